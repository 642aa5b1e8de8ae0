"""Shared helpers for the networked run tests: a real local cluster whose nodes serve runs."""

from __future__ import annotations

import contextlib
import pathlib
import time
from typing import Iterator, Sequence

import numpy as np

from hushnet.net.cluster import LocalCluster
from hushnet.runs.policy import NodePolicy


def write_node_data(
    state_dir: pathlib.Path,
    shards: Sequence[tuple[np.ndarray, np.ndarray] | None],
    *,
    epsilon: float | None = 50.0,
    delta: float = 1e-5,
) -> None:
    """Give node i (``nodes/n{i}``) its shard as data.npz and a runs.toml policy (before the nodes start)."""
    for i, shard in enumerate(shards):
        d = pathlib.Path(state_dir) / "nodes" / f"n{i}"
        d.mkdir(parents=True, exist_ok=True)
        data = None
        if shard is not None:
            np.savez(d / "data.npz", X=shard[0], y=shard[1])
            data = "data.npz"
        NodePolicy.write(d, epsilon=epsilon, delta=delta, data_path=data)


@contextlib.contextmanager
def cluster(
    state_dir: pathlib.Path,
    n: int,
    topology: str,
    shards=None,
    *,
    epsilon: float | None = 50.0,
    delta: float = 1e-5,
    timeout: float = 90.0,
) -> Iterator[LocalCluster]:
    """Start bootstrap + n node processes (real TLS on 127.0.0.x); always stopped on exit."""
    if shards is not None:
        write_node_data(state_dir, shards, epsilon=epsilon, delta=delta)
    c = LocalCluster(state_dir, n, topology, restart=False)
    try:
        c.start(timeout=timeout)
        c.wait_healthy(timeout=timeout)
        yield c
    finally:
        c.stop(timeout=10)


def synthetic_shards(n: int, per_node: int = 20, d: int = 4, seed: int = 0):
    """Planted, well-separated logistic data (unit-norm rows), plus a test set."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(d)
    w /= np.linalg.norm(w)

    def draw(m):
        X = rng.standard_normal((m, d))
        X /= np.linalg.norm(X, axis=1, keepdims=True)
        y = np.where(X @ w > 0, 1.0, -1.0)
        return X, y

    return [draw(per_node) for _ in range(n)], draw(400)


def wait_for(pred, timeout: float = 30.0, every: float = 0.2):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(every)
    raise TimeoutError("condition not met")
