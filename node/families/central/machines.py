"""Central DP-SGD: the **non-decentralized baseline** with a trusted aggregator (operator side).

Shipped only for comparison (docs/design/spec/randomwalk.md §E.7, P-AD Fig. 2 "Centralized DP-SGD"): the aggregator holds
the model, samples a node uniformly at each step, receives that node's clipped gradient *in the
clear*, adds the Gaussian noise itself and steps.  Nodes must trust the aggregator; the ledger
entries say so (``view_model="trusted-aggregator"``).  Machine ids: nodes 0..n−1, aggregator n.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from hushnet.engine.actions import Action, Finish, LedgerEntry, Metric, Send
from hushnet.engine.errors import MalformedMessage, ReplayedMessage, UnexpectedSender
from hushnet.engine.protocol import NodeContext, Protocol
from hushnet.families.central.params import PROTOCOL, CentralParams
from hushnet.families.central.wire import (
    KIND_GRADIENT_REPLY,
    KIND_GRADIENT_REQUEST,
    decode_reply,
    decode_request,
    encode_reply,
    encode_request,
)
from hushnet.families.walk.wire import message_kind
from hushnet.tasks.base import GradientTask


class CentralClient(Protocol):
    """A data-holding node: answers each gradient request of the aggregator with its clipped gradient."""

    name: ClassVar[str] = PROTOCOL

    def __init__(
        self, ctx: NodeContext, task: GradientTask, aggregator: int, clip_after_noise: bool = False
    ) -> None:
        super().__init__(ctx)
        self.task = task
        self.aggregator = aggregator
        self.raw = clip_after_noise
        self.last_step = -1
        # the last request answered and its reply: the aggregator asks again when its call failed in
        # transport, possibly after this node answered (the answer lost) — see on_message
        self._last: tuple[bytes, bytes] | None = None

    def on_start(self) -> list[Action]:
        return []

    def on_message(self, src: int, payload: bytes) -> list[Action]:
        if message_kind(payload) != KIND_GRADIENT_REQUEST:
            raise MalformedMessage("central client expects gradient requests")
        if src != self.aggregator:
            raise UnexpectedSender(
                f"gradient request from node {src}, not the aggregator {self.aggregator}"
            )
        tok = decode_request(payload, self.task.dim)
        if tok.step == self.last_step and self._last is not None and self._last[0] == payload:
            # the same request again (the aggregator's call failed, maybe after this answer left): the
            # same reply, not charged again — the aggregator learns nothing it was not sent already
            return [Send(src, self._last[1])]
        if tok.step <= self.last_step:
            raise ReplayedMessage(
                f"gradient request for step {tok.step} after step {self.last_step}"
            )
        self.last_step = tok.step
        g = self.task.raw_gradient(tok.vector) if self.raw else self.task.gradient(tok.vector)
        led = LedgerEntry(
            self.ctx.node,
            tok.step,
            "gradient",
            "trusted-aggregator",
            self.task.sensitivity(),
            0.0,
            0.0,
            self.name,
            self.ctx.run_id,
            {"clear_to": "aggregator"},
        )
        reply = encode_reply(tok.step, tok.total, src, g)
        self._last = (bytes(payload), reply)
        return [led, Send(src, reply)]


class CentralAggregator(Protocol):
    """The trusted curator: uniform node sampling, no cap, noise added centrally."""

    name: ClassVar[str] = PROTOCOL
    #: seconds a request whose call failed in transport (unreachable, deadline passed) is asked again for,
    #: the same bytes to the same node (:func:`~hushnet.families.central.operator.run_central` acts on it).
    #: Why: one failed call stopped the run (issue 12, ``test_central_redeliver.py``); a node that already
    #: answered gives the same reply again without a second charge (:class:`CentralClient`).
    redeliver_for: ClassVar[float] = 120.0

    def __init__(self, ctx: NodeContext, n_clients: int, dim: int, params: CentralParams) -> None:
        super().__init__(ctx)
        self.n_clients = n_clients
        self.dim = dim
        self.p = params
        self.x = np.zeros(dim)
        self.step = 0
        self.waiting: int | None = None

    def _request(self) -> list[Action]:
        u = int(self.ctx.rng.integers(self.n_clients))
        self.waiting = u
        return [Send(u, encode_request(self.step, self.p.steps, u, self.x))]

    def on_start(self) -> list[Action]:
        return self._request()

    def on_message(self, src: int, payload: bytes) -> list[Action]:
        if message_kind(payload) != KIND_GRADIENT_REPLY:
            raise MalformedMessage("aggregator expects gradient replies")
        if src != self.waiting:
            raise UnexpectedSender(
                f"gradient from node {src}, the aggregator asked node {self.waiting}"
            )
        tok = decode_reply(payload, self.dim)
        if tok.step != self.step:
            raise ReplayedMessage(f"gradient for step {tok.step}, expected step {self.step}")
        eta = self.ctx.rng.standard_normal(self.dim) * self.p.noise_std
        u = tok.vector + eta
        if self.p.clip_after_noise and self.p.clip is not None:
            nrm = float(np.sqrt(u @ u))
            if nrm > self.p.clip:
                u *= self.p.clip / nrm
        self.x = self.x - self.p.step_size * u
        self.step += 1
        acts: list[Action] = []
        if self.p.snapshot_every and self.step % self.p.snapshot_every == 0:
            acts.append(Metric("model", self.x.copy(), self.step, self.ctx.node))
        if self.step >= self.p.steps:
            self.finished = True
            self.waiting = None
            return acts + [
                Finish(
                    self.ctx.node,
                    self.step,
                    self.x.copy(),
                    {"baseline": "central (trusted aggregator)"},
                )
            ]
        return acts + self._request()
