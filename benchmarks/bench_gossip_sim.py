"""Benchmark: simulated gossip rounds per second, n = 2048 and n = 4000, against a bare numpy ``W @ X`` loop.

What is timed: Muffliato averaging (plain gossip) on the hypercube d = 11 (n = 2048, degree 11) and
on connected Erdős–Rényi graphs G(n, 1.2 ln n/n) for n = 2048 and n = 4000 (the issue's simulator
size), model dimension D = 100, run by the engine's
simulator with every node a :class:`~hushnet.families.gossip.machines.MuffliatoAveraging` machine: each round
is the full two-phase protocol (availability, then values; every message encoded as an envelope,
decoded and validated, the effective weights rebuilt on both ends, the schedule entry recorded).

Also timed: the batch driver (:func:`hushnet.families.gossip.batch.run_gossip_batch`), the same computation as
array operations with the machines' noise and weights (tested equal to them to 1e-12), which is what a
researcher reproducing the papers at n = 2048–4000 runs; goal within 10× of the bare ``W @ X``.

Baseline measured in the same run: the centralised recursion ``X ← W X`` with a sparse W (scipy
CSR × dense n×D), which is the least any implementation must do per round.  The ratio
``baseline / simulator`` is the per-round price of running the real protocol machines instead of
the matrix product.  Also reported: messages and events per second of the simulator.
"""

from __future__ import annotations

import math
import pathlib
import time

import networkx as nx
import numpy as np

from hushnet.families.gossip.batch import run_gossip_batch
from hushnet.families.gossip.build import build_gossip_machines, run_gossip
from hushnet.privacy.graphs import graph_from_edges, metropolis_hastings, parse_graph
from hushnet.tasks import SumTask

N = 2048
DIM = 100
ROUNDS = 6


def _connected_er(n: int):
    p = 1.2 * math.log(n) / n
    for seed in range(100):
        g = nx.gnp_random_graph(n, p, seed=seed)
        if nx.is_connected(g):
            return graph_from_edges(n, np.array(g.edges()), spec=f"er:{n}:{p:.6f}:{seed}")
    raise RuntimeError(f"no connected G({n}, {p:.4g}) in 100 seeds")


def _graphs() -> dict:
    return {
        "hypercube11": parse_graph("hypercube:11"),
        "er_1.2lnn": _connected_er(N),
        "er_1.2lnn_4000": _connected_er(4000),
    }


def _baseline(W, X: np.ndarray, rounds: int) -> float:
    t0 = time.perf_counter()
    for _ in range(rounds):
        X = W @ X
    return time.perf_counter() - t0


def main(out_dir: pathlib.Path) -> dict:
    rng = np.random.default_rng(0)
    rows = []
    for name, g in _graphs().items():
        vals = rng.random((g.n, DIM))
        tasks = [SumTask(vals[i]) for i in range(g.n)]
        W = metropolis_hastings(g)
        ms = build_gossip_machines(
            "muffliato", tasks, run_seed=1, params=dict(rounds=ROUNDS, sigma=1.0), W=W
        )
        res = run_gossip(ms)
        assert res.status == "finished", res.status
        sim_s = res.sim.wall_seconds
        base_rounds = 200
        base_s = _baseline(W, vals.copy(), base_rounds)
        batch_rounds = 100
        t0 = time.perf_counter()
        b = run_gossip_batch(
            "muffliato", tasks, run_seed=1, params=dict(rounds=batch_rounds, sigma=1.0), W=W
        )
        batch_s = time.perf_counter() - t0
        assert b.models.shape == (g.n, DIM)
        sim_rps = ROUNDS / sim_s
        base_rps = base_rounds / base_s
        batch_rps = batch_rounds / batch_s
        rows.append(
            {
                "graph": name,
                "n": g.n,
                "dim": DIM,
                "edges": int(g.num_edges),
                "rounds": ROUNDS,
                "simulator_seconds": round(sim_s, 3),
                "simulator_rounds_per_s": round(sim_rps, 3),
                "simulator_messages_per_s": round(res.sim.messages / sim_s, 1),
                "simulator_events_per_s": round(res.sim.events / sim_s, 1),
                "baseline_rounds_per_s": round(base_rps, 1),
                "baseline_over_simulator": round(base_rps / sim_rps, 1),
                "batch_rounds_per_s": round(batch_rps, 1),
                "baseline_over_batch": round(base_rps / batch_rps, 2),
            }
        )
    print(
        f"{'graph':<15} {'sim rounds/s':>12} {'msgs/s':>10} {'W@X rounds/s':>13} {'ratio':>7} "
        f"{'batch rounds/s':>15} {'ratio':>6}"
    )
    for r in rows:
        print(
            f"{r['graph']:<15} {r['simulator_rounds_per_s']:>12.2f} {r['simulator_messages_per_s']:>10.0f} "
            f"{r['baseline_rounds_per_s']:>13.1f} {r['baseline_over_simulator']:>7.0f} "
            f"{r['batch_rounds_per_s']:>15.1f} {r['baseline_over_batch']:>6.2f}"
        )
    return {
        "benchmark": "gossip simulator rounds per second vs numpy W@X",
        "results": rows,
        "note": "ratio = baseline rounds/s divided by simulator (or batch driver) rounds/s (same run, same W); "
        "goal for the batch driver: within 10x; not asserted",
    }


if __name__ == "__main__":
    main(pathlib.Path(__file__).resolve().parent / "out")
