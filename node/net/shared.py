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
  by an ephemeral host key to which each node delegates its lease once (:class:`HostLease`);
* the nodes that stop together leave together: one ``LeaveHost`` carries their leaves, each signed by
  its own node (:class:`HostLeaves`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time

import grpc

from hushnet.net import load as _load
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
        #: the process's copy of the directory, moved forward by changes: its version, the members and
        #: the graph's indexes (updated in place per change), and the full message built only when read
        self.epoch: int | None = None
        self.view: DirectoryView | None = None
        self._members: dict[str, bpb.Member] = {}
        self._base: bpb.Directory | None = None  # the last snapshot (topology, edges, weights, CA)
        self._built: bpb.Directory | None = None  # ``current`` at ``epoch`` once asked for
        self._updated = asyncio.Event()
        #: nodes waiting for a change of their own neighbourhood (:meth:`next_change`), by their vertex
        self._waiters: dict[int, set[asyncio.Future]] = {}
        self._watcher: asyncio.Task | None = None
        self.lease = HostLease(self)
        self.leaves = HostLeaves(self)
        self.onion = HostOnionKeys(self)

    @property
    def current(self) -> bpb.Directory | None:
        """The process's directory as one message (built on first read after a change, then cached).

        Why lazily: rebuilding the whole message (every member, edge and weight) on each change of a
        2048-node join storm cost a host ~15 ms a change; only runs and tools read the message, the
        nodes themselves follow :attr:`view`.
        """
        if self.epoch is None:
            return None
        if self._built is None or self._built.epoch != self.epoch:
            new = bpb.Directory()
            new.CopyFrom(self._base)
            del new.members[:]
            new.members.extend(sorted(self._members.values(), key=lambda m: m.vertex))
            new.epoch = self.epoch
            self._built = new
        return self._built

    @property
    def settings(self) -> bpb.Directory | None:
        """The last snapshot: its network-wide fields are current (they never change within a bootstrap
        state), its members may not be."""
        return self._base

    async def directory(self, *, since: float, timeout: float = 5.0) -> int | None:
        """A directory read that started at or after ``since`` (``time.monotonic()``), shared if possible;
        returns the process's directory version after it (:attr:`view` holds the members).

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
        return self.epoch  # that read merged into the process's copy, which only moves forward

    async def _read_after(self, prev: asyncio.Task | None, timeout: float) -> int | None:
        if prev is not None:
            await asyncio.wait([prev])
        started = time.monotonic()
        me = asyncio.current_task()
        self._inflight, self._next = (started, me), None
        try:
            self.reads += 1
            _load.of_loop().count("directory_read")
            epoch = await self._fetch(0.0, timeout)
        finally:
            if self._inflight is not None and self._inflight[1] is me:
                self._inflight = None
        if self._last is None or started >= self._last[0]:
            self._last = (started, epoch)
        return epoch

    # ------------------------------------------------------------------ versioned directory
    async def _fetch(self, wait: float, timeout: float) -> int | None:
        """Ask for the changes after our version (held up to ``wait`` s by the bootstrap), apply them."""
        since = self.epoch if self.epoch is not None else 0
        changes = await self.stub.WatchDirectory(
            bpb.DirectoryWatch(since_epoch=since, wait_seconds=wait), timeout=wait + timeout
        )
        return self._merge(changes)

    def _merge(self, changes: bpb.DirectoryChanges) -> int | None:
        """Apply a snapshot or the changed members to the process's copy; returns its version.

        A change costs what it changes: the members it names are replaced in :attr:`view` in place, the
        graph's adjacency is built once per snapshot (the topology never changes within a bootstrap state),
        and the full message waits until someone reads :attr:`current`.  (Rebuilding the indexes and the
        message on every change was a third of a 410-node host's time during a 2048-node join storm.)
        """
        if changes.snapshot:
            base = self._base
            if (
                base is not None
                and self.epoch is not None
                and changes.epoch < self.epoch
                and changes.directory.ca_pem == base.ca_pem
            ):
                return self.epoch  # an older answer overtaken by a newer one
            new = changes.directory
            same_graph = (
                base is not None
                and self.view is not None
                and (base.topology, base.n_vertices, base.ca_pem)
                == (new.topology, new.n_vertices, new.ca_pem)
                and list(base.edges) == list(new.edges)
            )
            self._base = new
            self._members = {m.node_id: m for m in new.members}
            self.view = DirectoryView(new, adjacency=self.view.adjacency if same_graph else None)
            self.view.snapshot_epoch = int(changes.epoch)
            self._members = self.view.members
            self._built = new
            touched = None  # everyone's neighbourhood may have changed
        else:
            if self.epoch is None or changes.epoch <= self.epoch:
                return self.epoch
            touched = self.view.update(changes.changed, int(changes.epoch))
        self.epoch = int(changes.epoch)
        self._updated.set()
        self._updated = asyncio.Event()
        self._wake(touched)
        return self.epoch

    def _wake(self, touched: set[int] | None) -> None:
        """Wake the :meth:`next_change` waiters whose own vertex or a neighbour's is in ``touched`` (all if None)."""
        if not self._waiters:
            return
        if touched is None:
            hit = list(self._waiters)
        else:
            adjacency, hit = self.view.adjacency, set()
            for v in touched:
                hit.add(v)
                hit.update(adjacency.get(v, ()))
        for v in hit:
            for fut in self._waiters.pop(v, ()):
                if not fut.done():
                    fut.set_result(None)

    async def next_directory(self, after_epoch: int | None) -> int:
        """The process's directory version once it differs from ``after_epoch`` (the watch starts on first use)."""
        if self._watcher is None:
            self._watcher = self.loop.create_task(self._watch(), name="directory-watch")
        while self.epoch is None or self.epoch == after_epoch:
            await self._updated.wait()
        return self.epoch

    async def next_change(self, after_epoch: int | None, vertex: int) -> int:
        """The process's directory version once the entry of ``vertex`` or of one of its neighbours changed
        after ``after_epoch`` (any version if ``after_epoch`` is None); the watch starts on first use.

        Why not :meth:`next_directory`: there every node of the process woke on every change, to find
        that most were other nodes' neighbourhoods — during a 2048-node join storm each host's ~410 nodes
        woke a few hundred times each; here a change wakes only the nodes it concerns (its vertex and the
        vertex's graph neighbours, :meth:`_wake`)."""
        if self._watcher is None:
            self._watcher = self.loop.create_task(self._watch(), name="directory-watch")
        while True:
            if self.epoch is not None and (
                after_epoch is None
                or (self.epoch != after_epoch and self.view.changed_since(after_epoch, vertex))
            ):
                return self.epoch
            fut = self.loop.create_future()
            waiting = self._waiters.setdefault(vertex, set())
            waiting.add(fut)
            try:
                await fut
            finally:
                waiting.discard(fut)

    async def _watch(self) -> None:
        """One long poll per process: the directory changes arrive when they happen, not every poll period."""
        failing = False
        while True:
            try:
                before = self.epoch
                _load.of_loop().count("directory_watch")
                await self._fetch(WATCH_WAIT_S, 5.0)
                failing = False
                if self.epoch != before:
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
        for task in (self._watcher, self.lease.task, self.leaves.task):
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
        _load.of_loop().count("lease_renewal")
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


#: how long the first leave waits, at most, for those of the other nodes stopping with it (they usually
#: arrive sooner: the batch goes as soon as every node that said it is stopping has left)
LEAVE_COALESCE_S = 0.5
#: the LeaveHost call's deadline (the bootstrap checks one signature per leave: ~0.1 ms each)
LEAVE_TIMEOUT_S = 5.0


class HostLeaves:
    """The leaves of the nodes of one process, sent together: one ``LeaveHost`` per batch.

    Why: stopping 5 host processes of 410 nodes sent 2048 ``Leave`` calls at once, and only ~190 reached
    the bootstrap within their 1.5 s timeout; the others stayed listed (alive) until their leases ran out,
    so neighbours and operators saw them for a lease longer.  Each leave is still the node's own signed
    ``Leave`` request (the bootstrap checks it alone: a host cannot take out a node whose key it does
    not hold).  A node says it is stopping (:meth:`expect`) when its stop begins; the batch goes when every
    node that said so has its leave in it, or :data:`LEAVE_COALESCE_S` after its first leave — a node
    stopping alone leaves at once.  One call is in flight at a time; leaves that arrive meanwhile go in
    the next.  A bootstrap without ``LeaveHost`` (an older
    version) gets each leave as its own ``Leave``.
    """

    def __init__(self, shared: SharedBootstrap) -> None:
        self.shared = shared
        self.pending: list[tuple[bpb.SignedRequest, asyncio.Future]] = []
        self.task: asyncio.Task | None = None
        self.calls = 0  # LeaveHost requests sent (tests read it)
        self._unbatched = False  # the bootstrap does not serve LeaveHost
        self._expected: set[str] = set()  # nodes stopping whose leave has not come yet
        self._arrived = asyncio.Event()

    def expect(self, node_id: str) -> None:
        """``node_id`` is stopping and will leave: the batch waits for it (at most LEAVE_COALESCE_S)."""
        self._expected.add(node_id)

    async def leave(self, request: bpb.SignedRequest) -> bool:
        """Send this node's signed ``Leave`` with the others of the process; True if the bootstrap took it."""
        fut = self.shared.loop.create_future()
        self.pending.append((request, fut))
        self._expected.discard(request.node_id)
        self._arrived.set()
        if self.task is None or self.task.done():
            self.task = self.shared.loop.create_task(self._send(), name="host-leaves")
        return await fut

    async def _send(self) -> None:
        loop = self.shared.loop
        while self.pending:
            deadline = loop.time() + LEAVE_COALESCE_S
            while self._expected and (left := deadline - loop.time()) > 0:
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), left)
                except asyncio.TimeoutError:
                    break
            self._expected.clear()  # who has not come by now goes in a later batch (or expires)
            batch, self.pending = self.pending, []
            try:
                left = await self._one_call([r for r, _ in batch])
            except asyncio.CancelledError:
                for _, f in batch + self.pending:
                    if not f.done():
                        f.set_result(False)
                raise
            except Exception as exc:  # the bootstrap is down or slow: the leases will expire
                log.warning(
                    "leaving failed for %d nodes (%s); their leases will expire",
                    len(batch),
                    exc.code().name
                    if isinstance(exc, grpc.aio.AioRpcError)
                    else type(exc).__name__,
                    extra={"event": "leave_failed"},
                )
                left = set()
            for r, f in batch:
                if not f.done():
                    f.set_result(r.node_id in left)

    async def _one_call(self, leaves: list[bpb.SignedRequest]) -> set[str]:
        if not self._unbatched:
            self.calls += 1
            try:
                reply = await self.shared.stub.LeaveHost(
                    bpb.HostLeave(leaves=leaves), timeout=LEAVE_TIMEOUT_S
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                self._unbatched = True
            else:
                for r in reply.refused:
                    log.warning(
                        "the bootstrap refused the leave of %s: %s",
                        r.node_id,
                        r.reason,
                        extra={"event": "leave_refused", "member": r.node_id},
                    )
                return set(reply.left)

        async def one(r: bpb.SignedRequest) -> str | None:
            try:
                await self.shared.stub.Leave(r, timeout=1.5)
            except grpc.aio.AioRpcError:
                return None
            return r.node_id

        return {i for i in await asyncio.gather(*(one(r) for r in leaves)) if i is not None}


class OnionKeysRefused(Exception):
    """The bootstrap refused one node's onion-key publication (``code``: the gRPC status code's name)."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(f"{code}: {reason}")
        self.code, self.reason = code, reason


class HostOnionKeys:
    """The onion-key publications of a process's nodes, sent together (``PublishOnionKeysHost``).

    Why: every node published its keys with its own call right after it joined — at n = 2048 that was
    2 048 calls and as many directory changes on the bootstrap, each change then sent to every host process.
    A node still signs its own publication (the bootstrap checks each signature alone and refuses a bad
    one alone); what is shared is the call: publications queued while one call is in flight go in the
    next (at most :data:`MAX_BATCH`), so a host starting hundreds of nodes makes a few dozen calls and
    a lone node one, as before, with no added wait.  A bootstrap without the batched call (an older
    version) gets one call per node from then on.
    """

    MAX_BATCH = 256

    def __init__(self, shared: SharedBootstrap) -> None:
        self.shared = shared
        self.batched = True
        self.calls = 0  # batched calls sent (tests and benchmarks read it)
        self._queue: list[tuple[bpb.OnionKeysRequest, asyncio.Future]] = []
        self._task: asyncio.Task | None = None

    async def publish(self, request: bpb.OnionKeysRequest, timeout: float = 5.0) -> None:
        """Publish one node's signed keys; raises :class:`OnionKeysRefused` or ``grpc.aio.AioRpcError``."""
        if not self.batched:
            await self.shared.stub.PublishOnionKeys(request, timeout=timeout)
            return
        fut = self.shared.loop.create_future()
        self._queue.append((request, fut))
        if self._task is None or self._task.done():
            self._task = self.shared.loop.create_task(self._send(timeout), name="onion-keys-batch")
        await fut

    async def _send(self, timeout: float) -> None:
        while self._queue:
            batch = [(r, f) for r, f in self._queue[: self.MAX_BATCH] if not f.done()]
            del self._queue[: self.MAX_BATCH]
            if not batch:
                continue
            self.calls += 1
            _load.of_loop().count("onion_keys_batch")
            try:
                reply = await self.shared.stub.PublishOnionKeysHost(
                    bpb.OnionKeysBatch(requests=[r for r, _ in batch]), timeout=timeout
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    self.batched = False  # an older bootstrap: these and later ones one by one
                    for request, fut in batch + self._queue:
                        self._settle_alone(request, fut, timeout)
                    self._queue = []
                    return
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            refused = {r.node_id: r for r in reply.refused}
            published = set(reply.published)
            for request, fut in batch:
                if fut.done():
                    continue
                node_id = request.auth.node_id
                if node_id in published:
                    fut.set_result(None)
                else:
                    r = refused.get(node_id)
                    fut.set_exception(
                        OnionKeysRefused(r.code, r.reason)
                        if r is not None
                        else OnionKeysRefused(
                            "UNKNOWN", "the bootstrap did not answer for this node"
                        )
                    )

    def _settle_alone(
        self, request: bpb.OnionKeysRequest, fut: asyncio.Future, timeout: float
    ) -> None:
        async def one() -> None:
            try:
                await self.shared.stub.PublishOnionKeys(request, timeout=timeout)
            except grpc.aio.AioRpcError as exc:
                if not fut.done():
                    fut.set_exception(exc)
            else:
                if not fut.done():
                    fut.set_result(None)

        self.shared.loop.create_task(one())


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
    """Indexes of the process's directory (members by id and vertex, adjacency), kept up to date in place.

    Why: each node used to scan every member and every edge of the directory on each change, so a
    process hosting K nodes of an n-node graph did K × |E| work per change — 1.5–2 s of blocked
    event loop per change at n = 1024, K = 342.  Then the indexes were built once per change for the
    process, still |E| + n work a change (a third of a 410-node host's time in a 2048-node join storm);
    now the adjacency is built once per snapshot and a change replaces only the members it names.
    The nodes read these dictionaries and never write them.
    """

    __slots__ = ("members", "by_vertex", "adjacency", "vertex_epoch", "snapshot_epoch")

    def __init__(
        self, directory: bpb.Directory, adjacency: dict[int, list[int]] | None = None
    ) -> None:
        self.members = {m.node_id: m for m in directory.members}
        self.by_vertex = {m.vertex: m for m in directory.members}
        if adjacency is None:
            sets: dict[int, set[int]] = {}
            for e in directory.edges:
                sets.setdefault(e.u, set()).add(e.v)
                sets.setdefault(e.v, set()).add(e.u)
            adjacency = {v: sorted(ns) for v, ns in sets.items()}
        self.adjacency = adjacency
        #: version at which each vertex's entry last changed, and of the last snapshot: a node whose own and
        #: neighbours' vertices did not change since it last applied the directory has nothing to redo
        self.vertex_epoch: dict[int, int] = {}
        self.snapshot_epoch = 0

    def update(self, changed, epoch: int = 0) -> set[int]:
        """Replace the members named in ``changed`` (a member that moved vertex leaves its old one);
        returns the vertices whose entry changed."""
        touched: set[int] = set()
        for m in changed:
            old = self.members.get(m.node_id)
            if old is not None and old.vertex != m.vertex:
                self.vertex_epoch[old.vertex] = epoch
                touched.add(old.vertex)
                if self.by_vertex.get(old.vertex) is old:
                    del self.by_vertex[old.vertex]
            self.members[m.node_id] = m
            self.by_vertex[m.vertex] = m
            self.vertex_epoch[m.vertex] = epoch
            touched.add(m.vertex)
        return touched

    def changed_since(self, epoch: int, vertex: int) -> bool:
        """Whether ``vertex``'s entry or one of its neighbours' changed after version ``epoch``."""
        if self.snapshot_epoch > epoch:
            return True
        get = self.vertex_epoch.get
        return get(vertex, 0) > epoch or any(
            get(v, 0) > epoch for v in self.adjacency.get(vertex, ())
        )
