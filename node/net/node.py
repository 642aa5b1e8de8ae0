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
import fcntl
import hashlib
import json
import logging
import os
import pathlib
import random
import signal
import time
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from hushnet.net import VERSION, pki
from hushnet.net import shared as _shared
from hushnet.net.handlers import (
    ControlRegistry,
    Handler,
    HandlerRegistry,
    OutgoingEnvelope,
    UnknownCommand,
    UnknownProtocol,
)
from hushnet.net.logs import ContextLog, RateLimitedLog
from hushnet.net.store import NodeStore
from hushnet.net.wire import encode_envelope, tune_allocator
from hushnet.v1 import bootstrap_pb2 as bpb
from hushnet.v1 import bootstrap_pb2_grpc as bpb_grpc
from hushnet.v1 import envelope_pb2 as epb
from hushnet.v1 import peer_pb2 as ppb
from hushnet.v1 import peer_pb2_grpc as ppb_grpc

log_base = logging.getLogger("hushnet.node")


log = ContextLog(log_base, {})

MiB = 1024 * 1024
DEFAULT_MAX_MESSAGE = 128 * MiB
ENVELOPE_SLACK = 64 * 1024  # room for the envelope's header fields around the payload
PEER_SERVICE = "hushnet.v1.Peer"
_NON_RETRYABLE_JOIN = {
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.PERMISSION_DENIED,
}


class NodeError(RuntimeError):
    """A node cannot start or an operation failed; the message is meant for the user."""


class NotANeighbour(NodeError):
    pass


class PayloadTooLarge(NodeError):
    pass


class DeliveryError(NodeError):
    """The neighbour refused or could not receive an envelope."""

    def __init__(self, peer: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"delivery to {peer} failed: {code.name}: {details}")
        self.peer, self.code, self.details = peer, code, details


@dataclass
class NodeConfig:
    """Everything a node needs; paths are relative to the working directory."""

    state_dir: pathlib.Path
    listen: str = "127.0.0.1:0"
    bootstrap: str = "127.0.0.1:7400"
    token: str | None = None
    ca_file: pathlib.Path | None = None
    node_id: str | None = None
    advertise: str | None = None  # address published in the directory (default: listen address)
    max_message_bytes: int = DEFAULT_MAX_MESSAGE
    heartbeat_s: float = 3.0
    directory_refresh_s: float = 2.0
    probe_s: float = 2.0
    join_timeout_s: float | None = None  # None: retry forever
    max_backoff_s: float = 10.0
    builtin_handlers: bool = True
    #: refused/failed inbound messages are logged at most once per kind per this many seconds (with counts)
    log_interval_s: float = 10.0
    #: callables ``fn(node) -> object | None`` run before start (see :mod:`hushnet.net.plugins`)
    plugins: tuple = ()


@dataclass
class PeerLink:
    """Our channel to one neighbour and what we know about its health."""

    peer_id: str
    address: str
    channel: grpc.aio.Channel
    stub: ppb_grpc.PeerStub
    healthy: bool = False
    last_ok: float = 0.0
    sent: int = 0
    failures: int = 0
    ever_healthy: bool = False
    deliver: Any = None  # Deliver with pre-encoded request bytes (see hushnet.net.wire)

    def __post_init__(self) -> None:
        if self.deliver is None:
            self.deliver = self.channel.unary_unary(
                f"/{PEER_SERVICE}/Deliver", request_serializer=None,
                response_deserializer=epb.DeliveryAck.FromString)

    def state(self) -> str:
        try:
            return self.channel.get_state(try_to_connect=False).name
        except Exception:  # channel closed
            return "SHUTDOWN"


@dataclass
class Identity:
    node_id: str
    vertex: int
    key: Any
    key_pem: bytes
    cert_pem: bytes
    ca_pem: bytes
    x25519: Any

    @property
    def x25519_public(self) -> bytes:
        return pki.x25519_public_bytes(self.x25519)


# ------------------------------------------------------------------------ built-in protocols


class PingProtocol:
    """``net.ping``: records every envelope (sender, run, seq, size, SHA-256) in the inbox.

    Used by the demo and the tests to prove that an envelope crossed an edge exactly once and
    intact; returns nothing.
    """

    protocol = "net.ping"

    def __init__(self, store: NodeStore) -> None:
        self.store = store

    def handle(self, envelope: epb.Envelope) -> list[OutgoingEnvelope]:
        digest = hashlib.sha256(envelope.payload).hexdigest()
        self.store.record(envelope.protocol, envelope.run_id, envelope.seq, envelope.sender,
                          len(envelope.payload), digest)
        return []


class DiscardProtocol:
    """``net.discard``: counts envelopes and drops them (transport benchmarks)."""

    protocol = "net.discard"

    def __init__(self) -> None:
        self.count = 0
        self.bytes = 0

    def handle(self, envelope: epb.Envelope) -> None:
        self.count += 1
        self.bytes += len(envelope.payload)
        return None


class _Rejected(Exception):
    """A refused RPC: ``code``/``message`` go to the caller; ``kind`` groups it in the rate-limited log;
    ``exc_info`` (an unexpected handler failure) is logged with the first line of its kind only."""

    def __init__(self, code: grpc.StatusCode, message: str, *, kind: str | None = None, exc_info: Any = None,
                 **fields: Any) -> None:
        super().__init__(message)
        self.code, self.message, self.fields = code, message, fields
        self.kind = kind or f"rejected:{code.name}"
        self.exc_info = exc_info


# ------------------------------------------------------------------------ the node


class Node:
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
        self.directory: bpb.Directory | None = None
        self.onion_keys = None  # hushnet.net.onion_keys.OnionKeyStore once the directory says the network rotates
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
        self._pending: set[asyncio.Task] = set()
        self._seen: collections.OrderedDict[tuple, None] = collections.OrderedDict()
        self._seq: dict[tuple[str, str, str], int] = {}
        self._cert_cache: dict[bytes, tuple[pki.PeerIdentity | None, str]] = {}
        self._bootstrap_ok = True
        self._last_dir_fetch = 0.0
        self._stopping = False
        self.store: NodeStore | None = None
        self._lock_fd: int | None = None
        self.incarnation = 0
        self.lease_seconds = 15.0
        self.log = ContextLog(log_base, {"node": config.node_id or "-"})
        self.rlog = RateLimitedLog(self.log, config.log_interval_s)
        self._boot: _shared.SharedBootstrap | None = None  # the process's bootstrap channel, see hushnet.net.shared

    # ------------------------------------------------------------------ public API
    @property
    def node_id(self) -> str:
        return self.identity.node_id if self.identity else ""

    def register_handler(self, handler: Handler, *, replace: bool = False) -> None:
        """Plug a protocol in (see :mod:`hushnet.net.handlers`); allowed while running."""
        self.handlers.register(handler, replace=replace)

    def unregister_handler(self, protocol: str) -> Handler | None:
        return self.handlers.unregister(protocol)

    def register_control(self, command: str, fn, *, replace: bool = False) -> None:
        """Add an operator command ``fn(payload: bytes) -> bytes`` (sync or async)."""
        self.controls.register(command, fn, replace=replace)

    def next_seq(self, protocol: str, run_id: str, to: str = "") -> int:
        """Sequence numbers unique per (protocol, run, link) across restarts (incarnation in the high bits).

        One counter per *link*, not per node and run: a neighbour then sees only how many envelopes
        this node sent *to it*, which it counted itself, never how busy the node is with others (with
        onion relaying that would tell a receiver how much its last relay relayed — issue 11 finding 5).
        Receivers deduplicate by ``(sender, protocol, run_id, seq)``, so per-link numbers stay unique there.
        """
        key = (protocol, run_id, to)
        value = self._seq.get(key, 0)
        self._seq[key] = value + 1
        return (self.incarnation << 32) | value

    async def send(self, to: str, payload: bytes, *, protocol: str, run_id: str = "", seq: int | None = None,
                   timeout: float = 60.0) -> epb.DeliveryAck:
        """Send one envelope to neighbour ``to`` and wait for its delivery receipt.

        Raises :class:`NotANeighbour`, :class:`PayloadTooLarge` or :class:`DeliveryError`.
        Transient failures are retried until ``timeout``; the receiver drops duplicates by
        ``(sender, protocol, run_id, seq)``, so a retry never delivers twice.
        """
        link = self.links.get(to)
        if link is None:
            raise NotANeighbour(f"{to} is not a neighbour of {self.node_id} (neighbours: {', '.join(self.neighbors)})")
        if len(payload) > self.config.max_message_bytes:
            raise PayloadTooLarge(
                f"payload of {len(payload)} bytes exceeds the configured limit of {self.config.max_message_bytes} bytes")
        if seq is None:
            seq = self.next_seq(protocol, run_id, to)
        wire = encode_envelope(protocol, run_id, seq, payload, self.node_id, to)
        deadline = time.monotonic() + timeout
        delay = 0.2
        while True:
            remaining = deadline - time.monotonic()
            if to in self.cut:  # fault injection: a cut link behaves like a dead one (retried until the deadline)
                if remaining <= 0:
                    raise DeliveryError(to, grpc.StatusCode.UNAVAILABLE, "link cut (fault injection)")
                await asyncio.sleep(min(0.2, remaining))
                continue
            try:
                ack = await link.deliver(wire, timeout=max(remaining, 0.01), wait_for_ready=True)
                link.sent += 1
                return ack
            except grpc.aio.AioRpcError as exc:
                link.failures += 1
                code = exc.code()
                if code == grpc.StatusCode.UNAVAILABLE and time.monotonic() + delay < deadline:
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 2.0)
                    link = self.links.get(to, link)
                    continue
                raise DeliveryError(to, code, exc.details() or "") from None

    async def send_many(self, items: list[OutgoingEnvelope], *, timeout: float = 60.0) -> list[BaseException | epb.DeliveryAck]:
        """Send several envelopes concurrently; returns an ack or the exception for each."""
        coros = [self.send(o.to, o.payload, protocol=o.protocol or "", run_id=o.run_id, seq=o.seq, timeout=timeout)
                 for o in items]
        return await asyncio.gather(*coros, return_exceptions=True)

    def status(self) -> ppb.StatusReply:
        conns = [
            ppb.Connection(peer_id=l.peer_id, address=l.address, state=l.state(), healthy=l.healthy,
                           last_ok_unix=l.last_ok, sent=l.sent, failures=l.failures)
            for l in sorted(self.links.values(), key=lambda l: l.peer_id)
        ]
        return ppb.StatusReply(
            node_id=self.node_id, address=self.address, neighbors=self.neighbors, connections=conns,
            version=VERSION, uptime_seconds=time.monotonic() - self._started,
            vertex=self.identity.vertex if self.identity else 0,
            directory_epoch=self.directory.epoch if self.directory else 0,
            protocols=self.handlers.protocols(), delivered=self.delivered, rejected=self.rejected,
        )

    # ------------------------------------------------------------------ start / stop
    async def start(self) -> None:
        tune_allocator()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._lock_state_dir()
        try:
            await self._start()
        except BaseException:
            if self._server is None:  # nothing serves from this directory: let another process have it
                self._unlock_state_dir()
            raise

    def _lock_state_dir(self) -> None:
        """Hold an exclusive ``flock`` on ``STATE/node.lock`` for the life of this node.

        Two processes on one state directory would be admitted under the same identity, share the
        privacy ledger, and the second one's ``Leave`` would remove the first from the directory; the
        second start is refused instead.  The kernel drops the lock when the holder dies (even by
        SIGKILL), so a crashed node never blocks its own restart.
        """
        path = self.state_dir / "node.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            try:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            finally:
                os.close(fd)
            raise NodeError(f"state directory {self.state_dir} is in use by another node process (pid {holder}); "
                            "stop that node first, or give this one its own --state-dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _unlock_state_dir(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    async def _start(self) -> None:
        self.store = NodeStore(self.state_dir / "node.sqlite")
        self.incarnation = self.store.next_incarnation()
        key, x_key = self._load_keys()
        ca_pem = self._load_ca()
        host, port = pki.split_address(self.config.listen)
        # The certificate must exist before the TLS server can start, and the directory entry
        # needs our address before that: resolve port 0 to a concrete free port up front.
        if port == 0:
            port = _free_port(host)
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
        self.log.info("node %s serving on %s, neighbours: %s", self.node_id, self.address,
                 ", ".join(self.neighbors) or "(none yet)",
                 extra={"event": "serving", "address": self.address, "neighbors": self.neighbors})

    async def stop(self, grace: float = 1.0, leave: bool = True) -> None:
        if self._stopping:
            return
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        if leave and self.identity is not None:
            try:
                async with self._bootstrap_channel() as ch:
                    await bpb_grpc.BootstrapStub(ch).Leave(self._signed("Leave"), timeout=1.5)
            except (grpc.aio.AioRpcError, asyncio.TimeoutError, OSError):
                pass
        if self._boot is not None:
            await _shared.release(self._boot)
            self._boot = None
        if self._server is not None:
            await self._server.stop(grace)
        for link in list(self.links.values()):
            await link.channel.close()
        self.links.clear()
        for task in list(self._pending):
            task.cancel()
        if self.store is not None:
            self.store.close()
            self.store = None
        if self.onion_keys is not None:
            self.onion_keys.close()
            self.onion_keys = None
        self.rlog.flush(force=True)
        self._unlock_state_dir()
        self.log.info("node %s stopped", self.node_id, extra={"event": "stopped"})

    # ------------------------------------------------------------------ identity and join
    def _load_keys(self):
        key_path, x_path = self.state_dir / "node.key", self.state_dir / "x25519.key"
        if key_path.exists():
            key = pki.load_key(key_path.read_bytes())
        else:
            key = pki.generate_key()
            pki.write_secret(key_path, pki.key_to_pem(key))
        if x_path.exists():
            from cryptography.hazmat.primitives.asymmetric import x25519

            x_key = x25519.X25519PrivateKey.from_private_bytes(x_path.read_bytes())
        else:
            x_key = pki.generate_x25519()
            pki.write_secret(x_path, pki.x25519_to_bytes(x_key))
        return key, x_key

    def _load_ca(self) -> bytes:
        if self.config.ca_file is not None:
            path = pathlib.Path(self.config.ca_file)
            if not path.exists():
                raise NodeError(f"CA certificate {path} does not exist")
            ca_pem = path.read_bytes()
            pki.load_cert(ca_pem)
            pki.write_public(self.state_dir / "ca.pem", ca_pem)
            return ca_pem
        stored = self.state_dir / "ca.pem"
        if stored.exists():
            return stored.read_bytes()
        raise NodeError("no CA certificate: pass --ca PATH (the bootstrap's ca.pem) on first start")

    def _token(self) -> str:
        if self.config.token:
            return self.config.token
        stored = self.state_dir / "join_token"
        if stored.exists():
            return stored.read_text().strip()
        raise NodeError("no join token: pass --token TOKEN (or --token-file) on first start")

    def _bootstrap_channel(self):
        """The bootstrap channel this process's nodes share (requests are signed per node), for one call."""
        if self._boot is None:
            self._boot = _shared.acquire(self.config.bootstrap, (self.state_dir / "ca.pem").read_bytes())
        return _shared.borrow(self._boot)

    async def _join(self, key, x_key, ca_pem: bytes) -> Identity:
        token = self._token()
        saved = _read_json(self.state_dir / "identity.json")
        requested = self.config.node_id or saved.get("node_id") or ""
        if self.config.node_id and saved.get("node_id") and saved["node_id"] != self.config.node_id:
            raise NodeError(f"state directory {self.state_dir} belongs to node {saved['node_id']}, "
                            f"not {self.config.node_id}")
        request = bpb.JoinRequest(token=token, csr_pem=pki.make_csr(key), requested_id=requested,
                                  address=self.address, x25519_public=pki.x25519_public_bytes(x_key))
        delay, attempt = 0.5, 0
        started = time.monotonic()
        while True:
            attempt += 1
            try:
                async with self._bootstrap_channel() as ch:
                    reply = await bpb_grpc.BootstrapStub(ch).Join(request, timeout=5.0)
                break
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                if code in _NON_RETRYABLE_JOIN:
                    raise NodeError(f"bootstrap {self.config.bootstrap} refused to admit this node: "
                                    f"{code.name}: {exc.details()}") from None
                waited = time.monotonic() - started
                if self.config.join_timeout_s is not None and waited + delay > self.config.join_timeout_s:
                    raise NodeError(f"bootstrap {self.config.bootstrap} unreachable after {attempt} attempts "
                                    f"({waited:.0f} s): {code.name}") from None
                self.log.warning("bootstrap %s unreachable (%s); retrying in %.1f s (attempt %d)",
                            self.config.bootstrap, code.name, delay, attempt,
                            extra={"event": "bootstrap_unreachable", "attempt": attempt})
                await asyncio.sleep(delay * (0.8 + 0.4 * random.random()))
                delay = min(delay * 2, self.config.max_backoff_s)
        cert_pem = bytes(reply.cert_pem)
        if reply.lease_seconds > 0:
            self.lease_seconds = reply.lease_seconds
        pki.write_public(self.state_dir / "node.pem", cert_pem)
        if reply.ca_pem and bytes(reply.ca_pem) != ca_pem:
            raise NodeError("the bootstrap presented a different CA than the one configured")
        pki.write_public(self.state_dir / "identity.json", json.dumps({
            "node_id": reply.node_id, "vertex": reply.vertex, "bootstrap": self.config.bootstrap,
            "address": self.address, "cert_sha256": pki.cert_sha256(cert_pem),
            "key_sha256": pki.key_sha256(key.public_key()),
            "x25519_public": pki.x25519_public_bytes(x_key).hex(),
        }, indent=2).encode())
        if self.config.token:
            pki.write_secret(self.state_dir / "join_token", self.config.token.encode())
        self.log.info("%s as %s (vertex %d)", "re-joined" if reply.rejoined else "joined", reply.node_id, reply.vertex,
                 extra={"event": "joined", "node": reply.node_id, "rejoined": reply.rejoined})
        return Identity(reply.node_id, reply.vertex, key, pki.key_to_pem(key), cert_pem, ca_pem, x_key)

    def _signed(self, method: str) -> bpb.SignedRequest:
        ms = int(time.time() * 1000)
        sig = pki.sign(self.identity.key, pki.signed_message(method, self.node_id, ms))
        return bpb.SignedRequest(node_id=self.node_id, unix_ms=ms, signature=sig,
                                 address=self.address if method == "Heartbeat" else "")

    # ------------------------------------------------------------------ server
    async def _start_server(self, bind: str) -> None:
        limit = self.config.max_message_bytes + ENVELOPE_SLACK
        options = [
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            ("grpc.keepalive_time_ms", 20_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
            ("grpc.http2.max_ping_strikes", 0),
            ("grpc.so_reuseport", 0),
        ]
        server = grpc.aio.server(options=options)
        ident = lambda b: b  # noqa: E731  raw bytes in: we parse (and reject) ourselves
        handlers = {
            "Deliver": grpc.unary_unary_rpc_method_handler(
                self._rpc_deliver, request_deserializer=ident,
                response_serializer=epb.DeliveryAck.SerializeToString),
            "Health": grpc.unary_unary_rpc_method_handler(
                self._rpc_health, request_deserializer=ppb.HealthRequest.FromString,
                response_serializer=ppb.HealthReply.SerializeToString),
            "Status": grpc.unary_unary_rpc_method_handler(
                self._rpc_status, request_deserializer=ppb.StatusRequest.FromString,
                response_serializer=ppb.StatusReply.SerializeToString),
            "Control": grpc.unary_unary_rpc_method_handler(
                self._rpc_control, request_deserializer=ident,
                response_serializer=ppb.ControlReply.SerializeToString),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(PEER_SERVICE, handlers),))
        ident_ = self.identity
        creds = pki.server_credentials(ident_.key_pem, ident_.cert_pem, ident_.ca_pem)
        try:
            port = server.add_secure_port(bind, creds)
        except RuntimeError as exc:
            raise NodeError(f"cannot listen on {bind}: {exc}") from exc
        if port == 0:
            raise NodeError(f"cannot listen on {bind} (address in use?)")
        await server.start()
        self._server = server

    def _caller(self, context) -> tuple[pki.PeerIdentity | None, str]:
        """(identity, key fingerprint) of the caller, cached per certificate."""
        auth = context.auth_context() or {}
        pems = auth.get("x509_pem_cert") or []
        if not pems:
            return None, ""
        pem = pems[0]
        hit = self._cert_cache.get(pem)
        if hit is None:
            cert = pki.load_cert(pem)
            hit = (pki.identity_of(cert), pki.key_sha256(cert.public_key()))
            if len(self._cert_cache) > 4096:
                self._cert_cache.clear()
            self._cert_cache[pem] = hit
        return hit

    async def _reject(self, context, exc: _Rejected) -> None:
        self.rejected += 1
        level = logging.ERROR if exc.exc_info is not None else logging.WARNING
        self.rlog.log_event(level, exc.kind, "rejected: %s", exc.message, exc_info=exc.exc_info,
                            extra={"event": "rejected", "code": exc.code.name, "peer": context.peer(), **exc.fields})
        await context.abort(exc.code, exc.message)

    async def _check_member(self, who: pki.PeerIdentity, key_sha: str) -> None:
        member = self.members.get(who.name)
        if member is None or member.key_sha256 != key_sha:
            # A valid certificate from a caller we do not know yet is usually a node that joined after our
            # last directory read: read it again (at most every 0.5 s, waiting rather than refusing).
            await self._refresh_directory(force=False, min_interval=0.5, wait=True)
            member = self.members.get(who.name)
        if member is None:
            raise _Rejected(grpc.StatusCode.PERMISSION_DENIED,
                            f"node {who.name} is not in the membership directory", kind="rejected:not-a-member",
                            caller=who.name)
        if member.key_sha256 != key_sha:
            raise _Rejected(grpc.StatusCode.PERMISSION_DENIED,
                            f"certificate presented for {who.name} does not match its membership entry",
                            kind="rejected:key-mismatch",
                            caller=who.name)

    async def _rpc_deliver(self, raw: bytes, context) -> epb.DeliveryAck:
        try:
            who, key_sha = self._caller(context)
            if who is None or not who.is_node:
                raise _Rejected(grpc.StatusCode.PERMISSION_DENIED,
                                f"Deliver requires a node certificate (caller: {who or 'none'})", kind="rejected:not-a-node")
            if len(raw) > self.config.max_message_bytes + ENVELOPE_SLACK:
                raise _Rejected(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"message of {len(raw)} bytes exceeds the limit of {self.config.max_message_bytes} bytes",
                                kind="rejected:too-large",
                                caller=who.name)
            env = epb.Envelope()
            try:
                env.ParseFromString(raw)
            except DecodeError as exc:
                raise _Rejected(grpc.StatusCode.INVALID_ARGUMENT, f"malformed Envelope from {who.name}: {exc}",
                                kind="rejected:malformed-envelope", caller=who.name) from None
            if len(env.payload) > self.config.max_message_bytes:
                raise _Rejected(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"payload of {len(env.payload)} bytes exceeds the limit of "
                                f"{self.config.max_message_bytes} bytes", kind="rejected:too-large", caller=who.name)
            if env.sender != who.name:
                raise _Rejected(grpc.StatusCode.PERMISSION_DENIED,
                                f"envelope claims sender {env.sender!r} but the certificate names {who.name!r}",
                                kind="rejected:sender-mismatch",
                                caller=who.name)
            await self._check_member(who, key_sha)
            if who.name in self.cut:
                raise _Rejected(grpc.StatusCode.UNAVAILABLE, f"link to {who.name} is cut (fault injection)",
                                kind="rejected:link-cut", caller=who.name)
            if env.recipient and env.recipient != self.node_id:
                raise _Rejected(grpc.StatusCode.INVALID_ARGUMENT,
                                f"envelope addressed to {env.recipient!r}, this is {self.node_id}",
                                kind="rejected:wrong-recipient", caller=who.name)
            if who.name not in self.neighbors:
                raise _Rejected(grpc.StatusCode.PERMISSION_DENIED,
                                f"{who.name} is not a neighbour of {self.node_id}", kind="rejected:not-a-neighbour",
                                caller=who.name)
            key = (env.sender, env.protocol, env.run_id, env.seq)
            if key in self._seen:
                return epb.DeliveryAck(accepted=True, duplicate=True)
            # claim the key before dispatching: a concurrent retry of the same envelope is a duplicate
            self._seen[key] = None
            if len(self._seen) > 65536:
                self._seen.popitem(last=False)
            try:
                outgoing = await self.handlers.dispatch(env)
            except UnknownProtocol:
                self._seen.pop(key, None)  # not delivered: a later retry may succeed
                raise _Rejected(grpc.StatusCode.UNIMPLEMENTED,
                                f"unknown protocol {env.protocol!r} (this node serves: "
                                f"{', '.join(self.handlers.protocols()) or 'none'})",
                                kind="rejected:unknown-protocol", caller=who.name, protocol=env.protocol) from None
            except Exception as exc:  # a protocol bug must not take the node down
                self._seen.pop(key, None)
                # a refusal the handler names (``exc.code``, e.g. a run's RunRefused) is an expected answer to
                # bad input: one rate-limited line per code; anything else is a bug: its traceback is logged
                # with the first line of its kind per interval, never once per message
                code = getattr(exc, "code", None)
                refusal = isinstance(code, str)
                raise _Rejected(grpc.StatusCode.INTERNAL, f"handler {env.protocol!r} failed: {exc}",
                                kind=f"{'refused' if refusal else 'handler_error'}:{env.protocol}:"
                                     f"{code if refusal else type(exc).__name__}",
                                exc_info=None if refusal else exc, caller=who.name, protocol=env.protocol) from None
            self.delivered += 1
            if outgoing:
                task = asyncio.get_running_loop().create_task(self._send_outgoing(outgoing))
                self._pending.add(task)
                task.add_done_callback(self._pending.discard)
            return epb.DeliveryAck(accepted=True, produced=len(outgoing))
        except _Rejected as exc:
            await self._reject(context, exc)

    async def _send_outgoing(self, items: list[OutgoingEnvelope]) -> None:
        for item, result in zip(items, await self.send_many(items)):
            if isinstance(result, BaseException):
                self.log.warning("could not send %s envelope to %s: %s", item.protocol, item.to, result,
                            extra={"event": "send_failed", "to": item.to})

    async def _rpc_health(self, request, context) -> ppb.HealthReply:
        return ppb.HealthReply(ok=True, node_id=self.node_id)

    async def _rpc_status(self, request, context) -> ppb.StatusReply:
        who, key_sha = self._caller(context)
        if who is None:
            await self._reject(context, _Rejected(grpc.StatusCode.PERMISSION_DENIED, "Status requires a certificate",
                                                                  kind="rejected:no-certificate"))
        if who.is_node:  # a node certificate counts only with the key of that node's directory entry
            try:
                await self._check_member(who, key_sha)
            except _Rejected as exc:
                await self._reject(context, exc)
        return self.status()

    async def _rpc_control(self, raw: bytes, context) -> ppb.ControlReply:
        try:
            who, _ = self._caller(context)
            if who is None or not who.is_operator:
                raise _Rejected(grpc.StatusCode.PERMISSION_DENIED,
                                f"Control requires an operator certificate (caller: {who or 'none'})",
                                kind="rejected:not-an-operator")
            req = ppb.ControlRequest()
            try:
                req.ParseFromString(raw)
            except DecodeError as exc:
                raise _Rejected(grpc.StatusCode.INVALID_ARGUMENT, f"malformed ControlRequest: {exc}",
                                kind="rejected:malformed-control") from None
            try:
                out = await self.controls.run(req.command, bytes(req.payload))
            except UnknownCommand:
                raise _Rejected(grpc.StatusCode.UNIMPLEMENTED,
                                f"unknown control command {req.command!r} (known: {', '.join(self.controls.commands())})",
                                kind="rejected:unknown-command") from None
            except (KeyError, ValueError, PermissionError) as exc:
                # an expected refusal (unknown run id, bad argument): one line, no traceback
                msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
                self.log.warning("control command %s refused: %s", req.command, msg, extra={"event": "control_refused"})
                return ppb.ControlReply(ok=False, error=f"{type(exc).__name__}: {msg}")
            except Exception as exc:
                self.log.exception("control command %s failed", req.command, extra={"event": "control_error"})
                return ppb.ControlReply(ok=False, error=f"{type(exc).__name__}: {exc}")
            return ppb.ControlReply(ok=True, payload=out)
        except _Rejected as exc:
            await self._reject(context, exc)

    # ------------------------------------------------------------------ built-in operator commands
    def _register_builtin_controls(self) -> None:
        async def ping_neighbors(payload: bytes) -> bytes:
            args = json.loads(payload or b"{}")
            run_id = str(args.get("run_id", "ping"))
            size = int(args.get("size", 32))
            targets = args.get("to") or list(self.neighbors)
            results: dict[str, Any] = {}

            async def one(peer: str) -> None:
                body = os.urandom(size)
                t0 = time.perf_counter()
                try:
                    ack = await self.send(peer, body, protocol="net.ping", run_id=run_id,
                                          timeout=float(args.get("timeout", 30)))
                    results[peer] = {"ok": bool(ack.accepted), "duplicate": ack.duplicate,
                                     "rtt_ms": 1000 * (time.perf_counter() - t0),
                                     "sha256": hashlib.sha256(body).hexdigest(), "size": size}
                except NodeError as exc:
                    results[peer] = {"ok": False, "error": str(exc)}

            await asyncio.gather(*(one(p) for p in targets))
            return json.dumps({"node": self.node_id, "run_id": run_id, "sent": results}).encode()

        async def inbox(payload: bytes) -> bytes:
            args = json.loads(payload or b"{}")
            rows = self.store.inbox(args.get("protocol"), args.get("run_id"))
            return json.dumps({"node": self.node_id, "inbox": rows}).encode()

        async def status(payload: bytes) -> bytes:
            st = self.status()
            return json.dumps({"node": st.node_id, "neighbors": list(st.neighbors),
                               "connections": {c.peer_id: c.healthy for c in st.connections}}).encode()

        async def cut(payload: bytes) -> bytes:
            """``{"peers": [...], "cut": bool}``: cut (or restore) this node's side of links (fault injection)."""
            args = json.loads(payload or b"{}")
            peers = [str(p) for p in args.get("peers", [])]
            if args.get("cut", True):
                self.cut.update(peers)
            else:
                self.cut.difference_update(peers)
            return json.dumps({"node": self.node_id, "cut": sorted(self.cut)}).encode()

        builtins = [("ping_neighbors", ping_neighbors), ("inbox", inbox), ("status", status)]
        if os.environ.get("HUSHNET_FAULT_INJECTION") == "1":  # never on a deployed node
            builtins.append(("net.cut", cut))
        for name, fn in builtins:
            if name not in self.controls.commands():
                self.controls.register(name, fn)

    # ------------------------------------------------------------------ directory, channels, probes
    async def _refresh_directory(self, force: bool = False, min_interval: float = 0.0, wait: bool = False,
                                 max_age: float = 0.0) -> None:
        """Read the directory from the bootstrap, at most once per ``min_interval``.

        With ``wait`` a call inside the interval sleeps until it ends and then reads (unless another read started
        meanwhile), so that a caller who joined a moment ago is not refused because of the rate limit.
        """
        now = time.monotonic()
        if not force and now - self._last_dir_fetch < min_interval:
            if not wait:
                return
            asked = now
            await asyncio.sleep(self._last_dir_fetch + min_interval - now)
            if self._last_dir_fetch >= asked:
                return
            now = time.monotonic()
        self._last_dir_fetch = now
        try:
            self._bootstrap_channel()
            # a read begun after we asked (or at most max_age before), shared with this process's other nodes
            directory = await self._boot.directory(since=now - max_age, timeout=5.0)
        except grpc.aio.AioRpcError as exc:
            if self._bootstrap_ok:
                self.log.warning("bootstrap %s unreachable (%s); keeping the last directory",
                            self.config.bootstrap, exc.code().name, extra={"event": "bootstrap_unreachable"})
            self._bootstrap_ok = False
            if self.directory is None and force:
                raise NodeError(f"cannot read the directory from {self.config.bootstrap}: {exc.code().name}") from None
            return
        if not self._bootstrap_ok:
            self.log.info("bootstrap %s reachable again", self.config.bootstrap, extra={"event": "bootstrap_back"})
        self._bootstrap_ok = True
        if self.directory is not None and directory.epoch == self.directory.epoch and not force:
            return
        self._apply_directory(directory)

    def _apply_directory(self, directory: bpb.Directory) -> None:
        self.directory = directory
        view = _shared.view_of(directory)  # built once per directory for all nodes of this process
        self.members = dict(view.members)
        by_vertex = view.by_vertex
        nbr_vertices = view.adjacency.get(self.identity.vertex, [])
        neighbors = [by_vertex[v].node_id for v in nbr_vertices if v in by_vertex]
        if neighbors != self.neighbors:
            self.log.info("neighbours: %s", ", ".join(neighbors) or "(none)",
                     extra={"event": "neighbors", "neighbors": neighbors, "epoch": directory.epoch})
        self.neighbors = neighbors
        for peer_id in list(self.links):
            link = self.links[peer_id]
            member = self.members.get(peer_id)
            if peer_id not in neighbors or member is None or member.address != link.address:
                del self.links[peer_id]
                task = asyncio.get_running_loop().create_task(link.channel.close())
                self._pending.add(task)
                task.add_done_callback(self._pending.discard)
        for peer_id in neighbors:
            if peer_id not in self.links:
                self.links[peer_id] = self._open_link(self.members[peer_id])

    def _open_link(self, member: bpb.Member) -> PeerLink:
        limit = self.config.max_message_bytes + ENVELOPE_SLACK
        ident = self.identity
        options = [
            ("grpc.ssl_target_name_override", pki.node_dns(member.node_id)),
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            ("grpc.keepalive_time_ms", 20_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.initial_reconnect_backoff_ms", 250),
            ("grpc.min_reconnect_backoff_ms", 250),
            ("grpc.max_reconnect_backoff_ms", int(self.config.max_backoff_s * 1000)),
            # a distinct channel per neighbour, never shared with another identity
            ("grpc.use_local_subchannel_pool", 1),
        ]
        creds = pki.channel_credentials(ident.ca_pem, ident.key_pem, ident.cert_pem)
        channel = grpc.aio.secure_channel(member.address, creds, options=options)
        channel.get_state(try_to_connect=True)
        self.log.debug("opened channel to %s at %s", member.node_id, member.address)
        return PeerLink(member.node_id, member.address, channel, ppb_grpc.PeerStub(channel))

    async def _probe(self, link: PeerLink) -> None:
        try:
            reply = await link.stub.Health(ppb.HealthRequest(), timeout=max(self.config.probe_s, 1.0),
                                           wait_for_ready=True)
            ok = reply.ok and reply.node_id == link.peer_id
        except grpc.aio.AioRpcError as exc:
            ok = False
            detail = exc.code().name
        else:
            detail = "ok"
        if ok:
            link.last_ok = time.time()
            if not link.healthy:
                self.log.info("%s neighbour %s at %s", "reconnected to" if link.ever_healthy else "connected to",
                         link.peer_id, link.address, extra={"event": "link_up", "peer_id": link.peer_id})
            link.ever_healthy = True
        elif link.healthy:
            self.log.warning("lost neighbour %s at %s (%s); reconnecting with backoff", link.peer_id, link.address, detail,
                        extra={"event": "link_down", "peer_id": link.peer_id})
        link.healthy = ok

    async def _probe_loop(self) -> None:
        while True:
            links = list(self.links.values())
            if links:
                await asyncio.gather(*(self._probe(l) for l in links), return_exceptions=True)
            await asyncio.sleep(self.config.probe_s * (0.9 + 0.2 * random.random()) if all(
                l.healthy for l in self.links.values()) else 0.5)

    async def _log_flush_loop(self) -> None:
        """Write the counts of suppressed log lines once their interval is over."""
        while True:
            await asyncio.sleep(max(self.rlog.interval / 2, 0.1))
            self.rlog.flush()

    async def _directory_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.directory_refresh_s)
            try:
                await self._refresh_directory(force=False, max_age=self.config.directory_refresh_s / 2)
            except NodeError:
                pass

    # ------------------------------------------------------------------ per-epoch onion keys
    async def maintain_onion_keys(self, now: float | None = None) -> None:
        """Rotate the onion keys on the network's period (``Directory.onion_epoch_seconds``): make the
        current and next epochs' keys, delete those past their grace (and their replay tags), and publish
        the public halves through the bootstrap when they changed (see :mod:`hushnet.net.onion_keys`)."""
        from hushnet.net.onion_keys import OnionKeyStore, keys_digest

        d = self.directory
        period = float(getattr(d, "onion_epoch_seconds", 0.0) or 0.0) if d is not None else 0.0
        if period <= 0:
            return
        grace = float(d.onion_grace_seconds)
        if self.onion_keys is None or (self.onion_keys.period, self.onion_keys.grace) != (period, grace):
            if self.onion_keys is not None:
                self.onion_keys.close()
            self.onion_keys = OnionKeyStore(self.state_dir, period, grace)
        published = self.onion_keys.maintain(now)
        mine = self.members.get(self.node_id)
        listed = sorted((int(k.epoch), bytes(k.public_key)) for k in mine.onion_keys) if mine is not None else []
        if published == self._onion_published and all(k in listed for k in published):
            return
        ms = int(time.time() * 1000)
        method = f"PublishOnionKeys:{keys_digest(published)}"
        auth = bpb.SignedRequest(node_id=self.node_id, unix_ms=ms,
                                 signature=pki.sign(self.identity.key, pki.signed_message(method, self.node_id, ms)))
        req = bpb.OnionKeysRequest(auth=auth, keys=[bpb.OnionKey(epoch=e, public_key=pk) for e, pk in published])
        try:
            async with self._bootstrap_channel() as ch:
                await bpb_grpc.BootstrapStub(ch).PublishOnionKeys(req, timeout=5.0)
        except grpc.aio.AioRpcError as exc:
            self.log.warning("publishing onion keys failed (%s: %s); will retry", exc.code().name, exc.details(),
                             extra={"event": "onion_keys_failed"})
            return
        self._onion_published = published
        self.log.info("onion keys published for epochs %s", [e for e, _ in published],
                      extra={"event": "onion_keys", "epochs": [e for e, _ in published]})
        await self._refresh_directory(force=True)

    async def _onion_key_loop(self) -> None:
        while True:
            period = float(getattr(self.directory, "onion_epoch_seconds", 0.0) or 0.0)
            await asyncio.sleep(min(self.config.heartbeat_s, period / 8) if period > 0 else self.config.heartbeat_s)
            try:
                await self.maintain_onion_keys()
            except (NodeError, OSError) as exc:
                self.log.warning("onion-key rotation failed: %s", exc, extra={"event": "onion_keys_failed"})

    async def _heartbeat_loop(self) -> None:
        failing = False
        while True:
            # renew well within the lease the bootstrap granted, whatever heartbeat_s says
            await asyncio.sleep(min(self.config.heartbeat_s, self.lease_seconds / 3))
            try:
                async with self._bootstrap_channel() as ch:
                    await bpb_grpc.BootstrapStub(ch).Heartbeat(self._signed("Heartbeat"), timeout=5.0)
                if failing:
                    self.log.info("lease renewed again", extra={"event": "lease_ok"})
                failing = False
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    self.log.warning("bootstrap forgot this node; re-joining", extra={"event": "rejoin"})
                    try:
                        key, x_key = self._load_keys()
                        self.identity = await self._join(key, x_key, self.identity.ca_pem)
                    except NodeError as err:
                        self.log.error("re-join failed: %s", err)
                elif not failing:
                    self.log.warning("heartbeat failed (%s); will keep trying", exc.code().name,
                                extra={"event": "heartbeat_failed"})
                failing = True


def _read_json(path: pathlib.Path) -> dict:
    try:
        return json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError):
        return {}


def _free_port(host: str) -> int:
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------ process entry point


async def serve(config: NodeConfig, stop: asyncio.Event | None = None) -> None:
    """Start a node and run it until ``stop`` is set (default: SIGINT/SIGTERM)."""
    if stop is None:
        stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    node = Node(config)
    installed = [plugin(node) for plugin in config.plugins]
    start = loop.create_task(node.start())
    waiter = loop.create_task(stop.wait())
    done, _ = await asyncio.wait({start, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if start not in done:  # stopped while still joining
        start.cancel()
        try:
            await start
        except (asyncio.CancelledError, NodeError):
            pass
        return
    waiter.cancel()
    start.result()  # raise NodeError if start failed
    from hushnet.net import logs as _logs

    _logs.set_identity(node.node_id)  # a process of one node: every record of the process is its own
    await stop.wait()
    for obj in installed:
        close = getattr(obj, "close", None)
        if callable(close):
            close()
    await node.stop()


def run(config: NodeConfig) -> int:
    """Run a node process on uvloop; a user-facing error becomes a log line and exit code 1."""
    import uvloop

    try:
        uvloop.run(serve(config))
    except NodeError as exc:
        log.error("%s", exc, extra={"event": "fatal"})
        return 1
    return 0
