"""The token-walk machine shared by every random-walk protocol.

One token travels; the node holding it updates it with its own data and noise, then hands it to
the next holder chosen by a public rule.  This module owns everything that is *not* the update:
strict validation of incoming tokens (dimension, run length, replay, sender), acknowledged
handoff with retries, the run option for a neighbour that stays down (pause, or deviate and
record it), self-loops (the same node updates again, no message), progress metrics and the end
of the run.  Subclasses implement :meth:`WalkMachine.visit` (one update) and the initial token.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from hushnet.engine.actions import (
    Action,
    CancelTimer,
    Deviation,
    Finish,
    LedgerEntry,
    Metric,
    Paused,
    Send,
    SetTimer,
)
from hushnet.engine.errors import MalformedMessage, ReplayedMessage, UnexpectedSender
from hushnet.engine.protocol import NodeContext, Protocol
from hushnet.families.walk.hops import HopRule
from hushnet.families.walk.wire import (
    KIND_ACK,
    KIND_TOKEN,
    decode_ack,
    decode_token,
    digest,
    digest_v0,
    encode_ack,
    encode_token,
    message_kind,
    own_token,
)

ON_PEER_DOWN = ("pause", "deviate")
_HANDOFF = "handoff"
#: replay digests in a checkpoint: sealed chunks of this many ``(step, digest)`` records, each written
#: once (the run store keeps a buffer it saw before by reference), plus the open tail
_SEEN_CHUNK = 256
_SEEN_REC = struct.Struct("<q16s")


@dataclass(frozen=True)
class WalkOptions:
    """Transport-facing options of a walk (public, part of the run spec).

    ``reliable``: acknowledge every handoff and retransmit after ``ack_timeout`` seconds, up to
    ``max_retries`` times; then ``on_peer_down`` decides: ``"pause"`` keeps the token and retries
    every ``pause_retry`` seconds (the run stalls visibly, W is unchanged), ``"deviate"`` records a
    :class:`~hushnet.engine.actions.Deviation` and re-samples among the remaining entries of the row,
    renormalised — which changes W, so the accountant must be told.
    ``progress_every``: emit a ``step`` metric every that many steps (0 = never).
    ``snapshot_every``: emit the model itself as a ``model`` metric (simulation traces only; a
    released model is an extra observation not covered by the walk's accounting, docs/design/spec/randomwalk.md §E.1).
    ``prefetch_noise``: draw the next visit's noise while the token is away (a zero-delay timer
    after each handoff; same draws, same models — see :meth:`RWDPSGD.on_timer`).  On for networked
    runs, where it takes the draw off a hop's critical path; off in the simulator, where it would
    only add events.
    ``link_receipts``: the transport's answer to the token's delivery is the handoff's ack (one RPC
    per hop instead of two).  Set only by a driver whose transport reports each ``Send(…, receipt)``
    as :class:`~hushnet.engine.events.Delivered` once the receiver's machine accepted it (the
    networked node: :meth:`hushnet.families.walk.WalkFamily.node_machine`); the simulator has no
    receipts and keeps ack messages.  See :meth:`WalkMachine.on_delivered` for why it is sound.
    """

    reliable: bool = True
    ack_timeout: float = 0.05
    max_retries: int = 3
    on_peer_down: str = "pause"
    pause_retry: float = 1.0
    progress_every: int = 0
    snapshot_every: int = 0
    prefetch_noise: bool = False
    link_receipts: bool = False

    def __post_init__(self) -> None:
        if self.on_peer_down not in ON_PEER_DOWN:
            raise ValueError(
                f"on_peer_down must be one of {ON_PEER_DOWN}, got {self.on_peer_down!r}"
            )
        if self.ack_timeout <= 0 or self.pause_retry <= 0 or self.max_retries < 0:
            raise ValueError("ack_timeout and pause_retry must be > 0, max_retries >= 0")


class WalkMachine(Protocol):
    """Base class of token-walk protocols (one instance per node)."""

    name: ClassVar[str] = "walk"

    def __init__(
        self,
        ctx: NodeContext,
        hop: HopRule,
        total_steps: int,
        dim: int,
        *,
        start: int = 0,
        options: WalkOptions | None = None,
    ) -> None:
        super().__init__(ctx)
        if total_steps < 1:
            raise ValueError("a walk needs at least one step")
        if not 0 <= start < ctx.n:
            raise ValueError(f"start node {start} outside 0..{ctx.n - 1}")
        self.hop = hop
        self.total = int(total_steps)
        self.dim = int(dim)
        self.start = int(start)
        self.opt = options or WalkOptions()
        self.contributions = 0  # visits that used this node's data
        self.visits = 0
        self.last_step = -1  # last step this node processed
        self._seen: dict[int, bytes] = {}  # step -> digest of the accepted token
        # the newest accepted token, kept whole until its digest is taken off the critical path (_settle)
        self._recent: tuple[int, bytes] | None = None
        self._pending: tuple[int, bytes, int, int] | None = None  # (dst, payload, step, attempts)
        self._down: set[int] = set()
        self._paused = False
        self._held: tuple[int, np.ndarray, int] | None = (
            None  # token kept while a handoff is unresolved
        )
        # the last token this node handed off and had acknowledged: (dst, step, x, aux) — the durable
        # copy the operator resumes from if its receiver never comes back (see :meth:`resume`)
        self._copy: tuple[int, int, np.ndarray, int] | None = None
        self._copy_payload: bytes | None = None  # the handoff's bytes: the checkpoint stores these
        # _seen in insertion order as the checkpoint writes it: sealed chunks of _SEEN_CHUNK records
        self._seen_sealed: list[bytes] = []
        self._seen_tail = bytearray()  # the records after the sealed chunks
        self._fenced: set[int] = set()  # lost holders whose tokens this run no longer accepts

    # ---- subclass hooks -------------------------------------------------------------------------

    def initial_token(self) -> tuple[np.ndarray, int, list[Action]]:
        """(vector, aux, actions) at the start node before step 0."""
        return np.zeros(self.dim), 0, []

    def visit(self, step: int, x: np.ndarray, aux: int) -> tuple[np.ndarray, int, list[Action]]:
        """One update by this node at global step ``step``: returns the new (vector, aux) and ledger actions."""
        raise NotImplementedError

    def final_result(self, x: np.ndarray, aux: int) -> tuple[np.ndarray | None, dict[str, Any]]:
        """(model, extra result fields) when the walk ends at this node."""
        return x, {}

    # ---- events ---------------------------------------------------------------------------------

    def on_start(self) -> list[Action]:
        if self.ctx.node != self.start:
            return []
        x, aux, acts = self.initial_token()
        return acts + self._advance(0, x, aux)

    def on_message(self, src: int, payload: bytes) -> list[Action]:
        kind = message_kind(payload)
        if kind == KIND_ACK:
            return self._on_ack(src, decode_ack(payload))
        if kind != KIND_TOKEN:
            raise MalformedMessage(f"unknown message kind {kind} for protocol {self.name}")
        if src in self._fenced:
            raise UnexpectedSender(
                f"node {src} was declared a lost holder of run {self.ctx.run_id} and the walk "
                "resumed without it; its tokens are refused"
            )
        tok = decode_token(payload, self.dim)
        if tok.total != self.total:
            raise MalformedMessage(
                f"token for a run of {tok.total} steps; this run has {self.total}"
            )
        if tok.recipient != self.ctx.node:
            raise MalformedMessage(
                f"token addressed to node {tok.recipient}, delivered to node {self.ctx.node}"
            )
        if not 1 <= tok.step < self.total:
            raise MalformedMessage(f"token step {tok.step} outside 1..{self.total - 1}")
        if self.ctx.view_model == "sender-known" and not self.hop.may_receive_from(src):
            raise UnexpectedSender(
                f"node {self.ctx.node} got a token from node {src}, which cannot hand it the token under the public rule"
            )
        recent = self._recent
        if (recent is not None and recent[0] == tok.step) or tok.step in self._seen:
            same = (
                recent[1] == payload
                if recent is not None and recent[0] == tok.step
                # a digest restored from an earlier version's checkpoint is BLAKE2b (digest_v0)
                else self._seen[tok.step] in (digest(payload), digest_v0(payload))
            )
            if same:  # a retransmission whose ack was lost: acknowledge again, do nothing
                return self._ack(src, tok.step)
            raise ReplayedMessage(
                f"step {tok.step} of run {self.ctx.run_id} already processed here, with other contents"
            )
        if tok.step <= self.last_step:
            raise ReplayedMessage(
                f"stale token: step {tok.step} of run {self.ctx.run_id}, but this node already handled step {self.last_step}"
            )
        if self.finished:
            raise ReplayedMessage(f"run {self.ctx.run_id} already finished at this node")
        self._settle()
        self._recent = (tok.step, payload)
        return self._ack(src, tok.step) + self._advance(tok.step, tok.vector, tok.aux)

    def _ack(self, src: int, step: int) -> list[Action]:
        """The ack message for an accepted token — none with ``link_receipts``: the transport's answer
        to this very delivery is the ack (it leaves when the driver ran this batch and, in a durable
        run, wrote its checkpoint)."""
        if self.opt.reliable and not self.opt.link_receipts:
            return [Send(src, encode_ack(step))]
        return []

    def on_timer(self, name: str) -> list[Action]:
        if name != _HANDOFF or self._pending is None:
            return []
        dst, payload, step, attempts = self._pending
        attempts += 1
        if attempts <= self.opt.max_retries:
            self._pending = (dst, payload, step, attempts)
            return [self._handoff(dst, payload, step), SetTimer(_HANDOFF, self.opt.ack_timeout)]
        if self.opt.on_peer_down == "pause":
            self._pending = (dst, payload, step, attempts)
            acts: list[Action] = []
            if not self._paused:
                self._paused = True
                acts.append(
                    Paused(
                        self.ctx.node,
                        step,
                        f"neighbour {dst} unreachable after {self.opt.max_retries} retries",
                    )
                )
            return acts + [
                self._handoff(dst, payload, step),
                SetTimer(_HANDOFF, self.opt.pause_retry),
            ]
        # deviate: record it, drop the dead neighbour from the row, re-sample
        self._pending = None
        self._down.add(dst)
        new_rule = self.hop.without(self._down)
        if new_rule is None:
            self._pending = (dst, payload, step, attempts)
            self._paused = True
            return [
                Paused(
                    self.ctx.node, step, f"no reachable neighbour left (down: {sorted(self._down)})"
                ),
                self._handoff(dst, payload, step),
                SetTimer(_HANDOFF, self.opt.pause_retry),
            ]
        self.hop = new_rule
        assert self._held is not None
        _, x, aux = self._held
        dev = Deviation(
            self.ctx.node, step, "peer-down", {"dead": dst, "excluded": sorted(self._down)}
        )
        return [dev] + self._forward(step, x, aux)

    def _settle(self) -> None:
        """Replace the newest accepted token by its digest.

        Hashing a token is the largest cost of a hop after the noise (≈ 20 ms for a 10⁶-float
        model), and it is only needed to tell a later retransmission from a replay.  So it is not
        done on arrival, before the token moves on: the whole payload is kept (one token, no copy)
        and compared byte for byte if the same step comes again soon; its digest is taken when the
        next holder acknowledges (the token has left — this node is idle) or, at the latest, when
        the next token arrives here.  (A durable walk's checkpoint needs the digest at once: it is
        SHA-256, ≈ 5.6 ms for 10⁶ floats and 61 µs for 10⁴ measured here, half BLAKE2b's time or
        less; see :func:`hushnet.families.walk.wire.digest`.)
        """
        if self._recent is not None:
            step, payload = self._recent
            d = self._seen[step] = digest(payload)
            self._recent = None
            self._seen_tail += _SEEN_REC.pack(step, d)
            if len(self._seen_tail) >= _SEEN_CHUNK * _SEEN_REC.size:
                self._seen_sealed.append(bytes(self._seen_tail))
                self._seen_tail = bytearray()

    def _reseal(self) -> None:
        """Rebuild the checkpoint's chunks of replay digests after ``_seen`` was replaced or filtered."""
        items = list(self._seen.items())
        full = len(items) - len(items) % _SEEN_CHUNK
        self._seen_sealed = [
            b"".join(_SEEN_REC.pack(*r) for r in items[i : i + _SEEN_CHUNK])
            for i in range(0, full, _SEEN_CHUNK)
        ]
        self._seen_tail = bytearray(b"".join(_SEEN_REC.pack(*r) for r in items[full:]))

    def on_delivered(self, dst: int, receipt: str) -> list[Action]:
        """The transport's receipt for a handoff (``link_receipts``): the same as an ack message.

        Why it is sound — the ledger and replay detection are untouched, only who tells the sender
        changes.  The node's ``Deliver`` answers after the receiving driver ran its machine on the
        token and, in a durable run, wrote the checkpoint holding it (the same point an ack message
        would have left).  A token the receiver *refused* (replayed with other contents, stale, from a
        fenced or impossible sender, wrong run or dimension, a run over there) makes ``Deliver`` fail
        with the refusal, so no receipt comes and the handoff is retried, then paused or deviated, as
        when no ack message came.  A retransmission the receiver recognises as one (same step, same
        bytes) is answered without any side effect there, and its receipt here is one more harmless
        ack.  A receipt is matched like an ack: only the pending handoff's receiver and step count,
        so a late receipt from a neighbour this node already deviated away from, or resumed around,
        does nothing.  One weaker case: a token that reaches a node before the operator started the
        run there is buffered in memory and answered at once (``RunDriver.on_message``); its receipt
        means "queued for the start", and if that node dies before the start, or its machine then
        refuses the token, the sender has already moved on: the walk stalls there until the operator
        declares that holder lost and resumes from this node's copy (a recorded deviation, as for any
        lost holder).  With ack messages it would have retried instead.
        """
        if not self.opt.link_receipts:
            return []
        try:
            step = int(receipt)
        except ValueError:
            return []  # not a handoff's receipt
        return self._on_ack(dst, step)

    def _on_ack(self, src: int, step: int) -> list[Action]:
        self._settle()
        if self._pending is None or self._pending[0] != src or self._pending[2] != step:
            return []  # late or duplicate ack: harmless
        payload = self._pending[1]
        self._pending = None
        if self._held is not None:
            self._copy = (src, *self._held)
            self._copy_payload = payload
        self._held = None
        acts: list[Action] = [CancelTimer(_HANDOFF)]
        if self._paused:
            self._paused = False
            acts.append(Metric("resumed", step, step, self.ctx.node))
        return acts

    # ---- durability (issue 14) ------------------------------------------------------------------

    def checkpoint(self) -> dict[str, Any]:
        """The walk's state at this node: generator state, counters, replay digests, the token it holds
        or has not had acknowledged, the last acknowledged handoff (the resume copy), excluded and
        fenced neighbours.  Subclasses add their own fields with :meth:`_checkpoint_extra`.

        Each token is in it once, as the bytes that were handed off: the held token is the pending
        handoff's payload (``"held": "pending"``) and the resume copy is the previous handoff's payload
        (``copy_payload``), which the run store already has from the last checkpoint, so a hop writes
        one new token.  Replay digests are chunks that never change once sealed (``seen_log``), so a
        hop does not rewrite the digests of the whole run either."""
        self._settle()
        held: Any = self._held
        if held is not None and self._pending is not None and self._is_pending(held):
            held = "pending"
        copy: Any = self._copy
        copy_payload = None
        if (
            copy is not None
            and self._copy_payload is not None
            and self._is_token(self._copy_payload, copy[1:])
        ):
            copy, copy_payload = None, (int(self._copy[0]), self._copy_payload)
        return {
            "rng": self.ctx.rng.bit_generator.state,
            "contributions": self.contributions,
            "visits": self.visits,
            "last_step": self.last_step,
            "finished": self.finished,
            "seen_log": (
                list(self._seen_sealed),
                bytes(self._seen_tail),
            ),
            "pending": self._pending,
            "held": held,
            "copy": copy,
            "copy_payload": copy_payload,
            "down": set(self._down),
            "fenced": set(self._fenced),
            "paused": self._paused,
            "extra": self._checkpoint_extra(),
        }

    def _is_pending(self, held: tuple[int, np.ndarray, int]) -> bool:
        assert self._pending is not None
        return held[0] == self._pending[2] and self._is_token(self._pending[1], held)

    @staticmethod
    def _is_token(payload: Any, token: tuple[int, np.ndarray, int]) -> bool:
        """Whether ``payload`` (a handoff's bytes) is exactly ``token`` = (step, vector, aux), bit for bit."""
        step, x, aux = token
        if not isinstance(payload, bytes) or message_kind(payload) != KIND_TOKEN:
            return False
        try:
            s, a, v = own_token(payload, copy=False)
        except Exception:  # noqa: BLE001 - not a plain token: the checkpoint keeps the token itself
            return False
        x = np.asarray(x)
        return (
            s == step
            and a == aux
            and x.dtype == np.float64
            and x.shape == v.shape
            and np.array_equal(x.view(np.uint64), v.view(np.uint64))
        )

    def restore(self, state: dict[str, Any]) -> list[Action]:
        """Load :meth:`checkpoint` into this (freshly built) machine; re-send an unacknowledged token."""
        self.ctx.rng.bit_generator.state = state["rng"]
        self.contributions = int(state["contributions"])
        self.visits = int(state["visits"])
        self.last_step = int(state["last_step"])
        self.finished = bool(state["finished"])
        if "seen_log" in state:
            chunks, tail = state["seen_log"]
            raw = b"".join([*chunks, tail])
            self._seen = {int(st): bytes(d) for st, d in _SEEN_REC.iter_unpack(raw)}
        else:  # a checkpoint written before the digests were chunked
            self._seen = {int(k): bytes(v) for k, v in state["seen"].items()}
        self._reseal()
        self._recent = None
        self._pending = None if state["pending"] is None else tuple(state["pending"])  # type: ignore[assignment]
        held = state["held"]
        if isinstance(held, str) and held == "pending":
            if self._pending is None:
                raise ValueError(
                    "damaged walk checkpoint: the held token is the pending one, none is pending"
                )
            step, aux, x = own_token(self._pending[1])
            held = (step, x, aux)
        self._held = None if held is None else tuple(held)  # type: ignore[assignment]
        self._copy, self._copy_payload = None, None
        if state.get("copy_payload") is not None:
            dst, payload = state["copy_payload"]
            step, aux, x = own_token(payload)
            self._copy, self._copy_payload = (int(dst), step, x, aux), bytes(payload)
        elif state["copy"] is not None:
            self._copy = tuple(state["copy"])  # type: ignore[assignment]
        self._down = {int(v) for v in state["down"]}
        self._fenced = {int(v) for v in state["fenced"]}
        self._paused = bool(state["paused"])
        if self._down:
            rule = self.hop.without(self._down)
            if rule is not None:
                self.hop = rule
        self._restore_extra(state.get("extra") or {})
        if self._pending is not None and not self.finished:
            dst, payload, step, _ = self._pending
            return [self._handoff(dst, payload, step), SetTimer(_HANDOFF, self.opt.ack_timeout)]
        return []

    def _checkpoint_extra(self) -> dict[str, Any]:
        return {}

    def _restore_extra(self, extra: dict[str, Any]) -> None:
        pass

    def whereabouts(self) -> dict[str, Any]:
        """Where the token is, as far as this node knows: the last step it processed, a handoff awaiting
        its ack (``pending_to``/``pending_step``), and its last acknowledged handoff (``passed_to``/
        ``passed_step``) — what the operator's watch uses to name a holder that stopped answering."""
        out: dict[str, Any] = {"last_step": self.last_step, "finished": self.finished}
        if self._pending is not None:
            out["pending_to"], out["pending_step"] = int(self._pending[0]), int(self._pending[2])
        if self._copy is not None:
            out["passed_to"], out["passed_step"] = int(self._copy[0]), int(self._copy[1])
        return out

    def resume(
        self, lost: set[int], *, take_up: bool = True, from_step: int | None = None
    ) -> list[Action]:
        """The operator declared ``lost`` (holders that never came back): refuse their tokens from now on,
        drop them from this node's row, and — if this node's last handoff went to one of them and
        nothing newer passed through here — take the walk up again from its copy of that token.

        Resuming is a deviation (the walk no longer follows the public W, and the copy's token is now
        seen by a second next holder), recorded as such: the operator's close then tops every node up
        to the local-DP bound, which holds for any number of observers of each noisy contribution.
        """
        lost = {int(v) for v in lost} - {self.ctx.node}
        self._fenced |= lost
        self._down |= lost
        rule = self.hop.without(self._down)
        if rule is not None:
            self.hop = rule
        if self.finished:
            return []
        if not take_up:
            # another node takes the walk up from its copy of step ``from_step``: everything this node
            # did from that step on belongs to the abandoned branch (its contributions stay counted
            # toward the cap and stay on the ledger — the safe side)
            if from_step is None:
                return []
            acts: list[Action] = []
            if self._pending is not None and self._pending[2] >= from_step:
                self._pending, self._held, self._paused = None, None, False
                acts.append(CancelTimer(_HANDOFF))
            if self._copy is not None and self._copy[1] >= from_step:
                self._copy, self._copy_payload = None, None
            self._settle()
            self._seen = {k: v for k, v in self._seen.items() if k < from_step}
            self._reseal()
            self.last_step = min(self.last_step, from_step - 1)
            return acts
        token = None
        if self._pending is not None and self._pending[0] in lost and self._held is not None:
            token = self._held
        elif self._pending is None and self._copy is not None and self._copy[0] in lost:
            token = self._copy[1:]
            self.last_step = min(self.last_step, int(token[0]) - 1)
        if token is None or rule is None:
            return []
        step, x, aux = token
        self._settle()
        self._seen = {k: v for k, v in self._seen.items() if k < step}
        self._reseal()
        self._pending = None
        self._held = None
        self._paused = False
        dev = Deviation(
            self.ctx.node,
            step,
            "holder-lost",
            {"dead": sorted(lost)[0], "lost": sorted(lost), "resumed_from": self.ctx.node},
        )
        return [
            CancelTimer(_HANDOFF),
            dev,
            Metric("resumed", step, step, self.ctx.node),
        ] + self._forward(step, x, aux)

    # ---- the walk -------------------------------------------------------------------------------

    def _advance(self, step: int, x: np.ndarray, aux: int) -> list[Action]:
        """Update at ``step`` and keep going while the next hop is this node (self-loop: no message)."""
        acts: list[Action] = []
        node = self.ctx.node
        opt = self.opt
        while True:
            x, aux, led = self.visit(step, x, aux)
            acts.extend(led)
            self.visits += 1
            self.last_step = step
            step += 1
            if opt.progress_every and step % opt.progress_every == 0:
                acts.append(Metric("step", step, step, node))
            if opt.snapshot_every and step % opt.snapshot_every == 0:
                acts.append(Metric("model", x.copy(), step, node))
            if step >= self.total:
                self.finished = True
                model, extra = self.final_result(x, aux)
                extra = {"contributions": self.contributions, **extra}
                acts.append(Finish(node, step, model, extra))
                return acts
            nxt = self.hop.sample(self.ctx.rng)
            if nxt != node:
                return acts + self._send_token(nxt, step, x, aux)

    def _forward(self, step: int, x: np.ndarray, aux: int) -> list[Action]:
        """Re-sample the next hop for a token already updated up to ``step`` (after a deviation)."""
        nxt = self.hop.sample(self.ctx.rng)
        if nxt == self.ctx.node:
            return self._advance(step, x, aux)
        return self._send_token(nxt, step, x, aux)

    def _send_token(self, dst: int, step: int, x: np.ndarray, aux: int) -> list[Action]:
        payload = encode_token(step, self.total, aux, dst, x)
        if not self.opt.reliable:
            return [Send(dst, payload)]
        self._pending = (dst, payload, step, 0)
        self._held = (step, x, aux)
        return [self._handoff(dst, payload, step), SetTimer(_HANDOFF, self.opt.ack_timeout)]

    def _handoff(self, dst: int, payload: bytes, step: int) -> Send:
        """The token's (re)transmission; with ``link_receipts`` it asks for the transport's receipt,
        named by the step (a retransmission asks for the same one)."""
        return Send(dst, payload, str(step) if self.opt.link_receipts else "")

    def ledger(
        self, step: int, kind: str, sensitivity: float, noise_std: float, **detail: Any
    ) -> LedgerEntry:
        return LedgerEntry.of_noise(self.ctx, self.name, step, kind, sensitivity, noise_std, detail)
