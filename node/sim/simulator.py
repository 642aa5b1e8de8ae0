"""The simulator: runs the same protocol machines as the gRPC node, in one process.

The machines, their generators, the payload bytes they exchange and the event order rules are the
node's; messages are delivered after a virtual latency, timers fire in virtual time, nothing
sleeps.  Since every machine draws only from its own generator and a single token orders the
work, the outcome depends on the run seed alone — which is what the simulator/network parity
tests check.  Actions become effects through :func:`hushnet.engine.execute.execute`, as in every
driver; ``finish`` says whether the run ends at the first ``Finish`` or when every live node has
finished (gossip).

**What differs from the network (the transport, not the protocol).**  Payloads are wrapped in the
engine's compact :class:`~hushnet.engine.wire.Envelope` (protocol, run id, per-destination
sequence number), not in the protobuf ``hushnet.v1.Envelope`` nodes send, which also carries the
sender and recipient node ids.  On the network the transport checks the sender against its TLS
certificate, drops a repeated ``(sender, protocol, run_id, seq)`` before any machine sees it, and
the run service refuses an envelope of another run (the *sender's* call fails); here ``src`` is the
sending vertex by construction (or whatever :meth:`Simulator.inject` claims), every envelope —
replays included — reaches the machine, and an envelope of another run or a corrupt one becomes a
:class:`~hushnet.engine.actions.Fault` at the receiver.  The latency is constant, so delivery
between two nodes is FIFO, as the node driver's per-destination queue makes it on the network.
With ``envelopes=False`` the payloads travel bare (a benchmark of the envelope's cost).

Per-step overhead is kept small (a heap of pending deliveries, no per-event allocation beyond
the event itself) so a walk of n = 2048 nodes and T = 20 000 steps takes about a second.
"""

from __future__ import annotations

import heapq
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Sequence

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
from hushnet.engine.errors import ProtocolError
from hushnet.engine.events import MessageArrived, RunStarted, TimerFired
from hushnet.engine.execute import execute
from hushnet.engine.protocol import Protocol
from hushnet.engine.wire import Envelope


@dataclass
class SimResult:
    """Everything a run produced.  ``status``: ``finished``, ``stalled`` (no event left and no finish:
    the token is lost or held by a dead node — never silent), ``paused`` (a node paused the run and
    nothing else can happen before ``until``), ``faulted`` (``stop_on_fault`` and a message was refused),
    or ``limit`` (the event/time limit was hit).

    ``finish`` is the last :class:`Finish` executed (the one that ended the run), ``finishes`` every
    node's Finish by node.  ``model`` is ``finish.model`` when the run ends at the first Finish, and
    ``None`` with ``finish="all"``, where each node holds its own model (see ``finishes``)."""

    status: str
    model: np.ndarray | None
    finish: Finish | None
    ledgers: dict[int, list[LedgerEntry]]
    metrics: list[Metric]
    deviations: list[Deviation]
    pauses: list[Paused]
    faults: list[Fault]
    messages: int
    events: int
    virtual_time: float
    wall_seconds: float
    dead: dict[int, tuple[float, float]] = field(default_factory=dict)
    finishes: dict[int, Finish] = field(default_factory=dict)

    def visits(self) -> np.ndarray:
        """Holder of the token at each step, from the ledger entries (one entry per visit that used data or added noise)."""
        pairs = [(e.step, e.node) for led in self.ledgers.values() for e in led]
        pairs.sort()
        return np.asarray([v for _, v in pairs], dtype=np.int64)

    def ledger_counts(self, kind: str = "gradient") -> np.ndarray:
        n = max(self.ledgers) + 1 if self.ledgers else 0
        out = np.zeros(n, dtype=np.int64)
        for v, led in self.ledgers.items():
            out[v] = sum(1 for e in led if e.kind == kind)
        return out


class Simulator:
    """Drive ``machines`` (index = node id) with an in-memory transport.

    ``latency`` is the virtual one-way delay of a message; ``protocol``/``run_id`` name the envelope
    (defaults: the first machine's).  :meth:`kill` makes a node crash at a virtual time: from then on
    it handles nothing and messages to it are lost, exactly what a peer sees of a dead process.
    """

    def __init__(
        self,
        machines: Sequence[Protocol],
        *,
        latency: float = 1e-3,
        protocol: str | None = None,
        run_id: str | None = None,
        envelopes: bool = True,
    ) -> None:
        if not machines:
            raise ValueError("no machines")
        self.machines = list(machines)
        self.latency = float(latency)
        self.protocol = protocol or machines[0].name
        self.run_id = run_id or machines[0].ctx.run_id
        self.envelopes = envelopes
        self._dead: dict[int, tuple[float, float]] = {}
        self._injected: list[tuple[float, int, int, bytes]] = []
        self._on_metric: Callable[[Metric], None] | None = None

    def kill(self, node: int, at: float = 0.0, until: float = float("inf")) -> None:
        """Node ``node`` is down from virtual time ``at`` until ``until`` (default: forever).

        While down it handles nothing and messages to it are lost.  A node that comes back keeps its
        state (an unreachable process, not a wiped one), so a paused walk can resume.
        """
        self._dead[int(node)] = (float(at), float(until))

    def inject(self, node: int, src: int, data: bytes, at: float = 0.0) -> None:
        """Deliver raw transport bytes (an envelope) to ``node`` at virtual time ``at`` as if ``src`` sent them —
        how tests play a misbehaving or replaying peer."""
        self._injected.append((float(at), int(node), int(src), bytes(data)))

    def on_metric(self, fn: Callable[[Metric], None]) -> None:
        """Stream metrics to ``fn`` as they happen (what a ``run watch`` subscriber gets)."""
        self._on_metric = fn

    def run(
        self,
        *,
        until: float = float("inf"),
        max_events: int = 50_000_000,
        stop_on_fault: bool = False,
        stop_on_pause: bool = True,
        finish: str = "first",
    ) -> SimResult:
        """Run to the end.  With ``stop_on_pause`` the run stops at the first pause when no down node is
        scheduled to come back (otherwise a paused walk would retry forever in virtual time).

        ``finish`` says when a run is over: ``"first"`` — at the first :class:`Finish` (a walk's token
        holder, an aggregator); ``"all"`` — when every node that is not down for good has finished
        (gossip: every node ends with its own model, all of them in :attr:`SimResult.finishes`).
        """
        if finish not in FINISH_RULES:
            raise ValueError(f"finish must be one of {FINISH_RULES}, got {finish!r}")
        t0 = time.perf_counter()
        machines = self.machines
        dead = self._dead
        fx = _SimEffects(self, stop_on_pause, finish == "all")
        heap = fx.heap
        use_env = self.envelopes
        protocol, run_id = self.protocol, self.run_id
        events = 0
        now = 0.0
        pop = heapq.heappop
        run_actions = execute

        # event tuples: (time, seq, node, kind, a, b); kind 0 start, 1 message(src, bytes), 2 timer(name, gen)
        for v in range(len(machines)):
            fx.push(0.0, v, 0, None, None)
        for at, node, src, data in self._injected:
            fx.push(at, node, 1, src, data if use_env else Envelope.decode(data).payload)
        status = "stalled"
        timer_gen = fx.timer_gen
        while heap:
            now, _, v, kind, a, b = pop(heap)
            if now > until:
                status = "limit"
                break
            if v in dead and dead[v][0] <= now < dead[v][1]:
                continue
            if kind == 0:
                acts = machines[v].handle(RunStarted())
            elif kind == 1:
                if use_env:
                    try:
                        env = Envelope.decode(b, protocol=protocol, run_id=run_id)
                    except ProtocolError as err:
                        acts = [Fault(v, err)]
                    else:
                        acts = machines[v].handle(MessageArrived(a, env.payload))
                else:
                    acts = machines[v].handle(MessageArrived(a, b))
            else:
                if timer_gen.get((v, a)) != b:
                    continue  # cancelled or replaced
                del timer_gen[(v, a)]
                acts = machines[v].handle(TimerFired(a))
            events += 1
            fx.node = v
            fx.now = now
            run_actions(acts, fx)
            if fx.stop:  # one check per event on the hot path; which stop it was comes after
                status = "finished" if fx.over else "paused"
                break
            if stop_on_fault and fx.faults:
                status = "faulted"
                break
            if events >= max_events:
                status = "limit"
                break
        pauses = fx.pauses
        if status == "stalled" and any(
            not (p.node in dead and dead[p.node][1] == float("inf")) for p in pauses
        ):
            status = "paused"  # a live node holds the token and waits; a dead one means the token is gone
        last = fx.last_finish
        return SimResult(
            status=status,
            model=None if last is None or fx.wait_all else last.model,
            finish=last,
            ledgers=dict(fx.ledgers),
            metrics=fx.metrics,
            deviations=fx.deviations,
            pauses=pauses,
            faults=fx.faults,
            messages=fx.messages,
            events=events,
            virtual_time=now,
            wall_seconds=time.perf_counter() - t0,
            dead=dict(dead),
            finishes=fx.finishes,
        )

    def deliver(self, node: int, src: int, payload: bytes) -> list:
        """Hand one raw protocol message to a machine outside the event loop (tests of bad input)."""
        return self.machines[node].handle(MessageArrived(src, payload))


FINISH_RULES = ("first", "all")
_push = heapq.heappush


class _SimEffects:
    """The simulator's effects: an in-memory transport and virtual-time timers on one event heap,
    everything else recorded for the :class:`SimResult`.  ``node``/``now`` are the node whose
    actions are being executed and the virtual time, set by the event loop before each batch."""

    __slots__ = (
        "heap",
        "seq",
        "node",
        "now",
        "lat",
        "use_env",
        "protocol",
        "run_id",
        "env_seq",
        "timer_gen",
        "ledgers",
        "metrics",
        "deviations",
        "pauses",
        "faults",
        "last_finish",
        "finishes",
        "messages",
        "on_metric",
        "dead",
        "stop_on_pause",
        "paused_stop",
        "wait_all",
        "awaited",
        "over",
        "stop",
    )

    def __init__(self, sim: Simulator, stop_on_pause: bool, wait_all: bool) -> None:
        self.heap: list = []
        self.seq = 0
        self.node = 0
        self.now = 0.0
        self.lat = sim.latency
        self.use_env = sim.envelopes
        self.protocol, self.run_id = sim.protocol, sim.run_id
        self.env_seq: dict[tuple[int, int], int] = defaultdict(int)
        self.timer_gen: dict[tuple[int, str], int] = {}
        self.ledgers: dict[int, list[LedgerEntry]] = defaultdict(list)
        self.metrics: list[Metric] = []
        self.deviations: list[Deviation] = []
        self.pauses: list[Paused] = []
        self.faults: list[Fault] = []
        self.last_finish: Finish | None = None
        self.finishes: dict[int, Finish] = {}
        self.messages = 0
        self.on_metric = sim._on_metric
        self.dead = sim._dead
        self.stop_on_pause = stop_on_pause
        self.paused_stop = False
        self.wait_all = wait_all
        # "all": every node not down for good (a node that comes back is live and must finish too)
        self.awaited = {
            v
            for v in range(len(sim.machines))
            if not (v in sim._dead and sim._dead[v][1] == float("inf"))
        }
        self.over = False
        self.stop = False  # over or paused_stop: the event loop ends after this batch

    def push(self, at: float, node: int, kind: int, a: object, b: object) -> None:
        heapq.heappush(self.heap, (at, self.seq, node, kind, a, b))
        self.seq += 1

    def send(self, act: Send) -> None:
        self.messages += 1
        v = self.node
        if self.use_env:
            key = (v, act.dst)
            self.env_seq[key] += 1
            data = Envelope(self.protocol, self.run_id, self.env_seq[key], act.payload).encode()
        else:
            data = act.payload
        seq = self.seq
        _push(self.heap, (self.now + self.lat, seq, act.dst, 1, v, data))
        self.seq = seq + 1

    def set_timer(self, act: SetTimer) -> None:
        seq, v = self.seq, self.node
        self.timer_gen[(v, act.name)] = seq
        _push(self.heap, (self.now + act.delay, seq, v, 2, act.name, seq))
        self.seq = seq + 1

    def cancel_timer(self, act: CancelTimer) -> None:
        self.timer_gen.pop((self.node, act.name), None)

    def charge(self, act: LedgerEntry) -> None:
        self.ledgers[act.node].append(act)

    def metric(self, act: Metric) -> None:
        self.metrics.append(act)
        if self.on_metric is not None:
            self.on_metric(act)

    def deviation(self, act: Deviation) -> None:
        self.deviations.append(act)

    def pause(self, act: Paused) -> bool:
        self.pauses.append(act)
        now = self.now
        if self.stop_on_pause and not any(now < b < float("inf") for _, b in self.dead.values()):
            self.paused_stop = self.stop = (
                True  # nothing scheduled can bring the neighbour back: stop here
            )
            return False
        return True

    def fault(self, act: Fault) -> None:
        self.faults.append(act)

    def finish(self, act: Finish) -> None:
        self.last_finish = act
        self.finishes[act.node] = act
        if not self.wait_all or self.awaited <= self.finishes.keys():
            self.over = self.stop = True
