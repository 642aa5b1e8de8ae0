"""An asyncio driver with real concurrency: one task and inbox per node, real (random) delays.

This is the shape of the gRPC node driver without gRPC: every node runs its machine in its own
task, messages travel as :class:`~hushnet.engine.wire.Envelope` bytes with random wall-clock delays
(so they may be reordered; the envelope differs from the network's protobuf one as the
simulator's module docstring says), and timers are real ``loop.call_later`` timers.  Each node's
actions become effects through :func:`hushnet.engine.execute.execute`, like every driver's.  The
parity test runs the same run here and in the simulator and gets the same model bit for bit, which
is what makes the simulator's numbers stand for the network's.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import defaultdict
from typing import Sequence

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
from hushnet.sim.simulator import FINISH_RULES, SimResult


class LoopbackNetwork:
    """Run ``machines`` concurrently on the current event loop; ``delay`` = (min, max) seconds per message."""

    def __init__(
        self,
        machines: Sequence[Protocol],
        *,
        delay: tuple[float, float] = (0.0, 2e-3),
        seed: int = 0,
    ) -> None:
        self.machines = list(machines)
        self.delay = delay
        self._jitter = random.Random(seed)  # transport timing only; never reaches a machine
        self.protocol = machines[0].name
        self.run_id = machines[0].ctx.run_id

    async def run(self, timeout: float = 60.0, *, finish: str = "first") -> SimResult:
        """Run until the first ``Finish`` (``finish="first"``) or every node's (``"all"``), or ``timeout``."""
        if finish not in FINISH_RULES:
            raise ValueError(f"finish must be one of {FINISH_RULES}, got {finish!r}")
        t0 = time.perf_counter()
        n = len(self.machines)
        shared = _Shared(self, asyncio.get_running_loop(), n, finish == "all")
        inbox = shared.inbox

        async def node_task(v: int) -> None:
            try:
                await node_loop(v)
            except (
                Exception
            ) as exc:  # a machine or effect bug ends the run loudly, not as a timeout
                if not shared.done.done():
                    shared.done.set_exception(exc)
                raise

        async def node_loop(v: int) -> None:
            m = self.machines[v]
            fx = _NodeEffects(shared, v)
            execute(m.handle(RunStarted()), fx)
            while True:
                kind, a, b = await inbox[v].get()
                if kind == "msg":
                    try:
                        env = Envelope.decode(b, protocol=self.protocol, run_id=self.run_id)
                    except ProtocolError as err:
                        execute([Fault(v, err)], fx)
                        continue
                    acts = m.handle(MessageArrived(a, env.payload))
                else:
                    shared.timers.pop((v, a), None)
                    acts = m.handle(TimerFired(a))
                shared.events += 1
                execute(acts, fx)

        tasks = [asyncio.create_task(node_task(v)) for v in range(n)]
        status = "finished"
        last: Finish | None = None
        try:
            last = await asyncio.wait_for(shared.done, timeout)
        except asyncio.TimeoutError:
            status = "paused" if shared.pauses else "stalled"
        finally:
            for t in tasks:
                t.cancel()
            for h in shared.timers.values():
                h.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        model = None if last is None or shared.wait_all else last.model
        return SimResult(
            status,
            model,
            last,
            dict(shared.ledgers),
            shared.metrics,
            shared.deviations,
            shared.pauses,
            shared.faults,
            shared.messages,
            shared.events,
            time.perf_counter() - t0,
            time.perf_counter() - t0,
            finishes=dict(shared.finishes),
        )


class _Shared:
    """What the node tasks of one loopback run share: inboxes, timers, the run's records, the end."""

    def __init__(
        self, net: LoopbackNetwork, loop: asyncio.AbstractEventLoop, n: int, wait_all: bool
    ) -> None:
        self.net = net
        self.loop = loop
        self.inbox: list[asyncio.Queue] = [asyncio.Queue() for _ in range(n)]
        self.timers: dict[tuple[int, str], asyncio.TimerHandle] = {}
        self.seqs: dict[tuple[int, int], int] = defaultdict(int)
        self.ledgers: dict[int, list[LedgerEntry]] = defaultdict(list)
        self.metrics: list[Metric] = []
        self.deviations: list[Deviation] = []
        self.pauses: list[Paused] = []
        self.faults: list[Fault] = []
        self.finishes: dict[int, Finish] = {}
        self.wait_all = wait_all
        self.n = n
        self.done: asyncio.Future = loop.create_future()
        self.messages = 0
        self.events = 0


class _NodeEffects:
    """Node ``v``'s effects: envelopes delivered after a random delay, ``call_later`` timers, records."""

    def __init__(self, shared: _Shared, v: int) -> None:
        self.s = shared
        self.v = v

    def send(self, act: Send) -> None:
        s, net, v = self.s, self.s.net, self.v
        s.messages += 1
        s.seqs[(v, act.dst)] += 1
        data = Envelope(net.protocol, net.run_id, s.seqs[(v, act.dst)], act.payload).encode()
        lo, hi = net.delay
        s.loop.call_later(
            net._jitter.uniform(lo, hi), s.inbox[act.dst].put_nowait, ("msg", v, data)
        )

    def set_timer(self, act: SetTimer) -> None:
        s, v = self.s, self.v
        old = s.timers.pop((v, act.name), None)
        if old:
            old.cancel()
        s.timers[(v, act.name)] = s.loop.call_later(
            act.delay, s.inbox[v].put_nowait, ("timer", act.name, None)
        )

    def cancel_timer(self, act: CancelTimer) -> None:
        h = self.s.timers.pop((self.v, act.name), None)
        if h:
            h.cancel()

    def charge(self, act: LedgerEntry) -> None:
        self.s.ledgers[act.node].append(act)

    def metric(self, act: Metric) -> None:
        self.s.metrics.append(act)

    def deviation(self, act: Deviation) -> None:
        self.s.deviations.append(act)

    def pause(self, act: Paused) -> None:
        self.s.pauses.append(act)

    def fault(self, act: Fault) -> None:
        self.s.faults.append(act)

    def finish(self, act: Finish) -> None:
        s = self.s
        if s.done.done():
            return
        s.finishes[act.node] = act
        if not s.wait_all or len(s.finishes) == s.n:
            s.done.set_result(act)
