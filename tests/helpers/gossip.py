"""Shared builders for the gossip protocol tests."""

from __future__ import annotations

import numpy as np

from hushnet.engine.rng import node_generators
from hushnet.families.gossip.build import build_gossip_machines, run_gossip
from hushnet.privacy.graphs import metropolis_hastings, parse_graph
from hushnet.tasks import SumTask


def value_tasks(n: int, d: int = 2, seed: int = 0) -> tuple[list[SumTask], np.ndarray]:
    vals = np.random.default_rng(seed).random((n, d))
    return [SumTask(vals[i]) for i in range(n)], vals


def gossip_matrix(spec: str):
    return metropolis_hastings(parse_graph(spec))


def noisy_inputs(vals: np.ndarray, tasks, run_seed: int, sigma: float) -> np.ndarray:
    """x⁰ the machines draw: value + N(0, (σΔ)²) from each node's own generator (first draw)."""
    rngs = node_generators(run_seed, len(tasks))
    return np.array(
        [
            vals[i] + rngs[i].standard_normal(vals.shape[1]) * sigma * tasks[i].sensitivity()
            for i in range(len(tasks))
        ]
    )


def run(protocol: str, tasks, W, *, seed: int = 5, kill=(), **params):
    ms = build_gossip_machines(protocol, tasks, run_seed=seed, params=params, W=W)
    return run_gossip(ms, kill=kill), ms
