"""Muffliato Fig. 1c and Table 2: Muffliato-GD logistic regression on "Houses", n = 2000 and 4000.

Setup (Table 2 + the reference code's constants, docs/design/spec/gossip.md E6): 10 gradient steps of size 0.7,
a fresh connected public G(n, ln n/n) per step with MH weights, K_t = ⌈ln n/√λ_t⌉ Chebyshev steps
(Def. 3 initialisation — the reference code's ``x_old = 0`` bias is not reproduced), the reference
code's local update (gradient + N(0, 0.75²), then clipped to norm 1), θ ∈ R⁹ (8 weights +
intercept), node v gets ``per_node`` consecutive rows of the 80 % training split; central baseline
= the same noisy clipped updates, averaged exactly.  Score = test accuracy averaged over nodes.

How it is run: the algorithm is the :class:`~hushnet.families.gossip.machines.MuffliatoGD` machine; the ten
steps of every trial are computed with a vectorised replica of it (same node generators, same
public graphs, same K_t and γ_t from :func:`hushnet.families.gossip.build.resolve_params`), and the
first ``MACHINE_STEPS`` step(s) of trial 0 at n = 2000 are *also* run by the 2000 machines in the
engine's simulator: the JSON reports the largest difference (the full 10 steps of 2000 machines
take well over 15 min on this shared 2-core machine; the test suite checks machine/recursion parity at small n).

Privacy toward node 0 (per observer, summed over steps, as a ratio to the LDP total):
* ``paper``: the reference code's ``eps_random`` ([M] Theorem 4 form, degree +2 quirk) — not a guarantee;
* ``certified``: the exact view divergence of each step's gossip (K_t accelerated rounds, observer knows
  its own noise), summed over steps (RDP composition), for node 0's neighbours in any step plus
  ``OBSERVERS`` random observers, trial 0 only.
Trials: ``TRIALS`` = 10 per size, as Table 2 says.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import time

import numpy as np

from hushnet.engine.rng import node_generators
from hushnet.families.gossip.build import (
    build_gossip_machines,
    mh_matrix,
    resolve_params,
    run_gossip,
)
from hushnet.families.gossip.machines import connected_er
from hushnet.privacy import muffliato as mf
from hushnet.tasks import LogisticRegressionTask, houses_partition

_SHARED = (
    pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "data"
)  # ../shared/data from the repo root
if "HUSHNET_DATA_DIR" not in os.environ and _SHARED.is_dir():
    os.environ["HUSHNET_DATA_DIR"] = str(_SHARED)

STEPS = 10
STEP_SIZE = 0.7
NOISE_STD = 0.75
CLIP = 1.0
SIZES = {2000: 8, 4000: 4}
TRIALS = {2000: 10, 4000: 10}
OBSERVERS = {2000: 40, 4000: 20}
MACHINE_STEPS = 1
SPEC_ACC = {
    2000: {"central": 0.664, "muffliato": 0.655},
    4000: {"central": 0.655, "muffliato": 0.647},
}
SPEC_RATIO = {2000: {"median": 0.285, "mean": 0.287}, 4000: {"median": 0.176, "mean": 0.178}}
NOTE = (  # the last run's reading, kept in the JSON beside the numbers it is about
    "Re-run on OpenML 823's label with the paper's 10 trials per size. Final test accuracy (mean over nodes, "
    "mean +- std over trials): n = 2000 Muffliato-GD 0.926 +- 0.013, trusted aggregator 0.926 +- 0.013; n = "
    "4000 0.927 +- 0.009 and 0.927 +- 0.009; the two curves agree to 1e-4 at every step (the paper: 'both "
    "approaches behave similarly'), from 0.432 (theta = 0) to 0.87-0.88 after one step. Old label: 0.657 / "
    "0.665; spec E6's 0.664 / 0.655 were computed on that old label, and the paper prints no accuracy numbers"
    " for Fig. 1c, so there is no published number to compare to. The privacy ratios do not depend on the "
    "label and are unchanged (paper bound median 0.310 / 0.170 of LDP at n = 2000 / 4000 against spec E6's "
    "0.285 / 0.176). Split: the paper's 80/20 (the reference code's 0.7755 is not used)."
)


def _params(n: int, seed: int) -> dict:
    return dict(
        steps=STEPS,
        K="auto",
        step_size=STEP_SIZE,
        sigma=0.0,
        noise_std=NOISE_STD,
        clip_after_noise=True,
        graph="er-per-step",
        q=math.log(n) / n,
        graph_seed=seed,
        chebyshev=True,
    )


def _tasks(n: int, per_node: int, seed: int):
    part = houses_partition(n, per_node, seed=seed)
    return [LogisticRegressionTask(X, y, clip=CLIP) for X, y in part.shards], part


def _accuracy(thetas: np.ndarray, Xa: np.ndarray, y: np.ndarray) -> float:
    pred = np.where(Xa @ thetas.T >= 0.0, 1.0, -1.0)  # (test, nodes)
    return float((pred == y[:, None]).mean())


def _noisy_clipped(tasks, theta: np.ndarray, xi: np.ndarray) -> np.ndarray:
    g = np.array([t.raw_gradient(theta[v]) for v, t in enumerate(tasks)]) + xi
    nrm = np.linalg.norm(g, axis=1, keepdims=True)
    return g * np.minimum(1.0, CLIP / np.maximum(nrm, 1e-300))


def vectorised_run(tasks, n: int, seed: int, steps: int = STEPS, Xa=None, y=None) -> dict:
    """Muffliato-GD exactly as the machines compute it (same draws, same graphs, same K_t, γ_t)."""
    p = resolve_params("muffliato-gd", _params(n, seed), None, n, float(tasks[0].sensitivity()))
    rngs = node_generators(seed, n)
    d = tasks[0].dim
    theta = np.zeros((n, d))
    central = np.zeros(d)
    acc_m, acc_c, graphs = [], [], []
    for r in range(steps):
        if Xa is not None:
            acc_m.append(_accuracy(theta, Xa, y))
            acc_c.append(_accuracy(central[None, :], Xa, y))
        xi = np.array([rngs[v].standard_normal(d) * NOISE_STD for v in range(n)])
        x0 = theta - STEP_SIZE * _noisy_clipped(tasks, theta, xi)
        gc = _noisy_clipped(tasks, np.tile(central, (n, 1)), xi)
        central = central - STEP_SIZE * gc.mean(axis=0)
        A = connected_er(n, p["q"], p["graph_seed"] * 1_000_003 + r)
        W = mh_matrix(A)
        graphs.append((A, W))
        x = list(mf.simulate(W, x0, p["ks"][r], chebyshev=True, gamma=p["gammas"][r]))[-1]
        theta = x
    if Xa is not None:
        acc_m.append(_accuracy(theta, Xa, y))
        acc_c.append(_accuracy(central[None, :], Xa, y))
    return {
        "theta": theta,
        "acc_muffliato": acc_m,
        "acc_central": acc_c,
        "ks": p["ks"],
        "gammas": p["gammas"],
        "graphs": graphs,
    }


def privacy_ratios(run: dict, n: int, seed: int) -> dict:
    """Per-observer loss toward node 0 over the steps, as a ratio to the LDP total (steps × LDP)."""
    rng = np.random.default_rng(seed)
    nbrs = set()
    for A, _ in run["graphs"]:
        nbrs |= set(int(j) for j in A.indices[A.indptr[0] : A.indptr[1]])
    others = [v for v in rng.permutation(np.arange(1, n)) if v not in nbrs][: OBSERVERS[n]]
    obs = sorted(nbrs - {0}) + [int(v) for v in others]
    cert = np.zeros(len(obs))
    paper_all = np.zeros(n)
    for r, (A, W) in enumerate(run["graphs"]):
        K, g = run["ks"][r], run["gammas"][r]
        S = mf.exact_sensitivity_matrix(W, K, chebyshev=True, gamma=g, observers=obs)
        cert += S[0]
        deg = np.diff(A.indptr).astype(float) + 2.0  # reference code: self-loops counted twice
        per = np.minimum(2.0 * K * deg / (n - deg), 1.0)
        per[A.indices[A.indptr[0] : A.indptr[1]]] = 1.0
        per[0] = 1.0
        paper_all += per
    cert /= len(run["graphs"])
    paper = paper_all[1:] / len(run["graphs"])
    is_nb = np.array([v in nbrs for v in obs])
    return {
        "paper_ratio": {
            "median": float(np.median(paper)),
            "mean": float(paper.mean()),
            "q05": float(np.quantile(paper, 0.05)),
            "q95": float(np.quantile(paper, 0.95)),
            "frac_over_half": float((paper > 0.5).mean()),
            "all": paper.tolist(),
        },
        "certified_ratio": {
            "observers": len(obs),
            "neighbours_of_0_in_some_step": int(is_nb.sum()),
            "median_non_neighbours": float(np.median(cert[~is_nb])),
            "mean_non_neighbours": float(cert[~is_nb].mean()),
            "max_non_neighbours": float(cert[~is_nb].max()),
            "median_neighbours": float(np.median(cert[is_nb])) if is_nb.any() else None,
            "values": cert.tolist(),
            "is_neighbour": is_nb.tolist(),
        },
    }


def machine_parity(tasks, n: int, seed: int) -> dict:
    p = _params(n, seed)
    p["steps"] = MACHINE_STEPS
    ms = build_gossip_machines("muffliato-gd", tasks, run_seed=seed, params=p)
    res = run_gossip(ms)
    ref = vectorised_run(tasks, n, seed, steps=MACHINE_STEPS)["theta"]
    return {
        "steps": MACHINE_STEPS,
        "rounds": int(sum(ms[0].ks)),
        "status": res.status,
        "max_abs_diff": float(np.nanmax(np.abs(res.models - ref))),
        "messages": res.sim.messages,
        "simulator_seconds": round(res.sim.wall_seconds, 1),
        "faults": len(res.sim.faults),
    }


def main(out_dir: pathlib.Path) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    out: dict = {
        "figure": "Muffliato Fig. 1c / Table 2 (Muffliato-GD on houses)",
        "bounds": {
            "paper": "reference code eps_random ([M] Thm 4 form), not a guarantee",
            "certified": "exact per-step view divergence, RDP-composed over steps",
        },
        "trials": TRIALS,
        "trials_note": "10 trials, as the paper's Table 2",
        "setup": {
            "steps": STEPS,
            "step_size": STEP_SIZE,
            "noise_std": NOISE_STD,
            "clip": CLIP,
            "split": "80/20 stratified (reference code: 0.7755)",
            "gossip": "Def. 3 Chebyshev",
            "data": "OpenML 823's label: +1 iff longitude < its mean, latitude a feature "
            "(hushnet.datasets.load_houses)",
        },
        "spec_final_accuracy_note": "spec E6's reference accuracies (spec_final_accuracy) were computed with "
        "an earlier, wrong label (house value vs its mean); the paper prints no "
        "accuracy numbers for Fig. 1c, only curves",
        "sizes": {},
    }
    curves = {}
    privacy = {}
    for n, per in SIZES.items():
        accs_m, accs_c, ks = [], [], []
        for trial in range(TRIALS[n]):
            seed = 100 + trial
            tasks, part = _tasks(n, per, seed)
            Xa = tasks[0].augment(part.X_test)
            run = vectorised_run(tasks, n, seed, Xa=Xa, y=part.y_test)
            accs_m.append(run["acc_muffliato"])
            accs_c.append(run["acc_central"])
            ks.append(run["ks"])
            if trial == 0:
                privacy[n] = privacy_ratios(run, n, seed)
                if n == 2000:
                    out["machine_parity"] = machine_parity(tasks, n, seed)
        am, ac = np.array(accs_m), np.array(accs_c)
        curves[n] = (am, ac)
        out["sizes"][str(n)] = {
            "per_node": per,
            "ks_range": [int(np.min(ks)), int(np.max(ks))],
            "accuracy_muffliato_mean": am.mean(axis=0).tolist(),
            "accuracy_muffliato_std": am.std(axis=0).tolist(),
            "accuracy_central_mean": ac.mean(axis=0).tolist(),
            "accuracy_central_std": ac.std(axis=0).tolist(),
            "spec_final_accuracy": SPEC_ACC[n],
            "spec_privacy_ratio": SPEC_RATIO[n],
            "privacy": {
                k: {kk: vv for kk, vv in v.items() if kk not in ("all", "values", "is_neighbour")}
                for k, v in privacy[n].items()
            },
        }
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for i, (n, (am, ac)) in enumerate(curves.items()):
        it = np.arange(am.shape[1])
        axes[0].errorbar(
            it, am.mean(0), yerr=am.std(0), color=f"C{i}", capsize=3, label=f"Muffliato-GD n={n}"
        )
        axes[0].errorbar(
            it,
            ac.mean(0),
            yerr=ac.std(0),
            color=f"C{i}",
            ls="--",
            capsize=3,
            label=f"central n={n}",
        )
    axes[0].set_xlabel("gradient steps")
    axes[0].set_ylabel("test accuracy (mean over nodes)")
    axes[0].set_title("Fig. 1c: houses, fresh ER graph per step")
    axes[0].legend(fontsize=7)
    for i, n in enumerate(SIZES):
        pr = privacy[n]
        axes[1].hist(pr["paper_ratio"]["all"], bins=40, alpha=0.5, color=f"C{i}", label=f"n={n}")
        vals = np.array(pr["certified_ratio"]["values"])
        nb = np.array(pr["certified_ratio"]["is_neighbour"])
        axes[2].hist(vals[~nb], bins=40, alpha=0.5, color=f"C{i}", label=f"n={n}, non-neighbours")
    axes[1].set_xlabel("loss toward node 0 / LDP loss")
    axes[1].set_title("paper bound (reference eps_random)")
    axes[1].legend(fontsize=7)
    axes[2].set_xlabel("loss toward node 0 / LDP loss")
    axes[2].set_title(
        f"certified (exact view), {OBSERVERS[2000]}/{OBSERVERS[4000]} random observers"
    )
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "muffliato_fig1c_table2.png", dpi=110)
    plt.close(fig)
    out["note"] = NOTE
    out["wall_seconds"] = round(time.time() - t0, 1)
    (out_dir / "muffliato_fig1c_table2.json").write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main(pathlib.Path(__file__).resolve().parent / "out")
