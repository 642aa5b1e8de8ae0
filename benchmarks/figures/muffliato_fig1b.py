"""[M] Figure 1b: privacy loss from one node to every other on the Facebook ego graph of node 1912.

Setup as the reference code (docs/design/spec/gossip.md §1.5 E5): SNAP ego-Facebook, ego network of 1912 without the ego,
largest connected component; source ``u = np.random.RandomState(1).randint(n)``; α = 1.5,
σ² = 3.75 (LDP loss α/2σ² = 0.2); plain (non-accelerated) gossip for T = T_mix rounds.

Paper values: [M] Theorem 1 (code convention t = 1..T), clipped at the LDP loss.  Certified: the
exact divergence of each observer's closed-neighbourhood view (own noise known), for every
observer (one block-Arnoldi basis per observer).  Communities (greedy modularity) quantify the paper's qualitative claim: loss
near LDP inside the source's community, much smaller outside.
"""

from __future__ import annotations

import json
import pathlib

import networkx as nx
import numpy as np

from hushnet.datasets import facebook_ego_graph, load_facebook_edges
from hushnet.privacy import muffliato as mf
from hushnet.privacy.graphs import Graph, metropolis_hastings
from hushnet.privacy.paper import muffliato as pmf  # the printed bounds (labelled "paper")

EGO = 1912
ALPHA = 1.5
SIGMA2 = 3.75
N_CERTIFIED: int | None = None  # None = every observer


def ego_graph_without_ego(ego: int) -> Graph:
    """SNAP's ``<ego>.edges`` excludes the ego: drop it from the induced ego network, keep the LCC."""
    g = facebook_ego_graph(ego)
    e = load_facebook_edges()
    nbrs = np.unique(np.concatenate([e[e[:, 0] == ego, 1], e[e[:, 1] == ego, 0]]))
    k = int(np.searchsorted(np.union1d(nbrs, [ego]), ego))
    keep = np.delete(np.arange(g.n), k)
    return Graph(
        g.adjacency[keep][:, keep].tocsr(), spec=f"facebook-ego:{ego}-noego"
    ).largest_component()


def main(out_dir: pathlib.Path) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    g = ego_graph_without_ego(EGO)
    n = g.n
    W = metropolis_hastings(g)
    sigma = float(np.sqrt(SIGMA2))
    ldp = ALPHA / (2 * SIGMA2)
    T = mf.t_mix(W, sigma)
    u = int(np.random.RandomState(1).randint(n))
    paper = np.minimum(ALPHA / (2 * SIGMA2) * pmf.thm1_from_source(W, u, T, convention="code"), ldp)

    rng = np.random.default_rng(0)
    others = np.delete(np.arange(n), u)
    if N_CERTIFIED is None:
        obs = others
    else:
        obs = np.sort(rng.choice(others, size=min(N_CERTIFIED, others.size), replace=False))
    S = mf.exact_sensitivity_matrix(W, T, observers=obs)
    cert = np.full(n, np.nan)
    cert[obs] = ALPHA / (2 * SIGMA2) * S[u, :]

    G = g.to_networkx()
    comms = list(nx.algorithms.community.greedy_modularity_communities(G))
    label = np.empty(n, dtype=int)
    for i, c in enumerate(comms):
        label[list(c)] = i
    inside = label == label[u]
    inside[u] = False
    outside = label != label[u]

    def med(v: np.ndarray, mask: np.ndarray) -> float:
        x = v[mask & np.isfinite(v)]
        return float(np.median(x)) if x.size else float("nan")

    stats = {
        "paper_median_in_community": med(paper, inside),
        "paper_median_outside": med(paper, outside),
        "certified_median_in_community": med(cert, inside),
        "certified_median_outside": med(cert, outside),
        "certified_fraction_at_ldp": float(np.mean(cert[obs] >= ldp * (1 - 1e-9))),
        "paper_fraction_at_ldp": float(np.mean(paper[others] >= ldp * (1 - 1e-9))),
    }

    pos = nx.spring_layout(G, seed=1, iterations=60)
    xy = np.array([pos[i] for i in range(n)])
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.6))
    norm = LogNorm(vmin=1e-4, vmax=ldp)
    edges = g.edges()
    for ax, vals, title in (
        (axes[0], paper, "paper: [M] Theorem 1 (clipped at LDP)"),
        (axes[1], cert, f"certified: exact view ({obs.size} observers)"),
    ):
        segs = xy[edges[:: max(1, edges.shape[0] // 4000)]]
        from matplotlib.collections import LineCollection

        ax.add_collection(LineCollection(segs, colors="0.85", linewidths=0.3, zorder=0))
        finite = np.isfinite(vals)
        ax.scatter(xy[~finite, 0], xy[~finite, 1], s=6, c="0.7", zorder=1)
        sc = ax.scatter(
            xy[finite, 0],
            xy[finite, 1],
            s=14,
            c=np.maximum(vals[finite], 1e-4),
            cmap="viridis",
            norm=norm,
            zorder=2,
        )
        ax.scatter(
            [xy[u, 0]], [xy[u, 1]], s=120, marker="*", c="red", zorder=3, label=f"source u={u}"
        )
        ax.set_title(title, fontsize=10)
        ax.set_axis_off()
        ax.legend(loc="lower left", fontsize=8)
    fig.colorbar(
        sc, ax=axes[:2], shrink=0.8, label=f"Rényi loss ε(α={ALPHA}), σ²={SIGMA2} (LDP = {ldp:.2f})"
    )
    dist = g.shortest_path_lengths(u)
    ax = axes[2]
    ax.scatter(
        dist[others] - 0.25 + rng.uniform(-0.1, 0.1, others.size),
        np.maximum(paper[others], 1e-6),
        s=6,
        alpha=0.4,
        label="paper",
    )
    ax.scatter(
        dist[obs] + 0.25 + rng.uniform(-0.1, 0.1, obs.size),
        np.maximum(cert[obs], 1e-6),
        s=8,
        c="tab:red",
        alpha=0.5,
        label="certified",
    )
    ax.axhline(ldp, color="k", ls="--", lw=1, label="LDP")
    ax.set_yscale("log")
    ax.set_ylim(1e-6, 0.5)
    ax.set_xlabel("shortest-path distance to the source")
    ax.set_ylabel("Rényi loss")
    ax.legend(fontsize=8)
    ax.set_title("loss by distance", fontsize=10)
    fig.suptitle(f"Muffliato Fig. 1b: Facebook ego {EGO} (n={n}, T={T}, plain gossip)")
    fig.savefig(out_dir / "muffliato_fig1b.png", dpi=80, bbox_inches="tight")
    plt.close(fig)

    summary = {
        "figure": "[M] Figure 1b",
        "ego": EGO,
        "n": n,
        "edges": g.num_edges,
        "steps_T": T,
        "alpha": ALPHA,
        "sigma2": SIGMA2,
        "ldp": ldp,
        "source": u,
        "communities": len(comms),
        "stats": stats,
        "certified_observers": obs.tolist(),
        "certified_values": cert[obs].tolist(),
        "paper_values_clipped": paper.tolist(),
        "note": "graph rebuilt from facebook_combined (ego removed); the paper gives no numbers for this figure",
    }
    (out_dir / "muffliato_fig1b.json").write_text(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main(pathlib.Path(__file__).resolve().parent / "out")
