"""P-RW Appendix C Figure 5: the privacy-loss matrix of a stochastic block model shows its blocks.

Spec randomwalk.md B.7.5: 200 nodes in blocks (75, 75, 50) with
``P = [[0.25, 0.05, 0.02], [0.05, 0.35, 0.07], [0.02, 0.07, 0.40]]`` (``nx.stochastic_block_model(..., seed=0)``),
α = 2, σ = 1, T = computeTwalk (σ and T are not stated by the paper: [AMBIG], spec default).
Check: for every node the mean loss to its own block exceeds the mean loss to each other block (the spec warns
*not* to test that most of the total loss goes to the own block).

"paper" = Thm 3 (ln T, N_u = T/n); "certified" = exact Σ W^t/t, proof noise condition (α=2, σ=1 meets
σ² ≥ α(α−1)/2 with equality; the printed strict one fails), N_u capped at T/n.
"""

from __future__ import annotations

import json
import math
import pathlib
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import networkx as nx  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.figures._png import save_palette_png  # noqa: E402
from hushnet.privacy import randomwalk as rw  # noqa: E402
from hushnet.privacy.graphs import graph_from_edges, metropolis_hastings  # noqa: E402

SIZES = [75, 75, 50]
PROBS = [[0.25, 0.05, 0.02], [0.05, 0.35, 0.07], [0.02, 0.07, 0.40]]
ALPHA, SIGMA = 2.0, 1.0


def block_stats(mat: np.ndarray, blocks: np.ndarray) -> dict:
    n = mat.shape[0]
    k = blocks.max() + 1
    mask = ~np.eye(n, dtype=bool)
    # mean loss from node u to each block (excluding u itself)
    per = np.zeros((n, k))
    for b in range(k):
        cols = blocks == b
        m = mat[:, cols] * mask[:, cols]
        cnt = cols.sum() - (blocks == b).astype(float)
        per[:, b] = m.sum(axis=1) / cnt
    own = per[np.arange(n), blocks]
    others = np.where(np.arange(k)[None, :] == blocks[:, None], -np.inf, per)
    own_wins = int((own > others.max(axis=1)).sum())
    total = mat.sum(axis=1)
    own_total = np.array([mat[u, blocks == blocks[u]].sum() for u in range(n)])
    block_means = [
        [
            float(
                mat[np.ix_(blocks == a, blocks == b)][mask[np.ix_(blocks == a, blocks == b)]].mean()
            )
            for b in range(k)
        ]
        for a in range(k)
    ]
    return {
        "nodes_own_block_mean_exceeds_others": own_wins,
        "nodes": n,
        "nodes_majority_of_total_in_own_block": int((own_total > 0.5 * total).sum()),
        "block_mean_matrix": block_means,
    }


def main(out_dir: pathlib.Path) -> dict:
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    G = nx.stochastic_block_model(SIZES, PROBS, seed=0)
    n = G.number_of_nodes()
    g = graph_from_edges(n, np.array(G.edges()), spec="sbm(75,75,50) seed 0")
    blocks = np.repeat(np.arange(len(SIZES)), SIZES)
    W = metropolis_hastings(g)
    T = rw.compute_T_walk(W, SIGMA)
    paper = rw.rw_pndp_matrix(W, T, ALPHA, SIGMA, bound="paper")
    cert = rw.rw_pndp_matrix(W, T, ALPHA, SIGMA, constraint="proof", max_contributions=T / n)
    off, coff = paper.off_diagonal(), cert.off_diagonal()
    res = {
        "figure": "P-RW App. C Fig. 5 (SBM)",
        "alpha": ALPHA,
        "sigma": SIGMA,
        "n": n,
        "edges": g.num_edges,
        "connected": bool(nx.is_connected(G)),
        "T": T,
        "c_T": ALPHA * T * math.log(T) / (SIGMA**2 * n**2),
        "paper": {
            "min": float(off.min()),
            "mean": float(off.mean()),
            "max": float(off.max()),
            **block_stats(paper.matrix, blocks),
        },
        "certified": {
            "min": float(coff.min()),
            "mean": float(coff.mean()),
            "max": float(coff.max()),
            **block_stats(cert.matrix, blocks),
            "notes": cert.notes,
        },
        "spec_reference": {
            "edges": 2727,
            "T": 675,
            "c_T": 0.2199,
            "min": 0.134,
            "mean": 0.214,
            "max": 0.812,
            "nodes_own_block_mean_exceeds_others": 200,
            "nodes_majority_of_total_in_own_block": 43,
        },
    }
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    for ax, (lab, m) in zip(
        axes[:2],
        (("paper (Thm 3, ln T)", paper.matrix), ("certified (exact Σ, cap T/n)", cert.matrix)),
    ):
        shown = m.copy()
        np.fill_diagonal(shown, np.nan)
        im = ax.imshow(shown, cmap="viridis")
        for edge in np.cumsum(SIZES)[:-1]:
            ax.axhline(edge - 0.5, color="w", lw=0.6)
            ax.axvline(edge - 0.5, color="w", lw=0.6)
        ax.set_title(f"{lab}\nε_(u→v), α=2, σ=1, T={T}", fontsize=10)
        ax.set_xlabel("observer v")
        ax.set_ylabel("contributor u")
        fig.colorbar(im, ax=ax, fraction=0.046)
    bm = np.array(res["paper"]["block_mean_matrix"])
    bc = np.array(res["certified"]["block_mean_matrix"])
    x = np.arange(3)
    for b in range(3):
        axes[2].bar(
            x + 0.13 * (2 * b - 2),
            bm[:, b],
            width=0.13,
            label=f"to block {b} (paper)",
            color=f"C{b}",
        )
        axes[2].bar(
            x + 0.13 * (2 * b - 1),
            bc[:, b],
            width=0.13,
            label=f"to block {b} (certified)",
            color=f"C{b}",
            alpha=0.45,
            hatch="//",
        )
    axes[2].set_xticks(x, [f"from block {b}" for b in range(3)])
    axes[2].set_ylabel("mean ε_(u→v)")
    axes[2].set_title(
        f"own block > each other block for {res['paper']['nodes_own_block_mean_exceeds_others']}/{n} "
        "nodes (paper)",
        fontsize=10,
    )
    axes[2].legend(fontsize=7, ncol=2)
    fig.suptitle("SBM (75, 75, 50): random-walk privacy loss follows the blocks", fontsize=11)
    fig.tight_layout()
    save_palette_png(fig, out_dir / "rw_fig5_sbm.png", dpi=80)
    plt.close(fig)
    res["seconds"] = time.perf_counter() - t0
    (out_dir / "rw_fig5_sbm.json").write_text(json.dumps(res, indent=1, default=float))
    return res


if __name__ == "__main__":
    main(pathlib.Path(__file__).resolve().parent / "out")
