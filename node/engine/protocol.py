"""The state-machine interface every protocol implements, and what a machine knows about its node."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import numpy as np

from hushnet.engine.actions import Action, Fault
from hushnet.engine.errors import ProtocolError
from hushnet.engine.events import Delivered, Event, MessageArrived, RunStarted, TimerFired

VIEW_MODELS = ("sender-known", "anonymous")


@dataclass
class NodeContext:
    """Public facts a machine may use: who it is, the run, its own generator, the view model.

    ``rng`` is this node's generator (:func:`hushnet.engine.rng.node_generators`); a machine must draw
    all its statistical randomness (DP noise, walk steps) from it.  ``csprng`` is the one source of
    *cryptographic* randomness a machine may use directly (mask seeds, unlinkable ids): a PCG64
    generator is not a CSPRNG, so these come from the OS pool by default; a test or a replay may pass
    its own.  (Crypto primitives the machine calls — sealing nonces, Shamir coefficients — draw from
    the OS pool themselves, at the edge.)
    """

    node: int
    n: int
    run_id: str
    rng: np.random.Generator
    view_model: str = "sender-known"
    csprng: Callable[[int], bytes] = os.urandom

    def __post_init__(self) -> None:
        if self.view_model not in VIEW_MODELS:
            raise ValueError(f"view model must be one of {VIEW_MODELS}, got {self.view_model!r}")
        if not 0 <= self.node < self.n:
            raise ValueError(f"node {self.node} outside 0..{self.n - 1}")


class Protocol(ABC):
    """A pure per-node state machine: ``handle(event) -> list[Action]``.

    No sockets, no clocks, no global randomness: the driver owns time and transport.  Input errors
    are raised by the ``on_*`` methods as :class:`~hushnet.engine.errors.ProtocolError` *before* any
    state change; :meth:`handle` turns them into a :class:`~hushnet.engine.actions.Fault` action, so one
    bad message never corrupts the machine or its ledger.
    """

    name: ClassVar[str] = "protocol"

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        self.finished = False

    def handle(self, event: Event) -> list[Action]:
        try:
            if isinstance(event, MessageArrived):
                return self.on_message(event.src, event.payload)
            if isinstance(event, TimerFired):
                return self.on_timer(event.name)
            if isinstance(event, RunStarted):
                return self.on_start()
            if isinstance(event, Delivered):
                return self.on_delivered(event.dst, event.receipt)
        except ProtocolError as err:
            return [Fault(self.ctx.node, err)]
        raise TypeError(f"unknown event {event!r}")

    @abstractmethod
    def on_start(self) -> list[Action]: ...

    @abstractmethod
    def on_message(self, src: int, payload: bytes) -> list[Action]: ...

    def on_timer(self, name: str) -> list[Action]:
        return []

    def on_delivered(self, dst: int, receipt: str) -> list[Action]:
        """The transport's receipt for a ``Send(…, receipt=…)`` (only from drivers that give receipts)."""
        return []

    # ---- durability hooks (issue 14) -------------------------------------------------------------
    #: whether :meth:`checkpoint` / :meth:`restore` are implemented (a machine without them is not
    #: resumed after its node restarts: its run is reported as lost there instead)
    durable: ClassVar[bool] = False
    #: checkpoint after every event, not only after batches that send or finish (machines whose state
    #: changes on receipt alone, e.g. gossip rounds collecting values)
    checkpoint_every_event: ClassVar[bool] = False

    def checkpoint(self) -> dict[str, Any]:
        """Everything this machine needs to continue after its process dies: plain values, numpy
        arrays and bytes only (the driver stores it before any ``Send`` of the batch leaves).  It
        must include the node generator's state, so a restored machine draws the same noise."""
        raise NotImplementedError(f"{type(self).__name__} keeps no checkpoint")

    def restore(self, state: dict[str, Any]) -> list[Action]:
        """Load a :meth:`checkpoint` into a freshly built machine of the same run; returns the actions
        that put it back in motion (e.g. re-send a token whose handoff was not acknowledged)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no checkpoint")
