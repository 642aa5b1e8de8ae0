"""Synthetic workloads for tests, benchmarks and figures: a data-free task and planted logistic shards.

``ZeroGradientTask`` has a zero gradient, so a walk with it is pure noise — the token is a real
``size``-float64 model updated with fresh Gaussian noise at every visit, and every cost measured
is the protocol's own (validation, serialisation, TLS, acknowledgement, ledger), not the task's.
Named in a spec as ``task = "hushnet.runs.synthetic:ZeroGradientTask"`` with ``size`` in [task].

:func:`planted_logistic_shards` is the one small labelled data set the networked tests, benchmarks
and figures hand their nodes (``local_net.network(..., shards=...)``) when the data only has to be
a valid logistic-regression shard: the walk's law and the protocols' costs do not depend on it.
"""

from __future__ import annotations

import numpy as np

from hushnet.tasks.base import GradientTask


class ZeroGradientTask(GradientTask):
    name = "hushnet.runs.synthetic:ZeroGradientTask"

    def __init__(self, X=None, y=None, size: int = 10, clip: float = 1.0) -> None:
        self._dim = int(size)
        self.clip = float(clip)

    @property
    def dim(self) -> int:
        return self._dim

    def sensitivity(self) -> float:
        return 2.0 * self.clip

    def gradient(self, w: np.ndarray) -> np.ndarray:
        return np.zeros(self._dim)

    def loss(self, w: np.ndarray) -> float:
        return 0.0

    def evaluate(self, w: np.ndarray, X: np.ndarray, y: np.ndarray) -> dict[str, float]:
        return {"loss": 0.0}


def planted_logistic_shards(
    n: int, m: int = 10, d: int = 4, seed: int = 1
) -> list[tuple[np.ndarray, np.ndarray]]:
    """``n`` shards of ``m`` unit-norm rows in ``d`` dimensions, labelled by a planted direction (±1).

    Rows have unit L2 norm, as the papers' preprocessing does, so per-example clipping at 1 never
    bites; the planted ``w`` makes the problem learnable. Draw order: ``w``, then each shard's rows.
    """
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(d)
    out = []
    for _ in range(n):
        X = rng.standard_normal((m, d))
        X /= np.linalg.norm(X, axis=1, keepdims=True)
        out.append((X, np.where(X @ w > 0, 1.0, -1.0)))
    return out
