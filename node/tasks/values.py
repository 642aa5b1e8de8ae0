"""Value tasks: real-vector sum and mean, and histograms (the P-AD summation protocols' inputs)."""

from __future__ import annotations

import math

import numpy as np

from hushnet.tasks.base import TaskError, ValueTask


class SumTask(ValueTask):
    """Contribute bounded real vectors; values are clipped coordinate-wise to ``[lo, hi]``.

    ``values`` is ``(d,)`` (the same value at every visit) or ``(K, d)`` (the k-th visit contributes row
    ``k mod K``).  Sensitivity under replacement of the node's data: ``(hi − lo)·√d`` in L2.
    """

    name = "sum"

    def __init__(self, values: np.ndarray, lo: float = 0.0, hi: float = 1.0) -> None:
        if not hi > lo:
            raise TaskError(f"need hi > lo, got [{lo}, {hi}]")
        v = np.asarray(values, dtype=np.float64)
        if v.ndim == 0:
            v = v.reshape(1, 1)
        elif v.ndim == 1:
            v = v.reshape(1, -1)
        elif v.ndim != 2:
            raise TaskError(f"values must be a scalar, (d,) or (K, d), got shape {v.shape}")
        if v.shape[0] == 0 or v.shape[1] == 0:
            raise TaskError("values are empty")
        if not np.all(np.isfinite(v)):
            raise TaskError("values contain NaN or infinity")
        self.lo, self.hi = float(lo), float(hi)
        self._values = np.clip(v, self.lo, self.hi)

    @property
    def dim(self) -> int:
        return int(self._values.shape[1])

    def sensitivity(self) -> float:
        return (self.hi - self.lo) * math.sqrt(self.dim)

    def value(self, k: int) -> np.ndarray:
        return self._values[k % self._values.shape[0]]

    def true_total(self, contributions: int) -> np.ndarray:
        """Sum of this node's first ``contributions`` values (for utility checks)."""
        K = self._values.shape[0]
        idx = np.arange(contributions) % K
        return self._values[idx].sum(axis=0)


class MeanTask(SumTask):
    """Same contributions as :class:`SumTask`; the protocol output is divided by the number of contributions."""

    name = "mean"


class HistogramTask(ValueTask):
    """Contribute categorical values in ``0..L-1``; the k-th visit contributes ``values[k mod K]``.

    Sensitivity of one report (a one-hot vector) under replacement: ``√2`` in L2 (two bins move by 1).
    The ring / complete-graph histogram protocols protect it with L-ary randomized response instead
    of Gaussian noise, so the ledger records ε₀ there.
    """

    name = "histogram"

    def __init__(self, values: np.ndarray | int, bins: int) -> None:
        if bins < 2:
            raise TaskError("a histogram needs at least 2 bins")
        v = np.atleast_1d(np.asarray(values))
        if v.ndim != 1 or v.size == 0:
            raise TaskError("histogram values must be a non-empty 1-D sequence of bin indices")
        if not np.issubdtype(v.dtype, np.integer):
            if not np.all(np.equal(np.mod(v, 1), 0)):
                raise TaskError("histogram values must be integers")
            v = v.astype(np.int64)
        if v.min() < 0 or v.max() >= bins:
            raise TaskError(f"histogram values must lie in 0..{bins - 1}")
        self.bins = int(bins)
        self._values = v.astype(np.int64)

    @property
    def dim(self) -> int:
        return self.bins

    def sensitivity(self) -> float:
        return math.sqrt(2.0)

    def value(self, k: int) -> np.ndarray:
        return np.asarray(self._values[k % self._values.size])

    def item(self, k: int) -> int:
        return int(self._values[k % self._values.size])
