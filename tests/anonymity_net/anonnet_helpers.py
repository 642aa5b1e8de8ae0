"""A real in-process network for the anonymity-layer tests (and the benchmark).

Bootstrap + n :class:`~node.net.node.Node` objects in one event loop, each on its own 127.0.0.x
address with real mutual TLS and its own state directory (own long-term X25519 key, own
``runs.toml`` and data, own SQLite privacy ledger), each serving runs through
:class:`~node.runs.service.RunService`, driven by the real operator client (signed specs).
In-process so a test can look at exactly what a receiver's handler sees.  Always torn down.
"""
from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import pathlib
import time
from typing import Any, AsyncIterator, Sequence

import numpy as np

from bootstrap.service import BootstrapConfig, serve as serve_bootstrap
from node.net.node import Node, NodeConfig
from node.runs.policy import NodePolicy
from node.runs.service import RUN_PROTOCOL, RunService


_PEER: contextvars.ContextVar[str] = contextvars.ContextVar("grpc_peer", default="")


class Net:
    def __init__(self, tmp: pathlib.Path, nodes: list[Node], services: list[RunService], client) -> None:
        self.tmp, self.nodes, self.services, self.client = tmp, nodes, services, client
        self.by_id = {nd.node_id: nd for nd in nodes}
        self.vertex_of = {nd.node_id: nd.identity.vertex for nd in nodes}
        self.ordered = sorted(nodes, key=lambda nd: nd.identity.vertex)
        self.svc_by_vertex = {nd.identity.vertex: s for nd, s in zip(nodes, services)}

    def driver(self, vertex: int, run_id: str):
        return self.svc_by_vertex[vertex].runs.get(run_id)

    async def wait(self, pred, timeout: float = 60.0, every: float = 0.05, what: str = "condition") -> Any:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            v = pred()
            if v:
                return v
            await asyncio.sleep(every)
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def write_policy(state: pathlib.Path, values: np.ndarray | None, xy: tuple[np.ndarray, np.ndarray] | None,
                 epsilon: float, delta: float) -> None:
    state.mkdir(parents=True, exist_ok=True)
    data = None
    if xy is not None:
        np.savez(state / "data.npz", X=xy[0], y=xy[1])
        data = "data.npz"
    elif values is not None:
        np.savez(state / "data.npz", X=np.asarray(values, dtype=np.float64).reshape(-1, 1), y=np.zeros(len(values)))
        data = "data.npz"
    NodePolicy.write(state, epsilon=epsilon, delta=delta, data_path=data)


@contextlib.asynccontextmanager
async def network(tmp: pathlib.Path, graph: str, n: int, *, values: Sequence[np.ndarray] | None = None,
                  shards: Sequence[tuple[np.ndarray, np.ndarray]] | None = None, epsilon: float = 1e6,
                  delta: float = 1e-5, base_ip: int = 40) -> AsyncIterator[Net]:
    from node.client.core import AsyncClient

    stop = asyncio.Event()
    ready = asyncio.Event()
    btask = asyncio.create_task(serve_bootstrap(BootstrapConfig(tmp / "b", "127.0.0.1:0", graph, "tok"), stop, ready))
    nodes: list[Node] = []
    services: list[RunService] = []
    spies: list[Spy] = []
    client = None
    try:
        await asyncio.wait([btask, asyncio.create_task(ready.wait())], return_when=asyncio.FIRST_COMPLETED)
        if btask.done():
            btask.result()
        addr = json.loads((tmp / "b" / "bootstrap.json").read_text())["address"]
        for i in range(n):
            st = tmp / f"n{i}"
            write_policy(st, None if values is None else values[i], None if shards is None else shards[i], epsilon, delta)
            nd = Node(NodeConfig(st, f"127.0.0.{base_ip + i}:0", addr, "tok", tmp / "b" / "ca.pem", node_id=f"n{i}",
                                 probe_s=0.3, directory_refresh_s=0.3))
            nodes.append(nd)
            services.append(RunService(nd).install())
            spies.append(Spy(nd, services[-1]))  # before start: the server binds the RPC method at start
        await asyncio.gather(*(nd.start() for nd in nodes))
        for _ in range(300):
            if all(nd.links and len(nd.neighbors) == len(nd.links) and all(l.healthy for l in nd.links.values())
                   and nd.directory is not None and len(nd.directory.members) == n for nd in nodes):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("in-process network did not become healthy")
        client = await AsyncClient.connect(tmp / "b")
        net = Net(tmp, nodes, services, client)
        net.spies = {nd.identity.vertex: sp for nd, sp in zip(nodes, spies)}
        yield net
    finally:
        if client is not None:
            await client.close()
        for s in services:
            s.close()
        await asyncio.gather(*(nd.stop(grace=0.2) for nd in nodes if nd.identity is not None), return_exceptions=True)
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(btask, 10)


class Spy:
    """Wraps a node's run handler: records what the receiver's handler sees (authenticated sender,
    the gRPC peer address of the Deliver call, the payload bytes) — a test-side observer only."""

    def __init__(self, node: Node, service: RunService) -> None:
        self.node, self.service = node, service
        self.seen: list[dict[str, Any]] = []
        self._rpc = node._rpc_deliver  # noqa: SLF001 - observe the real RPC entry, no behaviour change

        async def deliver(raw: bytes, context):
            _PEER.set(context.peer())  # per-call (context variables follow the RPC's task)
            return await self._rpc(raw, context)

        node._rpc_deliver = deliver  # noqa: SLF001
        self._handle = service.handle

        def handle(envelope):
            if envelope.protocol == RUN_PROTOCOL:
                self.seen.append({"sender": envelope.sender, "peer": _PEER.get(), "payload": bytes(envelope.payload),
                                  "run_id": envelope.run_id})
            return self._handle(envelope)

        service.handle = handle  # type: ignore[method-assign]
