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
"""
from __future__ import annotations

import asyncio
import hashlib
import time

import grpc

from hushnet.net import pki
from hushnet.v1 import bootstrap_pb2 as bpb
from hushnet.v1 import bootstrap_pb2_grpc as bpb_grpc

MiB = 1024 * 1024


class SharedBootstrap:
    """One bootstrap channel and one coalesced directory reader, shared by the nodes of a process."""

    def __init__(self, address: str, ca_pem: bytes) -> None:
        self.address = address
        self.channel = grpc.aio.secure_channel(
            address, pki.channel_credentials(ca_pem),
            options=[("grpc.ssl_target_name_override", pki.BOOTSTRAP_DNS),
                     ("grpc.max_receive_message_length", 64 * MiB),
                     ("grpc.initial_reconnect_backoff_ms", 500),
                     ("grpc.max_reconnect_backoff_ms", 5000)])
        self.stub = bpb_grpc.BootstrapStub(self.channel)
        self.users = 0
        self.reads = 0  # directory reads actually sent (the rest were shared)
        self._last: tuple[float, bpb.Directory] | None = None
        self._inflight: tuple[float, asyncio.Task] | None = None
        self._next: asyncio.Task | None = None
        self.loop = asyncio.get_running_loop()

    async def directory(self, *, since: float, timeout: float = 5.0) -> bpb.Directory:
        """A directory read that started at or after ``since`` (``time.monotonic()``), shared if possible.

        Callers that arrive while a read is under way and need a newer one all wait for the single
        read that starts when it ends: at most one read in flight and one queued, whatever K is.
        """
        if self._last is not None and self._last[0] >= since:
            return self._last[1]
        if self._inflight is not None and self._inflight[0] >= since:
            return await asyncio.shield(self._inflight[1])
        if self._next is None:
            prev = self._inflight[1] if self._inflight is not None else None
            self._next = asyncio.get_running_loop().create_task(self._read_after(prev, timeout))
        return await asyncio.shield(self._next)

    async def _read_after(self, prev: asyncio.Task | None, timeout: float) -> bpb.Directory:
        if prev is not None:
            await asyncio.wait([prev])
        started = time.monotonic()
        me = asyncio.current_task()
        self._inflight, self._next = (started, me), None
        try:
            self.reads += 1
            directory = await self.stub.GetDirectory(bpb.DirectoryRequest(), timeout=timeout)
        finally:
            if self._inflight is not None and self._inflight[1] is me:
                self._inflight = None
        if self._last is None or started >= self._last[0]:
            self._last = (started, directory)
        return directory


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
        await shared.channel.close()


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
    _VIEWS[id(directory)] = (directory, view)  # holding the directory keeps its id from being reused
    return view
