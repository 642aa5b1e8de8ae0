"""Node hosting: one OS process runs many complete hushnet peers on one event loop.

Why: a node alone costs one interpreter (~150 MB resident, ~1 s of imports) although almost all
of it is shared code; the papers' experiments need thousands of peers on one machine.  Each hosted
node is still a complete peer — its own identity, certificate, X25519 key, state directory,
SQLite store and ledger, mutual-TLS server on its own ``host:port``, its own channels to its
neighbours — and only the interpreter, the imports, the event loop and pure public computations
are shared.

Isolation (what a hosted node's failure takes with it):

* an exception in a protocol handler or control command is already caught per RPC by the node
  (the caller gets ``INTERNAL`` with the reason); neighbours on the same host are unaffected;
* a coroutine that never returns (a stuck handler) holds only its own RPC until the caller's
  deadline; the others keep being served;
* a node that fails to start (bad state directory, refused join, limit reached) is reported in
  :attr:`NodeHost.failed` and logged; the others start and keep running;
* a node whose background task (heartbeat, directory, probe) dies with an exception is stopped
  and reported by the watchdog; the others keep running;
* what cannot be contained in one process: code that blocks the event loop synchronously stalls
  every hosted node (the watchdog logs the stall), and a crash of the process (segfault, OOM
  kill, SIGKILL) takes all its nodes down; ``hushnet up`` then restarts the process, and every
  node rejoins with its stored identity.

Limits (:class:`HostLimits`): before a node starts, the host checks that the descriptors it may
need and the memory it will take are available, and refuses it with :class:`HostLimitError`
otherwise, instead of letting every hosted node fail later on ``EMFILE`` or the OOM killer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import pathlib
import resource
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hushnet.net import load as _load
from hushnet.net.hostcontrol import new_host_id
from hushnet.net.node import Node, NodeConfig, NodeError, exit_on_signal, exit_process

log = logging.getLogger("hushnet.host")


class HostLimitError(NodeError):
    """The host refuses a new node: it would run out of descriptors, memory, or its node cap."""


@dataclass(frozen=True)
class HostLimits:
    """Capacity rules of a node host (see ``docs/network.md``, "Node hosting").

    ``fds_per_node`` is what a node is assumed to need at most: one listening socket, one client
    socket per neighbour channel, one server-side socket per neighbour's channel to it (a link
    between two nodes of the same process therefore holds two descriptors), its SQLite files, the run
    store's checkpoint log and a transient bootstrap channel.  The default fits degrees up to ~12
    (hypercube:12); raise it for denser graphs.
    """

    max_nodes: int | None = None  # None: as many as descriptors and memory allow
    fds_per_node: int = 40
    fd_reserve: int = 256  # kept free for the process itself (logs, bootstrap and operator calls)
    mem_per_node_mb: float = 8.0  # expected marginal resident memory of one hosted node
    min_free_mb: float = 512.0  # memory the machine must keep available after the node starts
    #: health-probe rounds per second across the host: each hosted node probes its links every
    #: max(probe_s, hosted / probe_rounds_per_s) seconds, so probing costs a process the same CPU
    #: whatever K is (at K = 342, degree 10, 2 s probes were 1 700 Health RPCs a second per process).
    #: Dead connections are still found by keepalive and by every send's own deadline.  Heartbeats
    #: are stretched the same way (the node still renews at least every lease / 3).
    probe_rounds_per_s: float = 50.0
    #: probe periods between Health RPCs on a link whose channel stayed connected (the probes in between
    #: read the channel's state only).  At n = 2048 (K = 410, probe every 8.2 s) one RPC every 4 periods
    #: was ~690 Health RPCs a second across the network, ~0.4 of a core at 0.6 ms each (both ends) — a
    #: tenth of the CPU of the start-up, spent re-confirming links whose connection had not changed.  A
    #: lost connection is still seen at the next probe (the channel leaves READY), a hung neighbour within
    #: this many probe periods.
    health_rpc_every: float = 16.0
    #: probe timeouts in a row on a connected link before a paced host's node calls it down
    #: (``NodeConfig.probe_misses``; a lone node's default is 2)
    probe_misses: int = 3

    def __post_init__(self) -> None:
        if self.max_nodes is not None and self.max_nodes < 1:
            raise ValueError(f"max_nodes must be at least 1, got {self.max_nodes}")
        if self.fds_per_node < 4:
            raise ValueError(f"fds_per_node must be at least 4, got {self.fds_per_node}")
        if self.fd_reserve < 0 or self.mem_per_node_mb < 0 or self.min_free_mb < 0:
            raise ValueError("fd_reserve, mem_per_node_mb and min_free_mb must not be negative")
        if self.probe_rounds_per_s <= 0:
            raise ValueError(f"probe_rounds_per_s must be positive, got {self.probe_rounds_per_s}")
        if self.health_rpc_every < 1:
            raise ValueError(f"health_rpc_every must be at least 1, got {self.health_rpc_every}")
        if self.probe_misses < 1:
            raise ValueError(f"probe_misses must be at least 1, got {self.probe_misses}")


# ------------------------------------------------------------------------ machine probes


def _thread_cpu() -> dict[str, float]:
    """CPU seconds this process used, by thread kind (:func:`hushnet.net.load.cpu_split`); empty where
    /proc is not available."""
    try:
        return _load.cpu_split(os.getpid())
    except OSError:
        return {}


def fd_limit() -> int:
    """The soft open-file limit of this process."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def raise_fd_limit() -> int:
    """Lift the soft open-file limit to the hard one (allowed without privileges); returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


def open_fds() -> int:
    """Descriptors this process holds now."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:  # not Linux: count nothing rather than refuse everything
        return 0


def mem_available_mb() -> float | None:
    """Memory this process may still take: the smaller of the machine's and its cgroup's headroom."""
    avail = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) / 1024
                    break
    except OSError:
        pass
    try:
        limit = pathlib.Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(pathlib.Path("/sys/fs/cgroup/memory.current").read_text())
            room = (int(limit) - used) / (1024 * 1024)
            avail = room if avail is None else min(avail, room)
    except (OSError, ValueError):
        pass
    return avail


def rss_mb(pid: int | str = "self") -> float:
    """Resident memory of a process (MB), from /proc."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


_FD_SAMPLE: list[int] = [0, -1 << 30]  # [descriptors counted, nodes hosted when counted]


def _open_fds_sampled(hosted: int, near: bool) -> int:
    """:func:`open_fds`, counted again every 16 admissions or whenever the budget nears the limit.

    Why: listing ``/proc/self/fd`` costs time proportional to the descriptors held, so counting at every
    admission made starting K nodes quadratic (2.3 s of a 400-node host's 11.6 s start).  Between counts
    the promised budget (``fds_per_node`` a node) is what is checked; within 16 nodes' budget of the limit
    every admission counts.
    """
    if near or hosted - _FD_SAMPLE[1] >= 16 or hosted < _FD_SAMPLE[1]:
        _FD_SAMPLE[:] = [open_fds(), hosted]
    return _FD_SAMPLE[0]


def check_capacity(limits: HostLimits, hosted: int, fd_base: int = 0) -> None:
    """Raise :class:`HostLimitError` if one more node would break a limit.

    ``hosted``: nodes admitted so far; ``fd_base``: descriptors the process held before its first
    node.  Descriptors are budgeted, not only counted: a node admitted a moment ago has not yet
    received its neighbours' connections, so each admitted node counts ``fds_per_node`` (or what
    is really open, if that is more).
    """
    if limits.max_nodes is not None and hosted >= limits.max_nodes:
        raise HostLimitError(
            f"node host is full: {hosted} nodes hosted, the limit is {limits.max_nodes} "
            "(--max-nodes)"
        )
    limit, promised = fd_limit(), fd_base + hosted * limits.fds_per_node
    # counted exactly when 16 more nodes' budget would reach the limit (between samples at most 16 admissions)
    used = _open_fds_sampled(
        hosted, near=promised + 17 * limits.fds_per_node + limits.fd_reserve >= limit
    )
    budget = max(used, promised)
    if budget + limits.fds_per_node + limits.fd_reserve > limit:
        raise HostLimitError(
            f"node host refuses another node: {hosted} nodes hosted, {budget} of {limit} file descriptors "
            f"in use or promised, a node may need {limits.fds_per_node} and {limits.fd_reserve} stay reserved "
            "(raise 'ulimit -n', host fewer nodes per process, or lower --fds-per-node for a sparse graph)"
        )
    free = mem_available_mb()
    if free is not None and free - limits.mem_per_node_mb < limits.min_free_mb:
        raise HostLimitError(
            f"node host refuses another node: {free:.0f} MB of memory available, a node takes about "
            f"{limits.mem_per_node_mb:.0f} MB and {limits.min_free_mb:.0f} MB must stay free (--min-free-mb)"
        )


def default_per_process(
    n: int,
    *,
    cores: int | None = None,
    nofile: int | None = None,
    mem_mb: float | None = None,
    limits: HostLimits = HostLimits(),
    process_mb: float = 160.0,
) -> int:
    """How many nodes one process should host when ``hushnet up`` starts ``n`` nodes.

    Small networks keep a process per node while that fits comfortably (at most 4 per core and a
    quarter of the available memory): full crash isolation is worth 150 MB a node there.  Larger
    ones spread the nodes over one process per core (a single event loop uses one core), each
    capped by what its descriptor limit and the memory allow.
    """
    if n < 1:
        raise ValueError("n must be at least 1")
    cores = cores or os.cpu_count() or 1
    nofile = nofile or fd_limit()
    mem_mb = mem_mb if mem_mb is not None else (mem_available_mb() or 4096.0)
    if n <= 4 * cores and n * process_mb <= mem_mb / 4:
        return 1
    by_fds = max(1, (nofile - limits.fd_reserve) // limits.fds_per_node)
    k = min(math.ceil(n / cores), by_fds)
    if limits.max_nodes is not None:
        k = min(k, limits.max_nodes)
    k = max(1, k)
    return math.ceil(n / math.ceil(n / k))  # the same number of processes, evenly loaded


# ------------------------------------------------------------------------ the host

#: seconds a host's whole stop may take before the nodes still stopping are abandoned (:meth:`NodeHost.stop`);
#: ``hushnet up`` and the experiment runner wait 15 s before they kill a host
STOP_TIMEOUT_S = 10.0


@dataclass
class HostedNode:
    """One node of a host and what became of it."""

    config: NodeConfig
    node: Node
    installed: list = field(default_factory=list)
    error: str = ""
    started: bool = False
    admitted: bool = False  # counted against the limits while it starts
    exc: BaseException | None = None
    closing: asyncio.Task | None = None  # the watchdog's stop of this node, while it runs


class NodeHost:
    """Many :class:`Node` objects on one event loop, started, watched and stopped together.

    ``await start()`` starts every configured node (``concurrency`` at a time, so that a thousand
    joins do not all hit the bootstrap at once), each in its own task and context (its log records
    carry its own node id); ``await add(config)`` starts one more; ``await stop()`` stops all.
    """

    def __init__(
        self,
        configs: list[NodeConfig] | None = None,
        *,
        limits: HostLimits = HostLimits(),
        concurrency: int = 16,
        watchdog_s: float = 1.0,
        load_log_s: float | None = None,
        stop_timeout_s: float | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if stop_timeout_s is None:
            raw = os.environ.get("HUSHNET_HOST_STOP_S", "")
            try:
                stop_timeout_s = float(raw) if raw else STOP_TIMEOUT_S
            except ValueError:
                raise ValueError(
                    f"HUSHNET_HOST_STOP_S must be a number of seconds, got {raw!r}"
                ) from None
        if not stop_timeout_s > 0:
            raise ValueError(f"the host's stop timeout must be positive, got {stop_timeout_s}")
        if load_log_s is None:
            raw = os.environ.get("HUSHNET_HOST_LOAD_S", "")
            try:
                load_log_s = float(raw) if raw else 60.0
            except ValueError:
                raise ValueError(
                    f"HUSHNET_HOST_LOAD_S must be a number of seconds, got {raw!r}"
                ) from None
        #: seconds between ``host_load`` log lines (0: none); default ``HUSHNET_HOST_LOAD_S`` or 60
        self.load_log_s = load_log_s
        self.limits = limits
        self.concurrency = concurrency
        self.watchdog_s = watchdog_s
        configs = [self._paced(c, len(configs or [])) for c in (configs or [])]
        self.entries: list[HostedNode] = [HostedNode(c, Node(c)) for c in configs]
        self.max_stall_s = 0.0
        self.fd_base = open_fds()
        self._admit = asyncio.Lock()
        self._watchdog: asyncio.Task | None = None
        #: the bound on a whole :meth:`stop` (seconds; default ``HUSHNET_HOST_STOP_S`` or :data:`STOP_TIMEOUT_S`)
        self.stop_timeout_s = stop_timeout_s
        self.last_stop_s: float | None = None  # how long the last stop took
        #: names this process's set of nodes: each answers the operator's ``host.batch`` for all of them
        self.host_id = new_host_id()

    # ------------------------------------------------------------------ views
    @property
    def running(self) -> list[Node]:
        return [e.node for e in self.entries if e.started and not e.error]

    @property
    def failed(self) -> dict[str, str]:
        """State directory → reason, for every node that could not start or was stopped by the watchdog."""
        return {str(e.config.state_dir): e.error for e in self.entries if e.error}

    def peers(self) -> dict[str, Node]:
        """The running nodes by id: whom a hosted node's ``host.batch`` answers for."""
        return {n.node_id: n for n in self.running}

    def summary(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "running": len(self.running),
            "failed": self.failed,
            "open_fds": open_fds(),
            "fd_limit": fd_limit(),
            "rss_mb": round(rss_mb(), 1),
            "tasks": len(asyncio.all_tasks()),
            "max_stall_s": round(self.max_stall_s, 3),
        }

    # ------------------------------------------------------------------ start / add / stop
    async def start(self) -> None:
        """Start all configured nodes; failures are recorded, not raised (unless none started)."""
        sem = asyncio.Semaphore(self.concurrency)

        async def one(entry: HostedNode) -> None:
            async with sem:
                await self._start_entry(entry)

        loop = asyncio.get_running_loop()
        # one task per node: each gets a copy of the context, so its log identity stays its own
        await asyncio.gather(
            *(loop.create_task(one(e)) for e in self.entries if not e.started and not e.error)
        )
        if self._watchdog is None:
            self._watchdog = loop.create_task(self._watch(), name="host-watchdog")
        if self.entries and not self.running:
            reasons = "; ".join(f"{d}: {r}" for d, r in list(self.failed.items())[:5])
            raise NodeError(f"no hosted node started ({len(self.entries)} tried): {reasons}")

    def _paced(self, config: NodeConfig, hosted: int) -> NodeConfig:
        """``config`` with its probe period stretched to the host's probe budget (see :class:`HostLimits`)."""
        pace = hosted / self.limits.probe_rounds_per_s
        probe_s, heartbeat_s = (
            max(config.probe_s, pace),
            max(config.heartbeat_s, pace),
        )  # heartbeat ≤ lease/3 anyway
        if (probe_s, heartbeat_s) == (config.probe_s, config.heartbeat_s):
            return config
        # between Health RPCs (every health_rpc_every probe periods) a probe reads the channel state only: a
        # dropped connection still shows at the next probe, a live one costs no RPC (at n = 2048, K = 410 the
        # probe RPCs, ~1 100 a second per process in and out, were most of an idle host's CPU)
        health_rpc_s = max(config.health_rpc_s, self.limits.health_rpc_every * probe_s)
        # keepalive pings stretched the same way (4 probe periods: 33 s at K = 410): each costs ~0.1 ms of CPU
        # at both ends, and a 2048-node network has 22 528 connections
        keepalive_s = max(config.keepalive_s, 4 * probe_s)
        # a loop serving hundreds of nodes runs late under load, and so do its neighbours': one more miss
        # before a connected link is called down (n = 1024: 2 046 live links dropped in two minutes)
        probe_misses = max(config.probe_misses, self.limits.probe_misses)
        return dataclasses.replace(
            config,
            probe_s=probe_s,
            heartbeat_s=heartbeat_s,
            health_rpc_s=health_rpc_s,
            keepalive_s=keepalive_s,
            probe_misses=probe_misses,
        )

    async def add(self, config: NodeConfig) -> Node:
        """Start one more node on this host; raises :class:`HostLimitError` or :class:`NodeError`."""
        # a node of this state directory that the watchdog is stopping holds its lock until its stop ends
        # (its leave may wait for the host's batch): wait for it, as a restart of that node would
        same = pathlib.Path(config.state_dir).resolve()
        for e in self.entries:
            if e.closing is not None and pathlib.Path(e.config.state_dir).resolve() == same:
                await asyncio.shield(e.closing)
        config = self._paced(config, len(self.entries) + 1)
        entry = HostedNode(config, Node(config))
        self.entries.append(entry)
        await asyncio.get_running_loop().create_task(self._start_entry(entry))
        if entry.exc is not None:
            raise entry.exc
        if self._watchdog is None:
            self._watchdog = asyncio.get_running_loop().create_task(
                self._watch(), name="host-watchdog"
            )
        return entry.node

    async def _start_entry(self, entry: HostedNode) -> None:
        try:
            async with (
                self._admit
            ):  # check and admit one at a time, so two starts cannot share the last slot
                check_capacity(
                    self.limits,
                    sum(1 for e in self.entries if e.admitted and not e.error),
                    self.fd_base,
                )
                entry.admitted = True
            entry.node.host_peers, entry.node.host_id = self.peers, self.host_id
            entry.installed = [plugin(entry.node) for plugin in entry.config.plugins]
            for obj in entry.installed:  # closed by node.stop, after its server stopped accepting
                entry.node.attach(obj)
            await entry.node.start()
            entry.started = True
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # one node's failure is reported; the host and the others carry on
            entry.admitted = False
            entry.exc = exc
            entry.error = str(exc) if isinstance(exc, NodeError) else f"{type(exc).__name__}: {exc}"
            log.error(
                "node in %s did not start: %s",
                entry.config.state_dir,
                entry.error,
                extra={
                    "event": "host_node_failed",
                    "node": entry.config.node_id or "-",
                    "state_dir": str(entry.config.state_dir),
                },
            )
            await self._close_entry(entry, leave=False)

    async def _close_entry(
        self, entry: HostedNode, leave: bool = True, grace: float | None = None
    ) -> None:
        """Stop one hosted node; its plugins close inside :meth:`Node.stop`, after its server stopped
        accepting (see :meth:`Node.attach`)."""
        entry.installed = []
        try:
            await entry.node.stop(grace=grace, leave=leave)
        except Exception:
            log.exception("stopping node %s failed", entry.node.node_id or entry.config.state_dir)

    async def stop(self, *, grace: float | None = None, timeout: float | None = None) -> int:
        """Stop every hosted node at once; returns how many did not stop within ``timeout``.

        All nodes stop concurrently, each with the same ``grace`` for its running handlers (default: its
        ``NodeConfig.stop_grace_s``), so a host's stop takes one grace, not one per node; their files close in
        worker threads (:func:`hushnet.net.node.close_off_loop`).  ``timeout`` (default
        :attr:`stop_timeout_s`) bounds the whole stop: the nodes still stopping then are cancelled and named
        in the log, and the process may exit.  A node closes its files before its Leave (the step that waits
        for the bootstrap and for the host's other nodes), so one late in its leave has closed them; one stuck
        before that leaves them as its last commit left them (WAL: nothing half-written is ever read back).
        Logs one ``host_stopped`` line: how many nodes, how long, how many abandoned with files open."""
        t0 = time.monotonic()
        timeout = self.stop_timeout_s if timeout is None else timeout
        if self._watchdog is not None:
            self._watchdog.cancel()
            try:
                await self._watchdog
            except (asyncio.CancelledError, Exception):
                pass
            self._watchdog = None
        loop = asyncio.get_running_loop()
        # started nodes, and nodes whose start a stop cancelled half-way (admitted: their store, lock and
        # maybe their server are open — left so, the server outlived the host's loop)
        stopping = {
            loop.create_task(self._close_entry(e, grace=grace), name="host-stop-node"): e
            for e in self.entries
            if (e.started or e.admitted) and not e.error
        }
        # a node the watchdog is stopping already (a crashed background task) counts too
        closing = [
            e.closing for e in self.entries if e.closing is not None and not e.closing.done()
        ]
        late: set[asyncio.Task] = set()
        if stopping or closing:
            _, late = await asyncio.wait([*stopping, *closing], timeout=timeout)
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(
                late, timeout=1.0
            )  # let them unwind their cancellation (best effort)
        names = [
            stopping[t].node.node_id or str(stopping[t].config.state_dir)
            for t in late
            if t in stopping
        ]
        took = time.monotonic() - t0
        if late:
            # a node's files close before its Leave (Node.stop), so a node late only in its leave has none open
            still_open = sum(
                1 for t in late if t in stopping and stopping[t].node.store is not None
            )
            log.error(
                "stopped %d of %d hosted nodes in %.1f s; %d did not stop within %.0f s and were abandoned "
                "(%d with files still open): %s",
                len(stopping) - len(names),
                len(stopping),
                took,
                len(late),
                timeout,
                still_open,
                ", ".join(sorted(names)[:10]) + (" …" if len(names) > 10 else ""),
                extra={
                    "event": "host_stopped",
                    "nodes": len(stopping),
                    "late": len(late),
                    "files_open": still_open,
                    "stop_s": round(took, 2),
                },
            )
        else:
            log.info(
                "stopped %d hosted nodes in %.1f s",
                len(stopping),
                took,
                extra={"event": "host_stopped", "nodes": len(stopping), "stop_s": round(took, 2)},
            )
        self.last_stop_s = took
        return len(late)

    # ------------------------------------------------------------------ watchdog
    def _log_load(
        self, load: _load.LoopLoad, mark: tuple[float, dict[str, int], dict[str, float]]
    ) -> tuple[float, dict[str, int], dict[str, float]]:
        """One ``host_load`` line: the loop's lag (max/mean), the CPU the process used per second by
        thread kind, and the RPCs per second by kind since ``mark``; returns the new mark.

        Why: at n = 1024 a host's loop stalled under load and nobody could say on what; this line is the
        measurement (``benchmarks/bench_host_load.py`` reads it) and the evidence in a run's logs."""
        now = time.monotonic()
        span = max(now - mark[0], 1e-9)
        counts, cpu = dict(load.counts), _thread_cpu()
        lag_max, lag_mean = load.lag_stats(mark[0])
        rates = {
            k: round((v - mark[1].get(k, 0)) / span, 2)
            for k, v in sorted(counts.items())
            if v != mark[1].get(k, 0)
        }
        cpu_rate = {k: round((v - mark[2].get(k, 0.0)) / span, 3) for k, v in cpu.items()}
        rss = round(rss_mb(), 1)
        log.info(
            "host load over %.0f s: loop lag max %.2f s mean %.3f s; CPU/s %s; per second %s; %.0f MB resident",
            span,
            lag_max,
            lag_mean,
            cpu_rate,
            rates,
            rss,
            extra={
                "rss_mb": rss,
                "event": "host_load",
                "span_s": round(span, 1),
                "lag_max_s": round(lag_max, 3),
                "lag_mean_s": round(lag_mean, 4),
                "cpu_per_s": cpu_rate,
                "rates": rates,
                "nodes": len(self.running),
            },
        )
        return now, counts, cpu

    async def _watch(self) -> None:
        """Stop nodes whose background tasks died; log event-loop stalls (a blocking hosted node) and, every
        ``load_log_s``, what the loop is busy with (:meth:`_log_load`)."""
        period = self.watchdog_s
        load = _load.of_loop()
        mark = (time.monotonic(), dict(load.counts), _thread_cpu())
        while True:
            t0 = time.monotonic()
            if self.load_log_s > 0 and t0 - mark[0] >= self.load_log_s:
                mark = self._log_load(load, mark)
            await asyncio.sleep(period)
            stall = time.monotonic() - t0 - period
            if stall > 0.5:
                self.max_stall_s = max(self.max_stall_s, stall)
                log.warning(
                    "event loop stalled for %.1f s (hosted code not yielding, or the process starved of "
                    "CPU); every node of this process was stalled",
                    stall,
                    extra={"event": "host_stall", "stall_s": stall},
                )
            for entry in self.entries:
                if not entry.started or entry.error:
                    continue
                for task in entry.node._tasks:
                    if task.done() and not task.cancelled() and task.exception() is not None:
                        exc = task.exception()
                        entry.error = (
                            f"background task {task.get_name()} failed: {type(exc).__name__}: {exc}"
                        )
                        log.error(
                            "node %s: %s; stopping this node, the others keep running",
                            entry.node.node_id,
                            entry.error,
                            extra={"event": "host_node_crashed", "node": entry.node.node_id},
                        )
                        entry.closing = asyncio.get_running_loop().create_task(
                            self._close_entry(entry)
                        )
                        break


# ------------------------------------------------------------------------ process entry point


async def serve_host(
    configs: list[NodeConfig],
    *,
    limits: HostLimits = HostLimits(),
    concurrency: int = 16,
    stop: asyncio.Event | None = None,
    exit_now: Callable[[int], Any] | None = None,
) -> NodeHost:
    """Host ``configs`` until ``stop`` is set (default: SIGINT/SIGTERM); returns the stopped host.

    ``exit_now(code)`` (a host process's: :func:`exit_process`) ends the process at once: on a second
    SIGINT/SIGTERM while the nodes stop (an operator's second Ctrl-C), and when nodes did not stop within
    the host's stop timeout (their stuck tasks or threads would otherwise hold the loop's shutdown).
    In process (tests) it is None: a second signal is ignored and the host returns."""
    if stop is None:
        stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    host = NodeHost(configs, limits=limits, concurrency=concurrency)
    t0 = time.monotonic()
    start = loop.create_task(host.start())
    waiter = loop.create_task(stop.wait())
    await asyncio.wait({start, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if not start.done():  # stopped while still starting
        _force_on_second_signal(loop, host, exit_now)
        start.cancel()
        try:
            await start
        except (asyncio.CancelledError, NodeError):
            pass
        await _stop_host(host, exit_now)
        return host
    waiter.cancel()
    try:
        start.result()
    except NodeError:
        await host.stop()
        raise
    doc = host.summary()
    log.info(
        "hosting %d nodes (%d failed) after %.1f s: %.0f MB resident, %d of %d descriptors",
        doc["running"],
        len(doc["failed"]),
        time.monotonic() - t0,
        doc["rss_mb"],
        doc["open_fds"],
        doc["fd_limit"],
        extra={"event": "host_serving", **{k: doc[k] for k in ("running", "rss_mb", "open_fds")}},
    )
    await stop.wait()
    _force_on_second_signal(loop, host, exit_now)
    await _stop_host(host, exit_now)
    return host


def _force_on_second_signal(
    loop: asyncio.AbstractEventLoop, host: NodeHost, exit_now: Callable[[int], Any] | None
) -> None:
    """From now on SIGINT/SIGTERM end the host process at once (:func:`hushnet.net.node.exit_on_signal`)."""

    def left() -> str:
        n = sum(1 for e in host.entries if e.node.store is not None)
        return f"{n} of {len(host.entries)} nodes not closed (their stores keep their last commit)"

    exit_on_signal(loop, exit_now, left)


async def _stop_host(host: NodeHost, exit_now: Callable[[int], Any] | None) -> None:
    """Stop the host; in a host process, exit at once if nodes were abandoned (see :meth:`NodeHost.stop`).

    A host process (``exit_now`` given) first freezes its heap: the stop frees a great many objects, and
    each full cycle collection meanwhile walked every hosted node's heap (py-spy of a 410-node host's stop:
    ``gc_collect_main`` in a seventh of its event loop's samples).  The process is about to exit; what is
    frozen is never collected, which no longer matters.  In process (tests) nothing is frozen."""
    if exit_now is not None:
        import gc

        gc.freeze()
    late = await host.stop()
    if late and exit_now is not None:
        exit_now(1)


def tune_gc(gen0: int = 10_000) -> None:
    """Collect cycles less often in a host process, and never rescan what the imports left behind.

    Why: a host of hundreds of nodes allocates many short-lived objects (messages, calls, tasks) on a
    large heap.  With Python's default gen-0 threshold (700 allocations) the collector ran ~170 times in
    a 32-node host's start-up, 0.25–0.35 s of its ~2.5 CPU-seconds; at 10 000, 12 times and 0.11–0.15 s
    (64 nodes as 2 × 32, timed with ``gc.callbacks``, the threshold set from the process's start).  ``gc.freeze()`` moves the objects of the imports
    out of every later full collection.  Garbage without cycles is freed at once as before.
    """
    import gc

    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0, gen1, gen2)


def run_host(
    configs: list[NodeConfig], *, limits: HostLimits = HostLimits(), concurrency: int = 16
) -> int:
    """Run a node host process on uvloop: exit 0 after a clean stop, 1 if no node could start."""
    import uvloop

    from hushnet.net.node import log as node_log

    raise_fd_limit()
    tune_gc()
    try:
        uvloop.run(
            serve_host(configs, limits=limits, concurrency=concurrency, exit_now=exit_process)
        )
    except NodeError as exc:
        node_log.error("%s", exc, extra={"event": "fatal"})
        return 1
    # every node is stopped and its files closed: what is left is the interpreter's exit, whose cycle
    # collection walked the whole heap of the hosted nodes (64 nodes after a walk: 0.8 s of a 1.35 s exit
    # after SIGTERM; 0.2 s with the heap frozen first).  Frozen objects are never collected, which no longer
    # matters; atexit handlers (logging, coverage) still run.  (What the stop allocated is frozen here.)
    import gc

    gc.freeze()
    return 0


def hosted_configs(
    state_dirs: list[pathlib.Path],
    listen: str,
    node_ids: list[str] | None = None,
    advertise: str | None = None,
    **common: Any,
) -> list[NodeConfig]:
    """One :class:`NodeConfig` per state directory; ``listen`` ``HOST:0`` gives each node a free port,
    ``HOST:P`` gives node ``i`` port ``P + i``.

    ``advertise`` is what peers dial when it differs from ``listen`` (a container or a machine
    behind NAT listens on ``0.0.0.0`` but is reached at its own address): ``AHOST:AP`` publishes
    node ``i`` at ``AHOST:AP + i``, a bare ``AHOST`` at ``AHOST`` and node ``i``'s listen port.
    It needs a fixed listen port: a free port picked at start cannot be published beforehand."""
    from hushnet.net import pki

    if node_ids and len(node_ids) != len(state_dirs):
        raise ValueError(
            f"{len(node_ids)} node ids for {len(state_dirs)} state directories: give one per node or none"
        )
    if len({pathlib.Path(d).resolve() for d in state_dirs}) != len(state_dirs):
        raise ValueError("the same state directory is given twice: every hosted node needs its own")
    host, port = pki.split_address(listen)
    if port and port + len(state_dirs) - 1 > 65535:
        raise ValueError(f"ports {port}..{port + len(state_dirs) - 1} exceed 65535")
    adv_host, adv_port = None, None
    if advertise:
        if not port:
            raise ValueError(
                "--advertise with several nodes needs a fixed --listen port (PORT, not 0): "
                "node i is published at the advertised port + i"
            )
        if ":" not in advertise or pki.is_ip(advertise.strip("[]")):
            adv_host, adv_port = advertise.strip("[]"), port  # a bare host: the listen ports
        else:
            try:
                adv_host, adv_port = pki.split_address(advertise)
            except ValueError:
                raise ValueError(f"--advertise {advertise!r} is not HOST or HOST:PORT") from None
        if ":" in adv_host:  # IPv6: HOST:PORT needs the brackets back
            adv_host = f"[{adv_host}]"
        if not 0 < adv_port <= 65535 or adv_port + len(state_dirs) - 1 > 65535:
            raise ValueError(
                f"advertised ports {adv_port}..{adv_port + len(state_dirs) - 1} are not in 1..65535"
            )
    out = []
    for i, d in enumerate(state_dirs):
        addr = f"{host}:{port + i if port else 0}"
        out.append(
            NodeConfig(
                state_dir=pathlib.Path(d),
                listen=addr,
                advertise=f"{adv_host}:{adv_port + i}" if adv_host else None,
                node_id=node_ids[i] if node_ids else None,
                **common,
            )
        )
    return out


__all__ = [
    "HostLimitError",
    "HostLimits",
    "NodeHost",
    "check_capacity",
    "STOP_TIMEOUT_S",
    "default_per_process",
    "exit_process",
    "fd_limit",
    "hosted_configs",
    "mem_available_mb",
    "open_fds",
    "raise_fd_limit",
    "rss_mb",
    "run_host",
    "serve_host",
    "tune_gc",
]
