"""A sans-IO event loop that crashes one node and restores it from its last checkpoint (issue 14).

It plays the node driver's durability rule — a batch's checkpoint is written (through the run store's
``pack``/``unpack``) before any of its messages leave — and a SIGKILL: from the crash on the node
handles nothing and messages to it are lost; at the restart a freshly built machine restores the last
checkpoint and its actions run.  Used by the machines' checkpoint tests (the real-process tests are in
``tests/runs``).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from hushnet.engine.actions import CancelTimer, Deviation, Finish, LedgerEntry, Send, SetTimer
from hushnet.engine.events import MessageArrived, RunStarted, TimerFired
from hushnet.engine.protocol import Protocol
from hushnet.runs.run_store import pack, unpack


@dataclass
class CrashRun:
    """What a :func:`run_with_crash` produced: finishes, engine ledger entries, deviations, every send."""

    finishes: dict[int, Finish] = field(default_factory=dict)
    ledgers: dict[int, list[LedgerEntry]] = field(default_factory=dict)
    deviations: list[Deviation] = field(default_factory=list)
    sent: list[tuple[int, int, bytes]] = field(default_factory=list)  # (src, dst, payload)
    victim_batches: list[list[Any]] = field(default_factory=list)  # the victim's batches, in order
    crashed_at: float = -1.0

    def charged(self, v: int) -> list[int]:
        """Steps of node ``v``'s data charges, in order."""
        return [int(e.step) for e in self.ledgers[v] if e.uses_data]


def run_with_crash(
    machines: Sequence[Protocol],
    rebuild: Callable[[int], Protocol],
    victim: int,
    crash_after: int,
    down: float,
    *,
    latency: float = 1e-3,
    horizon: float = 1e4,
    lose_sends: bool = False,
) -> CrashRun:
    """Run ``machines`` to the end; ``victim`` crashes right after its ``crash_after``-th batch and is
    rebuilt (``rebuild(victim)``) and restored ``down`` virtual seconds later.  ``lose_sends``: the
    crash comes between that batch's checkpoint and its sends (none of them leaves)."""
    ms = list(machines)
    n = len(ms)
    out = CrashRun(ledgers={v: [] for v in range(n)})
    heap: list[tuple[float, int, int, str, Any, Any]] = []
    seq = [0]
    timers: dict[tuple[int, str], int] = {}
    snap: dict[int, bytes] = {}
    batches = [0]
    window = [-1.0, -1.0]  # the victim is down in [from, until)

    def push(at: float, v: int, kind: str, a: Any = None, b: Any = None) -> None:
        seq[0] += 1
        heapq.heappush(heap, (at, seq[0], v, kind, a, b))

    def execute(v: int, acts: list, now: float) -> None:
        for a in acts:
            if isinstance(a, LedgerEntry):
                out.ledgers[v].append(a)
            elif isinstance(a, Finish):
                out.finishes[v] = a
            elif isinstance(a, Deviation):
                out.deviations.append(a)
        if any(isinstance(a, (Send, Finish, Deviation, LedgerEntry)) for a in acts):
            snap[v] = pack(ms[v].checkpoint())  # before anything of the batch leaves
        crash = v == victim and window[0] < 0 and batches[0] + 1 == crash_after
        for a in acts:
            if isinstance(a, Send) and crash and lose_sends:
                continue  # killed between the checkpoint and the sends
            if isinstance(a, Send):
                out.sent.append((v, a.dst, bytes(a.payload)))
                push(now + latency, a.dst, "msg", v, bytes(a.payload))
            elif isinstance(a, SetTimer):
                seq[0] += 1
                timers[(v, a.name)] = seq[0]
                push(now + a.delay, v, "timer", a.name, seq[0])
            elif isinstance(a, CancelTimer):
                timers.pop((v, a.name), None)
        if v == victim:
            out.victim_batches.append(list(acts))
            batches[0] += 1
            if batches[0] == crash_after and window[0] < 0:
                window[:] = [now, now + down]
                out.crashed_at = now
                push(now + down, v, "restart")

    for v in range(n):
        push(0.0, v, "start")
    while heap:
        now, _, v, kind, a, b = heapq.heappop(heap)
        if now > horizon:
            break
        if v == victim and window[0] <= now < window[1] and kind != "restart":
            continue  # down: handles nothing, messages to it are lost
        if kind == "restart":
            ms[v] = rebuild(v)
            for key in [k for k in timers if k[0] == v]:
                del timers[key]
            execute(v, ms[v].restore(unpack(snap[v])), now)
            continue
        if kind == "start":
            acts = ms[v].handle(RunStarted())
        elif kind == "msg":
            acts = ms[v].handle(MessageArrived(a, b))
        else:
            if timers.get((v, a)) != b:
                continue
            del timers[(v, a)]
            acts = ms[v].handle(TimerFired(a))
        execute(v, acts, now)
    return out
