"""What the nodes of one process share with each other: the bootstrap channel and directory reads.

Why: every node talked to the bootstrap over a fresh TLS channel per call (join, each heartbeat,
each directory poll) and read the full directory every ``directory_refresh_s``.  At n = 256 that
is ~200 TLS handshakes and ~130 full-directory builds a second on the bootstrap, which then
needs longer than the lease to answer; at n = 1024 the network never became healthy.  The
bootstrap channel carries no client identity (requests are signed per node, see
``Node._signed``), and the directory is public, so the nodes of one process can share both:

* one channel per (event loop, bootstrap address, CA), reference-counted by the nodes using it;
* directory reads are coalesced: a caller that needs a directory read *after* a given moment
  (a node checking a caller it has not seen yet must see joins that happened before it asked)
  waits for a read started at or after that moment, or starts one; a periodic poll accepts a read
  up to ``max_age`` old.  A process hosting K nodes thus reads the directory about once per poll
  period, not K times.

At n = 2048 that was still too much (issue 12): every process re-read the full 2048-member directory
every poll period, and every node sent its own signed heartbeat (~700 a second, each a certificate
parse, a signature check and an SQLite commit on the bootstrap).  So, per process:

* the directory is a versioned snapshot plus changes: one ``WatchDirectory`` long poll asks for the
  changes after the version we hold, answered when the directory changes (not polled); the nodes
  wait for the process's copy to move (:meth:`SharedBootstrap.next_directory`).  A read that must
  be fresh (a caller we have not seen yet) is the same call with no wait: only the changed members;
* one ``HeartbeatHost`` per lease period renews the leases of all the process's nodes, signed once
  by an ephemeral host key to which each node delegates its lease once (:class:`HostLease`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time

import grpc

from hushnet.net import pki
from hushnet.v1 import bootstrap_pb2 as bpb
from hushnet.v1 import bootstrap_pb2_grpc as bpb_grpc

MiB = 1024 * 1024
WATCH_WAIT_S = 20.0  # how long the bootstrap may hold a WatchDirectory call without a change
COALESCE_S = (
    0.25  # after a change, wait this long before asking again (a join storm arrives in batches)
)
log = logging.getLogger("hushnet.node")


class SharedBootstrap:
    """One bootstrap channel and one coalesced directory reader, shared by the nodes of a process."""

    def __init__(self, address: str, ca_pem: bytes) -> None:
        self.address = address
        self.channel = grpc.aio.secure_channel(
            address,
            pki.channel_credentials(ca_pem),
            options=[
                ("grpc.ssl_target_name_override", pki.BOOTSTRAP_DNS),
                ("grpc.max_receive_message_length", 64 * MiB),
                ("grpc.initial_reconnect_backoff_ms", 500),
                ("grpc.max_reconnect_backoff_ms", 5000),
            ],
        )
        self.stub = bpb_grpc.BootstrapStub(self.channel)
        self.users = 0
        self.reads = 0  # directory reads actually sent (the rest were shared)
        self._last: tuple[float, bpb.Directory] | None = None
        self._inflight: tuple[float, asyncio.Task] | None = None
        self._next: asyncio.Task | None = None
        self.loop = asyncio.get_running_loop()
        self.current: bpb.Directory | None = None  # the process's copy, moved forward by changes
        self._members: dict[str, bpb.Member] = {}
        self._updated = asyncio.Event()
        self._watcher: asyncio.Task | None = None
        self.lease = HostLease(self)

    async def directory(self, *, since: float, timeout: float = 5.0) -> bpb.Directory:
        """A directory read that started at or after ``since`` (``time.monotonic()``), shared if possible.

        Callers that arrive while a read is under way and need a newer one all wait for the single
        read that starts when it ends: at most one read in flight and one queued, whatever K is.
        """
        if self._last is None or self._last[0] < since:
            if self._inflight is not None and self._inflight[0] >= since:
                await asyncio.shield(self._inflight[1])
            else:
                if self._next is None:
                    prev = self._inflight[1] if self._inflight is not None else None
                    self._next = asyncio.get_running_loop().create_task(
                        self._read_after(prev, timeout)
                    )
                await asyncio.shield(self._next)
        return self.current  # that read merged into the process's copy, which only moves forward

    async def _read_after(self, prev: asyncio.Task | None, timeout: float) -> bpb.Directory:
        if prev is not None:
            await asyncio.wait([prev])
        started = time.monotonic()
        me = asyncio.current_task()
        self._inflight, self._next = (started, me), None
        try:
            self.reads += 1
            directory = await self._fetch(0.0, timeout)
        finally:
            if self._inflight is not None and self._inflight[1] is me:
                self._inflight = None
        if self._last is None or started >= self._last[0]:
            self._last = (started, directory)
        return directory

    # ------------------------------------------------------------------ versioned directory
    async def _fetch(self, wait: float, timeout: float) -> bpb.Directory:
        """Ask for the changes after our version (held up to ``wait`` s by the bootstrap), apply them."""
        since = self.current.epoch if self.current is not None else 0
        changes = await self.stub.WatchDirectory(
            bpb.DirectoryWatch(since_epoch=since, wait_seconds=wait), timeout=wait + timeout
        )
        return self._merge(changes)

    def _merge(self, changes: bpb.DirectoryChanges) -> bpb.Directory:
        cur = self.current
        if changes.snapshot:
            if (
                cur is not None
                and changes.epoch < cur.epoch
                and changes.directory.ca_pem == cur.ca_pem
            ):
                return cur  # an older answer overtaken by a newer one
            new = changes.directory
            self._members = {m.node_id: m for m in new.members}
        else:
            if cur is None or changes.epoch <= cur.epoch:
                return cur
            for m in changes.changed:
                self._members[m.node_id] = m
            new = bpb.Directory()
            new.CopyFrom(cur)
            del new.members[:]
            new.members.extend(sorted(self._members.values(), key=lambda m: m.vertex))
            new.epoch = changes.epoch
        self.current = new
        self._updated.set()
        self._updated = asyncio.Event()
        return new

    async def next_directory(self, after_epoch: int | None) -> bpb.Directory:
        """The process's directory once its version differs from ``after_epoch`` (started on first use)."""
        if self._watcher is None:
            self._watcher = self.loop.create_task(self._watch(), name="directory-watch")
        while self.current is None or self.current.epoch == after_epoch:
            await self._updated.wait()
        return self.current

    async def _watch(self) -> None:
        """One long poll per process: the directory changes arrive when they happen, not every poll period."""
        failing = False
        while True:
            try:
                before = self.current
                await self._fetch(WATCH_WAIT_S, 5.0)
                failing = False
                if self.current is not before:
                    await asyncio.sleep(COALESCE_S)
            except grpc.aio.AioRpcError as exc:
                if not failing:
                    log.warning(
                        "directory watch on %s failed (%s); retrying",
                        self.address,
                        exc.code().name,
                        extra={"event": "bootstrap_unreachable"},
                    )
                failing = True
                await asyncio.sleep(1.0)

    async def close(self) -> None:
        for task in (self._watcher, self.lease.task):
            if task is not None:
                task.cancel()
        await self.channel.close()


class HostLease:
    """The leases of all the nodes of one process, renewed by one signed ``HeartbeatHost`` per period.

    Each node holds its lease with :meth:`hold` (its ``heartbeat`` task: cancelling it silences that node
    alone).  The process signs each request once with an ephemeral P-256 key; a node's first request
    carries its delegation to that key (its own signature, checked once by the bootstrap).  A node the
    bootstrap no longer knows re-joins; a node it lists as undelegated sends its delegation again.
    """

    def __init__(self, shared: SharedBootstrap) -> None:
        self.shared = shared
        self.nodes: dict[str, object] = {}  # node id -> Node
        self.delegated: set[str] = set()
        self.task: asyncio.Task | None = None
        self.key = None
        self.der = b""
        self.sha = ""
        self.renewals = 0  # requests sent (tests and benchmarks read it)
        self._rejoining: set[str] = set()
        self._kick = asyncio.Event()

    async def hold(self, node) -> None:
        """Keep ``node``'s lease renewed until cancelled."""
        node_id = node.node_id
        self.nodes[node_id] = node
        self.delegated.discard(node_id)
        if self.task is None or self.task.done():
            self.task = self.shared.loop.create_task(self._loop(), name="host-lease")
        try:
            await asyncio.Future()
        finally:
            if self.nodes.get(node_id) is node:
                del self.nodes[node_id]
            self.delegated.discard(node_id)

    def _period(self) -> float:
        return min(
            (min(n.config.heartbeat_s, n.lease_seconds / 3) for n in self.nodes.values()),
            default=1.0,
        )

    async def _loop(self) -> None:
        failing = False
        while True:
            try:
                await asyncio.wait_for(self._kick.wait(), max(self._period(), 0.05))
            except asyncio.TimeoutError:
                pass
            self._kick.clear()
            if not self.nodes:
                continue
            try:
                await self.renew()
                if failing:
                    log.info("leases renewed again", extra={"event": "lease_ok"})
                failing = False
            except grpc.aio.AioRpcError as exc:
                if not failing:
                    log.warning(
                        "heartbeat failed (%s); will keep trying",
                        exc.code().name,
                        extra={"event": "heartbeat_failed"},
                    )
                failing = True

    async def renew(self) -> bpb.HostLeaseReply:
        """Send one HeartbeatHost for every node held now; act on the reply."""
        if self.key is None:
            self.key = pki.generate_key()
            self.der = pki.public_key_der(self.key)
            self.sha = hashlib.sha256(self.der).hexdigest()
        nodes = dict(self.nodes)
        ids = sorted(nodes)
        delegations = [
            nodes[i]._signed(f"Delegate:{self.sha}") for i in ids if i not in self.delegated
        ]
        ms = int(time.time() * 1000)
        req = bpb.HostHeartbeat(
            host_public_key=self.der,
            unix_ms=ms,
            node_ids=ids,
            delegations=delegations,
            signature=pki.sign(self.key, pki.host_lease_message(ids, self.sha, ms)),
        )
        self.renewals += 1
        reply = await self.shared.stub.HeartbeatHost(req, timeout=5.0)
        missing = set(reply.unknown) | set(reply.undelegated)
        self.delegated.update(i for i in ids if i not in missing)
        self.delegated.difference_update(missing)
        for node_id in reply.unknown:
            node = nodes.get(node_id)
            if node is not None and node_id not in self._rejoining:
                self._rejoining.add(node_id)
                task = self.shared.loop.create_task(self._rejoin(node_id, node))
                node._pending.add(task)
                task.add_done_callback(node._pending.discard)
        if reply.undelegated:
            self._kick.set()  # their delegations go out now, not a period later
        for node in nodes.values():
            if reply.lease_seconds > 0:
                node.lease_seconds = reply.lease_seconds
        return reply

    async def _rejoin(self, node_id: str, node) -> None:
        try:
            await node._rejoin()
        finally:
            self._rejoining.discard(node_id)
            self.delegated.discard(node_id)


class _Borrowed:
    """``async with`` that yields the shared channel and leaves it open (the old call sites close theirs)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel

    async def __aenter__(self) -> grpc.aio.Channel:
        return self.channel

    async def __aexit__(self, *exc) -> None:
        return None


_SHARED: dict[tuple[int, str, str], SharedBootstrap] = {}


def acquire(address: str, ca_pem: bytes) -> SharedBootstrap:
    """The process's shared bootstrap for this loop, address and CA (created on first use)."""
    key = (id(asyncio.get_running_loop()), address, hashlib.sha256(ca_pem).hexdigest())
    shared = _SHARED.get(key)
    if shared is None or shared.loop is not asyncio.get_running_loop():  # a dead loop's id reused
        shared = _SHARED[key] = SharedBootstrap(address, ca_pem)
    shared.users += 1
    return shared


async def release(shared: SharedBootstrap) -> None:
    """Drop one user; the last one closes the channel."""
    shared.users -= 1
    if shared.users <= 0:
        for key, value in list(_SHARED.items()):
            if value is shared:
                del _SHARED[key]
        await shared.close()


def borrow(shared: SharedBootstrap) -> _Borrowed:
    return _Borrowed(shared.channel)


# ------------------------------------------------------------------------ directory indexes


class DirectoryView:
    """Indexes of one directory (members by id and vertex, adjacency), built once per process.

    Why: each node used to scan every member and every edge of the directory on each change, so a
    process hosting K nodes of an n-node graph did K × |E| work per change — 1.5–2 s of blocked
    event loop per change at n = 1024, K = 342.  The coalesced reads hand the same directory
    object to all K nodes, so its indexes are built once.
    """

    __slots__ = ("members", "by_vertex", "adjacency")

    def __init__(self, directory: bpb.Directory) -> None:
        self.members = {m.node_id: m for m in directory.members}
        self.by_vertex = {m.vertex: m for m in directory.members}
        adjacency: dict[int, set[int]] = {}
        for e in directory.edges:
            adjacency.setdefault(e.u, set()).add(e.v)
            adjacency.setdefault(e.v, set()).add(e.u)
        self.adjacency = {v: sorted(ns) for v, ns in adjacency.items()}


_VIEWS: dict[int, tuple[bpb.Directory, DirectoryView]] = {}


def view_of(directory: bpb.Directory) -> DirectoryView:
    """The indexes of ``directory`` (cached while it is one of the last few seen; read-only)."""
    hit = _VIEWS.get(id(directory))
    if hit is not None and hit[0] is directory:
        return hit[1]
    view = DirectoryView(directory)
    if len(_VIEWS) >= 8:
        _VIEWS.pop(next(iter(_VIEWS)))
    _VIEWS[id(directory)] = (
        directory,
        view,
    )  # holding the directory keeps its id from being reused
    return view
