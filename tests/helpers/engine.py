"""Shared builders for the engine tests (imported by the test modules in this folder)."""

from __future__ import annotations

import numpy as np

from hushnet.families.walk.walker import WalkOptions
from hushnet.protocols.registry import build_machines, transition_matrix
from hushnet.sim import Simulator
from hushnet.tasks import GradientTask, LogisticRegressionTask


def synthetic_tasks(
    n: int, per_node: int = 4, d: int = 3, clip: float = 1.0, seed: int = 0
) -> list[LogisticRegressionTask]:
    """Small planted logistic-regression shards (no data files needed)."""
    rng = np.random.default_rng(seed)
    w_true = rng.standard_normal(d)
    tasks = []
    for _ in range(n):
        X = rng.standard_normal((per_node, d))
        X /= np.linalg.norm(X, axis=1, keepdims=True)
        y = np.where(X @ w_true + 0.3 * rng.standard_normal(per_node) > 0, 1.0, -1.0)
        tasks.append(LogisticRegressionTask(X, y, clip=clip))
    return tasks


def rw_run(
    graph: str,
    tasks,
    *,
    seed: int = 1,
    steps: int = 200,
    sigma: float = 1.0,
    step_size: float = 0.1,
    cap=None,
    over_cap: str | None = None,
    protocol: str = "rw-dpsgd",
    reliable: bool = True,
    latency: float = 1e-3,
    record_view: bool = False,
    on_peer_down: str = "pause",
    kill=None,
    until: float = float("inf"),
    stop_on_pause: bool = True,
    **opt,
):
    W = transition_matrix(graph) if protocol != "pad-complete-sgd" else None
    params = dict(steps=steps, step_size=step_size, sigma=sigma, cap=cap, record_view=record_view)
    if over_cap is not None:
        params["over_cap"] = over_cap
    ms = build_machines(
        protocol,
        tasks,
        run_seed=seed,
        params=params,
        W=W,
        options=WalkOptions(reliable=reliable, on_peer_down=on_peer_down, **opt),
    )
    sim = Simulator(ms, latency=latency)
    for node, *when in kill or []:
        sim.kill(node, *when)
    return sim.run(until=until, stop_on_pause=stop_on_pause), ms, W


class ZeroGradTask(GradientTask):
    """A user task (named by dotted path in a spec test): zero gradient, so the walk is pure noise."""

    def __init__(self, X=None, y=None, clip: float = 1.0, dim: int = 2) -> None:
        self._dim = dim
        self.clip = clip

    @property
    def dim(self) -> int:
        return self._dim

    def sensitivity(self) -> float:
        return 2.0 * self.clip

    def gradient(self, w):
        return np.zeros(self._dim)

    def loss(self, w) -> float:
        return float(w @ w)

    def evaluate(self, w, X, y):
        return {"loss": self.loss(w)}
