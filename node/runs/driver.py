"""The node driver: runs one engine machine of one run inside a networked node.

This is the networked twin of :mod:`hushnet.sim.simulator` / :mod:`hushnet.sim.loopback`: the same
machine, the same per-node generator, the same event order rules —

* ``RunStarted`` once, then every envelope of this run as ``MessageArrived(src_vertex, payload)``
  where ``src_vertex`` is the vertex of the peer the transport *authenticated* (mutual TLS, the
  certificate names the sender), and every expired timer as ``TimerFired``;
* actions executed in order by :func:`hushnet.engine.execute.execute` with this driver's
  :class:`NodeEffects`: ``Send`` → per-destination FIFO queue → ``Node.send``;
  ``SetTimer``/``CancelTimer`` → the event loop's clock; ``LedgerEntry`` → a charge on the node's
  persistent :class:`~hushnet.privacy.ledger.Ledger` (refused charge ⇒ the rest of the actions,
  in particular the ``Send`` carrying the contribution, are dropped and the run stops here: the
  data never leaves the node unaccounted); ``Metric``/``Deviation``/``Paused``/``Fault`` → the
  run's event stream (what ``run watch`` subscribers read); ``Finish`` → the final model.

Nothing here knows what a walk is: any :class:`~hushnet.engine.protocol.Protocol` runs in it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Awaitable, Callable, Mapping

import numpy as np

from hushnet.engine.actions import (
    CancelTimer,
    Deviation,
    Fault,
    Finish,
    LedgerEntry,
    Metric,
    Paused,
    Send,
    SetTimer,
)
from hushnet.engine.events import Delivered, MessageArrived, RunStarted, TimerFired
from hushnet.engine.execute import execute
from hushnet.engine.protocol import Protocol
from hushnet.privacy.conversions import CONVERSION_LABEL
from hushnet.privacy.distinct import convert_distinct
from hushnet.privacy.ledger import BudgetExceeded, Ledger
from hushnet.runs.accounting import (
    ContributionCost,
    dp_from_converted,
    dp_from_rdp_rows,
    paper_bound,
)
from hushnet.runs.spec import RunSpec
from hushnet.tasks.data import PublicEval

log = logging.getLogger("hushnet.runs")

#: ``send(node_id, payload)``; given ``next_seq``, the driver also calls it with ``seq=`` (the envelope's
#: number, kept when it sends the same bytes again — see :meth:`RunDriver._sender`), and with
#: ``started=`` (a callable the transport calls once, when the delivery is under way, e.g. the gRPC
#: call created; a transport that never calls it has it called when the send returns) when the batch
#: the envelope came from has zero-delay timers waiting for that moment (see :class:`_Soon`)
SendFn = Callable[..., Awaitable[Any]]

#: Envelopes of a run that arrive before the operator's ``run.start`` (a neighbour that was started a
#: moment earlier and already sent its token) are kept, at most this many and this many bytes per
#: run, and replayed in order at the start; beyond that they are refused (counted, logged once).
MAX_EARLY_MESSAGES = 256
MAX_EARLY_BYTES = 64 * 1024 * 1024

#: a failed delivery a machine asks to have sent again (``redeliver_for``) waits this long before its
#: first repeat, doubling up to :data:`REDELIVER_MAX_S` between repeats
REDELIVER_FIRST_S = 0.5
REDELIVER_MAX_S = 8.0
#: gRPC status names of a delivery that did not (or may not) reach the neighbour's run: worth repeating
TRANSIENT_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED"})
#: a neighbour's run refusals that mean "not yet", not "no": its early buffer was full before its start
TRANSIENT_REFUSALS = frozenset({"not-started"})
#: one log line per kind of failed delivery per this many seconds (the count is in the run status)
FAILURE_LOG_EVERY_S = 10.0

#: states a run goes through at one node
STATES = ("accepted", "running", "paused", "finished", "closed", "stopped", "cancelled")
TERMINAL = ("finished", "closed", "stopped", "cancelled")


class RunRefused(ValueError):
    """Something a run refuses, with a code: a peer's message (the machine's Fault, a run that is over)
    or an operator's request (e.g. ``run.gradient``).  A ``ValueError`` so the node's control channel
    reports it as an expected refusal (``code: message``, no traceback); the sender is told why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


@dataclass
class Timings:
    accepted: float = field(default_factory=time.time)
    started: float | None = None  # the operator's run.start reached the node (acknowledged)
    #: the machine got ``RunStarted`` (its first round's work ran): after ``started``, on the host's
    #: start queue (:class:`hushnet.runs.service.StartQueue`), so a host acknowledges all its starts first
    begun: float | None = None
    finished: float | None = None
    closed: float | None = None

    def to_dict(self) -> dict[str, Any]:
        wall = None
        if self.started is not None:
            end = self.finished or self.closed
            wall = None if end is None else end - self.started
        return {
            "accepted": self.accepted,
            "started": self.started,
            "begun": self.begun,
            "finished": self.finished,
            "closed": self.closed,
            "run_seconds": wall,
        }


class _Soon:
    """A zero-delay timer (``SetTimer(name, 0)``) of a batch that sends, held until the batch's last
    message is under way.

    Why: a machine sets one for work that must not delay its messages — the walk draws the next
    visit's noise while the token is away, an onion relay does its work after its ack.  On the event
    loop a zero-delay timer ran *before* the send it was meant to follow: the sender task wakes one
    step later, and gRPC starts a call from a task of its own one step after that.  Measured at
    n = 16 (10⁴ floats): every hop's noise draw (0.34 ms) ran between the receiver's checkpoint and its
    send, 15 % of the hop.  Held like this, it runs once the transport has the envelope.

    It is still a timer: cancelled or replaced by name like any other, and fired through
    :meth:`RunDriver._fire`.  It waits only for a send that starts at once — a destination whose sender
    is idle; behind a busy destination it fires on the next loop step, as before."""

    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass(slots=True)
class _Queued:
    """An envelope in a destination's queue: its bytes, the receipt it asks for, when it was queued, and
    what waits for its delivery to be under way (see :meth:`RunDriver._release`)."""

    payload: bytes
    receipt: str
    queued: float
    after: list[Callable[[], None]] = field(default_factory=list)


class RunDriver:
    """One run at one node: feeds the machine, executes its actions, keeps the event stream.

    ``ids[v]`` is the node id of vertex ``v`` (from the network directory); ``send(node_id,
    payload)`` delivers protocol bytes to a neighbour (``Node.send`` bound to this run).
    ``ledger``/``cost`` charge every contribution; without them (simulation-style tests) the
    driver only records the entries.
    """

    def __init__(
        self,
        spec: RunSpec,
        vertex: int,
        ids: list[str],
        machine: Protocol,
        send: SendFn,
        *,
        ledger: Ledger | None = None,
        cost: ContributionCost | None = None,
        W: Any = None,
        decision: dict[str, Any] | None = None,
        journal: Callable[[LedgerEntry], None] | None = None,
        public_eval: PublicEval | None = None,
        store: Any = None,
        next_seq: Callable[[str], int] | None = None,
    ) -> None:
        self.spec = spec
        self.run_id = spec.run_id
        self.vertex = vertex
        self.ids = list(ids)
        self.vertex_of = _vertex_index(self.ids)
        self.node_id = self.ids[vertex]
        self.machine = machine
        self._send = send
        #: the next envelope number toward a node (``Node.next_seq`` for this run), or None: a failed
        #: delivery is sent again under the same number only (see :meth:`_sender`)
        self._next_seq = next_seq
        self.ledger = ledger
        self.cost = cost
        self.W = _shared_matrix(W)  # read only by the report (the paper's row)
        self.decision, self._projected = _compact_decision(decision or {}, self.ids, vertex)
        self.journal = (
            journal  # durable record of every engine ledger entry (gossip schedule rows), or None
        )
        self.public_eval = public_eval  # public data the final model's loss is reported on, or None
        self.state = "accepted"
        self.reason = ""
        self.timings = Timings()
        self.events: list[dict[str, Any]] = []
        self._cond = asyncio.Condition()
        self._timers: dict[str, asyncio.TimerHandle | _Soon] = {}
        self._queues: dict[str, asyncio.Queue] = {}
        self._workers: dict[str, asyncio.Task] = {}
        #: destinations whose sender is delivering (not waiting for its queue)
        self._sending: set[str] = set()
        self.engine_entries: list[LedgerEntry] = []
        # the (targets, orders) row charged for this run (``run_rdp``): an array kept as it is, or — for
        # charges of ContributionCost.rows(σ), a walk's — a replay log summed only when asked (see
        # _add_run_rdp): the array the logged additions start from, the additions [[σ, count], …] and
        # where each one's rows come from (a ContributionCost — rows built when asked — or fixed rows)
        self._rdp_value: np.ndarray | None = None
        self._rdp_base: np.ndarray | None = None
        self._rdp_log: list[list] = []
        self._rdp_srcs: list[Any] = []
        self.contributions = 0
        self.noise_visits = 0
        self.deviations: list[dict[str, Any]] = []
        self.faults: list[dict[str, Any]] = []
        self.model: np.ndarray | None = None
        self.finish_step: int | None = None
        self.finish_result: dict[str, Any] = {}
        self.messages_in = 0
        self.messages_out = 0
        self.send_failures = 0
        self.redeliveries = 0  # failed deliveries sent again (machines with ``redeliver_for``)
        self._failure_logged: dict[str, float] = {}  # kind of failure → when it was last logged
        #: neighbours that refused this run's envelopes as closed there (the run is held: _closed_at)
        self.closed_by: set[str] = set()
        #: called with the first such neighbour (the node's service asks for the close record at once)
        self.on_peer_closed: Callable[[str], None] | None = None
        #: the last batch could not be checkpointed (nothing of it left): a message it came from is refused
        self._unsaved = False
        self.last_step = -1
        self.topped_up = False
        #: the machine got ``RunStarted`` (see :meth:`mark_started` / :meth:`begin`)
        self._begun = False
        self._early: list[
            tuple[str, bytes]
        ] = []  # (sender, payload) received before the machine's start
        self._early_bytes = 0
        self.early_dropped = 0
        # durable runs (issue 14): a RunStore and a machine with checkpoint/restore hooks
        self.store = store if (store is not None and getattr(machine, "durable", False)) else None
        self.used_sigmas: dict[
            float, int
        ] = {}  # noise multiplier → data contributions (for a top-up)
        self.ledger_credit = (
            0  # data charges already on the ledger for steps a restored machine redoes
        )
        self.restored = 0  # how many times this run was restored from disk at this node
        self._event_base = 0  # events before the last restart are gone; seq numbers go on from here
        self.checkpoints = 0
        self.checkpoint_seconds = 0.0
        #: seconds this node spent handling its run's envelopes (machine, charges, checkpoints: a hop's
        #: work at its receiver, which the report sets beside the hop's whole time)
        self.handle_seconds = 0.0
        self._journal_pending: list[
            LedgerEntry
        ] = []  # durable run: journal entries of the batch in progress

    # ------------------------------------------------------------------ event stream
    def _emit(self, kind: str, **fields: Any) -> None:
        self.events.append(
            {
                "seq": self._event_base + len(self.events),
                "t": time.time(),
                "node": self.node_id,
                "type": kind,
                **fields,
            }
        )
        asyncio.get_event_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._cond:
            self._cond.notify_all()

    async def wait_events(self, after: int, wait: float) -> list[dict[str, Any]]:
        """Events with ``seq >= after``; waits up to ``wait`` seconds for one (long poll)."""

        def seq_end() -> int:
            return self._event_base + len(self.events)

        if seq_end() <= after and wait > 0 and self.state not in TERMINAL:
            async with self._cond:
                try:
                    await asyncio.wait_for(
                        self._cond.wait_for(lambda: seq_end() > after or self.state in TERMINAL),
                        wait,
                    )
                except asyncio.TimeoutError:
                    pass
        return self.events[max(0, after - self._event_base) :]

    def next_seq(self) -> int:
        """The seq number the next event will carry (a watcher's cursor after reading everything)."""
        return self._event_base + len(self.events)

    # ------------------------------------------------------------------ inputs
    def start(self) -> None:
        """Deliver ``RunStarted`` now — the operator's ``run.start`` (idempotent): :meth:`mark_started`
        then :meth:`begin` in one go.  The node's service splits the two (its host's start queue)."""
        self.mark_started()
        self.begin()

    def mark_started(self) -> bool:
        """The operator started the run here: state ``running``, the ``started`` event — no machine work.

        Why split from :meth:`begin`: the first round's work (Muffliato-GD: a gradient, noise, a ledger
        charge toward every node, a checkpoint, the first messages) done inline in ``run.start`` made a
        host acknowledge its nodes one after the other (issue 12: 82 s from the first start to the last
        at n = 2048), so early nodes waited for late ones.  A host now marks all its nodes started in one
        cheap sweep and runs their first rounds as scheduled work.  Until :meth:`begin` the machine sees
        nothing: envelopes are buffered as before the start.  True if this call started the run.

        A durable run records the start before it is answered (state ``running``, no machine yet): a node
        that dies before its first round restarts it (:meth:`restore`), as it did when the start's own
        first checkpoint was the record — not left ``accepted`` while the operator thinks it started.  A
        record that cannot be written stops the run here (the operator's status says why)."""
        if self.state != "accepted":
            return False
        self.state = "running"
        self.timings.started = time.time()
        self._emit("started")
        if self.store is not None:
            try:
                self.persist()
            except Exception as exc:  # noqa: BLE001 - not on disk: the run must not start here
                self._stop(f"cannot record the run's start durably ({exc})")
        return True

    @property
    def begun(self) -> bool:
        """The machine got ``RunStarted`` (envelopes reach it instead of the early buffer)."""
        return self._begun

    def begin(self) -> None:
        """The machine's ``RunStarted`` (its first round's work), then, in arrival order, the envelopes
        neighbours sent before it.  Once, and only for a run marked started and not over since."""
        if self._begun or self.state != "running":
            return
        self._begun = True
        self.timings.begun = time.time()
        self._execute(self.machine.handle(RunStarted()), persist=True)
        early, self._early, self._early_bytes = self._early, [], 0
        for sender, payload in early:
            if self.state in TERMINAL:
                break
            self.messages_in += 1
            # a fault here cannot be returned to its sender any more: it is recorded (event, report)
            self._execute(self.machine.handle(MessageArrived(self.vertex_of[sender], payload)))

    def on_message(self, sender: str, payload: bytes) -> None:
        """An authenticated envelope of this run from ``sender``; raises :class:`RunRefused` on a fault.

        Before the operator's ``run.start`` nothing reaches the machine: a neighbour cannot start a run
        here (and make this node charge its ledger and send its data) by sending anything for it.  The
        envelope is buffered for the start instead — a started neighbour's token legitimately races
        ahead of our own ``run.start`` — up to :data:`MAX_EARLY_MESSAGES` / :data:`MAX_EARLY_BYTES`; so
        is one that arrives after ``run.start`` but before the machine's own start (:meth:`begin`).
        """
        if self.state in TERMINAL and not self._serves_finished():
            raise self._over()
        src = self.vertex_of.get(sender)
        if src is None:
            raise RunRefused(
                "unknown-sender", f"{sender} is not a vertex of run {self.run_id}'s graph"
            )
        if not self._begun:
            if (
                len(self._early) < MAX_EARLY_MESSAGES
                and self._early_bytes + len(payload) <= MAX_EARLY_BYTES
            ):
                self._early.append((sender, bytes(payload)))
                self._early_bytes += len(payload)
                return
            self.early_dropped += 1
            if self.early_dropped == 1:
                log.warning(
                    "run %s at %s: more than %d envelopes (or %d bytes) arrived before it was started; "
                    "refusing further ones until run.start (count in run status: early_dropped)",
                    self.run_id,
                    self.node_id,
                    MAX_EARLY_MESSAGES,
                    MAX_EARLY_BYTES,
                )
            raise RunRefused(
                "not-started",
                f"run {self.run_id} has not been started at {self.node_id} yet "
                f"and {len(self._early)} early envelopes are already waiting",
            )
        self.messages_in += 1
        self._unsaved = False
        t0 = time.perf_counter()
        try:
            faults = self._execute(self.machine.handle(MessageArrived(src, payload)))
        finally:
            self.handle_seconds += time.perf_counter() - t0
        if faults:
            err = faults[0].error
            raise RunRefused(getattr(err, "code", "protocol-error"), str(err))
        if (
            self._unsaved
        ):  # the answer is a transport receipt (link_receipts): never for what is not on disk
            raise RunRefused("not-durable", f"run {self.run_id} at {self.node_id}: {self.reason}")

    def _serves_finished(self) -> bool:
        """A finished run whose machine still answers peers (a restarted ``secagg-dpsgd`` node catching up
        asks for the outcomes it missed, the last round's included); closed or stopped runs answer nothing."""
        return self.state == "finished" and bool(
            getattr(self.machine, "serves_when_finished", False)
        )

    def _fire(self, name: str) -> None:
        self._timers.pop(name, None)
        if (
            self.state in TERMINAL or self.closed_by
        ):  # over, or held for the close record (_closed_at)
            return
        self._execute(self.machine.handle(TimerFired(name)))

    # ------------------------------------------------------------------ actions
    def _execute(self, actions: list, *, persist: bool = False) -> list[Fault]:
        """Carry out a batch through :class:`NodeEffects`; returns the batch's faults (the sender is told).

        Durable run: a batch that sends, finishes or deviates is checkpointed after its ledger charges
        and before any of its messages leave (the sends are held back until then) — so an ack only
        ever leaves for a token already on disk.  A checkpoint that cannot be written stops the run
        and nothing of the batch is sent."""
        fx = NodeEffects(self)
        if self.store is None:
            execute(actions, fx)
            self._release(fx)
            return fx.faults
        fx.outbox = []
        execute(actions, fx)
        # a batch that journals is checkpointed too (before its journal): the journal never runs ahead of
        # the checkpoint, so a restored machine re-journals exactly what is on disk (never a different
        # record of a round the journal already holds — a restored gossip node stopped on that)
        if (
            persist
            or fx.outbox
            or fx.changed
            or self._journal_pending
            or self.machine.checkpoint_every_event
        ):
            try:
                self.persist()
            except Exception as exc:  # noqa: BLE001 - not on disk: nothing of this batch may leave
                self._journal_pending = []
                self._unsaved = True
                self._stop(
                    f"cannot write the run's checkpoint ({exc}); nothing of this step was sent"
                )
                self._release(fx)
                return fx.faults
        if self._journal_pending and not self._flush_journal():
            self._release(fx)
            return fx.faults
        for dst, payload, receipt in fx.outbox:
            fx.last_sent = self._enqueue(dst, payload, receipt)
        self._release(fx)
        return fx.faults

    def _release(self, fx: NodeEffects) -> None:
        """Schedule the batch's zero-delay timers: once its last message is under way when that message
        goes out at once (its destination's sender was idle), else on the next loop step (see
        :class:`_Soon`).  Sends to other destinations queued earlier in the batch woke their senders
        first, so they are under way by then too."""
        if not fx.soon:
            return
        soon, fx.soon = fx.soon, []
        loop = asyncio.get_event_loop()

        def fire() -> None:
            for name, handle in soon:
                loop.call_soon(self._fire_soon, name, handle)

        if fx.last_sent is not None:
            fx.last_sent.after.append(fire)
        else:
            fire()

    def _fire_soon(self, name: str, handle: _Soon) -> None:
        if not handle.cancelled and self._timers.get(name) is handle:
            self._fire(name)

    # ------------------------------------------------------------------ durability
    def durable_state(self) -> dict[str, Any]:
        """The driver's part of a checkpoint (the machine adds its own)."""
        return {
            "state": self.state,
            "reason": self.reason,
            "contributions": self.contributions,
            "noise_visits": self.noise_visits,
            "used_sigmas": dict(self.used_sigmas),
            "last_step": self.last_step,
            "topped_up": self.topped_up,
            "run_rdp": None if self._rdp_logged() else self.run_rdp,
            "run_rdp_log": (
                {
                    "base": self._rdp_base,
                    "ops": [list(op) for op in self._rdp_log],
                    # what each entry's rows are built from (a walk: its sealed slopes, 16 kB at n = 2048,
                    # the same array every hop: the store writes it once), not the 2.6 MB rows
                    "sources": [_source_doc(src) for src in self._rdp_srcs],
                }
                if self._rdp_logged()
                else None
            ),
            "model": self.model,
            "finish_step": self.finish_step,
            "finish_result": self.finish_result,
            "deviations": self.deviations,
            "faults": self.faults[-50:],
            "started": self.timings.started,
            "finished": self.timings.finished,
            "restored": self.restored,
            "event_base": self.next_seq(),
            "messages_in": self.messages_in,
            "messages_out": self.messages_out,
        }

    def persist(self) -> None:
        """Write the run's checkpoint (driver and machine) in one fsync'd transaction."""
        if self.store is None:
            return
        t0 = time.perf_counter()
        # not begun: nothing of the machine to keep (a restored ``running`` run without one starts it)
        machine = None if not self._begun else self.machine.checkpoint()
        self.store.checkpoint(self.run_id, self.state, self.reason, self.durable_state(), machine)
        self.checkpoints += 1
        self.checkpoint_seconds += time.perf_counter() - t0

    def restore(
        self,
        driver: dict[str, Any] | None,
        machine: dict[str, Any] | None,
        state: str,
        reason: str,
        charged: int,
    ) -> None:
        """Put a run read back from the store in motion again after the node restarted.

        ``charged`` is the number of data entries of this run on the node's ledger: those beyond
        the checkpoint's count were charged for a step the node had not checkpointed when it died;
        the restored machine redoes that step identically (same token, same generator state), so
        the next that-many charges are not repeated (``ledger_credit``)."""
        self.restored = 1
        if driver is not None:
            self.contributions = int(driver["contributions"])
            self.noise_visits = int(driver["noise_visits"])
            self.used_sigmas = {float(k): int(v) for k, v in driver["used_sigmas"].items()}
            self.last_step = int(driver["last_step"])
            self.topped_up = bool(driver["topped_up"])
            log = driver.get("run_rdp_log")
            if log is not None:
                self._rdp_srcs = self._replay_run_rdp(log)
                self._rdp_value = None
                self._rdp_base = log.get("base")
                self._rdp_log = [[float(sg), int(c)] for sg, c in log["ops"]]
                if not self._rdp_log:
                    # nothing logged: the base is the row (a log always has an op)
                    self.run_rdp = self._rdp_base
            else:
                self.run_rdp = driver["run_rdp"]
            self.model = driver["model"]
            self.finish_step = driver["finish_step"]
            self.finish_result = driver["finish_result"] or {}
            self.deviations = list(driver["deviations"])
            self.faults = list(driver["faults"])
            self.timings.started = driver["started"]
            self.timings.finished = driver["finished"]
            self.restored = int(driver.get("restored", 0)) + 1
            self._event_base = int(driver["event_base"])
            self.messages_in = int(driver.get("messages_in", 0))
            self.messages_out = int(driver.get("messages_out", 0))
        self.ledger_credit = max(0, int(charged) - sum(self.used_sigmas.values()))
        self.state, self.reason = state, reason
        if state == "accepted":
            return
        self._begun = True  # below: the machine is restored, or (no checkpoint of it) started again
        if state in TERMINAL:
            if self._serves_finished() and machine is not None:
                # it answers catch-up requests from its history, and re-sends what may not have left
                # between its last checkpoint and the kill (a secagg-dpsgd leader's last outcome)
                self._execute(self.machine.restore(machine))
            return
        self._emit("restored", step=self.last_step, ledger_credit=self.ledger_credit)
        if (
            machine is None
        ):  # started, but died before its first checkpoint: start the machine again
            self._execute(self.machine.handle(RunStarted()), persist=True)
            return
        acts = self.machine.restore(machine)
        if (
            self.journal is not None
        ):  # records the checkpoint has but the crash kept from the journal
            self._journal_pending = list(getattr(self.machine, "journal_entries", lambda: [])())
            if not self._flush_journal():
                return
        self._execute(acts, persist=bool(acts))

    def resume(
        self, lost: list[str], *, take_up: bool = True, from_step: int | None = None
    ) -> dict[str, Any]:
        """The operator declared ``lost`` holders gone: see :meth:`hushnet.families.walk.walker.WalkMachine.resume`."""
        fn = getattr(self.machine, "resume", None)
        if fn is None:
            raise RunRefused(
                "not-resumable", f"{self.spec.protocol} runs cannot be resumed from a copy"
            )
        if self.state in TERMINAL:
            raise self._over()
        unknown = [n for n in lost if n not in self.vertex_of]
        if unknown:
            raise RunRefused(
                "unknown-node", f"{', '.join(unknown)} not in run {self.run_id}'s graph"
            )
        before = len(self.deviations)
        self._execute(
            fn({self.vertex_of[n] for n in lost}, take_up=take_up, from_step=from_step),
            persist=True,
        )
        return {**self.status(), "resumed_here": len(self.deviations) > before}

    def whereabouts(self) -> dict[str, Any] | None:
        fn = getattr(self.machine, "whereabouts", None)
        if fn is None or not self._begun:
            return None
        w = fn()
        for k in ("pending_to", "passed_to"):
            if k in w:
                w[k] = self.ids[w[k]]
        return w

    def note_progress(self, step: int) -> None:
        """Record that the machine reached ``step`` outside a ``step`` metric (e.g. a served request) and
        tell subscribers."""
        self.last_step = max(self.last_step, int(step))
        self._emit("progress", step=self.last_step, contributions=self.contributions)

    def _final_loss(self) -> dict[str, Any]:
        """Loss (and accuracy) of the final model on the spec's public evaluation data, when it names some.

        Only the *final* model is scored: it is released to the operator anyway (docs/design/spec/randomwalk.md §E.1), so a
        function of it on public rows reveals nothing more.  Intermediate models are never scored
        for subscribers — early iterates carry one node's noisy gradient with none of the later
        noise, and no accountant here covers an operator who watches them — and a loss on the
        node's own rows would release its data outright.  So progress events before the finish
        carry no loss, by design.
        """
        if self.public_eval is None or self.model is None:
            return {}
        try:
            m = self.public_eval.evaluate(self.model)
        except Exception as exc:  # noqa: BLE001 - a scoring failure must not lose the finished model
            log.warning(
                "run %s: cannot score the final model on %s: %s",
                self.run_id,
                self.public_eval.name,
                exc,
            )
            return {
                "loss_note": f"cannot score the final model on {self.public_eval.name}: {exc}"[:300]
            }
        out: dict[str, Any] = {
            "loss": m.get("loss"),
            "loss_data": self.public_eval.name,
            "loss_of": "final model",
        }
        if "accuracy" in m:
            out["accuracy"] = m["accuracy"]
        return out

    def _flush_journal(self) -> bool:
        """Durable run: write the batch's journal entries, after its checkpoint and before its sends (so a
        crash between the two leaves records the checkpoint already has: :meth:`restore` writes them)."""
        pending, self._journal_pending = self._journal_pending, []
        for ev in pending:
            try:
                self.journal(ev)  # type: ignore[misc]
            except Exception as exc:  # noqa: BLE001 - not on disk: nothing after it may leave the node
                self._stop(
                    f"cannot record the {ev.kind} entry of step {ev.step} durably ({exc}); "
                    "nothing after it was sent"
                )
                return False
        return True

    def prepare_charges(self) -> int:
        """Have the ledger prove, before the run starts, how many contributions at the machine's σ fit the
        node's budget (:meth:`~hushnet.privacy.ledger.Ledger.prepare_repeat`), so that every visit within
        it — the first too — is charged by reference; returns that number (0: nothing prepared, the
        visits take the exact path).  Called by the run service when the node accepts a walk.

        Why: a walk's first visit of each node did the O(n) check and write on the token's path (issue
        12: the first-visit phase of the 2048-node walk ran at ~60 hops/s, the rest at ~300)."""
        # the σ the machine's data visits report (a machine that does not say is not prepared for)
        sigma = float(getattr(self.machine, "contribution_sigma", 0.0) or 0.0)
        if (
            type(self.cost) is not ContributionCost
            or self.ledger is None
            or self.ledger_credit > 0
            or not (math.isfinite(sigma) and sigma > 0)
        ):
            return 0
        ev = LedgerEntry(
            self.vertex, 0, "gradient", self.spec.view_model, 1.0, sigma, sigma,
            self.spec.protocol, self.run_id,
        )  # fmt: skip
        return self.ledger.prepare_repeat(
            self.cost.entry(ev, self.run_id, self.node_id), self.cost.repeat_key(sigma)
        )

    def _charge(self, ev: LedgerEntry) -> bool:
        self.engine_entries.append(ev)
        if self.journal is not None and self.store is not None:
            self._journal_pending.append(ev)  # written with the batch's checkpoint (see _execute)
        elif self.journal is not None:
            try:
                self.journal(ev)
            except Exception as exc:  # noqa: BLE001 - not on disk: nothing after it may leave the node
                self._stop(
                    f"cannot record the {ev.kind} entry of step {ev.step} durably ({exc}); "
                    "nothing after it was sent"
                )
                return False
        if not ev.uses_data:  # noise-only visit, or a gossip round's schedule record
            self.noise_visits += ev.kind == "noise"
            return True
        self.used_sigmas[float(ev.sigma)] = self.used_sigmas.get(float(ev.sigma), 0) + 1
        if self.cost is not None:
            # a walk's contribution costs the same rows at every visit (one σ): the ledger charges a
            # visit it has proven within budget by reference, without building the rows (issue 12)
            key = None
            if type(self.cost) is ContributionCost and math.isfinite(ev.sigma) and ev.sigma > 0:
                key = self.cost.repeat_key(float(ev.sigma))
            if (
                key is not None
                and self.ledger_credit <= 0
                and self.ledger is not None
                and self.ledger.charge_repeat(
                    key, self.run_id, ev.protocol, ev.view_model, self.cost.note(ev)
                )  # durable (committed) before the Send below runs
            ):
                self._log_charge(self.cost, float(ev.sigma))
                self.contributions += 1
                return True
            try:
                entry = self.cost.entry(ev, self.run_id, self.node_id)
            except ValueError as exc:  # an entry this node cannot account: the data must not leave
                self._stop(f"cannot account the {ev.kind} contribution at step {ev.step}: {exc}")
                return False
            if self.ledger_credit > 0:  # charged before the crash, for this very step (see restore)
                self.ledger_credit -= 1
            elif self.ledger is not None:
                try:
                    self.ledger.charge(
                        entry, report=False, repeat=key
                    )  # durable (committed) before the Send below runs
                except BudgetExceeded as exc:
                    self.used_sigmas[float(ev.sigma)] -= 1
                    self._stop(
                        f"privacy budget exhausted at step {ev.step}: {exc}; the contribution was not sent"
                    )
                    return False
            if type(self.cost) is ContributionCost:
                # the entry's rows are the cost's per-σ curves in target order (what the stack below
                # builds, without n lookups per hop), and the sum is replayable from σ alone
                self._log_charge(self.cost, float(ev.sigma))
            elif self._no_run_rdp() or _any_nonzero(entry):
                # the entry's own (targets × orders) matrix when it has one in the cost's target order
                # (no restacking of n rows); an all-zero entry (Muffliato-GD's steps after the first)
                # leaves the sum as it is: no new n × 159 array per step and node (issue 12)
                rows = entry.rows
                if rows is None or list(entry.rdp) != [str(t) for t in self.cost.targets]:
                    rows = (
                        np.stack([entry.rdp[t] for t in self.cost.targets])
                        if self.cost.targets
                        else np.zeros((0, 1))
                    )
                self._add_run_rdp(rows)
        self.contributions += 1
        return True

    @property
    def run_rdp(self) -> np.ndarray | None:
        """The (targets × orders) RDP this run charged here (``None``: nothing yet).

        A walk's row is not kept: it is summed from the replay log when asked (a report, a top-up) —
        the same additions in the same order as a running sum, so bit for bit the same array.  Why: at
        n = 2048 the row is 2.6 MB a node, and a node holds it for the whole run while it is read only by
        the operator's report (issue 12: 2 048 visited nodes did not fit this machine)."""
        if not self._rdp_log:
            return self._rdp_value
        r = self._rdp_base
        for (sigma, count), src in zip(self._rdp_log, self._rdp_srcs):
            c = src.rows(sigma) if isinstance(src, ContributionCost) else src
            for _ in range(int(count)):
                if r is None:
                    r = c.copy()
                elif r is self._rdp_base:
                    r = r + c  # the base is not ours to change
                else:
                    r += c  # the array made here: in place (the same sums as ``r + c``)
        return r

    @run_rdp.setter
    def run_rdp(self, value: np.ndarray | None) -> None:
        """Set the row outside the log (a top-up, a family's settlement): the next logged charge starts
        a new log from it."""
        self._rdp_value = value
        self._rdp_base, self._rdp_log, self._rdp_srcs = None, [], []

    def _no_run_rdp(self) -> bool:
        """Whether nothing was charged to the run's row yet (without summing a log)."""
        return not self._rdp_log and self._rdp_value is None

    def _add_run_rdp(self, curves: np.ndarray) -> None:
        """``run_rdp += curves`` for charges that are not a cost's per-σ rows (a gossip phase): kept as an
        array (and the checkpoint keeps it)."""
        prev = self.run_rdp
        if prev is None and not curves.flags.writeable:
            # nobody can change it and this path never adds in place: kept, not copied (a gossip
            # cost's charged row: the cost and the driver share one n × 159 array)
            self.run_rdp = curves
        else:
            self.run_rdp = curves.copy() if prev is None else prev + curves

    def _log_charge(self, src: ContributionCost, sigma: float) -> None:
        """``run_rdp += src.rows(sigma)``, noted in the replay log instead of summed.

        Why a log: the run's row is (targets × orders) — 2.6 MB at n = 2048 — and it changes every hop, so a
        durable walk wrote a new megabyte into its checkpoint per hop (22 ms of a 33 ms hop measured
        here), and every hosted node kept its own sum (and its own rows) for the whole run.  The driver
        holds ``[[σ, count], …]`` and the cost each entry's rows come from (plus the array the additions
        started from, if anything changed ``run_rdp`` outside them: a top-up, a restored older checkpoint);
        :attr:`run_rdp` and :meth:`restore` replay the same additions in the same order — bit for bit the
        same sum.

        The checkpoint keeps what the rows are built from — the cost's slopes and α_max, an element-wise
        function of which the rows are — not the rows, and not a recomputation of them: the walk's slopes
        come from an all-pairs eigendecomposition whose rounding depends on the BLAS thread count, so a
        restarted process could replay a sum up to ~1e-14 relative below the one the run had reported — a
        certified number must not shrink through a restart.  An entry is continued only by the same cost
        object; a restarted process's own cost starts a new entry (its later charges are its ledger's)."""
        if not self._rdp_log:  # the log starts here, from whatever the row was (None: nothing)
            self._rdp_base, self._rdp_srcs = self._rdp_value, []
            self._rdp_value = None
        if self._rdp_log and self._rdp_log[-1][0] == sigma and self._rdp_srcs[-1] is src:
            self._rdp_log[-1][1] += 1
        else:
            self._rdp_log.append([sigma, 1])
            self._rdp_srcs.append(src)

    def _rdp_logged(self) -> bool:
        """Whether ``run_rdp`` is ``_rdp_base`` plus the logged additions (what the checkpoint holds)."""
        return bool(self._rdp_log)

    def _replay_run_rdp(self, log: dict[str, Any]) -> list[Any]:
        """Where the rows of a checkpoint's replay log come from (see :meth:`_log_charge`), checked: a cost
        rebuilt from the slopes the checkpoint kept (this node's own cost when they are its slopes, bit for
        bit), or fixed rows (a log written while the checkpoint kept the rows themselves), or — a log
        written before either (``[[σ, count]]`` only) — this process's cost, as it was then."""
        if type(self.cost) is not ContributionCost:
            raise ValueError(
                "damaged run checkpoint: a replay log of the run's charges, but no per-σ cost"
            )
        ops = log["ops"]
        sources, kept = log.get("sources"), log.get("rows")
        for name, got in (("sources", sources), ("rows", kept)):
            if got is not None and len(got) != len(ops):
                raise ValueError(
                    f"damaged run checkpoint: {len(ops)} replay-log entries but {len(got)} {name}"
                )
        cost = self.cost
        shape = (len(cost.targets), cost.orders.size)
        base = log.get("base")
        if base is not None and tuple(np.shape(base)) != shape:
            raise ValueError(
                f"damaged run checkpoint: a replay-log base of shape {np.shape(base)}, expected {shape}"
            )
        built: dict[tuple, ContributionCost] = {}
        srcs: list[Any] = []
        for i, (sigma, count) in enumerate(ops):
            if int(count) < 1:
                raise ValueError(f"damaged run checkpoint: a replay-log entry of {count} charges")
            if sources is not None:
                srcs.append(self._source(sources[i], built))
            elif kept is not None:
                buf = bytes(kept[i])
                if len(buf) != 8 * shape[0] * shape[1]:
                    raise ValueError(
                        f"damaged run checkpoint: replay-log rows of {len(buf)} bytes for "
                        f"{shape[0]} targets × {shape[1]} orders"
                    )
                c = np.frombuffer(buf, dtype=np.float64).reshape(shape)  # read-only, on the bytes
                mine = cost.rows(float(sigma))
                # this node's own rows, bit for bit: built when asked instead of kept
                srcs.append(cost if np.array_equal(c.view(np.uint64), mine.view(np.uint64)) else c)
            else:
                srcs.append(cost)
        return srcs

    def _source(self, doc: Any, built: dict[tuple, ContributionCost]) -> Any:
        """The cost a checkpoint's replay-log source describes (slopes and α_max on this node's targets),
        or the fixed rows it holds."""
        cost = self.cost
        if isinstance(doc, dict) and "rows" in doc:
            rows = np.asarray(doc["rows"], dtype=np.float64)
            if rows.shape != (len(cost.targets), cost.orders.size):
                raise ValueError(f"damaged run checkpoint: replay-log rows of shape {rows.shape}")
            from hushnet.privacy.ledger_math import sealed

            return sealed(rows)
        if not isinstance(doc, dict) or "alpha_max" not in doc:
            raise ValueError("damaged run checkpoint: a replay-log source without its slopes")
        slope, amax = doc.get("slope"), float(doc["alpha_max"])
        if slope is not None:
            slope = np.asarray(slope, dtype=np.float64)
            if slope.shape != (len(cost.targets),):
                raise ValueError(
                    f"damaged run checkpoint: replay-log slopes of shape {slope.shape} for "
                    f"{len(cost.targets)} targets"
                )
        key = (None if slope is None else slope.tobytes(), np.float64(amax).tobytes())
        hit = built.get(key)
        if hit is not None:
            return hit
        mine = cost.walk_slope
        same = (mine is None) == (slope is None) and (
            slope is None or np.ascontiguousarray(mine, dtype=np.float64).tobytes() == key[0]
        )
        if same and np.float64(cost.alpha_max).tobytes() == key[1]:
            src = cost  # its own slopes: its rows, bit for bit, and its charges continue the entry
        else:
            from hushnet.privacy.ledger_math import sealed

            src = ContributionCost(
                cost.targets,
                cost.orders,
                None if slope is None else sealed(slope),
                amax,
                cost.bound_name,
            )
        built[key] = src
        return src

    def _other_ids(self) -> list[str]:
        """Every node id of the run's graph but this node's, in vertex order (made once: a report reads
        it for two rows, 2 047 ids at n = 2048)."""
        made = self.__dict__.get("_other_ids_made")
        if made is None or made[0] is not self.ids:
            made = self._other_ids_made = (
                self.ids,
                [nid for v, nid in enumerate(self.ids) if v != self.vertex],
            )
        return made[1]

    def _over(self) -> RunRefused:
        """The refusal of a run that is over here: ``run-closed`` when the operator closed or cancelled it
        (the whole run is over: a neighbour told so stops stepping, see :meth:`_closed_at`), else
        ``run-over`` (finished or stopped here only: the walk goes around this node)."""
        code = "run-closed" if self.state in ("closed", "cancelled") else "run-over"
        return RunRefused(code, f"run {self.run_id} is {self.state} at {self.node_id}")

    def _closed_at(self, dst: str) -> None:
        """Neighbour ``dst`` refused this run's envelope because the operator closed (or cancelled) the
        run there: hold instead of retrying, deviating or taking another step on this node's data.

        Why: a node that was down or cut off when the operator closed a run comes back with the run
        still running here; its protocol would time the refused handoff out, route around the
        "dead" neighbour and compute (and charge) steps of a run that is over — spending its data
        for nothing.  Holding is always safe: no machine timer fires (nothing retries, deviates or
        steps), a token from a neighbour still running is still taken, and the operator's signed
        close record, asked of the neighbours at once (``on_peer_closed``), closes the run here with
        its top-up.  A neighbour lying about a close can only stall this node, which dropping our
        token could do as well (the operator then resumes from the last durable copy)."""
        first = not self.closed_by
        self.closed_by.add(dst)
        if not first:
            return
        self._cancel_timers()
        self._emit("peer_closed", peer=dst)
        log.info(
            "run %s is closed at %s: holding here until the operator's close record arrives",
            self.run_id,
            dst,
        )
        if self.on_peer_closed is not None:
            self.on_peer_closed(dst)

    def _enqueue(self, dst: str, payload: bytes, receipt: str = "") -> _Queued | None:
        """Queue an envelope for ``dst``'s sender; returns its queue item when it goes out at once (the
        sender was idle: see :meth:`_release`), else None."""
        q = self._queues.get(dst)
        if q is None:
            q = self._queues[dst] = asyncio.Queue()
            self._workers[dst] = asyncio.get_event_loop().create_task(self._sender(dst, q))
        self.messages_out += 1
        at_once = q.empty() and dst not in self._sending
        item = _Queued(payload, receipt, time.monotonic())
        q.put_nowait(item)
        return item if at_once else None

    def _redeliver_for(self) -> float:
        """Seconds a failed delivery is sent again for (0: never).

        The machine says (``redeliver_for``): the walk's ack timer already re-sends an unacknowledged
        token, so its failures are only recorded (a second sender would double its sends); the gossip
        round machines (plain, randomized, secure), secure aggregation and distributed-DP SGD send each
        message once, so a transient failure would otherwise cost the neighbour a whole round timeout and
        a deviation (issue 12; docs/runs.md has the table per family).  Needs the envelope numbers
        (``next_seq``): a copy sent again under the same number is dropped by a receiver that took the
        first one although its answer was lost, so nothing is ever delivered twice."""
        if self._next_seq is None:
            return 0.0
        return float(getattr(self.machine, "redeliver_for", 0.0) or 0.0)

    def _worth_again(self, exc: BaseException, queued: float, window: float) -> bool:
        """Whether a failed delivery is sent again: a transport failure (or a neighbour's "not yet"),
        within the machine's window from when it was queued, while the run is live here (a finished
        node's last messages still matter to its neighbours; a closed, cancelled or stopped run's not)."""
        if window <= 0 or time.monotonic() - queued > window:
            return False
        if self.state in ("closed", "cancelled", "stopped") or self.closed_by:
            return False
        refusal = getattr(exc, "refusal", None)
        if refusal is not None:
            return refusal in TRANSIENT_REFUSALS
        code = getattr(exc, "code", None)
        return getattr(code, "name", None) in TRANSIENT_CODES

    def _log_failure(self, dst: str, exc: BaseException, again: bool) -> None:
        """One line per kind of failure (status or refusal code) per :data:`FAILURE_LOG_EVERY_S`."""
        code = getattr(exc, "code", None)
        kind = str(
            getattr(exc, "refusal", None) or getattr(code, "name", None) or type(exc).__name__
        )
        now = time.monotonic()
        last = self._failure_logged.get(kind)
        if last is not None and now - last < FAILURE_LOG_EVERY_S:
            return
        if len(self._failure_logged) >= 32:  # refusal codes come from peers: keep the map bounded
            self._failure_logged.clear()
        self._failure_logged[kind] = now
        log.warning(
            "run %s: delivery to %s failed (%s); %s (%d failed so far)",
            self.run_id,
            dst,
            exc,
            "sending it again" if again else "not sent again here (the protocol may retry)",
            self.send_failures,
        )

    async def _sender(self, dst: str, q: asyncio.Queue) -> None:
        """FIFO per destination.  A failed delivery is recorded; the walk's ack timer retries it, and a
        machine with ``redeliver_for`` (gossip, secure aggregation, …) has the same bytes sent again here under the same
        envelope number, with backoff, before anything queued after them (see :meth:`_redeliver_for`).

        A ``Send`` that asked for a receipt gets :class:`Delivered` once ``Deliver`` answered: the
        receiver's driver answers only after its machine accepted the bytes (a refusal is an error)."""
        while True:
            item = await q.get()
            self._sending.add(dst)
            try:
                await self._deliver_one(dst, item)
            finally:
                self._sending.discard(dst)

    async def _deliver_one(self, dst: str, item: _Queued) -> None:
        """One queued envelope: sent (again, for a machine with ``redeliver_for``), then its receipt.
        ``item.after``: what waits for the delivery to be under way (see :meth:`_release`) — called by
        the transport (``started=``), or here when the first attempt returned without doing so."""
        payload, receipt, queued, after = item.payload, item.receipt, item.queued, item.after
        window = self._redeliver_for()
        seq = self._next_seq(dst) if window > 0 and self._next_seq is not None else None
        pause = REDELIVER_FIRST_S
        extra: dict[str, Any] = {} if seq is None else {"seq": seq}

        def started() -> None:
            while after:
                after.pop(0)()

        try:
            while True:
                try:
                    if after:
                        await self._send(dst, payload, started=started, **extra)
                    else:
                        await self._send(dst, payload, **extra)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - any transport failure: recorded, maybe sent again
                    self.send_failures += 1
                    if getattr(exc, "refusal", None) == "run-closed":
                        self._closed_at(dst)
                    again = seq is not None and self._worth_again(exc, queued, window)
                    self._log_failure(dst, exc, again)
                    self._emit("send_failed", to=dst, error=str(exc)[:300], again=again)
                    if again:
                        await asyncio.sleep(pause)
                        pause = min(2 * pause, REDELIVER_MAX_S)
                        # the run may have ended (or the window passed) while this waited
                        if self._worth_again(exc, queued, window):
                            self.redeliveries += 1
                            continue
                else:
                    if receipt and self.state not in TERMINAL:
                        self._execute(self.machine.handle(Delivered(self.vertex_of[dst], receipt)))
                break
        finally:
            started()  # a transport that does not say when a delivery is under way: now, at the latest

    # ------------------------------------------------------------------ ending
    def _cancel_timers(self) -> None:
        for h in self._timers.values():
            h.cancel()
        self._timers.clear()

    def _stop(self, reason: str) -> None:
        self.state = "stopped"
        self.reason = reason
        self._cancel_timers()
        self._emit("stopped", reason=reason)
        self._persist_state()

    def _persist_state(self) -> None:
        """Record a state change (stopped, cancelled, closed, topped up) durably; a failure is logged —
        the run's checkpoint is still the last good one."""
        if self.store is None:
            return
        try:
            self.persist()
        except Exception as exc:  # noqa: BLE001
            log.warning("run %s: cannot record state %s durably: %s", self.run_id, self.state, exc)

    def shutdown(self) -> None:
        self._cancel_timers()
        for t in self._workers.values():
            t.cancel()

    def cancel(self, reason: str = "cancelled by the operator") -> None:
        if self.state in TERMINAL:
            return
        self.state = "cancelled"
        self.reason = reason
        self.timings.closed = time.time()
        self._early, self._early_bytes = (
            [],
            0,
        )  # never started: what neighbours sent early is dropped
        self.shutdown()
        self._emit("cancelled", reason=reason)
        self._persist_state()

    def close(self, *, deviated: bool = False) -> None:
        """The operator ends the run everywhere after it finished (at some node).

        ``deviated``: a node departed from the public W during the run; the walk bound charged so
        far no longer holds, so every contribution is topped up to the local-DP bound
        ``α/(2σ²)`` (valid whatever the walk did) — the deviation is accounted, not hidden.
        """
        if (
            deviated
            and not self.topped_up
            and self.cost is not None
            and self.cost.walk_slope is not None
        ):
            self._top_up()
        if self.state not in TERMINAL:
            self.state = "closed"
            self.timings.closed = time.time()
            self.shutdown()
            self._emit("closed")
        elif self.state == "finished":
            self.timings.closed = time.time()
            self.shutdown()
        self._persist_state()

    def _top_up(self) -> None:
        from hushnet.privacy.ledger import PrivacyEntry

        self.topped_up = True
        # by noise multiplier, from counters kept in the run's checkpoint: a node restarted since its
        # contributions still knows them (its in-memory engine entries are gone)
        used = sum(self.used_sigmas.values())
        if not used or self.cost is None:
            return
        total = np.zeros((len(self.cost.targets), self.cost.orders.size))
        for sigma, count in self.used_sigmas.items():
            if count <= 0:
                continue
            ldp = np.broadcast_to(self.cost.orders / (2.0 * sigma**2), total.shape)
            total += count * (ldp - self.cost.curves(sigma))
        total = np.maximum(total, 0.0)
        entry = PrivacyEntry.from_row(
            self.run_id,
            self.spec.protocol,
            self.spec.view_model,
            "certified",
            self.cost.targets,
            total,
            note="deviation top-up: walk deviated from the public W, "
            "contributions re-accounted with the local-DP bound",
        )
        if self.ledger is not None:
            # the data was already used: a top-up is recorded even over budget (an exact ledger
            # over budget is better than a ledger that hides spending); the budget check is bypassed
            # by charging against a copy-free path: record through charge when it fits, else force
            try:
                self.ledger.charge(entry)
            except BudgetExceeded as exc:
                self._emit("over_budget", reason=str(exc))
                self.ledger.charge(entry, enforce_budget=False)  # spending already happened
        charged = self.run_rdp  # summed once (a walk's row is derived from its log)
        self.run_rdp = total if charged is None else charged + total
        self._emit("accounted_deviation", contributions=used)

    # ------------------------------------------------------------------ reports
    #: what a visit changes in :meth:`status` without an event: left out of a watch's brief status
    #: (:meth:`status` with ``brief``), so a node the token only passed through has nothing new to say
    VISIT_FIELDS = ("contributions", "token")

    def status(self, *, brief: bool = False) -> dict[str, Any]:
        """The run here.  ``brief``: without :data:`VISIT_FIELDS` — what changes only with an event or a
        change of state, which a watch compares to what it saw (``run.events`` with ``seen``)."""
        st = self._status()
        if brief:
            for k in self.VISIT_FIELDS:
                del st[k]
        return st

    def _status(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "node": self.node_id,
            "vertex": self.vertex,
            "state": self.state,
            "begun": self._begun,  # running: the machine's first round ran (not only acknowledged)
            "reason": self.reason,
            "step": self.last_step,
            "contributions": self.contributions,
            "protocol": self.spec.protocol,
            "steps": self.spec.total_steps(),
            "holds_model": self.model is not None,
            "deviations": len(self.deviations),
            "closed_by": sorted(self.closed_by),  # neighbours that said the run is closed (held)
            "faults": len(self.faults),
            "events": len(self.events),
            "early_buffered": len(self._early),
            "early_dropped": self.early_dropped,
            "durable": self.store is not None,
            "restored": self.restored,
            "token": self.whereabouts(),
            "deviation_accounted": self.topped_up,
            # how a finished run ended when it ended without completing (e.g. ``leader-lost``), and why
            **self._ended(),
        }

    def _ended(self) -> dict[str, Any]:
        res = self.finish_result if self.state in ("finished", "closed") else None
        if not isinstance(res, dict) or not res.get("ended"):
            return {}
        out = {"ended": str(res["ended"]), "ended_reason": str(res.get("reason", ""))}
        lost = res.get("lost_leader")
        if isinstance(lost, int) and 0 <= lost < len(self.ids):
            out["lost_node"], out["lost_round"] = self.ids[lost], res.get("lost_round")
        return out

    def report(self, *, packed: int = 0) -> dict[str, Any]:
        """This node's privacy report for the run: certified (ε, δ) toward every other node, paper values
        labelled as such, the lifetime ledger totals, deviations, faults and timings.

        ``packed`` (a version of :mod:`hushnet.runs.report_wire`, ``True`` for 1): the per-target rows
        packed, written from the arrays (the document :func:`~hushnet.runs.report_wire.pack_report`
        makes of the plain one, without n dicts per row in between).  The lifetime totals come from the
        ledger as columns, each distinct curve converted once, the run row's conversion reused when the
        totals are that row (issue 12: at n = 2048, one :class:`Spent` per target and every curve
        converted were ~70 % of a report's CPU)."""
        delta = self.spec.budget.delta
        rows: dict[str, tuple[list[str], np.ndarray]] = {}
        conv = None
        if self.cost is not None:
            charged = self.run_rdp  # summed once (a walk's row is derived from its log)
            if charged is None:
                eps = np.zeros(len(self.cost.targets))
            elif not len(charged):
                eps = dp_from_rdp_rows(self.cost.orders, charged, delta)
            else:  # dp_from_rdp_rows, keeping the conversion for the lifetime totals
                conv = convert_distinct(self.cost.orders, charged, delta)
                eps = dp_from_converted(conv)
            rows["certified"] = (self.cost.targets, np.asarray(eps, dtype=np.float64))
        paper_label = None
        pb = paper_bound(self.spec, self.vertex, float(self.contributions), self.W)
        if pb is not None:
            pr, paper_label = pb
            pr = np.asarray(pr, dtype=np.float64)
            rows["paper"] = (self._other_ids(), np.delete(pr[: len(self.ids)], self.vertex))
        life = self.ledger.spent_columns(delta, conv) if self.ledger is not None else None
        version = int(packed)
        certified: dict[str, float] = {}
        paper: dict[str, float] | None = None
        lifetime: dict[str, dict[str, Any]] = {}
        projected = None
        if not version:
            if "certified" in rows:
                certified = dict(zip(rows["certified"][0], rows["certified"][1].tolist()))
            if "paper" in rows:
                paper = dict(zip(rows["paper"][0], rows["paper"][1].tolist()))
            if life is not None:
                lifetime = {
                    t: {"epsilon": e, "bound": b, "method": m}
                    for t, e, b, m in zip(
                        life.keys, life.epsilon.tolist(), life.bounds(), life.methods()
                    )
                }
        else:
            if "paper" in rows:
                paper = {}  # replaced by the packed row
            if version >= 2 and self._projected is not None:
                rows["projected"] = (self._other_ids(), self._projected)
                projected = {}  # replaced by the packed row
        doc = self._report_doc(delta, certified, paper, paper_label, lifetime, projected)
        if not version:
            return doc
        from hushnet.runs.report_wire import pack_columns

        return pack_columns(doc, rows, life, version)

    def _report_doc(
        self,
        delta: float,
        certified: dict[str, float],
        paper: dict[str, float] | None,
        paper_label: str | None,
        lifetime: dict[str, dict[str, Any]],
        projected: dict[str, float] | None = None,
    ) -> dict[str, Any]:
        """The report's fields around its per-target rows (see :meth:`report`); ``projected`` replaces the
        projected row (a packed report's placeholder)."""
        return {
            **self.status(),
            "delta": delta,
            "certified": certified,
            "certified_bound": self.cost.bound_name if self.cost is not None else None,
            "certified_conversion": CONVERSION_LABEL,
            "paper": paper,
            "paper_bound": paper_label,
            "projected": (
                projected
                if projected is not None
                else self.decision.get("row")
                if self._projected is None
                else dict(zip(self._other_ids(), self._projected.tolist()))
            ),
            "accounting_view": self.decision.get("accounting_view"),
            "noise_source": self.spec.noise_label(),
            "lifetime": lifetime,
            "noise_visits": self.noise_visits,
            "deviation_accounted": self.topped_up,
            "deviations_list": self.deviations,
            "faults_list": self.faults,
            "timings": self.timings.to_dict(),
            "messages": {
                "in": self.messages_in,
                "out": self.messages_out,
                "send_failures": self.send_failures,
                "redeliveries": self.redeliveries,
                "handle_seconds": self.handle_seconds,
            },
            "result": self.finish_result,
            # durable runs: checkpoints written here and their time (the cost of durability per hop)
            "durability": {
                "checkpoints": self.checkpoints,
                "checkpoint_seconds": self.checkpoint_seconds,
            },
        }


class NodeEffects:
    """The node driver's effects for one batch of its machine's actions (see :mod:`hushnet.engine.execute`).

    ``Send`` → the destination's FIFO queue; ``LedgerEntry`` → a durable charge, and a refused one
    stops the batch (the ``Send`` carrying the contribution after it never runs); timers → the
    event loop; ``Metric``/``Deviation``/``Paused``/``Fault``/``Finish`` → the run's state and event
    stream.  ``faults`` collects the batch's faults, which :meth:`RunDriver.on_message` turns into a
    refusal the sender sees.  Subclass it to serve a machine differently (the central client's
    request/reply in :mod:`hushnet.families.central.node`).
    """

    def __init__(self, driver: RunDriver) -> None:
        self.driver = driver
        self.faults: list[Fault] = []
        #: durable runs: the batch's sends, held back until its checkpoint is written (None: send at once)
        self.outbox: list[tuple[str, bytes, str]] | None = None
        self.changed = False  # the batch finished or deviated: checkpoint it even without a send
        #: the batch's zero-delay timers, scheduled by :meth:`RunDriver._release` (see :class:`_Soon`)
        self.soon: list[tuple[str, _Soon]] = []
        #: the queue item of the batch's last envelope, when it went out at once (else None)
        self.last_sent: _Queued | None = None

    def send(self, act: Send) -> None:
        d = self.driver
        if self.outbox is not None:
            self.outbox.append((d.ids[act.dst], act.payload, act.receipt))
            return
        self.last_sent = d._enqueue(d.ids[act.dst], act.payload, act.receipt)

    def charge(self, act: LedgerEntry) -> bool:
        return self.driver._charge(act)  # False: contribution refused, nothing after it is executed

    def set_timer(self, act: SetTimer) -> None:
        timers = self.driver._timers
        old = timers.pop(act.name, None)
        if old is not None:
            old.cancel()
        if act.delay <= 0:  # held until the batch's messages are under way (RunDriver._release)
            handle = timers[act.name] = _Soon()
            self.soon.append((act.name, handle))
            return
        timers[act.name] = asyncio.get_event_loop().call_later(
            act.delay, self.driver._fire, act.name
        )

    def cancel_timer(self, act: CancelTimer) -> None:
        h = self.driver._timers.pop(act.name, None)
        if h is not None:
            h.cancel()

    def metric(self, act: Metric) -> None:
        d = self.driver
        if act.name == "step":
            d.last_step = max(d.last_step, int(act.step))
            d._emit("progress", step=int(act.step), contributions=d.contributions)
        elif act.name == "resumed":
            if d.state == "paused":
                d.state = "running"
            d._emit("resumed", step=int(act.step))
        elif isinstance(act.value, (int, float, np.floating, np.integer)):
            d._emit("metric", name=act.name, value=float(act.value), step=int(act.step))

    def deviation(self, act: Deviation) -> None:
        d = self.driver
        rec = {
            "node": d.ids[act.node] if act.node < len(d.ids) else act.node,
            "step": act.step,
            "reason": act.reason,
            "detail": _jsonable(act.detail),
        }
        if "dead" in act.detail and isinstance(act.detail["dead"], (int, np.integer)):
            rec["dead_node"] = d.ids[int(act.detail["dead"])]
        d.deviations.append(rec)
        self.changed = True
        d._emit("deviation", **rec)

    def pause(self, act: Paused) -> None:
        d = self.driver
        d.state = "paused"
        d._emit("paused", step=act.step, reason=act.reason)

    def fault(self, act: Fault) -> None:
        err = act.error
        f = {"code": getattr(err, "code", "protocol-error"), "message": str(err)}
        self.driver.faults.append(f)
        self.driver._emit("fault", **f)
        self.faults.append(act)

    def finish(self, act: Finish) -> None:
        d = self.driver
        d.model = None if act.model is None else np.asarray(act.model, dtype=np.float64).copy()
        d.finish_step = int(act.step)
        d.last_step = max(d.last_step, int(act.step))
        d.finish_result = _jsonable(act.result)
        d.state = "finished"
        self.changed = True
        d.timings.finished = time.time()
        d._cancel_timers()
        scored = d._final_loss()
        if scored:  # the last progress event carries the loss of the model the operator receives
            d._emit("progress", step=int(act.step), contributions=d.contributions, **scored)
        d._emit("finished", step=int(act.step), holds_model=d.model is not None, **scored)


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x


def _compact_decision(
    decision: dict[str, Any], ids: list[str], vertex: int
) -> tuple[dict[str, Any], np.ndarray | None]:
    """The acceptance record without its projected row when that row is ``{other node: ε}`` in vertex
    order (kept as a float array; the report rebuilds the same dict), else as it is.

    Why: the row is a dict of n − 1 Python floats, ~0.15 MB a hosted node at n = 2048, kept for the whole
    run only to be shown in the report (issue 12)."""
    row = decision.get("row")
    if not isinstance(row, dict) or not row or not all(type(x) is float for x in row.values()):
        return decision, None
    if list(row) != [nid for v, nid in enumerate(ids) if v != vertex]:
        return decision, None
    return {k: x for k, x in decision.items() if k != "row"}, np.fromiter(
        row.values(), dtype=np.float64, count=len(row)
    )


#: the public transition matrices the drivers of this process hold, read-only (see _shared_matrix)
_MATRICES: list[Any] = []
_MATRICES_MAX = 4
#: drivers are built in executor threads (restores) as well as on the loop: one lock for both caches
_SHARED_LOCK = threading.Lock()


def _shared_matrix(W: Any) -> Any:
    """``W``, or an equal read-only CSR matrix another driver of this process already holds.

    Why: each hosted node built the run's public W at acceptance and its driver kept it for the report's
    paper row — 0.3 MB a node at n = 2048 (hypercube:11), the same numbers in every node of a host.  Equal
    means the same shape, structure and bits; the shared copy's arrays are read-only, so a caller that
    would change it in place fails loudly instead of changing another node's matrix."""
    import scipy.sparse as sp

    if not isinstance(W, sp.csr_matrix) or W.dtype != np.float64:
        return W
    with _SHARED_LOCK:
        for C in _MATRICES:
            if (
                C.shape == W.shape
                and C.nnz == W.nnz
                and np.array_equal(C.indptr, W.indptr)
                and np.array_equal(C.indices, W.indices)
                and np.array_equal(C.data.view(np.uint64), W.data.view(np.uint64))
            ):
                return C
        C = W.copy()
        for a in (C.data, C.indices, C.indptr):
            a.flags.writeable = False
        _MATRICES.insert(0, C)
        del _MATRICES[_MATRICES_MAX:]
        return C


_VERTEX_INDEX: dict[tuple[str, ...], Mapping[str, int]] = {}
_VERTEX_INDEX_MAX = 4


def _vertex_index(ids: list[str]) -> Mapping[str, int]:
    """``node id → vertex`` of a run's graph, read-only and one per process for the same ids.

    Why shared: every hosted node of a run holds the same map — 2 048 entries, ~0.1 MB a node at
    n = 2048 (issue 12: a host's memory per node)."""
    key = tuple(ids)
    with _SHARED_LOCK:
        hit = _VERTEX_INDEX.get(key)
        if hit is None:
            if len(_VERTEX_INDEX) >= _VERTEX_INDEX_MAX:
                _VERTEX_INDEX.pop(next(iter(_VERTEX_INDEX)))
            hit = _VERTEX_INDEX[key] = MappingProxyType({nid: v for v, nid in enumerate(ids)})
        return hit


def _source_doc(src: Any) -> dict[str, Any]:
    """What a replay-log entry's rows are built from, for the checkpoint: a cost's slopes and α_max (the
    rows are an element-wise function of them, so a restart rebuilds them bit for bit), or fixed rows."""
    if isinstance(src, ContributionCost):
        return {"slope": src.walk_slope, "alpha_max": float(src.alpha_max)}
    return {"rows": src}


def _any_nonzero(entry) -> bool:
    """Whether a ledger entry charges anything (some curve value is not zero)."""
    if entry.rows is not None:
        return bool(np.any(entry.rows))
    return any(np.any(c) for c in entry.rdp.values())
