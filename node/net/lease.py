"""The node's standing with the bootstrap after joining: lease renewal (heartbeats, re-join when forgotten)
and the per-epoch onion keys it publishes.  A mixin of :class:`hushnet.net.node.Node`."""

from __future__ import annotations

import asyncio
import time

import grpc

from hushnet.net import pki
from hushnet.net import shared as _shared
from hushnet.net.errors import NodeError
from hushnet.v1 import bootstrap_pb2 as bpb


class LeaseMixin:
    """Heartbeats and onion-key publication (state on :class:`~hushnet.net.node.Node`)."""

    async def maintain_onion_keys(self, now: float | None = None) -> None:
        """Rotate the onion keys on the network's period (``Directory.onion_epoch_seconds``): make the
        current and next epochs' keys, delete those past their grace (and their replay tags), and publish
        the public halves through the bootstrap when they changed (see :mod:`hushnet.net.onion_keys`)."""
        from hushnet.net.onion_keys import OnionKeyStore, keys_digest

        d = self.directory_settings
        period = float(getattr(d, "onion_epoch_seconds", 0.0) or 0.0) if d is not None else 0.0
        if period <= 0:
            return
        grace = float(d.onion_grace_seconds)
        if self.onion_keys is None or (self.onion_keys.period, self.onion_keys.grace) != (
            period,
            grace,
        ):
            if self.onion_keys is not None:
                self.onion_keys.close()
                self.onion_keys = None

            def open_store() -> tuple[OnionKeyStore, list[tuple[int, bytes]]]:
                store = OnionKeyStore(self.state_dir, period, grace)
                try:
                    return store, store.maintain(now)
                except BaseException:
                    store.close()
                    raise

            # its replay cache is a SQLite store (fsyncs) and a first start writes two epochs' keys: in a worker
            # thread, as the node store is; no relay can use the store before it is assigned here
            self.onion_keys, published = await asyncio.to_thread(open_store)
        else:
            published = self.onion_keys.maintain(now)
        mine = self.members.get(self.node_id)
        listed = (
            sorted((int(k.epoch), bytes(k.public_key)) for k in mine.onion_keys)
            if mine is not None
            else []
        )
        if published == self._onion_published and all(k in listed for k in published):
            return
        ms = int(time.time() * 1000)
        method = f"PublishOnionKeys:{keys_digest(published)}"
        auth = bpb.SignedRequest(
            node_id=self.node_id,
            unix_ms=ms,
            signature=pki.sign(self.identity.key, pki.signed_message(method, self.node_id, ms)),
        )
        req = bpb.OnionKeysRequest(
            auth=auth, keys=[bpb.OnionKey(epoch=e, public_key=pk) for e, pk in published]
        )
        try:
            # with the other nodes of this process in one call (each signed by its own node, see
            # hushnet.net.shared.HostOnionKeys)
            self._bootstrap_channel()
            await self._boot.onion.publish(req, timeout=5.0)
        except (grpc.aio.AioRpcError, _shared.OnionKeysRefused) as exc:
            code, details = (
                (exc.code().name, exc.details())
                if isinstance(exc, grpc.aio.AioRpcError)
                else (exc.code, exc.reason)
            )
            self.log.warning(
                "publishing onion keys failed (%s: %s); will retry",
                code,
                details,
                extra={"event": "onion_keys_failed"},
            )
            return
        self._onion_published = published
        self.log.info(
            "onion keys published for epochs %s",
            [e for e, _ in published],
            extra={"event": "onion_keys", "epochs": [e for e, _ in published]},
        )
        await self._refresh_directory(force=True)

    async def _onion_key_loop(self) -> None:
        while True:
            period = float(getattr(self.directory_settings, "onion_epoch_seconds", 0.0) or 0.0)
            await asyncio.sleep(
                min(self.config.heartbeat_s, period / 8) if period > 0 else self.config.heartbeat_s
            )
            try:
                await self.maintain_onion_keys()
            except (NodeError, OSError) as exc:
                self.log.warning(
                    "onion-key rotation failed: %s", exc, extra={"event": "onion_keys_failed"}
                )

    async def _heartbeat_loop(self) -> None:
        """Hold this node's lease in the process's batched renewal (see :class:`hushnet.net.shared.HostLease`):
        one signed request per process and period renews all its nodes; cancelling this task silences
        this node alone."""
        self._bootstrap_channel()
        await self._boot.lease.hold(self)

    async def _rejoin(self) -> None:
        """The bootstrap forgot this node (its state was reset): join again with the same key."""
        self.log.warning("bootstrap forgot this node; re-joining", extra={"event": "rejoin"})
        try:
            key, x_key = self._load_keys()
            self.identity = await self._join(key, x_key, self.identity.ca_pem)
        except NodeError as err:
            self.log.error("re-join failed: %s", err)
