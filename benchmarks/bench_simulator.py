"""Simulator throughput: RW DP-SGD steps per second at n = 2048 (issue goal: T = 20 000 "in seconds").

Baseline, measured in the same run: a bare Python/numpy loop doing the same math per step (fresh
Gaussian noise, the node's clipped logistic gradient, the next hop from the node's public row, with
the same per-node generators) but no machine, no bytes and no event queue.  The ratio
simulator/baseline is the price of running the real protocol code (validation, serialisation,
envelopes, acknowledgements, ledger entries).  Nothing here is asserted.
"""

from __future__ import annotations

import pathlib
import time

import numpy as np

from hushnet.engine.rng import node_generators
from hushnet.families.walk.hops import TransitionRow
from hushnet.families.walk.walker import WalkOptions
from hushnet.protocols.registry import build_machines, transition_matrix
from hushnet.sim import Simulator
from hushnet.tasks import LogisticRegressionTask

N, T, D = 2048, 20_000, 8
SIGMA, STEP, CAP = 1.0, 0.05, 13


def _tasks(seed: int = 0) -> list[LogisticRegressionTask]:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(D)
    out = []
    for _ in range(N):
        X = rng.standard_normal((8, D))
        X /= np.linalg.norm(X, axis=1, keepdims=True)
        out.append(LogisticRegressionTask(X, np.where(X @ w > 0, 1.0, -1.0), clip=0.4))
    return out


def _bare_loop(tasks, W, seed: int) -> tuple[float, np.ndarray]:
    rows = [TransitionRow.from_matrix(W, v) for v in range(N)]
    gens = node_generators(seed, N)
    counts = np.zeros(N, dtype=np.int64)
    x = np.zeros(D + 1)
    v = 0
    std = tasks[0].sensitivity() * SIGMA
    t0 = time.perf_counter()
    for _ in range(T):
        g = gens[v]
        eta = g.standard_normal(D + 1) * std
        if counts[v] < CAP:
            counts[v] += 1
            x = x - STEP * (tasks[v].gradient(x) + eta)
        else:
            x = x - STEP * eta
        v = rows[v].sample(g)
    return time.perf_counter() - t0, x


def _sim(
    tasks, W, seed: int, *, reliable: bool, envelopes: bool
) -> tuple[float, float, np.ndarray]:
    t0 = time.perf_counter()
    ms = build_machines(
        "rw-dpsgd",
        tasks,
        run_seed=seed,
        params=dict(steps=T, step_size=STEP, sigma=SIGMA, cap=CAP),
        W=W,
        options=WalkOptions(reliable=reliable),
    )
    build = time.perf_counter() - t0
    res = Simulator(ms, envelopes=envelopes).run()
    assert res.status == "finished"
    return build, res.wall_seconds, res.model


def main(out_dir: pathlib.Path) -> dict:
    tasks = _tasks()
    rows = []
    out: dict = {"n": N, "T": T, "model_dim": D + 1, "graphs": {}}
    for graph in ("hypercube:11", "complete:2048"):
        W = transition_matrix(graph)
        bare, _ = _bare_loop(tasks, W, seed=1)
        entry = {"bare_loop_seconds": bare, "bare_steps_per_second": T / bare, "variants": {}}
        for name, rel, env in (
            ("simulator, no acks, raw payloads", False, False),
            ("simulator, no acks, envelopes", False, True),
            ("simulator, acked handoffs, envelopes", True, True),
        ):
            build, run, _ = _sim(tasks, W, 1, reliable=rel, envelopes=env)
            entry["variants"][name] = {
                "build_seconds": build,
                "run_seconds": run,
                "steps_per_second": T / run,
                "ratio_to_bare": (T / run) / (T / bare),
            }
            rows.append((graph, name, T / run, (T / run) / (T / bare), build + run))
        out["graphs"][graph] = entry
        rows.append((graph, "bare numpy loop (baseline)", T / bare, 1.0, bare))
    print(f"{'graph':15s} {'variant':40s} {'steps/s':>10s} {'vs bare':>8s} {'total s':>8s}")
    for g, name, sps, ratio, tot in rows:
        print(f"{g:15s} {name:40s} {sps:10.0f} {ratio:8.2f} {tot:8.2f}")
    return out


if __name__ == "__main__":
    import json

    print(
        json.dumps(main(pathlib.Path(__file__).resolve().parent / "out"), indent=2, default=float)
    )
