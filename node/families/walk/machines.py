"""RW DP-SGD (random-walk paper, Algorithm 1) and its complete-graph / local-DP relatives.

The token carries the model.  At every visit the holder draws fresh Gaussian noise of std
``Δσ`` (Δ = the task's sensitivity, σ = the noise multiplier), adds its clipped gradient if it
has not yet made ``cap`` contributions, steps, and samples the next holder from its public row
``W[v, :]`` (docs/design/spec/randomwalk.md §B.3, PART D 22–25):

* over-cap visits still add noise, with a zero gradient ("contribute then noise", Remark 5) —
  the other nodes' guarantees rely on that noise;
* the local-DP baseline instead adds *nothing* on over-cap visits ("contribute then nothing",
  docs/design/spec/randomwalk.md §A.4.6) and calibrates σ for local DP;
* P-AD Algorithm 4 (complete-graph SGD) is this machine on ``W = J/n`` with P-AD's calibration.

A node's view is only what it receives: ``(t, x_t)`` in the token, and the next node it picks.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from hushnet.engine.actions import Action, SetTimer
from hushnet.engine.protocol import NodeContext
from hushnet.families.walk.hops import HopRule
from hushnet.families.walk.params import RW_DPSGD, RWParams
from hushnet.families.walk.walker import WalkMachine, WalkOptions
from hushnet.tasks.base import GradientTask

_PREFETCH = "prefetch-noise"


class RWDPSGD(WalkMachine):
    """One node of RW DP-SGD."""

    name: ClassVar[str] = RW_DPSGD
    durable: ClassVar[bool] = True

    def __init__(
        self,
        ctx: NodeContext,
        hop: HopRule,
        task: GradientTask,
        params: RWParams,
        options: WalkOptions | None = None,
    ) -> None:
        super().__init__(ctx, hop, params.steps, task.dim, start=params.start, options=options)
        self.task = task
        self.p = params
        self.sens = float(task.sensitivity())
        self.noise_std = self.sens * params.sigma
        self.cap = params.steps if params.cap is None else int(params.cap)
        self.view: list[tuple[int, np.ndarray, int]] = []
        self._eta = np.empty(task.dim)  # noise buffer reused every visit
        self._eta_ready = False  # _eta already holds this node's next draw (see _send_token)
        if params.x0 is not None and len(params.x0) != task.dim:
            raise ValueError(f"x0 has {len(params.x0)} entries, the model has {task.dim}")

    @property
    def contribution_sigma(self) -> float:
        """The noise multiplier its data visits give the ledger (what :meth:`LedgerEntry.of_noise` derives
        from ``noise_std`` and ``sens``, bit for bit): the driver prepares the run's charges at it."""
        return self.noise_std / self.sens if self.sens > 0 else float("inf")

    def _checkpoint_extra(self) -> dict[str, Any]:
        # the buffer holds a draw only while ``eta_ready``; otherwise it is scratch the next visit
        # overwrites, and a hop's checkpoint (written before the prefetch timer fires) skips it
        if not self._eta_ready:
            return {"eta_ready": False}
        return {"eta": self._eta.copy(), "eta_ready": True}

    def _restore_extra(self, extra: dict[str, Any]) -> None:
        if extra.get("eta_ready") and "eta" in extra:
            self._eta[:] = extra["eta"]
            self._eta_ready = True
        else:
            self._eta_ready = False

    def initial_token(self) -> tuple[np.ndarray, int, list[Action]]:
        x0 = np.zeros(self.dim) if self.p.x0 is None else np.asarray(self.p.x0, dtype=np.float64)
        return x0, 0, []

    def visit(self, step: int, x: np.ndarray, aux: int) -> tuple[np.ndarray, int, list[Action]]:
        p = self.p
        if p.record_view:
            self.view.append((step, x.copy(), -1))
        if self.contributions < self.cap:
            self.contributions += 1
            if p.clip_after_noise:
                eta = self.ctx.rng.standard_normal(self.dim) * self.noise_std
                u = self.task.raw_gradient(x) + eta
                nrm = float(np.sqrt(u @ u))
                clip = float(getattr(self.task, "clip", np.inf))
                if nrm > clip:
                    u *= clip / nrm
                x = x - p.step_size * u
            else:
                x = self._noisy_step(x, self.task.gradient(x))
            led = self.ledger(
                step, "gradient", self.sens, self.noise_std, clip_after_noise=p.clip_after_noise
            )
            return x, aux, [led]
        if p.over_cap == "nothing":
            return x, aux, []
        if p.clip_after_noise:  # the reference code clips every update, noise-only ones included
            eta = self.ctx.rng.standard_normal(self.dim) * self.noise_std
            nrm = float(np.sqrt(eta @ eta))
            clip = float(getattr(self.task, "clip", np.inf))
            if nrm > clip:
                eta *= clip / nrm
            x = x - p.step_size * eta
        else:
            x = self._noisy_step(x, None)
        return x, aux, [self.ledger(step, "noise", self.sens, self.noise_std)]

    def _noisy_step(self, x: np.ndarray, grad: np.ndarray | None) -> np.ndarray:
        """``x − γ·(grad + η)`` with fresh η ~ N(0, noise_std²·I), in one buffer and one new array.

        Bit-identical to the plain expression (the same draws, the same operations in the same
        order: η·std, + grad, ·γ, x −), which keeps simulator/network parity and every seeded
        result; the new model is a fresh array, so ``x`` (held for a retransmission) is untouched.
        """
        buf = self._eta
        if self._eta_ready:  # drawn and scaled while the token was away
            self._eta_ready = False
        else:
            self.ctx.rng.standard_normal(out=buf)
            buf *= self.noise_std
        if grad is not None:
            buf += grad
        buf *= self.p.step_size
        return x - buf

    def _send_token(self, dst: int, step: int, x: np.ndarray, aux: int) -> list[Action]:
        if self.p.record_view and self.view and self.view[-1][2] == -1:
            t, xt, _ = self.view[-1]
            self.view[-1] = (t, xt, dst)
        acts = super()._send_token(dst, step, x, aux)
        if (
            self.opt.prefetch_noise
            and not self._eta_ready
            and not self.p.clip_after_noise
            and (self.contributions < self.cap or self.p.over_cap == "noise")
        ):
            acts.append(SetTimer(_PREFETCH, 0.0))
        return acts

    def on_timer(self, name: str) -> list[Action]:
        """Draw the next visit's noise while the token is away (a zero-delay timer after the handoff).

        The draw is the largest cost of a hop for a big model (≈ 15 ms for 10⁶ floats) and does not
        depend on the model, so it need not wait for the token.  It is drawn right after this node
        sampled its next hop — exactly where the next visit would have drawn it, since nothing else
        uses this node's generator in between — so the sequence of draws, and every model, is
        bit-identical to drawing at the visit.  The network driver fires it once the handoff is under
        way (its gRPC call started: :class:`hushnet.runs.driver._Soon`), so the draw never delays the
        token; a token that came back first would find no draw ready and draw at its visit — the same
        draws in the same order either way.  Only the draws a visit will use are taken ahead (not past
        the cap of the local-DP baseline, not on the reference code's clip-after-noise path).
        """
        if name == _PREFETCH:
            if not self._eta_ready and not self.finished:
                self.ctx.rng.standard_normal(out=self._eta)
                self._eta *= self.noise_std  # the same product the visit would form
                self._eta_ready = True
            return []
        return super().on_timer(name)

    def _advance(self, step: int, x: np.ndarray, aux: int) -> list[Action]:
        if not self.p.record_view:
            return super()._advance(step, x, aux)
        # record self-loops as "next = self" in the view
        n_before = len(self.view)
        acts = super()._advance(step, x, aux)
        for i in range(n_before, len(self.view) - 1):
            t, xt, nxt = self.view[i]
            if nxt == -1:
                self.view[i] = (t, xt, self.ctx.node)
        return acts

    def final_result(self, x: np.ndarray, aux: int) -> tuple[np.ndarray, dict[str, Any]]:
        return x, {"model_dim": self.dim}
