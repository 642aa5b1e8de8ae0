"""P-RW Table 1: test accuracy at a fixed mean pairwise privacy loss ε̄, gossip vs random walk (houses).

Spec B.7.3 [AMBIG → SPEC defaults]: ε̄ in (ε, δ) units with δ = 1e−6, graphs as in B.7.1 (complete,
hypercube(11) "exponential", RGG r = 0.07, grid 45×45), 8 runs per cell, each node participates 10 times.
The paper gives no step size, cap or σ convention for this table; both columns use the reference code's
houses conventions: L_clip = 0.4, noise std σ·L_clip, clip after noise (so σ is a multiplier of L_clip,
the reference code's "sensitivity L_clip"; the same for both columns, so they compare like with like).

**Random walk** (T = 10·n steps, step 0.0342, cap ⌈1.25·T/n⌉): σ from the B.8 mean-loss calibration
(``calibrate_sigma_mean``) in the *paper* convention (ln T horizon, N_u = T/n, no noise condition) and in
the *certified* one (exact horizon, strict condition k = 2).

**Gossip** (Muffliato-GD, [M] Alg. 3, as the paper's §6 says: 10 global gradient steps, each followed by
K Chebyshev-accelerated gossip rounds on the same public W; K = ⌈ln n/√λ⌉, the reference ``T_mix`` at
σ = 1, docs/design/spec/randomwalk.md §B.5; step size 0.7, the Muffliato houses reference).  Per-pair Δ² over the 10 steps, in units
of (σ L_clip)², so that the RDP is ``α·Δ²/(2σ²)``:

* ``paper``: the P-RW reference code's gossip accounting (docs/design/spec/randomwalk.md §B.5): per step
  ``min(1, Σ_{t=1..K} Σ_{w∈N(v)} (W^t)_{wu}²/‖(W^t)_{w,:}‖²)`` (Theorem 1 in the code's convention, clipped at
  the LDP value), ×10 steps — a labelled reproduction, not a guarantee;
* ``certified``: an upper bound of the exact joint view.  Step s's input x_s (u's clipped update + fresh
  noise) reaches the observer only through its neighbourhood's rows of polynomials of W of degree
  < K·(10 − s) (the state carries it on), so the whole view is post-processing of the independent
  single-shot Muffliato views of x_s over K·(10 − s) rounds; RDP composition over s gives
  ``Δ² ≤ Σ_s S_{K(10−s)}(u → v)`` with S the exact (Krylov) Muffliato sensitivity
  (:func:`hushnet.privacy.muffliato.observer_sensitivities`, observer knows its own noise).  Valid for
  adaptively chosen updates.  (Checked against the joint hidden-state accountant
  :func:`hushnet.privacy.muffliato.muffliato_gd_state_space` on hypercube(3), grid 3×4, ring 8 and a 12-node
  RGG: the bound is ≥ the joint value for every pair, equal on some.)  All sources per observer; complete and hypercube are vertex-transitive
  (one observer is the exact mean), RGG and grid use a random sample of observers (said in the JSON).

σ for a target ε̄: the mean Δ² over ordered pairs m gives the mean RDP curve α·m/(2σ²), converted once at
δ (Mironov, no cap on α: a Gaussian mechanism needs none): ``ε̄ = a + 2√(a ln(1/δ))`` with a = m/(2σ²).

Data: OpenML 823's label (+1 iff longitude < its mean, latitude a feature; :func:`hushnet.datasets.load_houses`),
the paper's data, so the absolute accuracies are comparable to the paper's (non-private ceiling ≈ 0.96).
"""

from __future__ import annotations

import json
import math
import pathlib
import time

import numpy as np

from hushnet.privacy import muffliato as mf
from hushnet.privacy.calibration import linear_rdp_epsilon
from hushnet.privacy.conversions import linear_rdp_to_dp
from hushnet.privacy.graphs import chebyshev_gamma
from hushnet.privacy.paper import muffliato as pmf  # the printed bounds (labelled "paper")
from hushnet.privacy.randomwalk import alpha_max, calibrate_sigma_mean, rw_mean_single_loss
from hushnet.protocols.registry import transition_matrix
from hushnet.sim.experiments import HousesSetup, houses_setup, nonprivate_accuracy, sgd_curve

EPS_BARS = (0.5, 1.0, 2.0)
DELTA, L_CLIP, STEP, RUNS = 1e-6, 0.4, 0.0342, 8
GOSSIP_STEPS, GOSSIP_STEP_SIZE = 10, 0.7
OBSERVER_SAMPLE = {"Geometric": 6, "Grid": 4}  # non-transitive graphs: observers drawn at random
GRAPHS = {
    "Complete": "complete:2048",
    "Exponential": "hypercube:11",
    "Geometric": "geometric:2048:0.07:0",
    "Grid": "grid:45x45",
}
TRANSITIVE = {"Complete", "Exponential"}
NOTE = (  # the last run's reading, kept in the JSON beside the numbers it is about
    "Re-run on OpenML 823's label (non-private full-batch 0.966; the old label capped it at 0.847 and RW sat "
    "at 0.80-0.83). RW at the 'paper' sigma: 0.958-0.965 in all 12 cells, flat in eps_bar, at the non-private"
    " ceiling -- ABOVE the paper's 0.795-0.940, so only the eps_bar = 2 cells are within the spec tolerance "
    "(8 of 12 are not, all by being too high). Gossip (Muffliato-GD) at the paper-accounting sigma: 0.76-0.91"
    " (certified sigma 0.71-0.90) against the paper's 0.60-0.89, also mostly higher. RW >= gossip in all 12 "
    "cells (the paper's claim). Why RW is higher: the paper gives no sigma convention, step, T or eps_bar "
    "units for Table 1 (docs/design/spec/randomwalk.md §B.7.3 [AMBIG]); the 'paper' sigma here (B.8: ln T horizon, N_u = T/n, no noise "
    "condition) is 3.30 / 1.67 / 0.85 noise multipliers of L_clip at eps_bar = 0.5 / 1 / 2 on the complete "
    "graph, so little noise that accuracy does not depend on eps_bar. A brief check on the complete graph (4 "
    "runs each, same T, step, cap, clip-after-noise) at the certified sigma (39.8 / 20.3 / 10.5: exact "
    "horizon, strict condition) gives 0.723 +- 0.126 / 0.850 +- 0.088 / 0.928 +- 0.029 against the paper's "
    "0.841 / 0.900 / 0.940: with the other runs here (multiplier 5 / 8 / 11 / 16: 0.953 / 0.945 / 0.934 / "
    "0.915, 4 runs; 27.5 gives 0.838 in P-RW Fig. 2's run) the paper's values match multipliers of about 27 /"
    " 17 / 9, i.e. 8-10x our 'paper' sigma and 0.7-0.9x the certified one: the paper's RW noise is near the "
    "certified level, not the ln T one. The certified-sigma RW column is not run in this script (time)."
)
PAPER = {  # (gossip, RW) mean ± std per ε̄, as printed
    "Complete": {
        0.5: ((0.65, 0.10), (0.841, 0.07)),
        1.0: ((0.70, 0.10), (0.900, 0.04)),
        2.0: ((0.83, 0.06), (0.940, 0.02)),
    },
    "Exponential": {
        0.5: ((0.70, 0.10), (0.818, 0.09)),
        1.0: ((0.77, 0.05), (0.883, 0.05)),
        2.0: ((0.89, 0.04), (0.937, 0.01)),
    },
    "Geometric": {
        0.5: ((0.60, 0.07), (0.795, 0.06)),
        1.0: ((0.66, 0.10), (0.873, 0.05)),
        2.0: ((0.67, 0.04), (0.933, 0.02)),
    },
    "Grid": {
        0.5: ((0.60, 0.07), (0.803, 0.10)),
        1.0: ((0.73, 0.10), (0.848, 0.07)),
        2.0: ((0.72, 0.10), (0.919, 0.02)),
    },
}


def sigma_for_mean_sens(mean_sens: float, eps_bar: float, delta: float) -> float:
    """σ with ``min_α α·m/(2σ²) + ln(1/δ)/(α−1) = ε̄`` (closed form of the linear-RDP conversion)."""
    lg = math.log(1.0 / delta)
    a = (math.sqrt(lg + eps_bar) - math.sqrt(lg)) ** 2
    sigma = math.sqrt(mean_sens / (2.0 * a))
    eps, _ = linear_rdp_epsilon(mean_sens / (2.0 * sigma**2), delta)
    assert abs(float(eps) - eps_bar) < 1e-9 * max(1.0, eps_bar)
    return sigma


def epsilon_both_ways(slope: float, delta: float, amax: float = math.inf) -> dict[str, float]:
    """ε̄ of the mean RDP curve ``slope·α`` (α ≤ amax) by Mironov's conversion (what σ was calibrated with,
    the papers' rule) and by hushnet's certified rule (dp-accounting's improved conversion), at the same σ."""
    return {
        "classic": float(linear_rdp_to_dp(slope, delta, amax, method="classic")[0]),
        "improved": float(linear_rdp_to_dp(slope, delta, amax)[0]),
    }


def gossip_paper_sens(W, K: int, transitive: bool) -> float:
    """Mean over ordered pairs of the B.5 per-step value (clipped at 1), in units of Δ².

    On a vertex-transitive graph (complete, hypercube) every source sees the same multiset of values
    (W is invariant under the automorphisms), so source 0's row is the exact mean."""
    n = W.shape[0]
    if transitive:
        f = np.minimum(pmf.thm1_from_source(W, 0, K, convention="code"), 1.0)
        return float((f.sum() - f[0]) / (n - 1))
    F = np.minimum(pmf.thm1_matrix(W, K, convention="code"), 1.0)
    return float((F.sum() - np.trace(F)) / (n * (n - 1)))


def gossip_certified_sens(W, K: int, observers: list[int]) -> dict:
    """Mean over (source, sampled observer) of ``Σ_s S_{K(R−s)}(u→v)`` (see module docstring)."""
    n = W.shape[0]
    totals, first = [], []
    for v in observers:
        tot = np.zeros(n)
        s_prev = None
        for j in range(1, GOSSIP_STEPS + 1):  # horizon K·j serves the input of step R − j
            if s_prev is not None and np.all(np.delete(s_prev, v) >= 1.0 - 1e-9):
                s = s_prev  # saturated (every source fully seen): S is monotone in T and ≤ 1
            else:
                s = mf.observer_sensitivities(W, v, K * j)
            if j == 1:
                first.append(float(s.sum() / (n - 1)))
            tot += s
            s_prev = s
        totals.append(float(tot.sum() / (n - 1)))
    return {
        "mean": float(np.mean(totals)),
        "per_observer": totals,
        "observers": observers,
        "single_step_mean": float(np.mean(first)),
    }


def _stacked(setup: HousesSetup) -> np.ndarray:
    """y·x of every node's rows, (n, m, d), for vectorised per-node gradients."""
    aug = setup.tasks[0].augment
    return np.stack([y[:, None] * aug(X) for X, y in setup.part.shards])


def gossip_run(
    W, K: int, gamma: float, YX: np.ndarray, setup: HousesSetup, sigma: float, seed: int
) -> float:
    """Muffliato-GD with clip-after-noise updates; returns the test accuracy averaged over nodes."""
    n, m, d = YX.shape
    rng = np.random.default_rng(seed)
    theta = np.zeros((n, d))
    for _ in range(GOSSIP_STEPS):
        marg = np.einsum("nmd,nd->nm", YX, theta)
        g = -np.einsum(
            "nm,nmd->nd", 1.0 / (1.0 + np.exp(marg)), YX
        ) / m + sigma * L_CLIP * rng.standard_normal((n, d))
        g *= np.minimum(1.0, L_CLIP / np.maximum(np.linalg.norm(g, axis=1, keepdims=True), 1e-300))
        theta = list(mf.simulate(W, theta - GOSSIP_STEP_SIZE * g, K, chebyshev=True, gamma=gamma))[
            -1
        ]
    pred = np.where(setup.X_test @ theta.T >= 0.0, 1.0, -1.0)
    return float((pred == setup.y_test[:, None]).mean())


def _rw_accs(setup, W, T, cap, sigma, seed0) -> list[float]:
    return [
        sgd_curve(
            "rw-dpsgd",
            setup,
            seed=seed0 + r,
            steps=T,
            step_size=STEP,
            noise_std=sigma * L_CLIP,
            W=W,
            cap=cap,
            eval_every=T,
        )["accuracy"][-1]
        for r in range(RUNS)
    ]


def _ms(a) -> list[float]:
    return [float(np.mean(a)), float(np.std(a))]


def main(out_dir: pathlib.Path) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    table: dict = {}
    for gi, (name, spec) in enumerate(GRAPHS.items()):
        W = transition_matrix(spec)
        n = W.shape[0]
        T = 10 * n
        cap = math.ceil(1.25 * T / n)
        K = mf.t_mix(W, 1.0)
        gamma = chebyshev_gamma(W, kind="code")  # once per graph (an eigen-solve)
        setup = houses_setup(n, 8, clip=L_CLIP)
        YX = _stacked(setup)
        obs = (
            [0]
            if name in TRANSITIVE
            else sorted(
                int(v)
                for v in np.random.default_rng(gi).choice(n, OBSERVER_SAMPLE[name], replace=False)
            )
        )
        tg = time.perf_counter()
        m_paper = GOSSIP_STEPS * gossip_paper_sens(W, K, name in TRANSITIVE)
        cert = gossip_certified_sens(W, K, obs)
        table[name] = {
            "graph": spec,
            "n": n,
            "T": T,
            "cap": cap,
            "nonprivate_test_accuracy": nonprivate_accuracy(setup),
            "gossip_K": K,
            "gossip_mean_sens_sq": {
                "paper": m_paper,
                "certified": cert["mean"],
                "certified_single_step_mean": cert["single_step_mean"],
                "certified_observers": "all (vertex-transitive: observer 0 is every observer)"
                if name in TRANSITIVE
                else f"{len(obs)} random observers {obs}, all sources",
                "certified_per_observer": cert["per_observer"],
                "ldp_total": float(GOSSIP_STEPS),
            },
            "gossip_accounting_seconds": round(time.perf_counter() - tg, 1),
            "cells": {},
        }
        print(name, "K", K, "mean Δ² paper/certified", m_paper, cert["mean"], flush=True)
        for ei, eb in enumerate(EPS_BARS):
            sig_p = calibrate_sigma_mean(W, T, None, eb, DELTA, "none", horizon="lnT")
            sig_c = calibrate_sigma_mean(W, T, None, eb, DELTA, "strict", horizon="exact")
            gs_p = sigma_for_mean_sens(m_paper, eb, DELTA)
            gs_c = sigma_for_mean_sens(cert["mean"], eb, DELTA)
            seed0 = 10_000 * gi + 100 * ei
            rw_p = _rw_accs(
                setup, W, T, cap, sig_p, seed0
            )  # the certified σ is reported, not run (time)
            go_p = [gossip_run(W, K, gamma, YX, setup, gs_p, seed0 + r) for r in range(RUNS)]
            go_c = [gossip_run(W, K, gamma, YX, setup, gs_c, seed0 + 50 + r) for r in range(RUNS)]
            (g_m, g_s), (p_m, p_s) = PAPER[name][eb]
            tol = 0.10 if eb == 0.5 else 0.05
            rw_slope = (
                (T / n) * rw_mean_single_loss(W, T, "exact") / sig_c**2
            )  # the certified σ's mean curve
            cell = {
                "rw": {
                    "paper": {"sigma": sig_p, "accuracy": _ms(rw_p)},
                    "certified": {
                        "sigma": sig_c,
                        "accuracy": None,
                        "epsilon_bar": epsilon_both_ways(
                            rw_slope, DELTA, alpha_max(sig_c, "strict")
                        ),
                    },
                },
                "gossip": {
                    "paper": {
                        "sigma": gs_p,
                        "accuracy": _ms(go_p),
                        "epsilon_bar": epsilon_both_ways(m_paper / (2 * gs_p**2), DELTA),
                    },
                    "certified": {
                        "sigma": gs_c,
                        "accuracy": _ms(go_c),
                        "epsilon_bar": epsilon_both_ways(cert["mean"] / (2 * gs_c**2), DELTA),
                    },
                },
                "paper_rw": [p_m, p_s],
                "paper_gossip": [g_m, g_s],
                "spec_tolerance": tol,
            }
            for col, ours, ref in (("rw", rw_p, p_m), ("gossip", go_p, g_m)):
                cell[col]["paper"]["within_spec_tolerance_of_paper"] = bool(
                    abs(float(np.mean(ours)) - ref) <= tol
                )
            cell["rw_at_least_gossip_paper_sigma"] = (
                cell["rw"]["paper"]["accuracy"][0] >= cell["gossip"]["paper"]["accuracy"][0]
            )
            table[name]["cells"][str(eb)] = cell
            print(name, eb, json.dumps({k: cell[k] for k in ("rw", "gossip")}), flush=True)
    fig, axes = plt.subplots(1, 4, figsize=(16, 4.6), sharey=True)
    x = np.arange(len(EPS_BARS))
    series = [  # (label, getter, offset, style, colour)
        ("RW, ours, paper σ", lambda c: c["rw"]["paper"]["accuracy"], -0.25, "o-", "tab:blue"),
        ("RW, paper", lambda c: c["paper_rw"], -0.05, "s:", "tab:cyan"),
        (
            "gossip, ours, paper σ",
            lambda c: c["gossip"]["paper"]["accuracy"],
            0.05,
            "^-",
            "tab:red",
        ),
        (
            "gossip, ours, certified σ",
            lambda c: c["gossip"]["certified"]["accuracy"],
            0.15,
            "^--",
            "tab:brown",
        ),
        ("gossip, paper", lambda c: c["paper_gossip"], 0.25, "v:", "tab:orange"),
    ]
    for ax, (name, row) in zip(axes, table.items()):
        for label, get, off, fmt, col in series:
            v = np.array([get(row["cells"][str(e)]) for e in EPS_BARS])
            ax.errorbar(x + off, v[:, 0], v[:, 1], fmt=fmt, color=col, label=label, capsize=2, ms=4)
        for e_i, e in enumerate(EPS_BARS):  # the spec's tolerance band around the paper's RW value
            p = PAPER[name][e][1][0]
            tol = row["cells"][str(e)]["spec_tolerance"]
            ax.fill_between(
                [e_i - 0.32, e_i + 0.32], p - tol, p + tol, color="tab:cyan", alpha=0.12, lw=0
            )
        ax.axhline(
            row["nonprivate_test_accuracy"],
            color="k",
            ls=":",
            lw=1,
            label="non-private ceiling (our data)",
        )
        ax.set_xticks(x, [f"ε̄={e:g}" for e in EPS_BARS])
        ax.set_title(f"{name} (n={row['n']}, gossip K={row['gossip_K']})", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy")
    axes[0].legend(fontsize=6.5, loc="lower right")
    fig.suptitle(
        f"P-RW Table 1 re-run: houses, δ={DELTA:g}, {RUNS} runs/cell; RW T = 10n, gossip = Muffliato-GD 10 steps; "
        "σ from the mean-loss calibration, 'paper' = published accounting, 'certified' = proven bound; "
        "shaded = spec tolerance around the paper's RW value",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(out_dir / "rw_table1.png", dpi=90)
    plt.close(fig)
    result = {
        "table": "P-RW Table 1 (accuracy at fixed mean privacy loss), RW and gossip re-run",
        "setting": {
            "delta": DELTA,
            "L_clip": L_CLIP,
            "runs": RUNS,
            "rw": {
                "T": "10·n",
                "step_size": STEP,
                "cap": "ceil(1.25·T/n)",
                "sigma_paper": "B.8, ln T horizon, N_u = T/n, no noise condition",
                "sigma_certified": "B.8, exact horizon, strict noise condition (k = 2); reported, not run (time on the shared machine)",
            },
            "gossip": {
                "algorithm": "Muffliato-GD ([M] Alg. 3) on the fixed public W, Chebyshev-accelerated",
                "steps": GOSSIP_STEPS,
                "step_size": GOSSIP_STEP_SIZE,
                "K": "ceil(ln n / sqrt(lambda)) = reference T_mix at sigma = 1 (docs/design/spec/randomwalk.md §B.5)",
                "accuracy": "test accuracy of every node's own model, averaged over nodes",
                "sigma_paper": "P-RW reference gossip accounting (docs/design/spec/randomwalk.md §B.5: Theorem 1, code convention "
                "t = 1..K, clipped at LDP per step) x 10 steps, mean over pairs; NOT a guarantee",
                "sigma_certified": "sum over steps s of the exact Muffliato sensitivity with horizon "
                "K(10-s) (upper bound of the joint view, RDP composition), mean over pairs",
                "conversion": "mean RDP curve alpha*m/(2 sigma^2), Mironov at delta, alpha uncapped",
                "epsilon_bar": "the mean curve at the calibrated sigma converted both ways: classic "
                "(Mironov, what sigma was calibrated with) and improved (dp-accounting)",
            },
            "noise": "std σ·L_clip, clip after noise (reference-code houses conventions) for both columns",
            "noise_caveat": "both accountants assume Gaussian noise added to a quantity of bounded sensitivity "
            "(clip, then noise); the runs use the reference code's clip-after-noise update at the "
            "calibrated σ, so an ε̄ here labels the noise level, it is not a guarantee of these runs",
            "data": "OpenML 823's label: +1 iff longitude < mean(longitude), latitude among the 8 features "
            "(hushnet.datasets.load_houses), standardised, unit-norm rows, 80/20 stratified split; "
            "'nonprivate_test_accuracy' of each row is full-batch logistic regression on the same split",
        },
        "rows": table,
        "note": NOTE,
        "wall_seconds": round(time.perf_counter() - t0, 1),
    }
    (out_dir / "rw_table1.json").write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main(pathlib.Path(__file__).resolve().parent / "out")
