"""Benchmark: the price of secure neighbourhood summation in gossip rounds (simulator, CPU).

What is timed: Muffliato averaging on ``grid:4x4`` (n = 16, degrees 2–4), 5 rounds, model
dimensions D = 10 and D = 10⁴, run by the engine's simulator twice with the same seeds — plain
gossip (each node sends its value to its neighbours) and ``secure_summation`` (each node leads one
SecAgg sum per round over the neighbours that joined and is a member of theirs:
:mod:`hushnet.families.gossip.secure`).  Every message is encoded, delivered and decoded; the crypto
(static X25519 secrets, sealed Shamir shares, AES-128-CTR masks) is real.  The simulator is single-threaded, so the
wall time is the CPU cost of all 16 nodes.

Baseline measured in the same run: the plain gossip run.  Reported: wall seconds, CPU milliseconds
per node and round, messages, and the ratio secure / plain; plus the largest difference between the
two runs' final models against the fixed-point bound ``T · max terms · 2^-(f+1)``.
"""

from __future__ import annotations

import pathlib
import time

import numpy as np

from hushnet.crypto.masks import FixedPoint
from hushnet.families.gossip.build import build_gossip_machines, run_gossip
from hushnet.privacy.graphs import metropolis_hastings, parse_graph
from hushnet.tasks import SumTask

GRAPH, N, ROUNDS = "grid:4x4", 16, 5


def _run(W, tasks, secure: bool) -> tuple[float, object]:
    params = dict(rounds=ROUNDS, sigma=0.5, **({"secure_summation": True} if secure else {}))
    ms = build_gossip_machines("muffliato", tasks, run_seed=1, params=params, W=W)
    t0 = time.perf_counter()
    r = run_gossip(ms)
    dt = time.perf_counter() - t0
    if r.status != "finished":
        raise RuntimeError(f"{'secure' if secure else 'plain'} run did not finish: {r.status}")
    return dt, r


def main(out_dir: pathlib.Path | str | None = None) -> dict:
    W = metropolis_hastings(parse_graph(GRAPH))
    rng = np.random.default_rng(0)
    out: dict = {"graph": GRAPH, "n": N, "rounds": ROUNDS, "protocol": "muffliato", "cases": []}
    bound = ROUNDS * 5 * FixedPoint(24).error_bound(1)
    for dim in (10, 10_000):
        tasks = [SumTask(rng.random(dim)) for _ in range(N)]
        best = {}
        runs = {}
        for secure in (False, True):
            times = []
            for _ in range(2):  # best of 2: the machine is shared
                dt, r = _run(W, tasks, secure)
                times.append(dt)
            best[secure], runs[secure] = min(times), r
        err = float(np.abs(runs[True].models - runs[False].models).max())
        out["cases"].append(
            {
                "dim": dim,
                "plain_s": best[False],
                "secure_s": best[True],
                "ratio_secure_over_plain": best[True] / best[False],
                "plain_ms_per_node_round": 1e3 * best[False] / (N * ROUNDS),
                "secure_ms_per_node_round": 1e3 * best[True] / (N * ROUNDS),
                "plain_messages": runs[False].sim.messages,
                "secure_messages": runs[True].sim.messages,
                "max_model_difference": err,
                "fixed_point_bound": bound,
                "within_bound": err <= bound,
            }
        )
    print(
        f"Muffliato averaging on {GRAPH}, {ROUNDS} rounds, simulator (CPU of all {N} nodes), best of 2"
    )
    print(
        f"{'dim':>7} {'plain ms/node/round':>20} {'secure ms/node/round':>21} {'ratio':>7} {'messages':>12} "
        f"{'max |diff|':>11} {'bound':>9}"
    )
    for c in out["cases"]:
        print(
            f"{c['dim']:>7} {c['plain_ms_per_node_round']:>20.3f} {c['secure_ms_per_node_round']:>21.3f} "
            f"{c['ratio_secure_over_plain']:>7.1f} {c['secure_messages']:>5}/{c['plain_messages']:<6} "
            f"{c['max_model_difference']:>11.2e} {c['fixed_point_bound']:>9.2e}"
        )
    return out


if __name__ == "__main__":  # pragma: no cover
    import json

    print(json.dumps(main(), indent=2))
