"""What an event loop is spending its time on: how late it runs, and the RPCs its nodes make and serve.

Why: at n = 1024 a host process's loop serves ~342 nodes; when it falls behind, every timer and every
probe deadline of every node it hosts is late with it, and a busy *local* loop is not evidence that a
neighbour is gone.  One :class:`LoopLoad` per event loop (shared by the nodes a host runs on it):

* lag: a task that sleeps ``period`` and records how much later than asked it woke (the time the loop
  was busy elsewhere); nodes ask :meth:`lag_since` before they count a probe timeout as a miss, and
  the host logs the lag's max/mean every ``HUSHNET_HOST_LOAD_S`` seconds;
* counters by kind (probe RPCs out, Health/Deliver/Control served, lease renewals, probes skipped
  because the link carried traffic): a dict increment per call, read as rates by the host's log line.
"""

from __future__ import annotations

import ast
import asyncio
import collections
import os
import re
import time
import weakref
from collections.abc import Iterator

#: how often the lag task wakes (s): lateness below this is invisible, the cost is 4 wake-ups a second
LAG_PERIOD_S = 0.25
#: lag samples kept (one per wake-up: 60 s at the default period)
LAG_KEEP = 240

_LOADS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class LoopLoad:
    """Lag samples and RPC counters of one event loop (see the module's docstring)."""

    def __init__(self, period: float = LAG_PERIOD_S) -> None:
        self.period = period
        self.samples: collections.deque[tuple[float, float]] = collections.deque(maxlen=LAG_KEEP)
        self.counts: collections.Counter[str] = collections.Counter()
        self._task: asyncio.Task | None = None
        self._expected = 0.0  # when the sleeping lag task should wake (monotonic)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name="loop-lag")

    async def _run(self) -> None:
        while True:
            self._expected = time.monotonic() + self.period
            await asyncio.sleep(self.period)
            now = time.monotonic()
            self.samples.append((now, max(0.0, now - self._expected)))

    def lag_since(self, since: float) -> float:
        """The largest lateness of this loop (s) seen since ``since`` (monotonic), including the current
        one: a lag task that has not woken yet because the loop is busy shows its overdue time."""
        now = time.monotonic()
        worst = max(0.0, now - self._expected) if self._task is not None else 0.0
        for t, lag in reversed(self.samples):
            if t < since:
                break
            worst = max(worst, lag)
        return worst

    def lag_stats(self, since: float) -> tuple[float, float]:
        """(max, mean) lateness of the wake-ups since ``since``; (0, 0) if none."""
        lags = [lag for t, lag in self.samples if t >= since]
        return (max(lags), sum(lags) / len(lags)) if lags else (0.0, 0.0)

    def count(self, kind: str, k: int = 1) -> None:
        self.counts[kind] += k


def of_loop(loop: asyncio.AbstractEventLoop | None = None) -> LoopLoad:
    """The :class:`LoopLoad` of ``loop`` (default: the running loop), its lag task started on first use."""
    loop = loop or asyncio.get_running_loop()
    load = _LOADS.get(loop)
    if load is None:
        load = _LOADS[loop] = LoopLoad()
    load.start(loop)
    return load


#: the message of a host's ``host_load`` line (:meth:`hushnet.net.host.NodeHost._log_load` writes it)
HOST_LOAD_LINE = re.compile(
    r"host load over (?P<span>[\d.]+) s: loop lag max (?P<max>[\d.]+) s mean (?P<mean>[\d.]+) s; "
    r"CPU/s (?P<cpu>\{[^}]*\}); per second (?P<rates>\{[^}]*\})(?:; (?P<rss>[\d.]+) MB resident)?"
)


def host_load_lines(text: str) -> list[dict]:
    """The ``host_load`` lines of a host's log (text or JSON lines) as dicts: span, lag max/mean, CPU/s, rates."""
    return [
        {
            "span_s": float(m["span"]),
            "lag_max_s": float(m["max"]),
            "lag_mean_s": float(m["mean"]),
            "cpu_per_s": ast.literal_eval(m["cpu"]),
            "rates": ast.literal_eval(m["rates"]),
            "rss_mb": float(m["rss"]) if m["rss"] else None,
        }
        for m in HOST_LOAD_LINE.finditer(text)
    ]


def threads(pid: int) -> Iterator[tuple[int, str, float, float]]:
    """(thread id, thread name, user CPU-s, system CPU-s) of each thread of process ``pid``, from /proc
    (threads that end while being read are skipped)."""
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                raw = fh.read()
        except OSError:
            continue
        fields = raw.rsplit(")", 1)[1].split()
        name = raw[raw.index("(") + 1 : raw.rindex(")")]
        yield int(tid), name, int(fields[11]) / tick, int(fields[12]) / tick


def cpu_split(pid: int) -> dict[str, float]:
    """CPU seconds process ``pid`` used, by thread kind: its event loop (the main thread: Python, the
    nodes' code), gRPC's event-engine threads (TLS handshakes, HTTP/2, the transport) and the rest
    (file and SQLite workers, gRPC's completion-queue poller)."""
    out = {"loop": 0.0, "grpc": 0.0, "other": 0.0}
    for tid, name, user, system in threads(pid):
        kind = "loop" if tid == pid else "grpc" if name.startswith("event_engine") else "other"
        out[kind] += user + system
    return out
