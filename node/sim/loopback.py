"""An asyncio driver with real concurrency: one task and inbox per node, real (random) delays.

This is the shape of the gRPC node driver without gRPC: every node runs its machine in its own
task, messages travel as :class:`~hushnet.engine.wire.Envelope` bytes with random wall-clock delays
(so they may be reordered), and timers are real ``loop.call_later`` timers.  The parity test runs
the same run here and in the simulator and gets the same model bit for bit, which is what makes
the simulator's numbers stand for the network's.
"""
from __future__ import annotations

import asyncio
import random
import time
from collections import defaultdict
from typing import Sequence

from hushnet.engine.actions import CancelTimer, Deviation, Fault, Finish, LedgerEntry, Metric, Paused, Send, SetTimer
from hushnet.engine.errors import ProtocolError
from hushnet.engine.events import MessageArrived, RunStarted, TimerFired
from hushnet.engine.protocol import Protocol
from hushnet.engine.wire import Envelope
from hushnet.sim.simulator import SimResult


class LoopbackNetwork:
    """Run ``machines`` concurrently on the current event loop; ``delay`` = (min, max) seconds per message."""

    def __init__(self, machines: Sequence[Protocol], *, delay: tuple[float, float] = (0.0, 2e-3), seed: int = 0) -> None:
        self.machines = list(machines)
        self.delay = delay
        self._jitter = random.Random(seed)  # transport timing only; never reaches a machine
        self.protocol = machines[0].name
        self.run_id = machines[0].ctx.run_id

    async def run(self, timeout: float = 60.0) -> SimResult:
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        n = len(self.machines)
        inbox: list[asyncio.Queue] = [asyncio.Queue() for _ in range(n)]
        timers: dict[tuple[int, str], asyncio.TimerHandle] = {}
        seqs: dict[tuple[int, int], int] = defaultdict(int)
        ledgers: dict[int, list[LedgerEntry]] = defaultdict(list)
        metrics: list[Metric] = []
        deviations: list[Deviation] = []
        pauses: list[Paused] = []
        faults: list[Fault] = []
        done: asyncio.Future = loop.create_future()
        messages = 0
        events = 0

        def execute(v: int, acts) -> None:
            nonlocal messages
            for act in acts:
                if isinstance(act, Send):
                    messages += 1
                    seqs[(v, act.dst)] += 1
                    data = Envelope(self.protocol, self.run_id, seqs[(v, act.dst)], act.payload).encode()
                    lo, hi = self.delay
                    loop.call_later(self._jitter.uniform(lo, hi), inbox[act.dst].put_nowait, ("msg", v, data))
                elif isinstance(act, SetTimer):
                    old = timers.pop((v, act.name), None)
                    if old:
                        old.cancel()
                    timers[(v, act.name)] = loop.call_later(act.delay, inbox[v].put_nowait, ("timer", act.name, None))
                elif isinstance(act, CancelTimer):
                    h = timers.pop((v, act.name), None)
                    if h:
                        h.cancel()
                elif isinstance(act, LedgerEntry):
                    ledgers[act.node].append(act)
                elif isinstance(act, Metric):
                    metrics.append(act)
                elif isinstance(act, Deviation):
                    deviations.append(act)
                elif isinstance(act, Paused):
                    pauses.append(act)
                elif isinstance(act, Fault):
                    faults.append(act)
                elif isinstance(act, Finish) and not done.done():
                    done.set_result(act)

        async def node_task(v: int) -> None:
            nonlocal events
            m = self.machines[v]
            execute(v, m.handle(RunStarted()))
            while True:
                kind, a, b = await inbox[v].get()
                if kind == "msg":
                    try:
                        env = Envelope.decode(b, protocol=self.protocol, run_id=self.run_id)
                    except ProtocolError as err:
                        execute(v, [Fault(v, err)])
                        continue
                    acts = m.handle(MessageArrived(a, env.payload))
                else:
                    timers.pop((v, a), None)
                    acts = m.handle(TimerFired(a))
                events += 1
                execute(v, acts)

        tasks = [asyncio.create_task(node_task(v)) for v in range(n)]
        status = "finished"
        finish: Finish | None = None
        try:
            finish = await asyncio.wait_for(done, timeout)
        except asyncio.TimeoutError:
            status = "paused" if pauses else "stalled"
        finally:
            for t in tasks:
                t.cancel()
            for h in timers.values():
                h.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return SimResult(status, None if finish is None else finish.model, finish, dict(ledgers), metrics, deviations,
                         pauses, faults, messages, events, time.perf_counter() - t0, time.perf_counter() - t0)
