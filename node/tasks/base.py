"""What a task is: the local computation a node performs on its own data when it holds the token.

Two families, because the protocols use data in two ways:

* :class:`ValueTask` — the node contributes bounded values (summation, mean, histogram, P-AD Alg. 1–3, 5);
* :class:`GradientTask` — the node contributes a clipped gradient of its local loss (RW DP-SGD, P-AD Alg. 4).

Each task states its L2 ``sensitivity``: how far one contribution can move when the node's whole
local data set is replaced (user-level adjacency, docs/design/spec/randomwalk.md §A.1 / B.2).  The noise calibration and the
ledger use that number, so it must be a true bound, enforced by clipping inside the task.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np


class TaskError(ValueError):
    """A task that cannot be built (unknown name, bad parameters)."""


class UnknownTask(TaskError):
    """The spec names a task that is neither built in nor an importable task class."""


class Task(ABC):
    """Common interface: the token / model dimension and the per-contribution L2 sensitivity."""

    #: registry name (built-ins) or dotted path (user tasks)
    name: str = "task"

    @property
    @abstractmethod
    def dim(self) -> int: ...

    @abstractmethod
    def sensitivity(self) -> float: ...


class ValueTask(Task):
    """A node's k-th contribution is a bounded value (``value(k)``, k = 0, 1, …)."""

    @abstractmethod
    def value(self, k: int) -> np.ndarray: ...


class GradientTask(Task):
    """A node contributes a clipped gradient of its local loss at the current model.

    ``gradient(w)`` must already be clipped so that ``‖gradient(w; D) − gradient(w; D')‖ ≤ sensitivity()``
    for any two local data sets D, D'.  ``raw_gradient`` (unclipped) exists only to emulate the
    reference code's clip-after-noise variant for figure reproductions (docs/design/spec/randomwalk.md §A.4.6).
    """

    @abstractmethod
    def gradient(self, w: np.ndarray) -> np.ndarray: ...

    def raw_gradient(self, w: np.ndarray) -> np.ndarray:
        return self.gradient(w)

    @abstractmethod
    def loss(self, w: np.ndarray) -> float: ...

    @abstractmethod
    def evaluate(self, w: np.ndarray, X: np.ndarray, y: np.ndarray) -> dict[str, float]: ...
