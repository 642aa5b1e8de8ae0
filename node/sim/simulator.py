"""The simulator: runs the same protocol machines as the gRPC node, in one process.

Messages go through the same :class:`~hushnet.engine.wire.Envelope` bytes a network would carry,
delivered after a virtual latency; timers fire in virtual time; nothing sleeps.  Since every
machine draws only from its own generator and a single token orders the work, the outcome
depends on the run seed alone — which is what the simulator/network parity test checks.

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
from hushnet.engine.protocol import Protocol
from hushnet.engine.wire import Envelope


@dataclass
class SimResult:
    """Everything a run produced.  ``status``: ``finished``, ``stalled`` (no event left and no finish:
    the token is lost or held by a dead node — never silent), ``paused`` (a node paused the run and
    nothing else can happen before ``until``), ``faulted`` (``stop_on_fault`` and a message was refused),
    or ``limit`` (the event/time limit was hit)."""

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
    ) -> SimResult:
        """Run to the end.  With ``stop_on_pause`` the run stops at the first pause when no down node is
        scheduled to come back (otherwise a paused walk would retry forever in virtual time)."""
        t0 = time.perf_counter()
        machines = self.machines
        dead = self._dead
        lat = self.latency
        heap: list = []
        seq = 0
        timer_gen: dict[tuple[int, str], int] = {}
        ledgers: dict[int, list[LedgerEntry]] = defaultdict(list)
        metrics: list[Metric] = []
        deviations: list[Deviation] = []
        pauses: list[Paused] = []
        faults: list[Fault] = []
        finish: Finish | None = None
        env_seq: dict[tuple[int, int], int] = defaultdict(int)
        protocol, run_id, use_env = self.protocol, self.run_id, self.envelopes
        messages = 0
        events = 0
        now = 0.0
        on_metric = self._on_metric
        push = heapq.heappush
        pop = heapq.heappop

        # event tuples: (time, seq, node, kind, a, b); kind 0 start, 1 message(src, bytes), 2 timer(name, gen)
        for v in range(len(machines)):
            push(heap, (0.0, seq, v, 0, None, None))
            seq += 1
        for at, node, src, data in self._injected:
            push(heap, (at, seq, node, 1, src, data if use_env else Envelope.decode(data).payload))
            seq += 1
        status = "stalled"
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
            for act in acts:
                cls = act.__class__
                if cls is Send:
                    messages += 1
                    if use_env:
                        key = (v, act.dst)
                        env_seq[key] += 1
                        data = Envelope(protocol, run_id, env_seq[key], act.payload).encode()
                    else:
                        data = act.payload
                    push(heap, (now + lat, seq, act.dst, 1, v, data))
                    seq += 1
                elif cls is LedgerEntry:
                    ledgers[act.node].append(act)
                elif cls is SetTimer:
                    key = (v, act.name)
                    timer_gen[key] = seq
                    push(heap, (now + act.delay, seq, v, 2, act.name, seq))
                    seq += 1
                elif cls is CancelTimer:
                    timer_gen.pop((v, act.name), None)
                elif cls is Metric:
                    metrics.append(act)
                    if on_metric is not None:
                        on_metric(act)
                elif cls is Finish:
                    finish = act
                elif cls is Deviation:
                    deviations.append(act)
                elif cls is Paused:
                    pauses.append(act)
                    if stop_on_pause and not any(now < b < float("inf") for _, b in dead.values()):
                        status = "paused"  # nothing scheduled can bring the neighbour back: stop here
                        break
                elif cls is Fault:
                    faults.append(act)
                else:  # pragma: no cover - a new action type the simulator does not know
                    raise TypeError(f"unknown action {act!r}")
            if finish is not None:
                status = "finished"
                break
            if status == "paused":
                break
            if stop_on_fault and faults:
                status = "faulted"
                break
            if events >= max_events:
                status = "limit"
                break
        if status == "stalled" and any(not (p.node in dead and dead[p.node][1] == float("inf")) for p in pauses):
            status = "paused"  # a live node holds the token and waits; a dead one means the token is gone
        return SimResult(
            status=status,
            model=None if finish is None else finish.model,
            finish=finish,
            ledgers=dict(ledgers),
            metrics=metrics,
            deviations=deviations,
            pauses=pauses,
            faults=faults,
            messages=messages,
            events=events,
            virtual_time=now,
            wall_seconds=time.perf_counter() - t0,
            dead=dict(dead),
        )

    def deliver(self, node: int, src: int, payload: bytes) -> list:
        """Hand one raw protocol message to a machine outside the event loop (tests of bad input)."""
        return self.machines[node].handle(MessageArrived(src, payload))
