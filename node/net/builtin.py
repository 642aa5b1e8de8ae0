"""The built-in protocols (``net.ping``, ``net.discard``) and operator commands every node serves."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from typing import Any

from hushnet.net.errors import NodeError
from hushnet.net.handlers import OutgoingEnvelope
from hushnet.net.store import NodeStore
from hushnet.v1 import envelope_pb2 as epb


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
        self.store.record(
            envelope.protocol,
            envelope.run_id,
            envelope.seq,
            envelope.sender,
            len(envelope.payload),
            digest,
        )
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


class BuiltinControlsMixin:
    """Operator commands of every node: ``ping_neighbors``, ``inbox``, ``status``, ``host.batch``."""

    def _register_builtin_controls(self) -> None:
        async def ping_neighbors(payload: bytes) -> bytes:
            args = json.loads(payload or b"{}")
            run_id = str(args.get("run_id", "ping"))
            size = int(args.get("size", 32))
            targets = args.get("to") or list(self.neighbors)
            # net.ping records each envelope in the receiver's inbox (proof of delivery); net.discard only
            # counts it, so its round trip is the transport's alone (no store write at the receiver)
            protocol = str(args.get("protocol", PingProtocol.protocol))
            allowed = (PingProtocol.protocol, DiscardProtocol.protocol)
            if protocol not in allowed:
                raise ValueError(f"ping_neighbors sends {' or '.join(allowed)}, not {protocol!r}")
            results: dict[str, Any] = {}

            async def one(peer: str) -> None:
                body = os.urandom(size)
                t0 = time.perf_counter()
                try:
                    ack = await self.send(
                        peer,
                        body,
                        protocol=protocol,
                        run_id=run_id,
                        timeout=float(args.get("timeout", 30)),
                    )
                    results[peer] = {
                        "ok": bool(ack.accepted),
                        "duplicate": ack.duplicate,
                        "rtt_ms": 1000 * (time.perf_counter() - t0),
                        "sha256": hashlib.sha256(body).hexdigest(),
                        "size": size,
                    }
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
            return json.dumps(
                {
                    "node": st.node_id,
                    "neighbors": list(st.neighbors),
                    "connections": {c.peer_id: c.healthy for c in st.connections},
                }
            ).encode()

        async def node_status(payload: bytes) -> bytes:
            """The ``Status`` RPC's reply, as its protobuf bytes: what the operator's status sweep reads of
            each node, carried by ``host.batch`` (one call per host process, each answer signed by its node)."""
            return self.status().SerializeToString()

        async def cut(payload: bytes) -> bytes:
            """``{"peers": [...], "cut": bool}``: cut (or restore) this node's side of links (fault injection)."""
            args = json.loads(payload or b"{}")
            peers = [str(p) for p in args.get("peers", [])]
            if args.get("cut", True):
                self.cut.update(peers)
            else:
                self.cut.difference_update(peers)
            return json.dumps({"node": self.node_id, "cut": sorted(self.cut)}).encode()

        from hushnet.net.hostcontrol import BATCH_COMMAND, HostBatch

        builtins = [
            ("ping_neighbors", ping_neighbors),
            ("inbox", inbox),
            ("status", status),
            ("node.status", node_status),
            # the operator's one call for every node of this process (watch, report, ledger at scale)
            (BATCH_COMMAND, HostBatch(self)),
        ]
        if os.environ.get("HUSHNET_FAULT_INJECTION") == "1":  # never on a deployed node
            builtins.append(("net.cut", cut))
        for name, fn in builtins:
            if name not in self.controls.commands():
                self.controls.register(name, fn)
