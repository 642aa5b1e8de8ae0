"""Randomized Muffliato ([M] Alg. 2) on a seeded public edge-activation schedule.

In the paper one random edge wakes up per tick and its two ends average.  Over a network there is
no global clock, so the activations come from a *public seeded schedule* that every node computes
the same way (:func:`hushnet.privacy.muffliato.randomized_schedule`, ``p_e = 2W_e/n``, leftover
probability = idle tick) — which is also what lets the accountant replay it.  Each node walks its
own activations in schedule order: send its value to the partner of activation t, wait for the
partner's value for t, set the average.  Both ends order their shared activations the same way, so
this never deadlocks; a partner *silent* past the timeout makes the node skip that activation (a
:class:`~hushnet.engine.actions.Deviation`) and, after ``give_up_after`` misses, stop waiting for it.
Silence, as in the synchronous rounds (:class:`~hushnet.families.gossip.params.GossipOptions`): a waiting node
sends ``HEARTBEAT(t)`` (t = the activation it is at) every ``timeout/ticks`` to the partners of its
remaining activations, and a partner's heartbeat from an *earlier* activation than the one we wait for
resets the wait — it is legitimately held up (perhaps by a dead node further away), so a crash does not
cascade into skips between live nodes.  A heartbeat from the activation we wait for, or later, means our
value or theirs was lost: the silence keeps counting.
Values for activations the node has not reached yet are buffered (a partner that skipped an earlier
activation runs ahead); a skipped activation's late value is refused as stale, never mixed in.
Each activation is recorded in the ledger (partner, whether the value was sent, whether it was used).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from hushnet.engine.actions import (
    Action,
    CancelTimer,
    Deviation,
    Finish,
    LedgerEntry,
    Send,
    SetTimer,
)
from hushnet.engine.errors import MalformedMessage, ReplayedMessage, UnexpectedSender
from hushnet.engine.protocol import NodeContext, Protocol
from hushnet.families.gossip.machines import StaleRound
from hushnet.families.gossip.params import MUFFLIATO_RANDOMIZED, GossipOptions
from hushnet.families.gossip.wire import KIND_HEARTBEAT, KIND_VALUE, decode_round, encode_round
from hushnet.tasks.base import TaskError, ValueTask

__all__ = ["RandomizedMuffliato"]


class RandomizedMuffliato(Protocol):
    """One node of Alg. 2.  ``schedule`` is the public (T, 2) activation array (``[-1, -1]`` = idle)."""

    name: ClassVar[str] = MUFFLIATO_RANDOMIZED

    def __init__(
        self,
        ctx: NodeContext,
        task: ValueTask,
        schedule: np.ndarray,
        sigma: float,
        *,
        options: GossipOptions | None = None,
    ) -> None:
        super().__init__(ctx)
        if not isinstance(task, ValueTask):
            raise TaskError("randomized muffliato averages values: it needs a value task")
        sched = np.asarray(schedule, dtype=np.int64)
        if sched.ndim != 2 or sched.shape[1] != 2:
            raise ValueError("schedule must be a (T, 2) array of activated edges")
        self.sched = sched
        self.task = task
        self.dim = task.dim
        self.sigma = float(sigma)
        self.sens = float(task.sensitivity())
        self.opt = options or GossipOptions()
        me = ctx.node
        mine = np.flatnonzero((sched[:, 0] == me) | (sched[:, 1] == me))
        self.acts = [(int(t), int(sched[t, 1] if sched[t, 0] == me else sched[t, 0])) for t in mine]
        self.ptr = 0
        self.x: np.ndarray | None = None
        self.gone: set[int] = set()
        self._missed: dict[int, int] = {}
        self._partners = frozenset(p for _, p in self.acts)
        self._silent = 0  # timer ticks without a sign of life from the current partner
        # activation -> partner's value, for activations this node has not reached yet: a partner that timed
        # out on an earlier activation runs ahead legitimately, so several may wait (each checked, at most T)
        self._buf: dict[int, np.ndarray] = {}
        self._seen: dict[int, int] = {}  # activation -> hash of the payload

    @property
    def redeliver_for(self) -> float:
        """Seconds the node's driver sends a failed delivery again for (transport failures only).

        Why: an activation's ``VALUE`` is sent once and the timer only heartbeats (which say "alive", not
        "resend"), so a partner whose copy was lost skips the activation after the timeout
        (``activation-timeout``; measured: ``test_gossipnet_randomized_redeliver.py``).  The driver sends the
        same bytes again under the same envelope number: a partner that took the first copy (its answer
        lost) drops the second by its replay cache, so a value is never drawn again nor averaged twice
        (the machine would refuse it as a replay anyway).  After two timeouts the partner has skipped the
        activation and would refuse the copy as stale."""
        return 2.0 * self.opt.timeout

    def on_start(self) -> list[Action]:
        if self.x is not None:
            return []
        std = self.sigma * self.sens
        self.x = (
            np.asarray(self.task.value(0), dtype=np.float64)
            + self.ctx.rng.standard_normal(self.dim) * std
        )
        led = LedgerEntry(
            self.ctx.node,
            0,
            "value",
            self.ctx.view_model,
            self.sens,
            std,
            std / self.sens if self.sens > 0 else float("inf"),
            self.name,
            self.ctx.run_id,
            {"activations": len(self.acts)},
        )
        return [led] + self._next()

    def _record(self, t: int, partner: int, used: bool, sent: bool) -> LedgerEntry:
        return LedgerEntry(
            self.ctx.node,
            t,
            "schedule",
            self.ctx.view_model,
            0.0,
            0.0,
            0.0,
            self.name,
            self.ctx.run_id,
            {"round": t, "partner": partner, "used": used, "sent": sent},
        )

    def _next(self) -> list[Action]:
        acts: list[Action] = []
        while self.ptr < len(self.acts):
            t, p = self.acts[self.ptr]
            if p in self.gone:
                acts.append(self._record(t, p, False, False))
                self.ptr += 1
                continue
            acts.append(Send(p, encode_round(KIND_VALUE, t, 1, self.x)))
            if t in self._buf:
                return acts + self._average(t, p, self._buf.pop(t))
            self._silent = 0
            acts.append(SetTimer(f"P{t}", self.opt.timeout / self.opt.ticks))
            return acts
        self.finished = True
        return acts + [
            Finish(
                self.ctx.node,
                len(self.sched),
                self.x,
                {"activations": len(self.acts), "gone": sorted(self.gone)},
            )
        ]

    def _average(self, t: int, p: int, vec: np.ndarray) -> list[Action]:
        self.x = 0.5 * (self.x + vec)
        self._missed[p] = 0
        self.ptr += 1
        return [CancelTimer(f"P{t}"), self._record(t, p, True, True)] + self._next()

    def on_message(self, src: int, payload: bytes) -> list[Action]:
        kind, t, _aux, vec = decode_round(payload, self.dim)
        if kind == KIND_HEARTBEAT:
            return self._heartbeat(src, t)
        if self.finished:
            raise StaleRound(f"run {self.ctx.run_id} already finished at node {self.ctx.node}")
        if kind != KIND_VALUE:
            raise MalformedMessage("randomized muffliato exchanges values only")
        if t >= len(self.sched):
            raise MalformedMessage(f"activation {t} outside 0..{len(self.sched) - 1}")
        a, b = (int(v) for v in self.sched[t])
        if {a, b} != {self.ctx.node, src}:
            raise UnexpectedSender(
                f"activation {t} is edge {{{a}, {b}}}: node {src} may not send it to node {self.ctx.node}"
            )
        if src in self.gone:
            raise UnexpectedSender(f"node {src} was declared gone by node {self.ctx.node}")
        if t in self._seen:
            raise ReplayedMessage(
                f"activation {t} from node {src} already received "
                f"({'duplicate' if self._seen[t] == hash(payload) else 'conflicting'}); not used again"
            )
        cur = self.acts[self.ptr][0] if self.ptr < len(self.acts) else len(self.sched)
        if t < cur:
            raise StaleRound(
                f"activation {t} already closed at node {self.ctx.node} (now at {cur}); value not used"
            )
        if t > cur:
            self._seen[t] = hash(payload)
            self._buf[t] = vec
            return []
        self._seen[t] = hash(payload)
        return self._average(t, src, vec)

    def _heartbeat(self, src: int, t: int) -> list[Action]:
        if src not in self._partners:
            raise UnexpectedSender(f"node {src} shares no activation with node {self.ctx.node}")
        if self.finished or src in self.gone:
            return []  # a late sign of life changes nothing
        if self.ptr < len(self.acts):
            cur, p = self.acts[self.ptr]
            if (
                p == src and t < cur
            ):  # the partner has not reached our activation yet: slow, not silent
                self._silent = 0
        return []

    def on_timer(self, name: str) -> list[Action]:
        if self.finished or self.ptr >= len(self.acts):
            return []
        t, p = self.acts[self.ptr]
        if name != f"P{t}":
            return []
        self._silent += 1
        if (
            self._silent < self.opt.ticks
        ):  # still waiting: tell whoever waits on this node that it is alive
            hb = encode_round(KIND_HEARTBEAT, t, 0)
            waiting = sorted({q for _, q in self.acts[self.ptr :]} - self.gone)
            return [Send(q, hb) for q in waiting] + [
                SetTimer(name, self.opt.timeout / self.opt.ticks)
            ]
        self._missed[p] = self._missed.get(p, 0) + 1
        acts: list[Action] = [
            Deviation(self.ctx.node, t, "activation-timeout", {"partner": p}),
            self._record(t, p, False, True),
        ]
        if self._missed[p] >= self.opt.give_up_after:
            self.gone.add(p)
            acts.append(Deviation(self.ctx.node, t, "neighbour-gone", {"neighbour": p}))
        self.ptr += 1
        return acts + self._next()

    def final_result(self) -> dict[str, Any]:
        return {"activations": len(self.acts)}
