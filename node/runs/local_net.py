"""A real in-process network (bootstrap + nodes serving runs in one event loop), for tests and benchmarks.

Bootstrap + n :class:`~hushnet.net.node.Node` objects in one event loop, each on its own 127.0.0.x
address with real mutual TLS and its own state directory (own long-term X25519 key, own
``runs.toml`` and data, own SQLite privacy ledger), each serving runs through
:class:`~hushnet.runs.service.RunService`, driven by the real operator client (signed specs).
In-process so a test can look at exactly what a receiver's handler sees (``observe`` is called
with each node and its run service *before* the node starts, so it can wrap the real RPC entry).
Unlike :class:`hushnet.net.cluster.LocalCluster` every node shares one Python process: CPU work that
would run in parallel on a real network is serialised here (benchmarks say so).  Always torn down.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import pathlib
import time
from typing import Any, AsyncIterator, Callable, Sequence

import numpy as np

from hushnet.bootstrap.service import BootstrapConfig
from hushnet.bootstrap.service import serve as serve_bootstrap
from hushnet.net.node import Node, NodeConfig
from hushnet.runs.policy import NodePolicy
from hushnet.runs.service import RunService


class Net:
    def __init__(
        self, tmp: pathlib.Path, nodes: list[Node], services: list[RunService], client
    ) -> None:
        self.tmp, self.nodes, self.services, self.client = tmp, nodes, services, client
        self.by_id = {nd.node_id: nd for nd in nodes}
        self.vertex_of = {nd.node_id: nd.identity.vertex for nd in nodes}
        self.ordered = sorted(nodes, key=lambda nd: nd.identity.vertex)
        self.svc_by_vertex = {nd.identity.vertex: s for nd, s in zip(nodes, services)}

    def driver(self, vertex: int, run_id: str):
        return self.svc_by_vertex[vertex].runs.get(run_id)

    async def wait(
        self, pred, timeout: float = 60.0, every: float = 0.05, what: str = "condition"
    ) -> Any:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            v = pred()
            if v:
                return v
            await asyncio.sleep(every)
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def write_policy(
    state: pathlib.Path,
    values: np.ndarray | None,
    xy: tuple[np.ndarray, np.ndarray] | None,
    epsilon: float,
    delta: float,
) -> None:
    state.mkdir(parents=True, exist_ok=True)
    data = None
    if xy is not None:
        np.savez(state / "data.npz", X=xy[0], y=xy[1])
        data = "data.npz"
    elif values is not None:
        np.savez(
            state / "data.npz",
            X=np.asarray(values, dtype=np.float64).reshape(-1, 1),
            y=np.zeros(len(values)),
        )
        data = "data.npz"
    NodePolicy.write(state, epsilon=epsilon, delta=delta, data_path=data)


@contextlib.asynccontextmanager
async def network(
    tmp: pathlib.Path,
    graph: str,
    n: int,
    *,
    values: Sequence[np.ndarray] | None = None,
    shards: Sequence[tuple[np.ndarray, np.ndarray]] | None = None,
    epsilon: float = 1e6,
    delta: float = 1e-5,
    base_ip: int = 40,
    observe: Callable[[Node, RunService], Any] | None = None,
    bootstrap_options: dict[str, Any] | None = None,
) -> AsyncIterator[Net]:
    from hushnet.client.core import AsyncClient

    stop = asyncio.Event()
    ready = asyncio.Event()
    btask = asyncio.create_task(
        serve_bootstrap(
            BootstrapConfig(tmp / "b", "127.0.0.1:0", graph, "tok", **(bootstrap_options or {})),
            stop,
            ready,
        )
    )
    nodes: list[Node] = []
    services: list[RunService] = []
    observers: list[Any] = []
    client = None
    try:
        await asyncio.wait(
            [btask, asyncio.create_task(ready.wait())], return_when=asyncio.FIRST_COMPLETED
        )
        if btask.done():
            btask.result()
        addr = json.loads((tmp / "b" / "bootstrap.json").read_text())["address"]
        for i in range(n):
            st = tmp / f"n{i}"
            write_policy(
                st,
                None if values is None else values[i],
                None if shards is None else shards[i],
                epsilon,
                delta,
            )
            nd = Node(
                NodeConfig(
                    st,
                    f"127.0.0.{base_ip + i}:0",
                    addr,
                    "tok",
                    tmp / "b" / "ca.pem",
                    node_id=f"n{i}",
                    probe_s=0.3,
                    directory_refresh_s=0.3,
                )
            )
            nodes.append(nd)
            services.append(RunService(nd).install())
            observers.append(
                None if observe is None else observe(nd, services[-1])
            )  # before start: the server binds its RPC methods at start
        await asyncio.gather(*(nd.start() for nd in nodes))
        for _ in range(300):
            if all(
                nd.links
                and len(nd.neighbors) == len(nd.links)
                and all(l.healthy for l in nd.links.values())
                and nd.directory is not None
                and len(nd.directory.members) == n
                and (
                    nd.directory.onion_epoch_seconds <= 0
                    or all(m.onion_keys for m in nd.directory.members)
                )
                for nd in nodes
            ):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("in-process network did not become healthy")
        client = await AsyncClient.connect(tmp / "b")
        net = Net(tmp, nodes, services, client)
        net.observers = {nd.identity.vertex: o for nd, o in zip(nodes, observers)}
        yield net
    finally:
        if client is not None:
            await client.close()
        await asyncio.gather(
            *(nd.stop(grace=0.2) for nd in nodes if nd.identity is not None), return_exceptions=True
        )
        for s in (
            services
        ):  # after the servers stopped accepting (see Node.stop); a test that stops a node
            s.close()  # mid-run keeps its service (its machine's clock) until here
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(btask, 10)
