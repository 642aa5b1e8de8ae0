"""Amplification-by-decentralization protocols (P-AD Alg. 1, 2, 3, 5), with the spec's errata applied.

* :class:`RingSum` — Alg. 1, private real summation on the directed ring: noise once every n−1
  hops, so exactly ``⌈Kn/(n−1)⌉`` draws (erratum 12); ``distributed_noise`` is Remark 1 with
  ``σ'_loc = σ_loc/√(n−1)`` (erratum 13).
* :class:`RingHistogram` — Alg. 2 with randomized response: ``round(γn)`` dummy reports at the
  start, the corrected count debiasing (erratum 15) and γ from the inverted shuffling bound
  (erratum 14, :func:`hushnet.privacy.amplification.rr_gamma_for_batch`).
* :class:`CompleteSum` — Alg. 3 on the complete graph (uniform next holder, self included).
* :class:`CompleteHistogram` — Alg. 5 (init 0, debias ``(τ − γT/L)/(1−γ)``).
Complete-graph SGD (Alg. 4) is :class:`~hushnet.families.walk.machines.RWDPSGD` on ``W = J/n`` (the walk family).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from hushnet.engine.actions import Action
from hushnet.engine.protocol import NodeContext
from hushnet.families.pad.params import COMPLETE_HISTOGRAM, COMPLETE_SUM, RING_HISTOGRAM, RING_SUM
from hushnet.families.pad.wire import ring_noise_aux
from hushnet.families.walk.hops import HopRule, RingSuccessor, UniformHop
from hushnet.families.walk.walker import WalkMachine, WalkOptions
from hushnet.privacy.amplification import (
    debias_complete_histogram,
    debias_ring_histogram,
    ring_noise_draws,
    rr_epsilon,
)
from hushnet.tasks.values import HistogramTask, MeanTask, SumTask

# Parameters and debiasing come from the privacy core (hushnet.privacy.amplification): the
# corrected γ of Thm 2 is ``rr_gamma_for_batch(eps, delta, n, L)``, the exact noise count of
# Alg. 1 ``ring_noise_draws(K, n)``, and the corrected debiasing ``debias_*_histogram``.


# ---- machines -----------------------------------------------------------------------------------


class _ValueWalk(WalkMachine):
    def __init__(
        self,
        ctx: NodeContext,
        hop: HopRule,
        task,
        steps: int,
        *,
        start: int,
        options: WalkOptions | None,
    ):
        super().__init__(ctx, hop, steps, task.dim, start=start, options=options)
        self.task = task


class RingSum(_ValueWalk):
    """Alg. 1: ``K`` rounds of the directed ring 0 → 1 → … → n−1 → 0, starting at node 0.

    The token's ``aux`` field is the number of hops left before the next noise injection.
    ``sigma_loc`` is the noise std (absolute units).  Result: the noisy sum (and the mean for a
    :class:`~hushnet.tasks.values.MeanTask`) plus the exact number of noise draws.
    """

    name: ClassVar[str] = RING_SUM

    def __init__(
        self,
        ctx: NodeContext,
        task: SumTask,
        rounds: int,
        sigma_loc: float,
        *,
        distributed_noise: bool = False,
        options: WalkOptions | None = None,
    ) -> None:
        if ctx.n < 2:
            raise ValueError("the ring needs n >= 2")
        super().__init__(
            ctx, RingSuccessor(ctx.node, ctx.n), task, rounds * ctx.n, start=0, options=options
        )
        self.rounds = int(rounds)
        self.sigma_loc = float(sigma_loc)
        self.sigma_small = self.sigma_loc / math.sqrt(ctx.n - 1)
        self.distributed = bool(distributed_noise)

    def visit(self, step: int, x: np.ndarray, aux: int) -> tuple[np.ndarray, int, list[Action]]:
        v = self.task.value(self.contributions)
        self.contributions += 1
        sens = self.task.sensitivity()
        if self.distributed:
            std = self.sigma_loc if step == 0 else self.sigma_small
            x = x + v + self.ctx.rng.standard_normal(self.dim) * std
            return x, 0, [self.ledger(step, "value", sens, std)]
        if aux == 0:
            x = x + v + self.ctx.rng.standard_normal(self.dim) * self.sigma_loc
            return x, ring_noise_aux(self.ctx.n), [self.ledger(step, "value", sens, self.sigma_loc)]
        return x + v, aux - 1, [self.ledger(step, "value", sens, 0.0)]

    def final_result(self, x: np.ndarray, aux: int) -> tuple[np.ndarray, dict[str, Any]]:
        res: dict[str, Any] = {
            "estimate": x.copy(),
            "noise_draws": (
                self.total if self.distributed else ring_noise_draws(self.rounds, self.ctx.n)
            ),
        }
        if isinstance(self.task, MeanTask):
            res["mean"] = x / self.total
        return x, res


class CompleteSum(_ValueWalk):
    """Alg. 3: ``steps`` visits, next holder uniform on all n nodes; every visit adds value + N(0, σ_loc²)."""

    name: ClassVar[str] = COMPLETE_SUM

    def __init__(
        self,
        ctx: NodeContext,
        task: SumTask,
        steps: int,
        sigma_loc: float,
        *,
        start: int = 0,
        options: WalkOptions | None = None,
    ) -> None:
        super().__init__(
            ctx, UniformHop(ctx.node, ctx.n), task, steps, start=start, options=options
        )
        self.sigma_loc = float(sigma_loc)

    def visit(self, step: int, x: np.ndarray, aux: int) -> tuple[np.ndarray, int, list[Action]]:
        v = self.task.value(self.contributions)
        self.contributions += 1
        x = x + v + self.ctx.rng.standard_normal(self.dim) * self.sigma_loc
        return x, aux, [self.ledger(step, "value", self.task.sensitivity(), self.sigma_loc)]

    def final_result(self, x: np.ndarray, aux: int) -> tuple[np.ndarray, dict[str, Any]]:
        res: dict[str, Any] = {"estimate": x.copy()}
        if isinstance(self.task, MeanTask):
            res["mean"] = x / self.total
        return x, res


class _HistogramWalk(_ValueWalk):
    def __init__(
        self, ctx, hop, task: HistogramTask, steps: int, gamma: float, *, start: int, options
    ):
        if not 0.0 <= gamma < 1.0:
            raise ValueError("gamma must lie in [0, 1)")
        super().__init__(ctx, hop, task, steps, start=start, options=options)
        self.gamma = float(gamma)
        self.L = task.bins
        self.eps0 = rr_epsilon(gamma, self.L) if gamma > 0 else float("inf")

    def _report(self, step: int, x: np.ndarray) -> tuple[np.ndarray, list[Action]]:
        true = self.task.item(self.contributions)
        self.contributions += 1
        rng = self.ctx.rng
        y = int(rng.integers(self.L)) if rng.random() < self.gamma else true
        x = x.copy()
        x[y] += 1.0
        return x, [
            self.ledger(step, "rr", self.task.sensitivity(), 0.0, eps0=self.eps0, gamma=self.gamma)
        ]


class RingHistogram(_HistogramWalk):
    """Alg. 2: RR_γ reports around the directed ring, ``round(γn)`` uniform dummy reports added by node 0 first."""

    name: ClassVar[str] = RING_HISTOGRAM

    def __init__(
        self,
        ctx: NodeContext,
        task: HistogramTask,
        rounds: int,
        gamma: float,
        *,
        options: WalkOptions | None = None,
    ):
        if ctx.n < 2:
            raise ValueError("the ring needs n >= 2")
        super().__init__(
            ctx,
            RingSuccessor(ctx.node, ctx.n),
            task,
            rounds * ctx.n,
            gamma,
            start=0,
            options=options,
        )
        self.rounds = int(rounds)
        self.dummies = int(round(gamma * ctx.n))

    def initial_token(self) -> tuple[np.ndarray, int, list[Action]]:
        tau = np.zeros(self.L)
        np.add.at(tau, self.ctx.rng.integers(self.L, size=self.dummies), 1.0)
        return tau, 0, []

    def visit(self, step: int, x: np.ndarray, aux: int) -> tuple[np.ndarray, int, list[Action]]:
        x, led = self._report(step, x)
        return x, aux, led

    def final_result(self, x: np.ndarray, aux: int) -> tuple[np.ndarray, dict[str, Any]]:
        est = debias_ring_histogram(x, self.gamma, self.ctx.n, self.rounds, self.L, self.dummies)
        return x, {"estimate": est, "dummies": self.dummies}


class CompleteHistogram(_HistogramWalk):
    """Alg. 5: RR_γ reports on a uniform walk over the complete graph; token starts at 0 (spec [AMBIG] default)."""

    name: ClassVar[str] = COMPLETE_HISTOGRAM

    def __init__(
        self,
        ctx: NodeContext,
        task: HistogramTask,
        steps: int,
        gamma: float,
        *,
        start: int = 0,
        options: WalkOptions | None = None,
    ):
        super().__init__(
            ctx, UniformHop(ctx.node, ctx.n), task, steps, gamma, start=start, options=options
        )

    def visit(self, step: int, x: np.ndarray, aux: int) -> tuple[np.ndarray, int, list[Action]]:
        x, led = self._report(step, x)
        return x, aux, led

    def final_result(self, x: np.ndarray, aux: int) -> tuple[np.ndarray, dict[str, Any]]:
        return x, {"estimate": debias_complete_histogram(x, self.gamma, self.total, self.L)}
