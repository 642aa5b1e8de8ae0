"""[P-AD] Figure 1b: empirical privacy loss of real summation on the complete graph (Gaussian
mechanism), T = 100 n, 10 walks per n, δ = 1e−7 (docs/design/spec/randomwalk.md A.6.2).

* "paper" — the authors' empirical walk accountant (known sender and receiver counted as
  contributions, Gaussian aggregation ε₀/√m, subsampling for unknown membership, heterogeneous
  advanced composition), averaged over all ordered pairs and runs, error bars at the best and
  worst pair; local DP = advanced composition over each user's actual visit count.
* "certified" — for the same per-step noise (Gaussian calibrated to ε₀-LDP by the classic rule),
  the random-walk RDP bound on K_n (P-RW Thm 3, exact H_T, printed noise condition), with the
  exact Binomial(T, 1/n) quantile of the count at δ̂ = 1e−7, anonymous-sender view; and the exact
  (μ-GDP) local-DP composition for that count.  One value per n (no walk dependence).
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

from benchmarks.figures.pad_fig1a import certified_curves
from hushnet.privacy import amplification as A

NAME = "pad_fig1b"
NS = (5, 10, 20, 50, 100, 200, 400)
EPS0S = (0.1, 0.4)
DELTA = 1e-7
RUNS = 10
SPEC = {  # docs/design/spec/randomwalk.md §A.6.2 [COMPUTED] means (NDP, LDP)
    (0.1, 5): (2.378, 6.716),
    (0.1, 10): (1.329, 6.719),
    (0.1, 20): (0.774, 6.721),
    (0.1, 50): (0.399, 6.722),
    (0.1, 100): (0.254, 6.722),
    (0.4, 5): (11.40, 42.30),
    (0.4, 10): (6.200, 42.33),
    (0.4, 20): (3.543, 42.34),
    (0.4, 50): (1.787, 42.35),
    (0.4, 100): (1.121, 42.35),
}


def main(out_dir: pathlib.Path) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rows = []
    for eps0 in EPS0S:
        for n in NS:
            res = [A.empirical_walk_accountant(n, 100 * n, eps0, DELTA, rng) for _ in range(RUNS)]
            ndp = np.concatenate([r.offdiag() for r in res])
            ldp = np.concatenate([r.ldp for r in res])
            cert = certified_curves(n, eps0, DELTA)
            rows.append(
                {
                    "eps0": eps0,
                    "n": n,
                    "ndp_mean": float(ndp.mean()),
                    "ndp_min": float(ndp.min()),
                    "ndp_max": float(ndp.max()),
                    "ldp_mean": float(ldp.mean()),
                    "ldp_min": float(ldp.min()),
                    "ldp_max": float(ldp.max()),
                    "certified_ndp": cert["ndp"],
                    "certified_ldp": cert["ldp"],
                    "certified_N_u": cert["N_u"],
                    "spec_ndp_mean": SPEC.get((eps0, n), (None, None))[0],
                    "spec_ldp_mean": SPEC.get((eps0, n), (None, None))[1],
                }
            )
            print(
                f"eps0={eps0} n={n}: NDP {ndp.mean():.4g} [{ndp.min():.4g}, {ndp.max():.4g}]  "
                f"LDP {ldp.mean():.4g}  certified NDP {cert['ndp']:.4g} LDP {cert['ldp']:.4g}"
            )

    fig, axes = plt.subplots(1, 2, figsize=(13, 6.2), sharey=True)
    for ax, eps0 in zip(axes, EPS0S):
        r = [x for x in rows if x["eps0"] == eps0]
        n = np.array([x["n"] for x in r])
        for key, color, label in (
            ("ndp", "g", "Network DP, empirical accountant (paper)"),
            ("ldp", "b", "Local DP, advanced composition (paper)"),
        ):
            mean = np.array([x[f"{key}_mean"] for x in r])
            err = np.vstack(
                [mean - [x[f"{key}_min"] for x in r], np.array([x[f"{key}_max"] for x in r]) - mean]
            )
            ax.errorbar(n, mean, yerr=err, fmt="-o", color=color, ms=4, capsize=3, label=label)
        ax.plot(
            n,
            [x["certified_ndp"] for x in r],
            "-s",
            color="tab:red",
            ms=4,
            label="Network DP, P-RW Thm 3 on $K_n$, anonymous sender (certified)",
        )
        ax.plot(
            n,
            [x["certified_ldp"] for x in r],
            "-s",
            color="tab:purple",
            ms=4,
            label="Local DP, exact GDP composition (certified)",
        )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("n (number of users)")
        ax.set_title(rf"$\varepsilon_0 = {eps0}$")
        ax.grid(True, which="both", alpha=0.25)
    axes[0].set_ylabel(r"privacy loss $\varepsilon$ at $\delta=10^{-7}$ (mean, min–max over pairs)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=9, loc="lower center", ncol=2, frameon=False)
    fig.suptitle(r"P-AD Fig. 1b: real summation on $K_n$, $T=100n$, 10 walks")
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(out_dir / f"{NAME}.png", dpi=100)
    plt.close(fig)

    result = {
        "figure": "P-AD Figure 1b",
        "params": {"T_over_n": 100, "delta": DELTA, "runs": RUNS, "seed": 0},
        "labels": {
            "ndp/ldp": "paper (reference-code empirical accountant)",
            "certified_ndp/certified_ldp": "certified (anonymous sender, binomial count at delta_hat=1e-7)",
        },
        "rows": rows,
    }
    (out_dir / f"{NAME}.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main(pathlib.Path(__file__).resolve().parent / "out")
