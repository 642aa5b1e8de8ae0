"""A data-free gradient task of any dimension: what the run benchmark moves around the network.

``ZeroGradientTask`` has a zero gradient, so a walk with it is pure noise — the token is a real
``size``-float64 model updated with fresh Gaussian noise at every visit, and every cost measured
is the protocol's own (validation, serialisation, TLS, acknowledgement, ledger), not the task's.
Named in a spec as ``task = "node.runs.synthetic:ZeroGradientTask"`` with ``size`` in [task].
"""
from __future__ import annotations

import numpy as np

from node.tasks.base import GradientTask


class ZeroGradientTask(GradientTask):
    name = "node.runs.synthetic:ZeroGradientTask"

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
