"""[Source anonymity] Figure 1: entropy seen by a destination versus its side information κ'.

Setting of the paper's Fig. 1 (docs/design/spec/anonymity.md §4.1, erratum E2): N = 300, c = 3, κ = 634,
δ = 5, [ℓ1, ℓ2] = [2, 6], δ' = 0.3 (so t1 = 218); maximum log 5 ≈ 1.609.

Left panel — the distance-level entropy ``H(W_{δ,κ'})`` the paper plots:
* **paper** (tree shells ``c(c−1)^{ℓ−1}``, Proposition 1 as printed): "with Assumption 1" (PAW),
  "without Assumption 1" (FULL, the spec's reading of "exact RRG properties"), "no countermeasure"
  (uniform p, PAW), and the "Theorem 3" guarantee ``THM2(printed THM1(κ, κ'))``;
* **certified / computable**: the COR model (exact truncated mean, graph-mean shells, decision D3),
  the shifted Theorem-1 bound proved for it (``THM2(ρ_shifted)``), and the *exact-graph* value —
  Definition 1 evaluated with the exact first-passage pmfs on ``random_regular_graph(3, 300,
  seed=1)`` for the deployed ``p*`` (min and mean over destinations), plus the uniform baseline.

Right panel — node-level Definition 1 on the same graph (what a destination actually faces:
entropy over the ≈ 140 candidate sources, max ``log Σ_ℓ |S_j(ℓ)|``).
"""

from __future__ import annotations

import json
import math
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import networkx as nx  # noqa: E402
import numpy as np  # noqa: E402

from hushnet.privacy.anonymity import (  # noqa: E402
    RRGModel,
    entropy_w,
    p_star,
    t1_return_bound,
    theorem1_rho,
    theorem2_bound,
)
from hushnet.privacy.anonymity_graph import (  # noqa: E402
    as_adjacency,
    definition1_entropies,
    destination_matrix,
    distance_matrix,
    graph_mean_shell_sizes,
    mean_hitting_times,
    shell_counts,
    window_masses_grid,
)

NAME = "anon_fig1"
N, C, KAPPA, DELTA, L1, L2, DELTA_PRIME = 300, 3, 634.0, 5.0, 2, 6, 0.3
GRAPH_KP = [
    8,
    10,
    12,
    15,
    20,
    30,
    50,
    75,
    100,
    150,
    218,
    300,
    400,
    634,
    1000,
    1500,
    2500,
    4000,
    math.inf,
]


def model_curves(kp: np.ndarray, A_graph: np.ndarray) -> dict[str, list[float]]:
    m = RRGModel(N, C)
    u = np.full(L2 - L1 + 1, 1.0 / (L2 - L1 + 1))
    out: dict[str, list[float]] = {}
    for mode in ("paw", "full"):
        out[f"paper_{mode}"] = entropy_w(
            p_star(m, L1, L2, KAPPA, mode=mode, delta=DELTA), m, L1, L2, kp, mode=mode, delta=DELTA
        ).tolist()
    out["paper_baseline_paw"] = entropy_w(u, m, L1, L2, kp, mode="paw").tolist()
    out["paper_baseline_full"] = entropy_w(u, m, L1, L2, kp, mode="full", delta=DELTA).tolist()
    rho = theorem1_rho(m, L1, L2, KAPPA, kp)
    out["paper_theorem1_rho"] = rho.tolist()
    out["paper_theorem3_bound"] = theorem2_bound(rho, L2 - L1 + 1).tolist()
    p_cor = p_star(m, L1, L2, KAPPA, mode="cor", A=A_graph)
    out["certified_cor_graphA"] = entropy_w(p_cor, m, L1, L2, kp, mode="cor", A=A_graph).tolist()
    rho_s = theorem1_rho(m, L1, L2, KAPPA, kp, version="shifted", shift_mode="cor")
    out["certified_shifted_rho"] = rho_s.tolist()
    out["certified_shifted_bound"] = theorem2_bound(rho_s, L2 - L1 + 1).tolist()
    return out


def graph_curves() -> dict[str, object]:
    g = nx.random_regular_graph(C, N, seed=1)
    adj = as_adjacency(g)
    dist = distance_matrix(adj)
    A = graph_mean_shell_sizes(dist, L1, L2)
    m = RRGModel(N, C)
    p_dep = p_star(m, L1, L2, KAPPA, mode="cor", A=A)
    M_dep = destination_matrix(dist, p_dep, L1)
    M_uni = destination_matrix(dist, np.full(L2 - L1 + 1, 1.0 / (L2 - L1 + 1)), L1)
    masses = window_masses_grid(adj, DELTA, GRAPH_KP, E=mean_hitting_times(adj))
    res: dict[str, list[float]] = {
        k: []
        for k in (
            "dist_min",
            "dist_mean",
            "node_min",
            "node_mean",
            "base_dist_mean",
            "base_node_mean",
        )
    }
    for mass in masses:
        r = definition1_entropies(dist, M_dep, mass, L1, L2)
        b = definition1_entropies(dist, M_uni, mass, L1, L2)
        res["dist_min"].append(float(r.distance_level.min()))
        res["dist_mean"].append(float(r.distance_level.mean()))
        res["node_min"].append(float(r.node_level.min()))
        res["node_mean"].append(float(r.node_level.mean()))
        res["base_dist_mean"].append(float(b.distance_level.mean()))
        res["base_node_mean"].append(float(b.node_level.mean()))
    max_node = float(np.log(shell_counts(dist)[:, L1 : L2 + 1].sum(axis=1)).mean())
    return {
        "A_graph": A.tolist(),
        "p_star_deployed": p_dep.tolist(),
        "max_node_level": max_node,
        **res,
    }


def _x(kp: list[float] | np.ndarray, x_inf: float) -> np.ndarray:
    arr = np.asarray(kp, dtype=float)
    return np.where(np.isfinite(arr), arr, x_inf)


def main(out_dir: pathlib.Path) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    kp = np.concatenate([np.unique(np.round(np.geomspace(7, 6000, 400))), [math.inf]])
    gr = graph_curves()
    A_graph = np.asarray(gr["A_graph"])
    mc = model_curves(kp, A_graph)
    x_inf = 9000.0
    x = _x(kp, x_inf)
    xg = _x(GRAPH_KP, x_inf)
    logk = math.log(L2 - L1 + 1)
    t1 = t1_return_bound(N, C, L1, DELTA_PRIME)

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 5.2), gridspec_kw={"width_ratios": [1.35, 1]})
    ax.axhline(logk, color="0.6", lw=0.8, ls=":")
    ax.axvspan(t1, x_inf * 1.3, color="0.93", zorder=0)
    ax.text(
        t1 * 1.05, 1.69, f"κ' ≥ t1 = {t1:.0f}: prob. ≥ 0.7 by eq. (6)", fontsize=8, color="0.35"
    )
    ax.axvline(KAPPA, color="0.75", lw=0.8)
    # paper
    ax.plot(x, mc["paper_paw"], color="C0", lw=2, label="paper: with Assumption 1 (PAW)")
    ax.plot(x, mc["paper_full"], color="C1", lw=2, label="paper: without Assumption 1 (FULL)")
    ax.plot(
        x, mc["paper_baseline_paw"], color="C3", lw=2, label="paper: no countermeasure (uniform p)"
    )
    ax.plot(
        x,
        mc["paper_theorem3_bound"],
        color="C2",
        lw=2,
        label="paper: Theorem 3 bound (printed Thm 1, δ'=0.3)",
    )
    # certified / computable
    ax.plot(
        x,
        mc["certified_cor_graphA"],
        color="C0",
        lw=1.3,
        ls="--",
        label="certified model: COR, graph-mean A",
    )
    ax.plot(
        x,
        mc["certified_shifted_bound"],
        color="C2",
        lw=1.3,
        ls="--",
        label="certified bound: shifted Thm 1 + Thm 2 (COR)",
    )
    ax.plot(
        xg,
        gr["dist_min"],
        "k-o",
        ms=3.5,
        lw=1.2,
        label="exact graph (seed 1), deployed p*: min over j",
    )
    ax.plot(xg, gr["dist_mean"], "k:", lw=1.2, label="exact graph: mean over j")
    ax.plot(
        xg,
        gr["base_dist_mean"],
        color="C3",
        ls="--",
        marker="s",
        ms=3,
        lw=1.0,
        label="exact graph: uniform p, mean over j",
    )
    ax.set_xscale("log")
    ax.set_xlim(7, x_inf * 1.3)
    ax.set_ylim(0, 1.75)
    ax.text(KAPPA * 1.04, 0.85, "κ = 634", fontsize=8, color="0.45")
    ticks = [10, 100, 1000, x_inf]
    ax.set_xticks(ticks, ["10", "100", "1000", "∞"])
    ax.set_xlabel("side information κ' (return time, hops)")
    ax.set_ylabel("H(W_{δ,κ'}) [nats]  (distance level, max log 5)")
    ax.set_title("Fig. 1: N=300, c=3, κ=634, δ=5, [ℓ1,ℓ2]=[2,6]", fontsize=10)
    ax.legend(fontsize=7, loc="lower right", framealpha=0.9)

    ax2.axhline(
        gr["max_node_level"], color="0.6", lw=0.8, ls=":", label="max: mean log(#candidates)"
    )
    ax2.axvline(KAPPA, color="0.75", lw=0.8)
    ax2.plot(xg, gr["node_mean"], "k-o", ms=3.5, lw=1.2, label="deployed p*: mean over j")
    ax2.plot(xg, gr["node_min"], "k--", lw=1.0, label="deployed p*: min over j (α of Def. 1)")
    ax2.plot(
        xg,
        gr["base_node_mean"],
        color="C3",
        marker="s",
        ms=3,
        lw=1.0,
        label="uniform p: mean over j",
    )
    ax2.set_xscale("log")
    ax2.set_xlim(7, x_inf * 1.3)
    ax2.set_xticks(ticks, ["10", "100", "1000", "∞"])
    ax2.set_xlabel("side information κ' (hops)")
    ax2.set_ylabel("node-level Definition-1 entropy [nats]")
    ax2.set_title(
        "certified: exact graph, node level (random_regular_graph(3,300,seed=1))", fontsize=9
    )
    ax2.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(out_dir / f"{NAME}.png", dpi=110)
    plt.close(fig)

    def at(values: list[float], grid: list[float] | np.ndarray, k: float) -> float:
        arr = np.asarray(grid, dtype=float)
        idx = int(np.flatnonzero((arr == k) | (np.isinf(arr) & math.isinf(k)))[0])
        return float(values[idx])

    ref_kp = [8, 12, 20, 50, 100, 218, 400, 634, 1000, math.inf]
    key_rows = []
    m = RRGModel(N, C)
    for k in ref_kp:
        kk = np.array([k], dtype=float)
        row = {"kappa_prime": "inf" if math.isinf(k) else k}
        for mode in ("paw", "full", "cor"):
            row[f"H_{mode}_tree"] = float(
                entropy_w(
                    p_star(m, L1, L2, KAPPA, mode=mode, delta=DELTA),
                    m,
                    L1,
                    L2,
                    kk,
                    mode=mode,
                    delta=DELTA,
                )[0]
            )
        rho = float(theorem1_rho(m, L1, L2, KAPPA, kk)[0])
        row["thm1_rho_printed"] = rho
        row["thm3_bound_paper"] = float(theorem2_bound(rho, 5))
        row["certified_shifted_bound"] = float(
            theorem2_bound(theorem1_rho(m, L1, L2, KAPPA, kk, version="shifted")[0], 5)
        )
        if k in GRAPH_KP:
            row["exact_graph_dist_min"] = at(gr["dist_min"], GRAPH_KP, k)
            row["exact_graph_node_min"] = at(gr["node_min"], GRAPH_KP, k)
        key_rows.append(row)
    result = {
        "name": NAME,
        "setting": {
            "N": N,
            "c": C,
            "kappa": KAPPA,
            "delta": DELTA,
            "ell": [L1, L2],
            "delta_prime": DELTA_PRIME,
            "t1": t1,
        },
        "labels": {
            "paper": "paper formulas, tree shells (Prop. 1 as printed for PAW; FULL = mixture pmf)",
            "certified": "COR model with graph-mean shells + shifted Theorem-1 bound (proved in the model); "
            "exact-graph Definition 1 with exact first-passage pmfs",
        },
        "spec_reference_section_4_4": {
            "PAW": [1.3713, 1.5707, 1.6027, 1.6089, 1.6093, 1.6094, 1.6094, 1.6094, 1.6094, 1.6094],
            "FULL": [
                1.2152,
                1.2705,
                1.2587,
                1.4013,
                1.5768,
                1.6094,
                1.6094,
                1.6094,
                1.6094,
                1.6088,
            ],
            "thm2_bound": [None, None, 0.298, 1.102, 1.358, 1.508, 1.574, 1.6094, 1.588, 1.574],
        },
        "key_values": key_rows,
        "graph_kappa_prime": ["inf" if math.isinf(k) else k for k in GRAPH_KP],
        "graph": gr,
    }
    (out_dir / f"{NAME}.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main(pathlib.Path(__file__).resolve().parent / "out")
