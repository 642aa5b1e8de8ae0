"""The hushnet node: an asyncio gRPC server and client that talks only to its graph neighbours.

Life cycle (:meth:`Node.start`):

1. load or create the identity in the state directory (ECDSA P-256 TLS key, X25519 key);
2. join through the bootstrap (join token + certificate request → certificate naming the node
   id), retrying with exponential backoff while the bootstrap is unreachable; a restarted node
   presents the same key and gets the same id back;
3. serve the peer API over mutual TLS (clients must chain to the network CA);
4. read the directory, open one channel per neighbour, probe them, renew the lease, and
   follow directory changes (neighbours that join later, move, or leave).

Every inbound envelope is checked before a protocol sees it: caller certificate is a node
certificate of this network whose key matches the directory entry of ``envelope.sender``, the
sender is a graph neighbour, the envelope is addressed to us, within the size limit, and not a
duplicate. Each refusal returns a gRPC status with a readable message to the caller, is logged
(``event=rejected``) and counted; the node keeps serving.

Usable in-process (tests, simulator parity) and from ``hushnet node serve`` (:func:`run`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import pathlib
import signal
import threading
import time
from typing import Any

import grpc

from hushnet.net import VERSION, pki
from hushnet.net import load as _load
from hushnet.net import shared as _shared
from hushnet.net.admission import AdmissionMixin, _Rejected  # noqa: F401  (re-exported)
from hushnet.net.builtin import BuiltinControlsMixin, DiscardProtocol, PingProtocol
from hushnet.net.channels import ChannelsMixin, PeerLink  # noqa: F401
from hushnet.net.config import DEFAULT_MAX_MESSAGE, ENVELOPE_SLACK, PEER_SERVICE, MiB, NodeConfig  # noqa: F401
from hushnet.net.directory import DirectoryMixin
from hushnet.net.errors import (  # noqa: F401
    DeliveryError,
    NodeError,
    NodeStopping,
    NotANeighbour,
    PayloadTooLarge,
)
from hushnet.net.handlers import ControlRegistry, Handler, HandlerRegistry
from hushnet.net.identity import Identity, IdentityMixin, _read_json  # noqa: F401
from hushnet.net.lease import LeaseMixin
from hushnet.net.logs import ContextLog, RateLimitedLog
from hushnet.net.server import ServerMixin
from hushnet.net.store import NodeStore
from hushnet.net.wire import tune_allocator
from hushnet.v1 import bootstrap_pb2 as bpb
from hushnet.v1 import bootstrap_pb2_grpc as bpb_grpc
from hushnet.v1 import peer_pb2 as ppb

log_base = logging.getLogger("hushnet.node")


log = ContextLog(log_base, {})


# ------------------------------------------------------------------------ the node


class Node(
    IdentityMixin,
    AdmissionMixin,
    ServerMixin,
    DirectoryMixin,
    ChannelsMixin,
    LeaseMixin,
    BuiltinControlsMixin,
):
    """One hushnet peer. ``await start()`` … ``await stop()``; or ``run(config)`` for a process."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.state_dir = pathlib.Path(config.state_dir)
        self.handlers = HandlerRegistry()
        self.controls = ControlRegistry()
        #: fault injection (``HUSHNET_FAULT_INJECTION=1`` only; the chaos test): peers whose link is cut —
        #: sends to them stall as on a dead link and fail at their deadline, their deliveries are refused
        self.cut: set[str] = set()
        self.identity: Identity | None = None
        self.onion_keys = (
            None  # hushnet.net.onion_keys.OnionKeyStore once the directory says the network rotates
        )
        self._onion_published: list[tuple[int, bytes]] = []
        self.neighbors: list[str] = []
        self.links: dict[str, PeerLink] = {}
        self.members: dict[str, bpb.Member] = {}
        self.address: str = ""
        self.delivered = 0
        self.rejected = 0
        self._started = time.monotonic()
        self._server: grpc.aio.Server | None = None
        self._tasks: list[asyncio.Task] = []
        #: the event loop's lag and RPC counters (hushnet.net.load), shared by every node on the loop
        self._load = _load.LoopLoad()
        self._pending: set[asyncio.Task] = set()
        self._inflight: set[asyncio.Task] = set()  # Deliver and Control handlers running now
        self._seen: collections.OrderedDict[tuple, None] = collections.OrderedDict()
        self._seq: dict[tuple[str, str, str], int] = {}
        self._bootstrap_ok = True
        self._last_dir_fetch = 0.0
        self._stopping = False
        #: objects whose ``close()`` runs when the node stops (plugins: the run service …), see :meth:`attach`
        self._attached: list[Any] = []
        self.store: NodeStore | None = None
        self._lock_fd: int | None = None
        self.incarnation = 0
        self.lease_seconds = 15.0
        self.log = ContextLog(log_base, {"node": config.node_id or "-"})
        self.rlog = RateLimitedLog(self.log, config.log_interval_s)
        self._boot: _shared.SharedBootstrap | None = (
            None  # the process's bootstrap channel, see hushnet.net.shared
        )

    # ------------------------------------------------------------------ public API
    @property
    def node_id(self) -> str:
        return self.identity.node_id if self.identity else ""

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` has begun (a handler still running may finish; nothing new is accepted)."""
        return self._stopping

    def attach(self, obj: Any) -> None:
        """Close ``obj`` (its ``close()``, if it has one) when the node stops: after the server stopped
        accepting and its in-flight handlers finished, before the node's own stores close.  An object with
        an ``async aclose()`` is awaited instead: it closes its files in a worker thread, so a host stopping
        hundreds of nodes does not run every SQLite checkpoint one after another on its event loop.

        Why here and not by the caller after :meth:`stop`: a plugin closed before the server stops leaves
        a window where a Deliver reaches a handler whose store is closed (INTERNAL "Cannot operate on a
        closed database" to the sender); closed after the node's stores, it could still write into them.
        """
        if callable(getattr(obj, "close", None)) or callable(getattr(obj, "aclose", None)):
            self._attached.append(obj)

    def register_handler(self, handler: Handler, *, replace: bool = False) -> None:
        """Plug a protocol in (see :mod:`hushnet.net.handlers`); allowed while running."""
        self.handlers.register(handler, replace=replace)

    def unregister_handler(self, protocol: str) -> Handler | None:
        return self.handlers.unregister(protocol)

    def register_control(self, command: str, fn, *, replace: bool = False) -> None:
        """Add an operator command ``fn(payload: bytes) -> bytes`` (sync or async)."""
        self.controls.register(command, fn, replace=replace)

    def status(self) -> ppb.StatusReply:
        conns = [
            ppb.Connection(
                peer_id=l.peer_id,
                address=l.address,
                state=l.state(),
                healthy=l.healthy,
                last_ok_unix=l.last_ok,
                sent=l.sent,
                failures=l.failures,
            )
            for l in sorted(self.links.values(), key=lambda l: l.peer_id)
        ]
        return ppb.StatusReply(
            node_id=self.node_id,
            address=self.address,
            neighbors=self.neighbors,
            connections=conns,
            version=VERSION,
            uptime_seconds=time.monotonic() - self._started,
            vertex=self.identity.vertex if self.identity else 0,
            directory_epoch=self.directory_epoch,
            protocols=self.handlers.protocols(),
            delivered=self.delivered,
            rejected=self.rejected,
        )

    # ------------------------------------------------------------------ start / stop
    async def start(self) -> None:
        tune_allocator()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._lock_state_dir()
        try:
            await self._start()
        except BaseException:
            if (
                self._server is None
            ):  # nothing serves from this directory: let another process have it
                self._unlock_state_dir()
            raise

    async def _start(self) -> None:
        # A first start creates and writes the keys, every start counts its incarnation (a file write; the
        # SQLite store itself opens on first use, see hushnet.net.store): all in one worker-thread call, so
        # that a host starting hundreds of nodes does not block every node's event loop on them (and hops to
        # a thread once, not per file)
        self._load = _load.of_loop()
        self.store, self.incarnation, key, x_key, ca_pem = await asyncio.to_thread(self._open_state)
        host, port = pki.split_address(self.config.listen)
        # The certificate must exist before the TLS server can start, and the directory entry
        # needs our address before that: resolve port 0 to a concrete free port up front.
        picked = port == 0
        if picked:
            port = _free_port(host)
        try:
            self.address = self.config.advertise or f"{host}:{port}"
            self.identity = await self._join(key, x_key, ca_pem)
            from hushnet.net import logs as _logs

            _logs.bind_node(self.identity.node_id)  # this task and the server/loop tasks it creates
            self.log.extra["node"] = self.identity.node_id
            if self.config.builtin_handlers:
                for h in (PingProtocol(self.store), DiscardProtocol()):
                    if h.protocol not in self.handlers.protocols():
                        self.handlers.register(h)
                self._register_builtin_controls()
            await self._start_server(f"{host}:{port}")
        finally:
            if picked:  # bound now (or never): the kernel's own bookkeeping holds it from here
                _release_port(host, port)
        await self._refresh_directory(force=True)
        await self.maintain_onion_keys()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._heartbeat_loop(), name="heartbeat"),
            loop.create_task(self._onion_key_loop(), name="onion-keys"),
            loop.create_task(self._directory_loop(), name="directory"),
            loop.create_task(self._probe_loop(), name="probe"),
            loop.create_task(self._log_flush_loop(), name="log-flush"),
        ]
        self.log.info(
            "node %s serving on %s, neighbours: %s",
            self.node_id,
            self.address,
            ", ".join(self.neighbors) or "(none yet)",
            extra={"event": "serving", "address": self.address, "neighbors": self.neighbors},
        )

    #: seconds gRPC's server gets to finish the answers still being sent once the node's own handlers ended
    SERVER_STOP_TAIL_S = 2.0

    async def stop(self, grace: float | None = None, leave: bool = True) -> None:
        """Stop in the order that loses nothing a neighbour was told it has.

        0. stop probing the links (they are going anyway);
        1. stop accepting: new RPCs are refused (UNAVAILABLE "node stopping"); handlers already running get
           ``grace`` seconds (default ``config.stop_grace_s``) to finish, so what they commit before
           answering is committed before anything closes — and their callers get their answer;
        2. the background tasks, the links and the sends still pending;
        3. what :meth:`attach` registered (plugins: the run service with its run store and ledger);
        4. the node's own stores (3 and 4 close their files in worker threads);
        5. the Leave (a hosted node's goes with its process's others, in one call), then the state
           directory's lock.  Last, because it waits for the bootstrap: a host whose bounded stop runs out
           of time during the leaves has every file closed already (n = 512, 410-node host, load 11: every
           node was still waiting for the leave batch when the 10 s bound ran out, its files still open).
        """
        if self._stopping:
            return
        self._stopping = True
        if leave and self.identity is not None and self._boot is not None:
            self._boot.leaves.expect(self.node_id)  # its leave goes with those stopping now
        # no more probes, from now: the links are going anyway.  At n = 2048 (5 hosts of 410 nodes stopping
        # together) every node went on probing neighbours that were stopping too — 40 % of a host's loop,
        # the first node stopped 40 s after SIGTERM (tests/net/test_net_probe_pacing.py)
        for task in self._tasks:
            if task.get_name() == "probe":
                task.cancel()
        for link in self.links.values():
            if link.probing is not None:
                link.probing.cancel()
        grace = self.config.stop_grace_s if grace is None else grace
        if self._server is not None:
            # from here every new RPC is answered UNAVAILABLE "node stopping" by the node itself while the
            # running handlers finish; only then the server stops (gRPC cancels what reaches it after that)
            deadline = time.monotonic() + grace
            running = {t for t in self._inflight if not t.done()}
            running.discard(asyncio.current_task())  # a handler that stops its own node: not itself
            if running and grace > 0:
                await asyncio.wait(running, timeout=grace)
            # gRPC gets a short tail, not the rest of the grace: the node's own handlers are done and what
            # reaches it now is refused at once, so a call still open in gRPC is one it holds without a
            # handler — a request that never came, or a call its aio server matched while its serving loop
            # was exiting (never handed over).  Given the rest of the grace, such a call hung its caller
            # until its deadline (a Deliver timed out after 5 s in CI); now gRPC cancels it
            tail = min(max(deadline - time.monotonic(), 0.0), self.SERVER_STOP_TAIL_S)
            await self._server.stop(tail)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        for link in list(self.links.values()):
            if link.probing is not None:
                link.probing.cancel()
            await link.channel.close()
        self.links.clear()
        for task in list(self._pending):
            task.cancel()
        attached, self._attached = self._attached, []
        for obj in attached:
            try:
                aclose = getattr(obj, "aclose", None)
                if aclose is not None:  # closes its files in a worker thread (see attach)
                    await aclose()
                else:
                    obj.close()
            except Exception:  # one plugin's failure must not keep the node's stores open
                self.log.exception(
                    "closing %s failed", type(obj).__name__, extra={"event": "close_error"}
                )
        stores = [s for s in (self.store, self.onion_keys) if s is not None]
        self.store = self.onion_keys = None
        if stores:
            await close_off_loop(*stores)
        # the Leave last: it waits for the bootstrap (and, hosted, for the process's other nodes' leaves, in
        # one call), so a host whose stop runs out of time (NodeHost.stop) has closed every file by then
        try:
            if leave and self.identity is not None:
                try:
                    if (
                        self._boot is not None
                    ):  # with the process's other nodes stopping now: one call
                        await self._boot.leaves.leave(self._signed("Leave"))
                    else:
                        async with self._bootstrap_channel() as ch:
                            await bpb_grpc.BootstrapStub(ch).Leave(
                                self._signed("Leave"), timeout=1.5
                            )
                except (grpc.aio.AioRpcError, asyncio.TimeoutError, OSError):
                    pass
            if self._boot is not None:
                await _shared.release(self._boot)
                self._boot = None
        finally:
            self.rlog.flush(force=True)
            self._unlock_state_dir()
        self.log.info("node %s stopped", self.node_id, extra={"event": "stopped"})

    async def _log_flush_loop(self) -> None:
        """Write the counts of suppressed log lines once their interval is over."""
        while True:
            await asyncio.sleep(max(self.rlog.interval / 2, 0.1))
            self.rlog.flush()


async def close_off_loop(*stores: Any) -> None:
    """``close()`` each of ``stores`` in a worker thread (one hop for all of them), not on the event loop.

    Why: closing a SQLite file in WAL mode checkpoints it — its WAL is copied into the database and both are
    fsynced.  A node host stopping 410 nodes did that for some 1 200 files one after another on its loop
    (py-spy of a stopping host: most samples in ``sqlite3WalCheckpoint`` → ``fdatasync``), so the nodes
    still to stop waited for all the others' disks.  The stores serialise their own calls (each holds a lock,
    connections are opened with ``check_same_thread=False``), so closing them from a worker is safe; the
    default executor runs several such closes at once and their fsyncs overlap.  Each store is closed even if
    another's close fails (the first failure is raised after).
    """

    def close_all() -> None:
        first: BaseException | None = None
        for store in stores:
            try:
                store.close()
            except Exception as exc:  # close the others anyway
                first = first or exc
        if first is not None:
            raise first

    await asyncio.to_thread(close_all)


#: ports :func:`_free_port` handed to this process's nodes that their servers have not bound yet
_PICKED: set[tuple[str, int]] = set()
_PICKED_LOCK = threading.Lock()
#: kernel answers tried before giving up on a port no other starting node of this process holds
_PICK_TRIES = 64


def _probe_port(host: str) -> int:
    """A port the kernel says is free on ``host`` now (bound once, then closed: free again at once)."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _free_port(host: str) -> int:
    """A free port for a node listening on ``HOST:0``, held for it until :func:`_release_port`.

    Why: the port must be known before the node joins (its address is in the directory and its
    certificate is issued then), so it is picked first and bound later.  Between the two the probe's
    port is free again, and the kernel handed the same port to another node starting in the same host
    process (CI: "cannot listen on 127.0.0.1:36733 … Address already in use", one of 16 hosted nodes
    not started).  Ports picked here and not yet bound are never handed out twice."""
    for _ in range(_PICK_TRIES):
        port = _probe_port(host)
        with _PICKED_LOCK:
            if (host, port) not in _PICKED:
                _PICKED.add((host, port))
                return port
    raise NodeError(
        f"no free port on {host}: the kernel kept offering ports other nodes are starting on"
    )


def _release_port(host: str, port: int) -> None:
    with _PICKED_LOCK:
        _PICKED.discard((host, port))


# ------------------------------------------------------------------------ process entry point


def exit_on_signal(loop: asyncio.AbstractEventLoop, exit_now, what) -> None:
    """From now on SIGINT/SIGTERM end the process at once (``exit_now(128 + signal)``), after one log line
    naming ``what()`` (what is left open).  Why: the first signal stops in order; a second one (the operator's
    second Ctrl-C, a supervisor's second SIGTERM) means "now".  Every store is SQLite in WAL mode: a commit
    is atomic and an open transaction is rolled back when the file is next opened, so nothing durable is
    lost that a kill would not lose."""
    if exit_now is None:
        return

    def force(sig: int) -> None:
        log.warning(
            "%s again while stopping: exiting now, %s",
            signal.Signals(sig).name,
            what(),
            extra={"event": "forced_exit"},
        )
        exit_now(128 + sig)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, force, sig)


def exit_process(code: int) -> None:
    """End this process now (``os._exit``) after flushing the log handlers: no ``atexit``, no waiting for the
    event loop's tasks or worker threads a stuck stop left behind."""
    import os
    import sys

    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


async def serve(config: NodeConfig, stop: asyncio.Event | None = None, exit_now=None) -> None:
    """Start a node and run it until ``stop`` is set (default: SIGINT/SIGTERM); ``exit_now``: see
    :func:`exit_on_signal` (a node process's :func:`exit_process`; None in process)."""
    if stop is None:
        stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    node = Node(config)
    for plugin in config.plugins:  # closed by node.stop, after its server stopped accepting
        node.attach(plugin(node))
    start = loop.create_task(node.start())
    waiter = loop.create_task(stop.wait())
    done, _ = await asyncio.wait({start, waiter}, return_when=asyncio.FIRST_COMPLETED)

    def left() -> str:
        return "its stores not closed" if node.store is not None else "its stores closed"

    if start not in done:  # stopped while still joining
        exit_on_signal(loop, exit_now, left)
        start.cancel()
        try:
            await start
        except (asyncio.CancelledError, NodeError):
            pass
        await node.stop()  # what the start had opened (store, lock, server, plugins)
        return
    waiter.cancel()
    start.result()  # raise NodeError if start failed
    from hushnet.net import logs as _logs

    _logs.set_identity(
        node.node_id
    )  # a process of one node: every record of the process is its own
    await stop.wait()
    exit_on_signal(loop, exit_now, left)
    await node.stop()


def run(config: NodeConfig) -> int:
    """Run a node process on uvloop; a user-facing error becomes a log line and exit code 1."""
    import uvloop

    try:
        uvloop.run(serve(config, exit_now=exit_process))
    except NodeError as exc:
        log.error("%s", exc, extra={"event": "fatal"})
        return 1
    return 0
