"""P-AD Figure 2: private logistic regression on houses — central vs network (complete graph) vs local DP-SGD.

Spec A.6.3: n = 2000 users × 8 rows, T = 20 000, ε ∈ {10, 1}, δ = 1e−6, L_clip = 0.4, the reference
code's σ calibration (labelled "paper": it is the code's formula, not a certified bound), step sizes
(0.0673 local, 0.0342 central, 0.0342 network), cap ⌈1.25·T/n⌉ = 13 (contribute-then-noise for the
network walk, contribute-then-nothing for local DP, no cap for central), the reference code's
clip-after-noise update (docs/design/spec/randomwalk.md §A.4.6 flag), objective on 1000 fixed training rows and test accuracy
every 100 steps.  All three methods run as protocol machines in the simulator.
The paper averages 20 runs; this reproduction uses RUNS = 10 per curve to stay within minutes.
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
from hushnet.sim.experiments import houses_setup, nonprivate_accuracy, sgd_curve

N, PER_NODE, T, DELTA, L_CLIP = 2000, 8, 20_000, 1e-6, 0.4
EPSILONS = (10.0, 1.0)
RUNS = 10
STEP = {"local": 0.0673, "central": 0.0342, "network": 0.0342}
CAP = math.ceil(1.25 * T / N)
PROTOCOL = {"central": "central-dpsgd", "network": "pad-complete-sgd", "local": "local-dp-sgd"}
SPEC_SIGMA = {
    10.0: {"local": 5.871, "central": 0.6968, "network": 1.2270},
    1.0: {"local": 46.87, "central": 6.968, "network": 10.98},
}
NOTE = (  # the last run's reading, kept in the JSON beside the numbers it is about
    "Re-run on OpenML 823's label (non-private full-batch 0.966). eps = 10: central 0.962 +- 0.002, network "
    "(complete graph) 0.961 +- 0.004, local 0.885 +- 0.089 -- the paper's picture (network matches central, "
    "both beat local). eps = 1: central 0.885 +- 0.042, network 0.784 +- 0.051, local 0.564 +- 0.094 with "
    "final objective 0.81 > ln 2 (diverges, as the paper says); network 'nearly bridges the gap' in objective"
    " (0.514 between central 0.396 and local 0.806) but is 0.10 below central in accuracy, so the check "
    "network_close_to_central_accuracy is false at eps = 1. (Old label: 0.81 / 0.80 / 0.70 at eps = 10, 0.72 "
    "/ 0.61 / 0.52 at eps = 1.) Setup differences from the paper: step sizes are the reference code's fixed "
    "ones (0.0342 network and central, 0.0673 local), where the paper tunes each method's step in [1e-4, 2]; "
    "10 runs instead of 20; the noise is the code's clip-after-noise update; at eps = 1 the network curve "
    "still climbs late (0.73 at 12 000 steps, 0.78-0.80 at 16 000-20 000)."
)


def main(out_dir: pathlib.Path) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    setup = houses_setup(N, PER_NODE, clip=L_CLIP)
    result: dict = {
        "figure": "P-AD Fig. 2 (houses logistic regression)",
        "setting": {
            "n": N,
            "per_node": PER_NODE,
            "T": T,
            "delta": DELTA,
            "L_clip": L_CLIP,
            "cap": CAP,
            "runs": RUNS,
            "paper_runs": 20,
            "step_sizes": STEP,
            "update": "clip after noise (reference code, docs/design/spec/randomwalk.md §A.4.6)",
            "split": "stratified 80/20, numpy seed 42 (not scikit-learn's permutation)",
        },
        "nonprivate_test_accuracy": nonprivate_accuracy(setup),
        "epsilons": {},
    }
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    colours = {"central": "tab:green", "network": "tab:blue", "local": "tab:red"}
    for row, eps in enumerate(EPSILONS):
        sig = {
            "local": fig2_sigma_local_code(L_CLIP, N, eps, DELTA, T)[0],
            "central": fig2_sigma_central_code(L_CLIP, N, eps, DELTA, T),
            "network": fig2_sigma_network_code(L_CLIP, N, eps, DELTA, T)[0],
        }
        entry: dict = {
            "sigma": {k: round(v, 6) for k, v in sig.items()},
            "sigma_label": "paper (reference-code calibration)",
            "sigma_spec": SPEC_SIGMA[eps],
            "methods": {},
        }
        for method in ("central", "network", "local"):
            curves = [
                sgd_curve(
                    PROTOCOL[method],
                    setup,
                    seed=1000 * row + r,
                    steps=T,
                    step_size=STEP[method],
                    noise_std=sig[method],
                    cap=None if method == "central" else CAP,
                )
                for r in range(RUNS)
            ]
            steps = curves[0]["steps"]
            obj = np.array([c["objective"] for c in curves])
            acc = np.array([c["accuracy"] for c in curves])
            entry["methods"][method] = {
                "final_objective_mean": float(obj[:, -1].mean()),
                "final_objective_std": float(obj[:, -1].std()),
                "final_accuracy_mean": float(acc[:, -1].mean()),
                "final_accuracy_std": float(acc[:, -1].std()),
                "initial_objective": float(obj[0, 0]),
                "objective_mean_curve": [round(float(v), 5) for v in obj.mean(axis=0)[::10]],
                "accuracy_mean_curve": [round(float(v), 5) for v in acc.mean(axis=0)[::10]],
                "curve_steps": [int(s) for s in steps[::10]],
            }
            label = {
                "central": "Centralized DP-SGD (trusted aggregator)",
                "network": "Network DP-SGD (complete graph)",
                "local": "Local DP-SGD",
            }[method]
            for col, data in ((0, obj), (1, acc)):
                ax = axes[row, col]
                m, s = data.mean(axis=0), data.std(axis=0)
                ax.plot(steps, m, color=colours[method], label=label)
                ax.fill_between(steps, m - s, m + s, color=colours[method], alpha=0.2)
        m = entry["methods"]
        entry["checks"] = {
            "network_close_to_central_accuracy": abs(
                m["network"]["final_accuracy_mean"] - m["central"]["final_accuracy_mean"]
            )
            < 0.05,
            "network_beats_local_objective": m["network"]["final_objective_mean"]
            < m["local"]["final_objective_mean"],
            "central_beats_local_objective": m["central"]["final_objective_mean"]
            < m["local"]["final_objective_mean"],
        }
        if eps == 1.0:
            entry["checks"]["local_does_not_decrease_at_eps1"] = (
                m["local"]["final_objective_mean"] >= m["local"]["initial_objective"]
            )
        result["epsilons"][str(eps)] = entry
        axes[row, 0].set_yscale("log")
        axes[row, 0].set_ylabel(f"ε = {eps:g}: objective (train, log)")
        axes[row, 1].set_ylabel(f"ε = {eps:g}: test accuracy")
        for ax in axes[row]:
            ax.set_xlabel("iterations")
            ax.grid(alpha=0.3)
    axes[0, 1].axhline(
        result["nonprivate_test_accuracy"], color="k", ls=":", lw=1, label="non-private"
    )
    axes[0, 1].legend(fontsize=8, loc="lower right")
    fig.suptitle(
        f"P-AD Fig. 2 reproduction: houses, n={N}, T={T}, δ={DELTA:g}, mean ± std over {RUNS} runs\n"
        "σ from the reference code's calibration (label: paper)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(out_dir / "pad_fig2.png", dpi=90)
    plt.close(fig)
    result["note"] = NOTE
    result["wall_seconds"] = round(time.perf_counter() - t0, 1)
    (out_dir / "pad_fig2.json").write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main(pathlib.Path(__file__).resolve().parent / "out")
