"""Logistic regression with per-example clipping (the papers' "houses" task)."""

from __future__ import annotations

import numpy as np

from hushnet.tasks.base import GradientTask, TaskError


def _sigmoid(z):
    """scipy's numerically stable logistic function, imported at the first call (this module is imported
    by every node process at start-up, where scipy.special cost ~50 ms before any task exists)."""
    global _sigmoid
    from scipy.special import expit

    _sigmoid = expit
    return expit(z)


def _log1pexp(z: np.ndarray) -> np.ndarray:
    """ln(1 + e^z) without overflow."""
    return np.logaddexp(0.0, z)


class LogisticRegressionTask(GradientTask):
    """``f(w; D_v) = mean_i ln(1 + exp(−y_i wᵀx_i))``, y ∈ {−1, +1}, with an optional intercept.

    ``gradient(w)`` is the mean of the per-example gradients, each clipped to L2 norm ``clip``; the
    mean of vectors of norm ≤ C has norm ≤ C, so replacing the node's whole data set moves it by at
    most ``2C``: ``sensitivity() = 2·clip`` (docs/design/spec/randomwalk.md §B.3 [SPEC], A.4.6 [SPEC]).
    """

    name = "logreg"

    def __init__(
        self, X: np.ndarray, y: np.ndarray, clip: float = 1.0, intercept: bool = True
    ) -> None:
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64).ravel()
        if X.ndim != 2:
            raise TaskError(f"features must be a 2-D array, got shape {X.shape}")
        if X.shape[0] != y.shape[0]:
            raise TaskError(f"{X.shape[0]} feature rows but {y.shape[0]} labels")
        if X.shape[0] == 0:
            raise TaskError("no local examples")
        if not np.all(np.isin(y, (-1.0, 1.0))):
            raise TaskError("labels must be -1 or +1")
        if not (clip > 0 and np.isfinite(clip)):
            raise TaskError("clip must be a positive number")
        if not np.all(np.isfinite(X)):
            raise TaskError("features contain NaN or infinity")
        self.intercept = bool(intercept)
        self.features = X.shape[1]
        self.X = np.hstack([X, np.ones((X.shape[0], 1))]) if intercept else X
        self.y = y
        self.clip = float(clip)
        self._yX = self.y[:, None] * self.X
        self._row_norms = np.sqrt(np.einsum("ij,ij->i", self.X, self.X))
        self._inv_m = 1.0 / self.X.shape[0]

    @property
    def dim(self) -> int:
        return int(self.X.shape[1])

    def sensitivity(self) -> float:
        return 2.0 * self.clip

    def _per_example(self, w: np.ndarray) -> np.ndarray:
        # d/dw ln(1+exp(-y wᵀx)) = -y x σ(-y wᵀx)
        m = self._yX @ w
        return -self._yX * _sigmoid(-m)[:, None]

    def gradient(self, w: np.ndarray) -> np.ndarray:
        # per-example gradient −s_i·y_i x_i has norm s_i‖x_i‖: clip without materialising the matrix
        s = _sigmoid(-(self._yX @ w))
        norms = s * self._row_norms
        coef = s * np.minimum(1.0, self.clip / np.maximum(norms, 1e-300))
        return -(coef @ self._yX) * self._inv_m

    def raw_gradient(self, w: np.ndarray) -> np.ndarray:
        return -(_sigmoid(-(self._yX @ w)) @ self._yX) * self._inv_m

    def loss(self, w: np.ndarray) -> float:
        return float(_log1pexp(-(self._yX @ w)).mean())

    def augment(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        return np.hstack([X, np.ones((X.shape[0], 1))]) if self.intercept else X

    def evaluate(self, w: np.ndarray, X: np.ndarray, y: np.ndarray) -> dict[str, float]:
        return logistic_metrics(w, self.augment(X), y)


def logistic_metrics(w: np.ndarray, Xa: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Loss and accuracy of model ``w`` on (already intercept-augmented) ``Xa``, labels ±1."""
    z = Xa @ w
    pred = np.where(z >= 0.0, 1.0, -1.0)
    return {"loss": float(_log1pexp(-(y * z)).mean()), "accuracy": float(np.mean(pred == y))}
