"""The bootstrap gRPC service: admission (CA), membership with leases, and the topology.

The bootstrap is never in the data path: nodes call it to join, renew their lease and read the
directory, and exchange protocol envelopes directly with their neighbours.

Every refusal is returned to the caller as a gRPC status with a readable message *and* logged
with ``event=refused`` and the reason; the service keeps serving.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import pathlib
import re
import signal
import time
from dataclasses import dataclass

import grpc

from hushnet.bootstrap.authority import Authority, load_or_create
from hushnet.bootstrap.store import BootstrapStore, MemberRow
from hushnet.bootstrap.topology import WEIGHT_RULE, PublishedTopology, build_topology
from hushnet.net import pki
from hushnet.net.logs import ContextLog
from hushnet.v1 import bootstrap_pb2 as pb
from hushnet.v1 import bootstrap_pb2_grpc as pb_grpc

log = ContextLog(logging.getLogger("hushnet.bootstrap"), {"node": "bootstrap"})

DEFAULT_LEASE_S = 15.0
CLOCK_SKEW_MS = 5 * 60 * 1000
#: most leaves one LeaveHost request may carry (a host process runs at most a few thousand nodes)
MAX_HOST_LEAVES = 8192
MAX_WATCH_S = 30.0  # longest a WatchDirectory call is held without a change
DEFAULT_ONION_EPOCH_S = 86400.0
MAX_ONION_BATCH = 1024  # publications in one PublishOnionKeysHost call
_AUTO_ID = re.compile(r"^n(\d+)$")


class BootstrapError(RuntimeError):
    """The bootstrap cannot start (bad state directory, topology mismatch, port in use)."""


class _Refusal(Exception):
    """A refused request: the status code and message its caller gets (fields go to the log line)."""

    def __init__(self, code: grpc.StatusCode, message: str, **fields) -> None:
        super().__init__(message)
        self.code, self.message, self.fields = code, message, fields


@dataclass
class BootstrapConfig:
    state_dir: pathlib.Path
    listen: str = "127.0.0.1:7400"
    topology: str | None = None
    token: str | None = None
    lease_seconds: float = DEFAULT_LEASE_S
    #: onion-key rotation period (s) published to every node; 0 turns rotation off (one long-lived key)
    onion_epoch_seconds: float = DEFAULT_ONION_EPOCH_S
    #: how long a node keeps an onion key after its epoch ended (None: one period; at most one period)
    onion_grace_seconds: float | None = None


class BootstrapService(pb_grpc.BootstrapServicer):
    def __init__(
        self,
        authority: Authority,
        store: BootstrapStore,
        topology: PublishedTopology,
        lease_seconds: float,
        onion_epoch_seconds: float = 0.0,
        onion_grace_seconds: float | None = None,
    ) -> None:
        self.authority = authority
        self.store = store
        self.topology = topology
        self.lease_seconds = lease_seconds
        if not (onion_epoch_seconds >= 0 and onion_epoch_seconds < float("inf")):
            raise BootstrapError(f"onion epoch period must be >= 0 s, got {onion_epoch_seconds!r}")
        grace = onion_epoch_seconds if onion_grace_seconds is None else float(onion_grace_seconds)
        if onion_epoch_seconds > 0 and not 0 <= grace <= onion_epoch_seconds:
            raise BootstrapError(
                f"onion key grace must be in [0, {onion_epoch_seconds:g}] s, got {grace!r}"
            )
        self.onion_epoch_seconds, self.onion_grace_seconds = float(onion_epoch_seconds), grace
        # Directory versions (see WatchDirectory): the epoch at which each member's entry last changed, kept in
        # memory since this service started; a watcher behind ``_base_epoch`` gets the full snapshot instead.
        self._base_epoch = store.epoch
        self._changed_at: dict[str, int] = {}
        self._epoch_moved: asyncio.Event | None = None
        # Batched leases (see HeartbeatHost): node id -> SHA-256 of the host key it delegated to; parsed keys.
        self._delegate: dict[str, str] = {}
        self._host_keys: dict[bytes, tuple[object, str]] = {}
        self._certs: dict[str, object] = {}

    # ------------------------------------------------------------------ helpers
    async def _refuse(self, context, code: grpc.StatusCode, message: str, **fields) -> None:
        log.warning(
            "refused: %s",
            message,
            extra={"event": "refused", "code": code.name, "peer": context.peer(), **fields},
        )
        await context.abort(code, message)

    def _bump(self, *node_ids: str) -> int:
        """Move the directory epoch for a change of these members' entries and wake the watchers."""
        epoch = self.store.bump_epoch()
        for node_id in node_ids:
            self._changed_at[node_id] = epoch
        if self._epoch_moved is not None:
            self._epoch_moved.set()
            self._epoch_moved = None
        return epoch

    def _cert(self, member: MemberRow):
        """The member's parsed certificate, cached by its hash (a parse per signature check was most of a
        heartbeat's cost at n = 2048)."""
        cert = self._certs.get(member.cert_sha256)
        if cert is None:
            if len(self._certs) > 65536:
                self._certs.clear()
            cert = self._certs[member.cert_sha256] = pki.load_cert(member.cert_pem)
        return cert

    def _alive(self, m: MemberRow, now: float) -> bool:
        return (not m.left_network) and (now - m.last_seen) <= self.lease_seconds

    # ------------------------------------------------------------------ RPCs
    async def Join(self, request: pb.JoinRequest, context) -> pb.JoinReply:
        if not hmac.compare_digest(request.token.encode(), self.authority.token.encode()):
            await self._refuse(
                context,
                grpc.StatusCode.UNAUTHENTICATED,
                "wrong join token",
                requested_id=request.requested_id,
            )
        try:
            csr = pki.load_csr(request.csr_pem)
        except pki.IdentityError as exc:
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if len(request.x25519_public) != 32:
            await self._refuse(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                "x25519_public must be a raw 32-byte X25519 public key",
            )
        try:
            host, _port = pki.split_address(request.address)
        except ValueError as exc:
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, f"bad address: {exc}")
        if request.requested_id and not pki.valid_node_id(request.requested_id):
            await self._refuse(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"invalid node id {request.requested_id!r} (lowercase letters, digits, '-')",
            )

        key_sha = pki.key_sha256(csr.public_key())
        now = time.time()
        existing = self.store.member_by_key(key_sha)
        rejoined = existing is not None
        if existing is not None:
            if request.requested_id and request.requested_id != existing.node_id:
                await self._refuse(
                    context,
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"this key is already registered as node {existing.node_id}",
                )
            node_id, vertex, joined = existing.node_id, existing.vertex, existing.joined_unix
        else:
            node_id = request.requested_id
            if node_id and self.store.member(node_id) is not None:
                await self._refuse(
                    context,
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"duplicate node id: {node_id} is already a member with a different key",
                    requested_id=node_id,
                )
            vertex = self._free_vertex(node_id)
            if vertex is None:
                await self._refuse(
                    context,
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"network full: all {self.topology.n} vertices of {self.topology.spec} are taken",
                )
            if not node_id:
                node_id = f"n{vertex}"
                if self.store.member(node_id) is not None:
                    node_id = f"n{vertex}-{key_sha[:6]}"
            joined = now
        cert = self.authority.issue_node_cert(csr.public_key(), node_id, host)
        cert_pem = pki.cert_to_pem(cert)
        changed = (
            existing is None
            or existing.address != request.address
            or existing.left_network
            or existing.x25519 != request.x25519_public
            or existing.cert_sha256 != pki.cert_sha256(cert)
        )
        self.store.upsert(
            MemberRow(
                node_id,
                vertex,
                request.address,
                cert_pem,
                pki.cert_sha256(cert),
                key_sha,
                bytes(request.x25519_public),
                joined,
                now,
                False,
            )
        )
        if changed:
            self._bump(node_id)
        log.info(
            "%s node %s at %s (vertex %d)",
            "re-admitted" if rejoined else "admitted",
            node_id,
            request.address,
            vertex,
            extra={"event": "join", "member": node_id, "vertex": vertex, "rejoined": rejoined},
        )
        return pb.JoinReply(
            node_id=node_id,
            cert_pem=cert_pem,
            ca_pem=self.authority.ca_pem,
            vertex=vertex,
            lease_seconds=self.lease_seconds,
            rejoined=rejoined,
        )

    def _free_vertex(self, requested_id: str) -> int | None:
        match = _AUTO_ID.match(requested_id or "")
        # the vertex an id "n<v>" asks for is looked up alone: reading every member's vertex on each join
        # made a join storm quadratic (2.8 s of the bootstrap's 30 s busy in a 2048-node start)
        if (
            match
            and int(match.group(1)) < self.topology.n
            and not self.store.vertex_taken(int(match.group(1)))
        ):
            return int(match.group(1))
        used = self.store.used_vertices()
        for v in range(self.topology.n):
            if v not in used:
                return v
        return None

    def _signed_member(self, request: pb.SignedRequest, method: str) -> MemberRow:
        """The member who signed ``request`` for ``method``; :class:`_Refusal` if it is not one."""
        member = self.store.member(request.node_id)
        if member is None:
            raise _Refusal(
                grpc.StatusCode.NOT_FOUND, f"unknown node {request.node_id!r}; join first"
            )
        if abs(int(time.time() * 1000) - request.unix_ms) > CLOCK_SKEW_MS:
            raise _Refusal(
                grpc.StatusCode.UNAUTHENTICATED,
                f"{method} from {request.node_id}: timestamp outside the allowed clock skew",
            )
        if not pki.verify(
            self._cert(member),
            pki.signed_message(method, request.node_id, request.unix_ms),
            request.signature,
        ):
            raise _Refusal(
                grpc.StatusCode.UNAUTHENTICATED,
                f"{method} from {request.node_id}: bad signature",
                member=request.node_id,
            )
        return member

    async def _check_signed(self, request: pb.SignedRequest, method: str, context) -> MemberRow:
        try:
            return self._signed_member(request, method)
        except _Refusal as r:
            await self._refuse(context, r.code, r.message, **r.fields)

    async def Heartbeat(self, request: pb.SignedRequest, context) -> pb.LeaseReply:
        member = await self._check_signed(request, "Heartbeat", context)
        address = request.address or None
        if address and address != member.address:
            try:
                pki.split_address(address)
            except ValueError as exc:
                await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, f"bad address: {exc}")
        self.store.touch(member.node_id, address)
        if member.left_network or (address and address != member.address):
            self._bump(member.node_id)
        return pb.LeaseReply(ok=True, lease_seconds=self.lease_seconds, epoch=self.store.epoch)

    async def Leave(self, request: pb.SignedRequest, context) -> pb.LeaseReply:
        member = await self._check_signed(request, "Leave", context)
        self.store.mark_left(member.node_id)
        self._delegate.pop(member.node_id, None)
        self._bump(member.node_id)
        log.info("node %s left", member.node_id, extra={"event": "leave", "member": member.node_id})
        return pb.LeaseReply(ok=True, lease_seconds=0.0, epoch=self.store.epoch)

    async def LeaveHost(self, request: pb.HostLeave, context) -> pb.HostLeaveReply:
        """The leaves of many nodes of one host process, each signed by its own node's key.

        Why: 5 host processes of 410 nodes stopping together sent 2048 Leave calls at once, and only ~190
        reached the bootstrap within their 1.5 s timeout — the others stayed in the directory until
        their leases ran out.  Each leave here is checked by what checks a lone :meth:`Leave` (member,
        clock skew, the node's own signature over "Leave"), so a process can only take out nodes whose
        keys it holds; a leave that fails is refused alone (listed with its reason), the others apply,
        in one transaction and one directory change."""
        if len(request.leaves) > MAX_HOST_LEAVES:
            await self._refuse(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"LeaveHost: {len(request.leaves)} leaves in one request (at most {MAX_HOST_LEAVES})",
            )
        left: list[str] = []
        refused: list[pb.LeaveRefusal] = []
        for leave in request.leaves:
            try:
                self._signed_member(leave, "Leave")  # the check a lone Leave gets, and its reason
            except _Refusal as r:
                refused.append(pb.LeaveRefusal(node_id=leave.node_id, reason=r.message))
                log.warning(
                    "refused: %s",
                    r.message,
                    extra={
                        "event": "refused",
                        "code": r.code.name,
                        "peer": context.peer(),
                        "member": leave.node_id,
                    },
                )
                continue
            if leave.node_id not in left:
                left.append(leave.node_id)
        if left:
            self.store.mark_left_many(left)
            for node_id in left:
                self._delegate.pop(node_id, None)
            self._bump(*left)
            log.info(
                "%d nodes left together",
                len(left),
                extra={"event": "leave", "members": left, "count": len(left)},
            )
        return pb.HostLeaveReply(epoch=self.store.epoch, left=left, refused=refused)

    def _onion_publication(
        self, request: pb.OnionKeysRequest, cur: int
    ) -> tuple[MemberRow, list[tuple[int, bytes]]]:
        """The member and keys of one publication (signature binds the keys); :class:`_Refusal` if refused."""
        from hushnet.net.onion_keys import keys_digest

        keys = [(int(k.epoch), bytes(k.public_key)) for k in request.keys]
        member = self._signed_member(request.auth, f"PublishOnionKeys:{keys_digest(keys)}")
        if self.onion_epoch_seconds <= 0:
            raise _Refusal(
                grpc.StatusCode.FAILED_PRECONDITION,
                "this network does not rotate onion keys (onion_epoch_seconds = 0)",
            )
        for e, pk in keys:
            if len(pk) != 32:
                raise _Refusal(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"onion key of epoch {e} must be a raw 32-byte X25519 public key",
                )
            if not cur - 1 <= e <= cur + 1:
                raise _Refusal(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"onion key for epoch {e} outside the published window {cur - 1}..{cur + 1} "
                    "(check the node's clock)",
                )
        return member, keys

    def _onion_epoch(self) -> int:
        from hushnet.net.onion_keys import epoch_at

        return (
            epoch_at(time.time(), self.onion_epoch_seconds) if self.onion_epoch_seconds > 0 else 0
        )

    async def PublishOnionKeys(self, request: pb.OnionKeysRequest, context) -> pb.LeaseReply:
        """A member publishes its onion keys of epochs current−1..current+1 (signature binds the keys)."""
        cur = self._onion_epoch()
        try:
            member, keys = self._onion_publication(request, cur)
        except _Refusal as r:
            await self._refuse(context, r.code, r.message, **r.fields)
        self.store.prune_onion_keys(cur - 1)
        if self.store.put_onion_keys(member.node_id, keys):
            self._bump(member.node_id)
        return pb.LeaseReply(ok=True, lease_seconds=self.lease_seconds, epoch=self.store.epoch)

    async def PublishOnionKeysHost(
        self, request: pb.OnionKeysBatch, context
    ) -> pb.OnionKeysBatchReply:
        """The onion-key publications of one host process's nodes, each checked alone (its own signature),
        recorded in one transaction with one directory change.

        Why: at n = 2048 every node published its keys with its own call right after joining: 2 048 RPCs,
        SQLite commits and directory changes on the bootstrap (each change then sent to every host process
        and applied there), half of the directory changes of a start-up.  A refused request (bad signature,
        unknown member, key outside the window) is named in the reply with the reason a lone call would get;
        the others are recorded.
        """
        if len(request.requests) > MAX_ONION_BATCH:
            await self._refuse(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"PublishOnionKeysHost: {len(request.requests)} requests, at most {MAX_ONION_BATCH}",
            )
        cur = self._onion_epoch()
        accepted: dict[str, list[tuple[int, bytes]]] = {}
        refused: list[pb.OnionKeysRefusal] = []
        for req in request.requests:
            node_id = req.auth.node_id
            try:
                if node_id in accepted:
                    raise _Refusal(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"PublishOnionKeysHost: {node_id} appears twice in one batch",
                    )
                member, keys = self._onion_publication(req, cur)
            except _Refusal as r:
                log.warning(
                    "refused: %s",
                    r.message,
                    extra={
                        "event": "refused",
                        "code": r.code.name,
                        "peer": context.peer(),
                        **r.fields,
                    },
                )
                refused.append(
                    pb.OnionKeysRefusal(node_id=node_id, code=r.code.name, reason=r.message)
                )
                continue
            accepted[member.node_id] = keys
        if accepted:
            self.store.prune_onion_keys(cur - 1)
            changed = self.store.put_onion_keys_many(accepted)
            if changed:
                self._bump(*changed)
        return pb.OnionKeysBatchReply(
            lease_seconds=self.lease_seconds,
            epoch=self.store.epoch,
            published=list(accepted),
            refused=refused,
        )

    async def HeartbeatHost(self, request: pb.HostHeartbeat, context) -> pb.HostLeaseReply:
        """Renew the leases of one host process's nodes: one signature check and one write per request.

        Why: one signed Heartbeat per node every lease / 3 was, at n = 2048, ~700 certificate parses,
        signature checks and SQLite commits a second on the bootstrap, which then answered later than
        the leases ran out.  Now the load is one request per host process per period plus one
        delegation check per node and host key (at a node's first heartbeat, or after a restart).
        """
        try:
            host_key, host_sha = self._host_key(bytes(request.host_public_key))
        except pki.IdentityError as exc:
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, f"HeartbeatHost: {exc}")
        if abs(int(time.time() * 1000) - request.unix_ms) > CLOCK_SKEW_MS:
            await self._refuse(
                context,
                grpc.StatusCode.UNAUTHENTICATED,
                "HeartbeatHost: timestamp outside the allowed clock skew",
            )
        ids = list(request.node_ids)
        if not pki.verify_key(
            host_key, pki.host_lease_message(ids, host_sha, request.unix_ms), request.signature
        ):
            await self._refuse(
                context, grpc.StatusCode.UNAUTHENTICATED, "HeartbeatHost: bad host signature"
            )
        method = f"Delegate:{host_sha}"
        for d in (
            request.delegations
        ):  # each node's consent to be renewed by this host key, checked once
            member = self.store.member(d.node_id)
            if (
                member is None
                or abs(int(time.time() * 1000) - d.unix_ms) > CLOCK_SKEW_MS
                or not pki.verify(
                    self._cert(member),
                    pki.signed_message(method, d.node_id, d.unix_ms),
                    d.signature,
                )
            ):
                continue  # reported below as unknown or undelegated
            self._delegate[d.node_id] = host_sha
        states = self.store.lease_states(ids)
        unknown = [i for i in ids if i not in states]
        undelegated = [i for i in ids if i in states and self._delegate.get(i) != host_sha]
        renew = [i for i in ids if i in states and self._delegate.get(i) == host_sha]
        self.store.touch_many(renew)
        back = [i for i in renew if states[i]]  # had left: their entries change
        if back:
            self._bump(*back)
        return pb.HostLeaseReply(
            lease_seconds=self.lease_seconds,
            epoch=self.store.epoch,
            unknown=unknown,
            undelegated=undelegated,
            renewed=len(renew),
        )

    def _host_key(self, der: bytes):
        hit = self._host_keys.get(der)
        if hit is None:
            key = pki.load_public_key_der(der)
            if len(self._host_keys) > 4096:
                self._host_keys.clear()
            hit = self._host_keys[der] = (key, hashlib.sha256(der).hexdigest())
        return hit

    async def WatchDirectory(self, request: pb.DirectoryWatch, context) -> pb.DirectoryChanges:
        """The changes after ``since_epoch``, held until there are some (at most ``wait_seconds``)."""
        since = int(request.since_epoch)
        wait = min(max(float(request.wait_seconds), 0.0), MAX_WATCH_S)
        if since == self.store.epoch and wait > 0:
            if self._epoch_moved is None:
                self._epoch_moved = asyncio.Event()
            try:
                await asyncio.wait_for(self._epoch_moved.wait(), wait)
            except asyncio.TimeoutError:
                pass
        return self.changes(since)

    def changes(self, since: int) -> pb.DirectoryChanges:
        epoch = self.store.epoch
        if (
            since == 0 or since < self._base_epoch or since > epoch
        ):  # no diff from there: the whole snapshot
            return pb.DirectoryChanges(epoch=epoch, snapshot=True, directory=self.directory())
        ids = {i for i, e in self._changed_at.items() if e > since}
        if not ids:
            return pb.DirectoryChanges(epoch=epoch)
        now = time.time()
        onion = self._onion(now, sorted(ids))
        rows = [m for m in (self.store.member(i) for i in sorted(ids)) if m is not None]
        return pb.DirectoryChanges(
            epoch=epoch, changed=[self._member_pb(m, now, onion) for m in rows]
        )

    async def GetDirectory(self, request: pb.DirectoryRequest, context) -> pb.Directory:
        return self.directory()

    def _onion(
        self, now: float, node_ids: list[str] | None = None
    ) -> dict[str, list[tuple[int, bytes]]]:
        """Published onion keys of the previous, current and next epochs (of ``node_ids`` only, if given)."""
        if self.onion_epoch_seconds <= 0:
            return {}
        from hushnet.net.onion_keys import epoch_at

        low = epoch_at(now, self.onion_epoch_seconds) - 1
        return {k: v for k, v in self.store.onion_keys(node_ids, min_epoch=low).items() if v}

    def _member_pb(self, m: MemberRow, now: float, onion: dict) -> pb.Member:
        return pb.Member(
            node_id=m.node_id,
            address=m.address,
            cert_sha256=m.cert_sha256,
            x25519_public=m.x25519,
            vertex=m.vertex,
            alive=self._alive(m, now),
            last_seen_unix=m.last_seen,
            key_sha256=m.key_sha256,
            onion_keys=[pb.OnionKey(epoch=e, public_key=pk) for e, pk in onion.get(m.node_id, [])],
        )

    def directory(self) -> pb.Directory:
        now = time.time()
        onion = self._onion(now)
        members = [self._member_pb(m, now, onion) for m in self.store.members()]
        topo = self.topology
        return pb.Directory(
            epoch=self.store.epoch,
            members=members,
            topology=topo.spec,
            n_vertices=topo.n,
            edges=[pb.Edge(u=int(u), v=int(v)) for u, v in topo.edges],
            weight_rule=WEIGHT_RULE,
            weights=[pb.Weight(u=u, v=v, w=w) for u, v, w in topo.weights],
            ca_pem=self.authority.ca_pem,
            onion_epoch_seconds=self.onion_epoch_seconds,
            onion_grace_seconds=self.onion_grace_seconds if self.onion_epoch_seconds > 0 else 0.0,
        )


def open_service(config: BootstrapConfig) -> BootstrapService:
    """Load (or create) the state directory and check the topology against the stored one."""
    authority = load_or_create(config.state_dir, token=config.token)
    store = BootstrapStore(pathlib.Path(config.state_dir) / "bootstrap.sqlite")
    stored = store.get_meta("topology")
    spec = config.topology or stored
    if spec is None:
        raise BootstrapError("no topology: pass --topology SPEC on first start (e.g. ring:8)")
    if stored is not None and config.topology and config.topology != stored:
        raise BootstrapError(
            f"state directory {config.state_dir} was created with topology {stored!r}; refusing {config.topology!r} "
            "(use a fresh --state-dir to change the graph)"
        )
    try:
        topology = build_topology(spec)
    except (ValueError, OSError) as exc:
        raise BootstrapError(f"bad topology {spec!r}: {exc}") from exc
    if stored is None:
        store.set_meta("topology", spec)
    return BootstrapService(
        authority,
        store,
        topology,
        config.lease_seconds,
        config.onion_epoch_seconds,
        config.onion_grace_seconds,
    )


async def serve(
    config: BootstrapConfig, stop: asyncio.Event | None = None, ready: asyncio.Event | None = None
) -> None:
    """Run the bootstrap until ``stop`` is set (or SIGINT/SIGTERM when ``stop`` is None)."""
    service = open_service(config)
    key_pem, cert_pem = service.authority.server_files()
    creds = grpc.ssl_server_credentials(
        [(key_pem, cert_pem)]
    )  # server-only TLS: joining nodes have no cert yet
    server = grpc.aio.server(
        options=[("grpc.max_receive_message_length", 4 * 1024 * 1024), ("grpc.so_reuseport", 0)]
    )
    pb_grpc.add_BootstrapServicer_to_server(service, server)
    try:
        port = server.add_secure_port(config.listen, creds)
    except RuntimeError as exc:
        raise BootstrapError(f"cannot listen on {config.listen}: {exc}") from exc
    if port == 0:
        raise BootstrapError(f"cannot listen on {config.listen} (address in use?)")
    host, _ = pki.split_address(config.listen)
    address = f"{host}:{port}"
    await server.start()
    info = {
        "address": address,
        "topology": service.topology.spec,
        "pid": os.getpid(),
        "ca": "ca.pem",
        "operator_cert": "operator.pem",
        "operator_key": "operator.key",
        "token_file": "join_token",
    }
    pki.write_public(
        pathlib.Path(config.state_dir) / "bootstrap.json", json.dumps(info, indent=2).encode()
    )
    log.info(
        "bootstrap serving on %s, topology %s (%d vertices), %d members",
        address,
        service.topology.spec,
        service.topology.n,
        len(service.store.members()),
        extra={"event": "serving", "address": address},
    )
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        await server.stop(1.0)
        service.store.close()
        log.info("bootstrap stopped", extra={"event": "stopped"})
