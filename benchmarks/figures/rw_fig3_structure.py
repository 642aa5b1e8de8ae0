"""P-RW Figure 3: graph structure vs pairwise privacy loss (Facebook ego network 0, Davis Southern Women).

Spec randomwalk.md B.7.4 ([CODE] parameters): α = 2, σ = 10, T = computeTwalk(W, σ), Hamilton "+1" weights.
Panels per graph: the loss matrix (log), the Estrada communicability ``expm(W)`` with zeroed diagonal (log), the
graph coloured by the loss (ego graph: loss from node 1; Davis: summed loss per node, ``priv.sum(axis=0)``) and by
eigenvector centrality (the code's "Katz" panel), and a scatter of certified vs paper per pair.

"paper" = Theorem 3 as the code computes it (ln T, N_u = T/n).  "certified" = exact Σ_{t≤T} W^t/t with the
*strict* printed noise condition (σ² = 100 ≥ 2α(α−1) = 4 holds) and N_u = T/n as a hard cap.
Facebook ego 0: the SNAP ``facebook/0.edges`` file excludes the ego, so the ego is removed and the largest
connected component kept (as in the reference code); data from ``hushnet.datasets`` (``../shared/data`` in tests).
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
from scipy.linalg import expm  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402

from benchmarks.figures._png import save_palette_png  # noqa: E402
from hushnet.privacy import randomwalk as rw  # noqa: E402
from hushnet.privacy.graphs import Graph, graph_from_edges, metropolis_hastings  # noqa: E402

ALPHA, SIGMA = 2.0, 10.0


def davis_graph() -> tuple[Graph, list[str]]:
    G = nx.davis_southern_women_graph()
    names = list(G.nodes())
    H = nx.convert_node_labels_to_integers(G)
    return graph_from_edges(H.number_of_nodes(), np.array(H.edges()), spec="davis"), names


def facebook_ego0() -> Graph | None:
    """Ego network of node 0 without the ego, largest connected component, relabelled 0..n−1."""
    try:
        from hushnet.datasets import facebook_ego_graph

        g = facebook_ego_graph(0)
    except Exception as exc:  # data not available on this machine
        print(f"  facebook ego graph unavailable: {exc}")
        return None
    e = g.edges()
    e = e[(e[:, 0] != 0) & (e[:, 1] != 0)] - 1  # the ego has the smallest id (0) → index 0
    sub = graph_from_edges(g.n - 1, e, spec="facebook-ego:0 (no ego)")
    return sub.largest_component()


def analyse(g: Graph) -> dict:
    W = metropolis_hastings(g)
    T = rw.compute_T_walk(W, SIGMA)
    paper = rw.rw_pndp_matrix(W, T, ALPHA, SIGMA, bound="paper")
    cert = rw.rw_pndp_matrix(W, T, ALPHA, SIGMA, constraint="strict", max_contributions=T / g.n)
    comm = expm(W.toarray())
    np.fill_diagonal(comm, 0.0)
    mask = ~np.eye(g.n, dtype=bool)
    G = g.to_networkx()
    eig = nx.eigenvector_centrality(G, max_iter=5000)
    cent = np.array([eig[i] for i in range(g.n)])
    summed = paper.matrix.sum(axis=0)
    off = paper.off_diagonal()
    coff = cert.off_diagonal()
    return {
        "W": W,
        "T": T,
        "paper": paper.matrix,
        "certified": cert.matrix,
        "comm": comm,
        "centrality": cent,
        "summed": summed,
        "nx": G,
        "stats": {
            "n": g.n,
            "edges": int(g.num_edges),
            "T": T,
            "vplambda": rw.vplambda(W),
            "lambda_min": float(rw.rw_spectrum(W).eigenvalues[0]),
            "c_T": ALPHA * T * math.log(T) / (SIGMA**2 * g.n**2),
            "paper_min": float(off.min()),
            "paper_mean": float(off.mean()),
            "paper_max": float(off.max()),
            "certified_min": float(coff.min()),
            "certified_mean": float(coff.mean()),
            "certified_max": float(coff.max()),
            "certified_over_paper_mean_ratio": float(np.mean(coff / off)),
            "spearman_loss_vs_communicability": float(
                spearmanr(paper.matrix[mask], comm[mask]).statistic
            ),
            "spearman_summed_loss_vs_eigenvector_centrality": float(
                spearmanr(summed, cent).statistic
            ),
            "spearman_certified_vs_paper": float(spearmanr(coff, off).statistic),
        },
    }


def _order(G: nx.Graph) -> np.ndarray:
    """Nodes grouped by greedy-modularity community so that block structure shows in the heatmaps."""
    comms = sorted(nx.algorithms.community.greedy_modularity_communities(G), key=len, reverse=True)
    return np.array([v for c in comms for v in sorted(c)])


def main(out_dir: pathlib.Path) -> dict:
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    davis, names = davis_graph()
    rows = [("Davis", davis, analyse(davis), np.arange(davis.n), np.log2)]
    fb = facebook_ego0()
    if fb is not None:
        a = analyse(fb)
        rows.insert(0, ("Facebook ego 0", fb, a, _order(a["nx"]), np.log))
    fig, axes = plt.subplots(len(rows), 5, figsize=(22, 4.4 * len(rows)))
    axes = np.atleast_2d(axes)
    result: dict = {
        "figure": "P-RW Fig. 3 (structure vs privacy loss)",
        "alpha": ALPHA,
        "sigma": SIGMA,
        "labels": {
            "paper": "Thm 3 as in the code: ln T, N_u = T/n",
            "certified": "exact Σ W^t/t, strict σ condition, N_u capped at T/n",
        },
    }
    for r, (title, g, a, order, logf) in enumerate(rows):
        ax = axes[r]
        P = a["paper"][np.ix_(order, order)].copy()
        C = a["comm"][np.ix_(order, order)].copy()
        np.fill_diagonal(P, np.nan)
        np.fill_diagonal(C, np.nan)
        base = "log₂" if logf is np.log2 else "ln"
        im = ax[0].imshow(logf(P), cmap="viridis")
        ax[0].set_title(f"{title} (n={g.n}): {base} loss (paper)\nT={a['T']}", fontsize=9)
        fig.colorbar(im, ax=ax[0], fraction=0.046)
        im = ax[1].imshow(logf(C), cmap="viridis")
        ax[1].set_title(
            f"{base} communicability expm(W), diag 0\nSpearman vs loss = "
            f"{a['stats']['spearman_loss_vs_communicability']:.3f}",
            fontsize=9,
        )
        fig.colorbar(im, ax=ax[1], fraction=0.046)
        G = a["nx"]
        pos = nx.spring_layout(G, seed=1) if g.n > 40 else nx.bipartite_layout(G, range(18))
        colour = a["paper"][1] if title.startswith("Facebook") else a["summed"]
        what = "loss from node 1" if title.startswith("Facebook") else "summed loss per node"
        nx.draw_networkx_edges(G, pos, ax=ax[2], alpha=0.15, width=0.5)
        sc = nx.draw_networkx_nodes(
            G, pos, ax=ax[2], node_color=colour, node_size=18 if g.n > 40 else 60, cmap="plasma"
        )
        fig.colorbar(sc, ax=ax[2], fraction=0.046)
        ax[2].set_title(f"coloured by {what} (paper)", fontsize=9)
        nx.draw_networkx_edges(G, pos, ax=ax[3], alpha=0.15, width=0.5)
        sc = nx.draw_networkx_nodes(
            G,
            pos,
            ax=ax[3],
            node_color=a["centrality"],
            node_size=18 if g.n > 40 else 60,
            cmap="plasma",
        )
        fig.colorbar(sc, ax=ax[3], fraction=0.046)
        ax[3].set_title(
            "coloured by eigenvector centrality\nSpearman(summed loss, centrality) = "
            f"{a['stats']['spearman_summed_loss_vs_eigenvector_centrality']:.3f}",
            fontsize=9,
        )
        if g.n <= 40:
            for i in range(g.n):
                ax[2].annotate(names[i], pos[i], fontsize=5)
        mask = ~np.eye(g.n, dtype=bool)
        ax[4].loglog(a["paper"][mask], a["certified"][mask], ".", ms=2, alpha=0.4)
        lim = [a["paper"][mask].min(), a["certified"][mask].max()]
        ax[4].plot(lim, lim, "k--", lw=0.8, label="y = x")
        ax[4].set_xlabel("paper ε_{u→v}")
        ax[4].set_ylabel("certified ε_{u→v}")
        ax[4].set_title(
            f"certified vs paper per pair (mean ratio {a['stats']['certified_over_paper_mean_ratio']:.3f})",
            fontsize=9,
        )
        ax[4].legend(fontsize=7)
        for k in range(4):
            ax[k].set_xticks([]), ax[k].set_yticks([])
        key = "facebook_ego0" if title.startswith("Facebook") else "davis"
        result[key] = a["stats"]
        if key == "davis":
            result[key]["top5_summed_loss"] = [names[i] for i in np.argsort(-a["summed"])[:5]]
            result[key]["spec_reference"] = {
                "T": 862,
                "vplambda": 0.08210,
                "lambda_min": -0.4343,
                "c_T": 0.11380,
                "min": 0.05810,
                "mean": 0.10222,
                "max": 0.37466,
                "spearman_comm": 0.956,
                "spearman_centrality": 0.84,
                "top5": ["E8", "E9", "E7", "E6", "E5"],
            }
    if fb is None:
        result["facebook_ego0"] = "unavailable: Facebook data not found (set HUSHNET_DATA_DIR)"
    fig.suptitle(
        "Structure vs privacy loss (α=2, σ=10, T = computeTwalk): paper (Thm 3) and certified",
        fontsize=11,
    )
    fig.tight_layout()
    save_palette_png(fig, out_dir / "rw_fig3_structure.png", dpi=70)
    plt.close(fig)
    result["seconds"] = time.perf_counter() - t0
    (out_dir / "rw_fig3_structure.json").write_text(json.dumps(result, indent=1, default=float))
    return result


if __name__ == "__main__":
    main(pathlib.Path(__file__).resolve().parent / "out")
