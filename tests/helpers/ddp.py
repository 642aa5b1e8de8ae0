"""Shared pieces of the secagg-dpsgd tests: data, and an independent re-implementation of the algorithm."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from scipy import integrate

from hushnet.engine.rng import node_generators
from hushnet.tasks import LogisticRegressionTask


def shards(
    n: int, d: int = 5, rows: int = 40, seed: int = 0
) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(d)
    out = []
    for _ in range(n):
        X = rng.standard_normal((rows, d))
        out.append((X, np.where(X @ w + 0.3 * rng.standard_normal(rows) > 0, 1.0, -1.0)))
    return out


def tasks_of(sh, clip: float = 1.0) -> list[LogisticRegressionTask]:
    return [LogisticRegressionTask(X, y, clip=clip) for X, y in sh]


def reference_model(
    tasks: Sequence,
    seed: int,
    rounds: int,
    step: float,
    share_std: float,
    survivors: Sequence[Sequence[int]],
    drew: Sequence[Sequence[int]] | None = None,
) -> np.ndarray:
    """The update rule written out: x ← x − η·Σ_{u∈U_r}(g_u(x) + s·ξ_u)/|U_r|, each member's noise from its own
    run generator (public-seed noise), drawn once per round it started (``drew[r]``, default the survivors).
    A round with no survivors (aborted) leaves the model unchanged; its members' draws still happened."""
    n = len(tasks)
    gens = node_generators(seed, n)
    x = np.zeros(tasks[0].dim)
    for r in range(rounds):
        noise = {
            u: gens[u].standard_normal(x.size) * share_std
            for u in (survivors[r] if drew is None else drew[r])
        }
        total = np.zeros_like(x)
        for u in survivors[r]:
            total += tasks[u].gradient(x) + noise[u]
        if survivors[r]:
            x = x - step * total / len(survivors[r])
    return x


def renyi_gaussian_numeric(alpha: float, shift: float, std: float) -> float:
    """D_α(N(shift, std²) ‖ N(0, std²)) by quadrature of ∫ p^α q^{1−α} (log space), not the closed form."""

    def integrand(z: float) -> float:
        lp = -0.5 * ((z - shift) / std) ** 2
        lq = -0.5 * (z / std) ** 2
        return math.exp(alpha * lp + (1 - alpha) * lq) / (std * math.sqrt(2 * math.pi))

    lo, hi = -40 * std - abs(shift) * alpha, 40 * std + abs(shift) * alpha
    val, _ = integrate.quad(integrand, lo, hi, limit=400, points=[alpha * shift])
    return math.log(val) / (alpha - 1)
