"""P-RW Figure 2: private logistic regression on houses with RW DP-SGD on three graphs.

Spec B.7.2: n = 2048 users × 8 rows, T = 20 000, ε = 1 (the paper's setting; the code's default is
10), δ = 1e−6, L_clip = 0.4, step sizes 0.0673 (local) / 0.0342 (central, RW), 8 runs, evaluation
every 100 steps.  Compared: centralized DP-SGD (trusted aggregator), local DP-SGD, and RW DP-SGD on
the complete graph, the hypercube(11) "exponential" graph and the random geometric graph (r = 0.07),
all RW curves with the same σ.

Noise: the paper's figure takes σ from the P-AD complete-graph calibration of the reference code
([CODE-vs-paper], σ_net = 10.98 at ε = 1) — labelled "paper".  The Theorem-3 mean-loss calibration of
docs/design/spec/randomwalk.md §B.8 is computed too, in both conventions (paper: ln T, no noise condition; certified: exact
horizon, strict condition), and one extra curve trains RW on the complete graph with the *certified*
σ, clean clipping to C and noise std 2Cσ (the spec's sound mode) — to show what a guarantee costs.
"""

from __future__ import annotations

import json
import math
import pathlib
import time

import numpy as np

from hushnet.privacy.amplification import (
    fig2_sigma_central_code,
    fig2_sigma_local_code,
    fig2_sigma_network_code,
)
from hushnet.privacy.randomwalk import calibrate_sigma_mean
from hushnet.protocols.registry import transition_matrix
from hushnet.sim.experiments import houses_setup, nonprivate_accuracy, sgd_curve

N, PER_NODE, T, EPS, DELTA, L_CLIP = 2048, 8, 20_000, 1.0, 1e-6, 0.4
RUNS = 8
STEP_LOCAL, STEP_RW = 0.0673, 0.0342
CAP = math.ceil(1.25 * T / N)
GRAPHS = {
    "complete": "complete:2048",
    "hypercube(11)": "hypercube:11",
    "geometric r=0.07": "geometric:2048:0.07:0",
}
NOTE = (  # the last run's reading, kept in the JSON beside the numbers it is about
    "Re-run on OpenML 823's label (non-private full-batch 0.966). At eps = 1 with the reference code's "
    "sigma_net = 10.98: RW complete 0.838 +- 0.077, hypercube(11) 0.698 +- 0.106, geometric 0.739 +- 0.128; "
    "central 0.917 +- 0.028; local 0.572 +- 0.139 with final objective 0.79 > ln 2 (it diverges, as the paper"
    " says). (Old label: RW 0.59-0.68, central 0.72.) RW beats local DP-SGD by far, but it is NOT 'close to "
    "Centralized DP-SGD' as the paper says: gap 0.08 (complete) to 0.22 (hypercube). Setup differences: the "
    "paper sets sigma from Thm 3's mean pairwise loss, the reference code (run here, docs/design/spec/randomwalk.md §B.7.2 [CODE-vs-"
    "paper]) from the P-AD complete-graph formula, sigma_net = 10.98 = 1.6 x sigma_central, whereas the Thm-3"
    " sigma in the paper's convention is 1.64 (sigma_b8_mean_loss; 6.7 x less noise: P-RW Table 1's RW cells "
    "are runs at that kind of sigma); step sizes are the code's fixed ones, not tuned per method; accuracy is"
    " still rising at T = 20000. The hypercube and RGG walks put 4.9 % / 6.9 % of their steps over the cap of"
    " 13 (noise only) against 2.8 % on the complete graph (8 simulated walks each): too little to explain "
    "their lower accuracy alone; their final objectives are within one std of the complete graph's (8 runs "
    "each)."
)


def _summ(curves: list[dict]) -> dict:
    obj = np.array([c["objective"] for c in curves])
    acc = np.array([c["accuracy"] for c in curves])
    return {
        "steps": curves[0]["steps"],
        "obj": obj,
        "acc": acc,
        "final_objective_mean": float(obj[:, -1].mean()),
        "final_objective_std": float(obj[:, -1].std()),
        "final_accuracy_mean": float(acc[:, -1].mean()),
        "final_accuracy_std": float(acc[:, -1].std()),
    }


def main(out_dir: pathlib.Path) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    setup = houses_setup(N, PER_NODE, clip=L_CLIP)
    sig_loc = fig2_sigma_local_code(L_CLIP, N, EPS, DELTA, T)[0]
    sig_cen = fig2_sigma_central_code(L_CLIP, N, EPS, DELTA, T)
    sig_net = fig2_sigma_network_code(L_CLIP, N, EPS, DELTA, T)[0]
    Ws = {name: transition_matrix(spec) for name, spec in GRAPHS.items()}
    b8 = {}
    for name, W in Ws.items():
        b8[name] = {
            "paper_lnT_no_constraint": calibrate_sigma_mean(
                W, T, None, EPS, DELTA, "none", horizon="lnT"
            ),
            "certified_exact_strict": calibrate_sigma_mean(
                W, T, None, EPS, DELTA, "strict", horizon="exact"
            ),
        }
    runs: dict[str, dict] = {}
    runs["Centralized DP-SGD (trusted aggregator)"] = _summ(
        [
            sgd_curve("central-dpsgd", setup, seed=r, steps=T, step_size=STEP_RW, noise_std=sig_cen)
            for r in range(RUNS)
        ]
    )
    runs["Local DP-SGD"] = _summ(
        [
            sgd_curve(
                "local-dp-sgd",
                setup,
                seed=100 + r,
                steps=T,
                step_size=STEP_LOCAL,
                noise_std=sig_loc,
                cap=CAP,
            )
            for r in range(RUNS)
        ]
    )
    for gi, (name, W) in enumerate(Ws.items()):
        runs[f"RW DP-SGD, {name}"] = _summ(
            [
                sgd_curve(
                    "rw-dpsgd",
                    setup,
                    seed=1000 * (gi + 1) + r,
                    steps=T,
                    step_size=STEP_RW,
                    noise_std=sig_net,
                    W=W,
                    cap=CAP,
                )
                for r in range(RUNS)
            ]
        )
    sig_cert = b8["complete"]["certified_exact_strict"]
    runs["RW DP-SGD, complete, certified σ (B.8 strict), clip before noise"] = _summ(
        [
            sgd_curve(
                "rw-dpsgd",
                setup,
                seed=9000 + r,
                steps=T,
                step_size=STEP_RW,
                noise_std=2 * L_CLIP * sig_cert,
                W=Ws["complete"],
                cap=CAP,
                clip_after_noise=False,
            )
            for r in range(RUNS)
        ]
    )

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8), gridspec_kw={"width_ratios": [1, 1, 0.7]})
    styles = ["tab:green", "tab:red", "tab:blue", "tab:orange", "tab:purple", "tab:gray"]
    for (label, s), colour in zip(runs.items(), styles):
        certified = "certified" in label
        panels = ((axes[2], s["obj"]),) if certified else ((axes[0], s["obj"]), (axes[1], s["acc"]))
        for ax, data in panels:
            m, sd = data.mean(axis=0), data.std(axis=0)
            ax.plot(s["steps"], m, color=colour, ls="--" if certified else "-", label=label, lw=1.4)
            ax.fill_between(s["steps"], m - sd, m + sd, color=colour, alpha=0.15)
    nonpriv = nonprivate_accuracy(setup)
    axes[1].axhline(nonpriv, color="k", ls=":", lw=1, label="non-private (full batch)")
    for ax in (axes[0], axes[2]):
        ax.set_yscale("log")
        ax.set_ylabel("objective (1000 training rows, log)")
    axes[1].set_ylabel("test accuracy")
    axes[2].set_title(
        f"RW, complete graph, certified σ={b8['complete']['certified_exact_strict']:.4g}\n"
        "(B.8, exact horizon, strict condition; clip before noise, std 2Cσ)",
        fontsize=8,
    )
    for ax in axes:
        ax.set_xlabel("iterations")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, loc="lower right")
    fig.suptitle(
        f"P-RW Fig. 2 reproduction: houses, n={N}×{PER_NODE}, T={T}, ε={EPS:g}, δ={DELTA:g}, "
        f"{RUNS} runs (mean ± std)\nσ: reference-code calibration (paper) — σ_net={sig_net:.4g}, "
        f"σ_loc={sig_loc:.4g}, σ_central={sig_cen:.4g}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(out_dir / "rw_fig2_houses.png", dpi=90)
    plt.close(fig)

    finals = {
        k: {
            kk: v[kk]
            for kk in (
                "final_objective_mean",
                "final_objective_std",
                "final_accuracy_mean",
                "final_accuracy_std",
            )
        }
        for k, v in runs.items()
    }
    rw = [finals[f"RW DP-SGD, {g}"] for g in GRAPHS]
    result = {
        "figure": "P-RW Fig. 2 (houses logistic regression, RW DP-SGD on three graphs)",
        "setting": {
            "n": N,
            "per_node": PER_NODE,
            "T": T,
            "epsilon": EPS,
            "delta": DELTA,
            "L_clip": L_CLIP,
            "cap": CAP,
            "runs": RUNS,
            "step_sizes": {"local": STEP_LOCAL, "central": STEP_RW, "rw": STEP_RW},
            "update": "clip after noise (reference code) unless stated",
            "graphs": GRAPHS,
        },
        "sigma_paper_code_calibration": {
            "network": sig_net,
            "local": sig_loc,
            "central": sig_cen,
            "spec_values": {"network": 10.98, "local": 46.87, "central": 6.800},
        },
        "sigma_b8_mean_loss": b8,
        "nonprivate_test_accuracy": nonpriv,
        "final": finals,
        "checks": {
            "rw_curves_within_each_others_std": max(r["final_objective_mean"] for r in rw)
            - min(r["final_objective_mean"] for r in rw)
            <= max(r["final_objective_std"] for r in rw) * 2,
            "rw_beats_local_accuracy": min(r["final_accuracy_mean"] for r in rw)
            > finals["Local DP-SGD"]["final_accuracy_mean"],
            "rw_close_to_central_accuracy": max(
                abs(
                    r["final_accuracy_mean"]
                    - finals["Centralized DP-SGD (trusted aggregator)"]["final_accuracy_mean"]
                )
                for r in rw
            )
            < 0.05,
        },
        "note": NOTE,
        "wall_seconds": round(time.perf_counter() - t0, 1),
    }
    (out_dir / "rw_fig2_houses.json").write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main(pathlib.Path(__file__).resolve().parent / "out")
