"""Identity and join: the state-directory lock, the keys, the CA and token, joining through the bootstrap,
and the per-node signature on bootstrap requests.  A mixin of :class:`hushnet.net.node.Node`."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import pathlib
import random
import time
from dataclasses import dataclass
from typing import Any

import grpc

from hushnet.net import pki
from hushnet.net import shared as _shared
from hushnet.net.errors import NodeError
from hushnet.v1 import bootstrap_pb2 as bpb
from hushnet.v1 import bootstrap_pb2_grpc as bpb_grpc

_NON_RETRYABLE_JOIN = {
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.PERMISSION_DENIED,
}


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


class IdentityMixin:
    """Who this node is and how it gets admitted (state on :class:`~hushnet.net.node.Node`)."""

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
            raise NodeError(
                f"state directory {self.state_dir} is in use by another node process (pid {holder}); "
                "stop that node first, or give this one its own --state-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _unlock_state_dir(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def _open_state(self):
        """The node's store (opened on first use), this start's incarnation, the keys and CA from its
        state directory (created on first start); blocking, called in a worker thread."""
        from hushnet.net.store import NodeStore

        store = NodeStore(self.state_dir / "node.sqlite")
        try:
            incarnation = store.next_incarnation()
            key, x_key = self._load_keys()
            ca_pem = self._load_ca()
        except BaseException:
            store.close()
            raise
        return store, incarnation, key, x_key, ca_pem

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
            self._boot = _shared.acquire(
                self.config.bootstrap, (self.state_dir / "ca.pem").read_bytes()
            )
        return _shared.borrow(self._boot)

    async def _join(self, key, x_key, ca_pem: bytes) -> Identity:
        token = self._token()
        saved = _read_json(self.state_dir / "identity.json")
        requested = self.config.node_id or saved.get("node_id") or ""
        if self.config.node_id and saved.get("node_id") and saved["node_id"] != self.config.node_id:
            raise NodeError(
                f"state directory {self.state_dir} belongs to node {saved['node_id']}, "
                f"not {self.config.node_id}"
            )
        request = bpb.JoinRequest(
            token=token,
            csr_pem=pki.make_csr(key),
            requested_id=requested,
            address=self.address,
            x25519_public=pki.x25519_public_bytes(x_key),
        )
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
                    raise NodeError(
                        f"bootstrap {self.config.bootstrap} refused to admit this node: "
                        f"{code.name}: {exc.details()}"
                    ) from None
                waited = time.monotonic() - started
                if (
                    self.config.join_timeout_s is not None
                    and waited + delay > self.config.join_timeout_s
                ):
                    raise NodeError(
                        f"bootstrap {self.config.bootstrap} unreachable after {attempt} attempts "
                        f"({waited:.0f} s): {code.name}"
                    ) from None
                self.log.warning(
                    "bootstrap %s unreachable (%s); retrying in %.1f s (attempt %d)",
                    self.config.bootstrap,
                    code.name,
                    delay,
                    attempt,
                    extra={"event": "bootstrap_unreachable", "attempt": attempt},
                )
                await asyncio.sleep(delay * (0.8 + 0.4 * random.random()))
                delay = min(delay * 2, self.config.max_backoff_s)
        cert_pem = bytes(reply.cert_pem)
        if reply.lease_seconds > 0:
            self.lease_seconds = reply.lease_seconds
        if reply.ca_pem and bytes(reply.ca_pem) != ca_pem:
            pki.write_public(self.state_dir / "node.pem", cert_pem)
            raise NodeError("the bootstrap presented a different CA than the one configured")
        identity = json.dumps(
            {
                "node_id": reply.node_id,
                "vertex": reply.vertex,
                "bootstrap": self.config.bootstrap,
                "address": self.address,
                "cert_sha256": pki.cert_sha256(cert_pem),
                "key_sha256": pki.key_sha256(key.public_key()),
                "x25519_public": pki.x25519_public_bytes(x_key).hex(),
            },
            indent=2,
        ).encode()
        await asyncio.to_thread(self._save_identity, cert_pem, identity)
        self.log.info(
            "%s as %s (vertex %d)",
            "re-joined" if reply.rejoined else "joined",
            reply.node_id,
            reply.vertex,
            extra={"event": "joined", "node": reply.node_id, "rejoined": reply.rejoined},
        )
        return Identity(
            reply.node_id, reply.vertex, key, pki.key_to_pem(key), cert_pem, ca_pem, x_key
        )

    def _save_identity(self, cert_pem: bytes, identity: bytes) -> None:
        """Write what the join gave (certificate, identity record, the token for restarts); blocking, called
        in a worker thread (three file writes a node, for hundreds of nodes a host starts)."""
        pki.write_public(self.state_dir / "node.pem", cert_pem)
        pki.write_public(self.state_dir / "identity.json", identity)
        if self.config.token:
            pki.write_secret(self.state_dir / "join_token", self.config.token.encode())

    def _signed(self, method: str) -> bpb.SignedRequest:
        ms = int(time.time() * 1000)
        sig = pki.sign(self.identity.key, pki.signed_message(method, self.node_id, ms))
        return bpb.SignedRequest(
            node_id=self.node_id,
            unix_ms=ms,
            signature=sig,
            address=self.address if method == "Heartbeat" else "",
        )


def _read_json(path: pathlib.Path) -> dict:
    try:
        return json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError):
        return {}
