"""P-RW Figure 1 (anonymous sender) and Figure 4 (sender known): privacy loss vs shortest-path distance.

n ≈ 2048, Hamilton "+1" weights, α = 2, σ = 1 (ε_local = 1), source node 0, docs/design/spec/randomwalk.md B.6–B.7.1:
hypercube(11) ("exponential"), Erdős–Rényi c = 1.2 (resampled until connected), random geometric r = 0.07 and
grid 45×45 (corner source).  Curves per panel:

* RW "paper": Theorem 3 as the reference code computes it (ln T, N_u = T/n, no σ condition) — solid, with the
  min–max band of the distance class;
* RW "certified": exact finite-T sum Σ W^t/t, proof noise condition (α=2, σ=1 meets σ² ≥ α(α−1)/2 with equality;
  it does *not* meet the printed strict one), N_u = T/n enforced as a hard cap (Remark 5) — dotted;
* gossip "paper": the Muffliato Theorem 1 sum the reference code plots (docs/design/spec/randomwalk.md §B.5) — dashed;
* gossip "certified": the exact Rényi divergence of the observer's whole Gaussian view from
  ``hushnet.privacy.muffliato.exact_sensitivity_matrix`` (plain gossip, T_gossip rounds, observer sees its closed
  neighbourhood and knows its own noise) — crosses, for sampled observers (it costs one projection per observer).
  Its rounds are t = 0..T_gossip−1 (hushnet's Muffliato convention) while the paper sum runs over t = 1..T_gossip;
  on the hypercube it shows the issue's counter-example: the antipodes (d = 10, 11) are at the LDP level.

All values are clipped to [0, ε_local] for drawing, as in the reference code; the JSON keeps the unclipped means too.
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
from hushnet.privacy.graphs import Graph, graph_from_edges, metropolis_hastings, parse_graph  # noqa: E402
from hushnet.privacy.paper import randomwalk as prw  # noqa: E402

ALPHA, SIGMA, EPS_LOCAL = 2.0, 1.0, 1.0
N = 2048
MAX_DIST = 25


def build_graphs(seed: int = 0) -> dict[str, Graph]:
    """The four graphs of Figure 1 (ER and RGG: first connected sample from ``seed``)."""
    graphs: dict[str, Graph] = {"hypercube": parse_graph("hypercube:11")}
    p = 1.2 * math.log(N) / N
    for s in range(seed, seed + 100):
        G = nx.gnp_random_graph(N, p, seed=s)
        if nx.is_connected(G):
            graphs["erdos_renyi"] = graph_from_edges(
                N, np.array(G.edges()), spec=f"er:{N}:{p:.6g}:{s}"
            )
            break
    for s in range(seed, seed + 100):
        G = nx.random_geometric_graph(N, 0.07, seed=s)
        if nx.is_connected(G):
            graphs["geometric"] = graph_from_edges(
                N, np.array(G.edges()), spec=f"geometric:{N}:0.07:{s}"
            )
            break
    graphs["grid"] = parse_graph("grid:45x45")
    return graphs


def _by_distance(vec: np.ndarray, dist: np.ndarray) -> dict[int, tuple[float, float, float]]:
    out = {}
    for d in range(1, int(dist.max()) + 1):
        sel = vec[dist == d]
        if sel.size:
            out[d] = (float(sel.mean()), float(sel.min()), float(sel.max()))
    return out


def _certified_gossip(
    name: str, g: Graph, W, T_g: int, dist: np.ndarray, rng: np.random.Generator
) -> dict[int, float]:
    """Exact Muffliato loss 0 → v, mean over sampled observers v per distance (certified)."""
    try:
        from hushnet.privacy import muffliato
    except ImportError:  # pragma: no cover - the module belongs to another engineer
        return {}
    scale = ALPHA / (2 * SIGMA**2)
    if name == "hypercube":
        # v ↦ v XOR w is an automorphism mapping (0, w) to (w, 0): loss(0 → w) = loss(w → 0); one observer suffices
        s = muffliato.exact_sensitivity_matrix(W, T_g, observers=[0])[:, 0]
        return {
            d: float(np.clip(scale * s[dist == d], 0, EPS_LOCAL).mean())
            for d in range(1, int(dist.max()) + 1)
        }
    per = {"erdos_renyi": 4, "grid": 3, "geometric": 1}[name]
    ds = range(1, min(int(dist.max()), MAX_DIST) + 1)
    if name == "geometric":  # 25 s per observer on 2 cores: a subset of distances
        ds = [d for d in (1, 2, 3, 5, 8, 10, 13, 16, 20, 24) if d <= dist.max()]
    obs, lab = [], []
    for d in ds:
        cand = np.flatnonzero(dist == d)
        pick = rng.choice(cand, size=min(per, cand.size), replace=False)
        obs.extend(int(x) for x in pick)
        lab.extend([d] * len(pick))
    S = muffliato.exact_sensitivity_matrix(W, T_g, observers=obs)
    vals = np.clip(scale * S[0, :], 0, EPS_LOCAL)
    lab_a = np.array(lab)
    return {d: float(vals[lab_a == d].mean()) for d in sorted(set(lab))}


def compute(name: str, g: Graph, with_certified_gossip: bool = True, seed: int = 0) -> dict:
    W = metropolis_hastings(g)
    n = g.n
    lam = rw.vplambda(W)
    T = rw.compute_T_walk(W, SIGMA)
    T_g = rw.gossip_T_mix(W, SIGMA)
    dist = g.shortest_path_lengths(0)
    out: dict = {
        "n": n,
        "spec": g.spec,
        "edges": int(g.num_edges),
        "vplambda": lam,
        "T_RW": T,
        "T_gossip": T_g,
        "c_T": ALPHA * T * math.log(T) / (SIGMA**2 * n**2),
    }
    curves: dict[str, np.ndarray] = {}
    for view, sk in (("anonymous", False), ("sender_known", True)):
        paper = rw.rw_pndp_matrix(W, T, ALPHA, SIGMA, bound="paper", sender_known=sk).matrix[0]
        cert = rw.rw_pndp_matrix(
            W,
            T,
            ALPHA,
            SIGMA,
            bound="certified",
            constraint="proof",
            sender_known=sk,
            max_contributions=T / n,
        ).matrix[0]
        for label, vec in (("rw_paper", paper), ("rw_certified", cert)):
            key = f"{label}_{view}"
            out[f"{key}_mean_unclipped"] = float(vec[1:].mean())
            clipped = np.clip(vec, 0, EPS_LOCAL)
            clipped[0] = EPS_LOCAL
            curves[key] = clipped
            out[f"{key}_mean"] = float(clipped[1:].mean())
    t0 = time.perf_counter()
    gp = prw.gossip_baseline_loss_vector(W, g, 0, ALPHA, SIGMA, T_g=T_g, clip_at=EPS_LOCAL)
    curves["gossip_paper"] = gp
    out["gossip_paper_mean"] = float(gp[1:].mean())
    out["gossip_paper_seconds"] = time.perf_counter() - t0
    out["by_distance"] = {
        k: {str(d): v for d, v in _by_distance(c, dist).items()} for k, c in curves.items()
    }
    if with_certified_gossip:
        t0 = time.perf_counter()
        cg = _certified_gossip(name, g, W, T_g, dist, np.random.default_rng(seed))
        out["gossip_certified_by_distance"] = {str(d): v for d, v in cg.items()}
        out["gossip_certified_seconds"] = time.perf_counter() - t0
    # shape checks of docs/design/spec/randomwalk.md §B.7.1
    bd = {k: {int(d): v[0] for d, v in m.items()} for k, m in out["by_distance"].items()}
    a, s, gs = bd["rw_paper_anonymous"], bd["rw_paper_sender_known"], bd["gossip_paper"]
    ds = sorted(a)
    out["checks"] = {
        "rw_decreasing_with_distance": bool(
            all(a[ds[i + 1]] <= a[ds[i]] + 1e-12 for i in range(len(ds) - 1))
        ),
        "rw_below_ldp_at_distance_1": bool(a[1] < EPS_LOCAL),
        "rw_below_gossip_every_distance": bool(all(a[d] < gs[d] for d in ds)),
        "rw_below_gossip_distances": [d for d in ds if a[d] < gs[d]],
        "sender_known_geq_anonymous": bool(all(s[d] >= a[d] - 1e-15 for d in ds)),
        "rw_mean_geq_gossip_mean": bool(out["rw_paper_anonymous_mean"] >= out["gossip_paper_mean"]),
    }
    return out


def plot(results: dict, path: pathlib.Path) -> None:
    names = list(results)
    titles = {
        "hypercube": "exponential (hypercube 11)",
        "erdos_renyi": "Erdős–Rényi c=1.2",
        "geometric": "geometric r=0.07",
        "grid": "grid 45×45 (corner)",
    }
    fig, axes = plt.subplots(2, len(names), figsize=(4.0 * len(names), 7.2), sharey=True)
    for col, name in enumerate(names):
        r = results[name]
        for row, view in enumerate(("anonymous", "sender_known")):
            ax = axes[row, col]
            for key, style, color, lab in (
                (f"rw_paper_{view}", "-", "C0", "RW, paper (Thm 3, ln T)"),
                (f"rw_certified_{view}", ":", "C2", "RW, certified (exact Σ, cap T/n)"),
                ("gossip_paper", "--", "C3", "gossip, paper (Muffliato Thm 1)"),
            ):
                m = {int(d): v for d, v in r["by_distance"][key].items() if int(d) <= MAX_DIST}
                ds = sorted(m)
                mean = [m[d][0] for d in ds]
                ax.plot(ds, mean, style, color=color, lw=1.8, label=lab)
                if key.startswith("rw_paper"):
                    ax.fill_between(
                        ds, [m[d][1] for d in ds], [m[d][2] for d in ds], color=color, alpha=0.15
                    )
            cg = r.get("gossip_certified_by_distance") or {}
            if cg:
                ds = sorted(int(d) for d in cg if int(d) <= MAX_DIST)
                ax.plot(
                    ds,
                    [cg[str(d)] for d in ds],
                    "x",
                    color="C1",
                    ms=6,
                    label="gossip, certified (exact view)",
                )
            ax.axhline(EPS_LOCAL, color="k", lw=0.8, label="LDP loss")
            ax.set_yscale("log", base=2)
            ax.set_ylim(1e-5, 1.2)
            ax.set_xlim(0, MAX_DIST)
            ax.grid(alpha=0.3)
            if row == 0:
                ax.set_title(
                    f"{titles.get(name, name)}\nT_RW={r['T_RW']}, T_g={r['T_gossip']}", fontsize=9
                )
            if row == 1:
                ax.set_xlabel("shortest-path distance from node 0")
            if col == 0:
                ax.set_ylabel(
                    ("Fig. 1: anonymous sender" if view == "anonymous" else "Fig. 4: sender known")
                    + "\nRDP loss (α=2, σ=1)"
                )
    axes[0, 0].legend(fontsize=7, loc="lower left")
    fig.suptitle(
        "Random walk vs gossip: pairwise privacy loss by distance (n≈2048) — paper vs certified",
        fontsize=11,
    )
    fig.tight_layout()
    save_palette_png(fig, path, dpi=80)
    plt.close(fig)


def main(out_dir: pathlib.Path, with_certified_gossip: bool = True) -> dict:
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    results = {}
    for name, g in build_graphs().items():
        t1 = time.perf_counter()
        results[name] = compute(name, g, with_certified_gossip=with_certified_gossip)
        results[name]["seconds"] = time.perf_counter() - t1
        print(
            f"  {name}: T_RW={results[name]['T_RW']} RW mean={results[name]['rw_paper_anonymous_mean']:.4g} "
            f"gossip mean={results[name]['gossip_paper_mean']:.4g} ({results[name]['seconds']:.1f} s)",
            flush=True,
        )
    plot(results, out_dir / "rw_fig1_distance.png")
    summary = {
        "figure": "P-RW Fig. 1 (anonymous) and Fig. 4 (sender known)",
        "alpha": ALPHA,
        "sigma": SIGMA,
        "eps_local": EPS_LOCAL,
        "source": 0,
        "labels": {
            "rw_paper": "paper: Thm 3 (ln T, N_u=T/n, no σ condition), clipped to [0, 1]",
            "rw_certified": "certified: exact Σ_{t≤T} W^t/t, proof σ condition, N_u capped at T/n",
            "gossip_paper": "paper: Muffliato Thm 1 sum as in the P-RW code (docs/design/spec/randomwalk.md §B.5)",
            "gossip_certified": "certified: exact Rényi divergence of the neighbourhood view (hushnet.privacy.muffliato)",
        },
        "spec_reference": {
            "hypercube": {
                "T_RW": 1150,
                "T_gossip": 19,
                "rw_mean": 3.788e-3,
                "gossip_mean": 9.947e-2,
            },
            "erdos_renyi": {"T_RW": 2450, "T_gossip": 28, "rw_mean": 8.85e-3, "gossip_mean": 0.110},
            "geometric": {"T_RW": 39675, "T_gossip": 110, "rw_mean": 0.172, "gossip_mean": 0.468},
            "grid": {"T_RW": 193225, "T_gossip": 243, "rw_mean": 0.569, "gossip_mean": 0.120},
        },
        "graphs": results,
        "seconds": time.perf_counter() - t0,
    }
    (out_dir / "rw_fig1_distance.json").write_text(json.dumps(summary, indent=1, default=float))
    return summary


if __name__ == "__main__":
    main(pathlib.Path(__file__).resolve().parent / "out")
