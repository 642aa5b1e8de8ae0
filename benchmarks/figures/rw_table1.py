"""P-RW Table 1: test accuracy of RW DP-SGD at a fixed mean pairwise privacy loss ε̄ (houses).

Spec B.7.3 [AMBIG → SPEC defaults]: ε̄ in (ε, δ) units with δ = 1e−6, σ from the mean-loss
calibration of spec B.8 (``calibrate_sigma_mean``), T = 10·n RW steps (each node ≈ 10 updates),
graphs as in B.7.1 (complete, hypercube(11) "exponential", RGG r = 0.07, grid 45×45), 8 runs.
The paper gives no step size, cap or σ convention for this table; this reproduction uses the
reference code's houses conventions: step 0.0342, L_clip = 0.4, noise std σ·L_clip, clip after
noise, cap ⌈1.25·T/n⌉, and the B.8 calibration in the *paper* convention (ln T horizon,
N_u = T/n, no noise condition).  Those ε̄ are therefore "paper" numbers, not certified ones: the
certified σ (exact horizon, strict condition) is reported beside them in the JSON.
The gossip columns are the paper's printed values (gossip is not re-run here).
Data caveat: with hushnet's houses labelling the non-private ceiling is ≈ 0.85, below the paper's
RW accuracies at ε̄ ≥ 1 (spec PART C: absolute accuracies are comparable only on the paper's data).
"""
from __future__ import annotations

import json
import math
import pathlib
import time

import numpy as np

from node.privacy.randomwalk import calibrate_sigma_mean
from node.protocols.registry import transition_matrix
from node.sim.experiments import houses_setup, nonprivate_accuracy, sgd_curve

EPS_BARS = (0.5, 1.0, 2.0)
DELTA, L_CLIP, STEP, RUNS = 1e-6, 0.4, 0.0342, 8
GRAPHS = {"Complete": "complete:2048", "Exponential": "hypercube:11", "Geometric": "geometric:2048:0.07:0", "Grid": "grid:45x45"}
PAPER = {  # (gossip, RW) mean ± std per ε̄, as printed
    "Complete": {0.5: ((0.65, 0.10), (0.841, 0.07)), 1.0: ((0.70, 0.10), (0.900, 0.04)), 2.0: ((0.83, 0.06), (0.940, 0.02))},
    "Exponential": {0.5: ((0.70, 0.10), (0.818, 0.09)), 1.0: ((0.77, 0.05), (0.883, 0.05)), 2.0: ((0.89, 0.04), (0.937, 0.01))},
    "Geometric": {0.5: ((0.60, 0.07), (0.795, 0.06)), 1.0: ((0.66, 0.10), (0.873, 0.05)), 2.0: ((0.67, 0.04), (0.933, 0.02))},
    "Grid": {0.5: ((0.60, 0.07), (0.803, 0.10)), 1.0: ((0.73, 0.10), (0.848, 0.07)), 2.0: ((0.72, 0.10), (0.919, 0.02))},
}


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
        setup = houses_setup(n, 8, clip=L_CLIP)
        table[name] = {"graph": spec, "n": n, "T": T, "cap": cap, "nonprivate_test_accuracy": nonprivate_accuracy(setup),
                       "cells": {}}
        for ei, eb in enumerate(EPS_BARS):
            sig_paper = calibrate_sigma_mean(W, T, None, eb, DELTA, "none", horizon="lnT")
            sig_cert = calibrate_sigma_mean(W, T, None, eb, DELTA, "strict", horizon="exact")
            accs = [sgd_curve("rw-dpsgd", setup, seed=10_000 * gi + 100 * ei + r, steps=T, step_size=STEP,
                              noise_std=sig_paper * L_CLIP, W=W, cap=cap, eval_every=T)["accuracy"][-1] for r in range(RUNS)]
            (g_m, g_s), (p_m, p_s) = PAPER[name][eb]
            tol = 0.10 if eb == 0.5 else 0.05
            table[name]["cells"][str(eb)] = {
                "sigma_paper_convention": sig_paper, "sigma_certified_strict": sig_cert,
                "rw_accuracy_mean": float(np.mean(accs)), "rw_accuracy_std": float(np.std(accs)),
                "paper_rw": [p_m, p_s], "paper_gossip": [g_m, g_s],
                "within_spec_tolerance": abs(float(np.mean(accs)) - p_m) <= tol,
                "rw_at_least_paper_gossip": float(np.mean(accs)) >= g_m,
            }
    # figure: our RW means ± std beside the paper's RW and gossip values
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.8), sharey=True)
    x = np.arange(len(EPS_BARS))
    for ax, (name, row) in zip(axes, table.items()):
        ours = np.array([[row["cells"][str(e)]["rw_accuracy_mean"], row["cells"][str(e)]["rw_accuracy_std"]] for e in EPS_BARS])
        prw = np.array([PAPER[name][e][1] for e in EPS_BARS])
        pg = np.array([PAPER[name][e][0] for e in EPS_BARS])
        ax.errorbar(x - 0.12, ours[:, 0], ours[:, 1], fmt="o-", color="tab:blue", label="RW, this reproduction", capsize=3)
        ax.errorbar(x, prw[:, 0], prw[:, 1], fmt="s--", color="tab:cyan", label="RW, paper", capsize=3)
        ax.errorbar(x + 0.12, pg[:, 0], pg[:, 1], fmt="^:", color="tab:red", label="gossip, paper", capsize=3)
        ax.axhline(row["nonprivate_test_accuracy"], color="k", ls=":", lw=1, label="non-private ceiling (our data)")
        ax.set_xticks(x, [f"ε̄={e:g}" for e in EPS_BARS])
        ax.set_title(f"{name} (n={row['n']})", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy")
    axes[0].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"P-RW Table 1 reproduction: houses, T = 10n, δ={DELTA:g}, {RUNS} runs; σ from the B.8 mean-loss "
                 "calibration in the paper convention (ln T, no noise condition)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out_dir / "rw_table1.png", dpi=90)
    plt.close(fig)
    result = {
        "table": "P-RW Table 1 (accuracy at fixed mean privacy loss)",
        "setting": {"delta": DELTA, "L_clip": L_CLIP, "step_size": STEP, "runs": RUNS, "T": "10·n",
                    "noise": "std σ·L_clip, clip after noise (reference-code houses conventions)",
                    "epsilon_bar_label": "paper (ln T horizon, N_u = T/n, no noise condition); certified σ listed per cell",
                    "gossip": "paper values only (not re-run)",
                    "data_caveat": "labels = median house value above its mean (node.datasets.load_houses); OpenML 823's "
                                   "binarisation is not documented (spec PART C [AMBIG]). On this labelling even non-private "
                                   "full-batch logistic regression reaches only the 'nonprivate_test_accuracy' of each row, "
                                   "below the paper's RW accuracies at ε̄ ≥ 1, so absolute numbers are not comparable."},
        "rows": table,
        "wall_seconds": round(time.perf_counter() - t0, 1),
    }
    (out_dir / "rw_table1.json").write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main(pathlib.Path(__file__).resolve().parent / "out")
