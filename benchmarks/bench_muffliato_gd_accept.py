"""Muffliato-GD acceptance per process: the nodes' certified rows on the public schedule (issue 12).

A process hosting K nodes of a Muffliato-GD run has each node project its certified row before it accepts
(``project_gossip``) and build its ledger cost (``gossip_cost``) — the same row again.  Baseline (the
code before the shared computation): each of those 2K rows is its own per-observer loop of the exact
joint-view accountant (:func:`hushnet.families.gossip.realised.gd_sensitivity`, one view basis per
observer and row).  Now: one computation per process for the public parameters
(:mod:`hushnet.families.gossip.allpairs`), on the hypercube one observer's basis (XOR translations,
verified exactly) — every further row is a lookup.  Ratio measured in the same run at n = 128 (where the
baseline is still affordable), the new path alone at n = 1024; the spec is ``net_experiments``'s
(4 gradient steps × K = 3 rounds, σ = 1).  Rows are checked: the shared ones are never below the baseline's.
"""

from __future__ import annotations

import os
import pathlib
import time

import numpy as np

HOSTED = 4  # nodes of the run one process hosts (vertices spread over the hypercube)
BASELINE_N = 128
SIZES = (128, 256, 1024)


def _spec(n: int):
    from hushnet.families.gossip.params import MUFFLIATO_GD
    from hushnet.runs.net_experiments import CONFIGS, graph_for
    from hushnet.runs.spec import Budget, RunSpec

    cfg = CONFIGS[MUFFLIATO_GD]
    return (
        RunSpec(
            **cfg.spec,
            steps=int(cfg.steps or 4),
            graph=graph_for(n),
            budget=Budget(cfg.node_budget, 1e-5),
            noise="public-seed",
            protocol_params=dict(cfg.protocol_params),
            task_params=dict(cfg.task_params),
        )
        .with_run_id()
        .validate()
    )


def _row_uncached(spec, vertex: int, W) -> np.ndarray:
    """The per-row computation every decision and every cost made before (one basis per observer)."""
    from hushnet.families.gossip.params import view_of
    from hushnet.families.gossip.realised import gd_sensitivity
    from hushnet.families.gossip.schedule import public_schedule, round_matrices, round_plan

    phases, gammas = round_plan(spec, W)
    T = max(max(ph) for ph in phases) + 1
    sched = public_schedule(round_matrices(spec, W), T)
    row = np.zeros(W.shape[0])
    for v in range(W.shape[0]):
        if v != vertex:
            row[v] = gd_sensitivity(sched, vertex, v, phases, gammas, view=view_of(spec))["value"]
    return row


def _process(n: int, baseline: bool) -> dict:
    from hushnet.families.gossip import allpairs
    from hushnet.families.gossip.accounting import gossip_cost, project_gossip
    from hushnet.protocols.registry import transition_matrix

    spec = _spec(n)
    W = transition_matrix(spec.graph, spec.weights)
    ids = [f"n{i}" for i in range(n)]
    vertices = [k * n // HOSTED for k in range(HOSTED)]
    allpairs.clear_cache()
    per_node, rows = [], {}
    t0 = time.perf_counter()
    for u in vertices:
        t = time.perf_counter()
        dec = project_gossip(spec, u, None, W)
        gossip_cost(spec, u, ids, W)
        per_node.append(time.perf_counter() - t)
        rows[u] = np.asarray(dec.details["sensitivity_sq"])
        assert dec.accept, dec.reason
    out = {
        "n": n,
        "hosted_nodes": HOSTED,
        "shared_seconds": round(time.perf_counter() - t0, 3),
        "shared_first_node_seconds": round(per_node[0], 3),
        "shared_other_nodes_seconds": [round(x, 3) for x in per_node[1:]],
        "symmetric": bool(next(iter(allpairs._CACHE.values())).symmetric),
    }
    if baseline:
        t0 = time.perf_counter()
        base = {}
        for u in vertices:
            base[u] = _row_uncached(spec, u, W)  # the decision's row
            _row_uncached(spec, u, W)  # the cost's row, computed again
        out["baseline_seconds"] = round(time.perf_counter() - t0, 3)
        out["speedup"] = round(out["baseline_seconds"] / out["shared_seconds"], 1)
        diff = np.concatenate([rows[u] - base[u] for u in vertices])
        rel = np.concatenate(
            [np.abs(rows[u] - base[u]) / np.maximum(base[u], 1e-300) for u in vertices]
        )
        out["min_shared_minus_baseline"] = float(diff.min())
        out["max_relative_difference"] = float(rel.max())
    allpairs.clear_cache()
    return out


def main(out_dir: pathlib.Path) -> dict:
    load_before = os.getloadavg()
    results = [_process(n, baseline=n == BASELINE_N) for n in SIZES]
    base = next(r for r in results if "baseline_seconds" in r)
    print(f"{'n':>6}{'shared (s)':>12}{'first node (s)':>16}{'baseline (s)':>14}{'ratio':>8}")
    for r in results:
        print(
            f"{r['n']:>6}{r['shared_seconds']:>12.2f}{r['shared_first_node_seconds']:>16.2f}"
            f"{r.get('baseline_seconds', float('nan')):>14.2f}{r.get('speedup', float('nan')):>8.1f}"
        )
    return {
        "what": f"Muffliato-GD acceptance of {HOSTED} hosted nodes (decision + cost each), one process",
        "spec": "net_experiments muffliato-gd: hypercube, 4 steps x K = 3, sigma = 1, neighbourhood view",
        "results": results,
        "speedup_at_baseline_n": base["speedup"],
        "never_below_baseline": bool(base["min_shared_minus_baseline"] >= 0.0),
        "goal": "acceptance computed once per process for the public parameters (issue 12)",
        "load_average_at_start": [round(x, 2) for x in load_before],
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "note": "ratio measured in the same run; wall times depend on the shared machine's load",
    }


if __name__ == "__main__":
    import json

    out = pathlib.Path(__file__).resolve().parent / "out"
    print(json.dumps(main(out), indent=2))
