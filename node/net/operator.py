"""Operator client: read the directory, query node status, and send control commands.

The operator authenticates with the operator certificate the bootstrap wrote into its state
directory (``operator.pem``/``operator.key``); nodes accept ``Control`` only from such
certificates. Used by ``hushnet status``, the demo, the tests and (later) the notebook client.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import pathlib
from dataclasses import dataclass
from typing import Any

import grpc

from hushnet.net import pki
from hushnet.v1 import bootstrap_pb2 as bpb
from hushnet.v1 import bootstrap_pb2_grpc as bpb_grpc
from hushnet.v1 import peer_pb2 as ppb
from hushnet.v1 import peer_pb2_grpc as ppb_grpc

MiB = 1024 * 1024


class OperatorError(RuntimeError):
    pass


def find_bootstrap_dir(state_dir: pathlib.Path) -> pathlib.Path:
    """The bootstrap state directory inside a ``hushnet up`` directory, or the directory itself."""
    state_dir = pathlib.Path(state_dir)
    for candidate in (state_dir / "bootstrap", state_dir):
        if (candidate / "bootstrap.json").exists() and (candidate / "operator.pem").exists():
            return candidate
    raise OperatorError(
        f"{state_dir} is neither a 'hushnet up' state directory nor a bootstrap state directory "
        "(no bootstrap.json + operator.pem found)"
    )


@dataclass
class OperatorCredentials:
    ca_pem: bytes
    key_pem: bytes
    cert_pem: bytes
    bootstrap: str

    @classmethod
    def from_state_dir(
        cls, state_dir: pathlib.Path, bootstrap: str | None = None
    ) -> "OperatorCredentials":
        bdir = find_bootstrap_dir(state_dir)
        info = json.loads((bdir / "bootstrap.json").read_text())
        return cls(
            (bdir / "ca.pem").read_bytes(),
            (bdir / "operator.key").read_bytes(),
            (bdir / "operator.pem").read_bytes(),
            bootstrap or info["address"],
        )


DEFAULT_MAX_CONCURRENT = 64


class Operator:
    """Async operator client; channels to nodes are cached and closed by :meth:`close`.

    At most ``max_concurrent`` node calls are in flight (``HUSHNET_OPERATOR_CONCURRENCY``; default 64):
    a status sweep or a command to every node of a 2048-node network is then a bounded stream of calls
    (and of TLS handshakes on first contact) instead of 2048 at once, which starved the node processes
    and timed out calls that were merely queued.  Timeouts count from when a call is sent.
    """

    def __init__(
        self,
        creds: OperatorCredentials,
        max_message_bytes: int = 256 * MiB,
        max_concurrent: int | None = None,
    ) -> None:
        self.creds = creds
        self.max_message_bytes = max_message_bytes
        self._channels: dict[tuple[str, str], grpc.aio.Channel] = {}
        self._followed: bpb.Directory | None = None  # see followed_directory
        self._followed_members: dict[str, bpb.Member] = {}
        #: (directory, expected neighbours by id, graph degree by vertex, edges) of the last status document
        self._status_index: tuple | None = None
        if max_concurrent is None:
            raw = os.environ.get("HUSHNET_OPERATOR_CONCURRENCY", str(DEFAULT_MAX_CONCURRENT))
            try:
                max_concurrent = int(raw)
            except ValueError:
                raise OperatorError(
                    f"HUSHNET_OPERATOR_CONCURRENCY must be an integer, got {raw!r}"
                ) from None
        if max_concurrent < 1:
            raise OperatorError(f"operator concurrency must be at least 1, got {max_concurrent}")
        self.max_concurrent = max_concurrent
        self._slots = asyncio.Semaphore(max_concurrent)
        #: Control calls made, by command (a batch counts once, as ``host.batch``)
        self.calls: collections.Counter[str] = collections.Counter()
        from hushnet.net.hostcontrol import HostBatchClient

        #: ``host.batch`` calls: one per host process (the status sweep and the run commands)
        self.hosts = HostBatchClient(self, OperatorError)

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()

    async def __aenter__(self) -> "Operator":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def followed_directory(self, timeout: float = 5.0) -> bpb.Directory:
        """The directory kept by this operator and moved forward by the changes since its version.

        For callers that ask again and again (``wait_healthy`` during a start-up): the bootstrap sends
        only the members changed since (not all n of them, with every edge and weight, on each sweep),
        over one kept channel.  Membership, addresses and keys are current; a member's ``alive`` flag
        is not (a lease that expires does not move the version): read :meth:`directory` for that.
        """
        ch = self._channels.get(("", self.creds.bootstrap))
        if ch is None:
            ch = self._channels[("", self.creds.bootstrap)] = grpc.aio.secure_channel(
                self.creds.bootstrap,
                pki.channel_credentials(self.creds.ca_pem),
                options=[
                    ("grpc.ssl_target_name_override", pki.BOOTSTRAP_DNS),
                    ("grpc.max_receive_message_length", 64 * MiB),
                ],
            )
        held = self._followed
        changes = await bpb_grpc.BootstrapStub(ch).WatchDirectory(
            bpb.DirectoryWatch(since_epoch=held.epoch if held is not None else 0, wait_seconds=0),
            timeout=timeout,
        )
        if changes.snapshot:
            held = changes.directory
            self._followed_members = {m.node_id: m for m in held.members}
        elif held is not None and changes.epoch > held.epoch and changes.changed:
            members = self._followed_members
            members.update((m.node_id, m) for m in changes.changed)
            new = bpb.Directory()
            new.CopyFrom(held)
            del new.members[:]
            new.members.extend(sorted(members.values(), key=lambda m: m.vertex))
            new.epoch = changes.epoch
            held = new
        self._followed = held
        return held

    async def directory(self, timeout: float = 5.0) -> bpb.Directory:
        async with grpc.aio.secure_channel(
            self.creds.bootstrap,
            pki.channel_credentials(self.creds.ca_pem),
            options=[
                ("grpc.ssl_target_name_override", pki.BOOTSTRAP_DNS),
                ("grpc.max_receive_message_length", 64 * MiB),
            ],
        ) as ch:
            return await bpb_grpc.BootstrapStub(ch).GetDirectory(
                bpb.DirectoryRequest(), timeout=timeout
            )

    def _stub(self, node_id: str, address: str) -> ppb_grpc.PeerStub:
        key = (node_id, address)
        ch = self._channels.get(key)
        if ch is None:
            ch = grpc.aio.secure_channel(
                address,
                pki.channel_credentials(self.creds.ca_pem, self.creds.key_pem, self.creds.cert_pem),
                options=[
                    ("grpc.ssl_target_name_override", pki.node_dns(node_id)),
                    ("grpc.max_receive_message_length", self.max_message_bytes),
                    ("grpc.max_send_message_length", self.max_message_bytes),
                    ("grpc.use_local_subchannel_pool", 1),
                ],
            )
            self._channels[key] = ch
        return ppb_grpc.PeerStub(ch)

    async def status(self, node_id: str, address: str, timeout: float = 3.0) -> ppb.StatusReply:
        async with self._slots:
            return await self._stub(node_id, address).Status(ppb.StatusRequest(), timeout=timeout)

    async def control_raw(
        self, node_id: str, address: str, command: str, args: Any = None, timeout: float = 60.0
    ) -> ppb.ControlReply:
        """Run ``command`` on a node and return its reply as it came (``ok``, ``payload``, ``error``)."""
        payload = args if isinstance(args, (bytes, bytearray)) else json.dumps(args or {}).encode()
        self.calls[command] += 1
        async with self._slots:
            return await self._stub(node_id, address).Control(
                ppb.ControlRequest(command=command, payload=bytes(payload)), timeout=timeout
            )

    async def control(
        self, node_id: str, address: str, command: str, args: Any = None, timeout: float = 60.0
    ) -> Any:
        """Run ``command`` on a node; JSON in and out (bytes pass through unchanged)."""
        reply = await self.control_raw(node_id, address, command, args, timeout)
        if not reply.ok:
            raise OperatorError(f"{node_id}: {command} failed: {reply.error}")
        try:
            return json.loads(reply.payload) if reply.payload else None
        except ValueError:
            return bytes(reply.payload)

    async def network_status(
        self,
        timeout: float = 3.0,
        only: set[str] | None = None,
        follow: bool = False,
        batch: bool = True,
    ) -> dict:
        """The ``hushnet status --json`` document: bootstrap view plus each node's own report.

        ``only``: ask just these nodes (``nodes`` then lists only them; ``members`` always lists every
        member id), for callers that re-check only what was not healthy yet.  ``follow``: read the
        directory as changes since the last call (:meth:`followed_directory`; ``alive_in_directory``
        may then be stale), for callers that sweep repeatedly.

        ``batch``: each node's ``Status`` reply is fetched through ``host.batch`` (``node.status``), one
        call per host process, each reply signed by its own node and checked against the directory's
        key (a sweep of 2048 nodes in 5 processes was 2048 Status calls, every start-up sweep of
        ``hushnet up``); the nodes no host answered for (lone or older nodes, a host that is gone) are
        asked with their own ``Status`` call, as with ``batch=False``."""
        directory = await (self.followed_directory if follow else self.directory)(timeout=timeout)
        if self._status_index is not None and self._status_index[0] is directory:
            # the followed directory did not move since the last sweep: its indexes are still right
            _, expected, graph_degree, edges = self._status_index
        else:
            by_vertex = {m.vertex: m.node_id for m in directory.members}
            expected = {m.node_id: set() for m in directory.members}
            graph_degree = {}
            for e in directory.edges:
                graph_degree[e.u] = graph_degree.get(e.u, 0) + 1
                graph_degree[e.v] = graph_degree.get(e.v, 0) + 1
                if e.u in by_vertex and e.v in by_vertex:
                    expected[by_vertex[e.u]].add(by_vertex[e.v])
                    expected[by_vertex[e.v]].add(by_vertex[e.u])
            edges = [[e.u, e.v] for e in directory.edges]
            self._status_index = (directory, expected, graph_degree, edges)

        async def one(m: bpb.Member) -> dict:
            entry: dict[str, Any] = {
                "id": m.node_id,
                "address": m.address,
                "vertex": m.vertex,
                "alive_in_directory": m.alive,
                "cert_sha256": m.cert_sha256,
                "x25519_public": bytes(m.x25519_public).hex(),
            }
            try:
                got = batched.get(m.node_id)
                if isinstance(got, (bytes, bytearray)):
                    st = ppb.StatusReply.FromString(bytes(got))
                else:  # not answered for by a host (or it failed there): its own Status call
                    st = await self.status(m.node_id, m.address, timeout=timeout)
            except grpc.aio.AioRpcError as exc:
                entry.update(
                    healthy=False,
                    serving=False,
                    wired=False,
                    neighbors=[],
                    connected=[],
                    all_neighbors_connected=False,
                    error=f"{exc.code().name}: {exc.details()}",
                )
                return entry
            connected = [c.peer_id for c in st.connections if c.healthy]
            # against the published graph, not the node's own (possibly stale) view
            wired = set(connected) == expected[m.node_id] == set(st.neighbors)
            entry.update(
                # per node, "healthy" is "serving" (answers as itself); "wired" says its links are all up
                healthy=st.node_id == m.node_id,
                serving=st.node_id == m.node_id,
                wired=wired,
                neighbors=list(st.neighbors),
                connected=connected,
                all_neighbors_connected=wired,
                uptime_s=round(st.uptime_seconds, 1),
                version=st.version,
                delivered=st.delivered,
                rejected=st.rejected,
                protocols=list(st.protocols),
                directory_epoch=st.directory_epoch,
                connections=[
                    {
                        "peer": c.peer_id,
                        "address": c.address,
                        "state": c.state,
                        "healthy": c.healthy,
                        "sent": c.sent,
                        "failures": c.failures,
                    }
                    for c in st.connections
                ],
            )
            return entry

        asked = [m for m in directory.members if only is None or m.node_id in only]
        batched: dict[str, Any] = {}
        if batch and asked:
            members = {m.node_id: m for m in directory.members}
            self.hosts.reset()
            batched = await self.hosts.ask(
                members, "node.status", None, [m.node_id for m in asked], timeout, decode=False
            )
        nodes = await asyncio.gather(*(one(m) for m in asked))
        return {
            "bootstrap": self.creds.bootstrap,
            "topology": directory.topology,
            "epoch": directory.epoch,
            "n_vertices": directory.n_vertices,
            "weight_rule": directory.weight_rule,
            "edges": [list(e) for e in edges],
            "nodes": sorted(nodes, key=lambda e: e["vertex"]),
            "members": [m.node_id for m in directory.members],
            # per member, how many of its graph neighbours are members (what "wired" was judged against)
            "expected_degree": {i: len(v) for i, v in expected.items()},
            # per member, the degree of its vertex in the graph (all its neighbours joined: equal to the above)
            "graph_degree": {m.node_id: graph_degree.get(m.vertex, 0) for m in directory.members},
            # the network is healthy when every node serves AND is connected to all its neighbours: a run
            # started on a network that only serves can be refused for missing links
            "serving": bool(nodes) and all(n["serving"] for n in nodes),
            "wired": bool(nodes) and all(n["wired"] for n in nodes),
            "healthy": bool(nodes) and all(n["serving"] and n["wired"] for n in nodes),
        }


def format_table(doc: dict) -> str:
    """Human table for ``hushnet status`` / ``hushnet up``."""
    rows = [("ID", "VERTEX", "ADDRESS", "SERVING", "WIRED", "LINKS", "NEIGHBOURS", "UPTIME")]
    for n in doc["nodes"]:
        links = f"{len(n.get('connected', []))}/{len(n.get('neighbors', []))}"
        rows.append(
            (
                n["id"],
                str(n["vertex"]),
                n["address"],
                "yes" if n.get("serving", n["healthy"]) else "NO",
                "yes" if n.get("wired", n.get("all_neighbors_connected")) else "NO",
                links,
                ",".join(n.get("neighbors", [])) or "-",
                f"{n['uptime_s']:.0f}s" if "uptime_s" in n else "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        f"network: topology {doc['topology']}, {len(doc['nodes'])}/{doc['n_vertices']} members, "
        f"directory epoch {doc['epoch']}, bootstrap {doc['bootstrap']}"
    ]
    if "serving" in doc:
        lines.append(
            f"healthy: {'yes' if doc['healthy'] else 'NO'} (serving: {'yes' if doc['serving'] else 'NO'}, "
            f"wired to every neighbour: {'yes' if doc['wired'] else 'NO'})"
        )
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)
