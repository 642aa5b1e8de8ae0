"""The operator's per-host batch (``host.batch``): one Control call answers for every node of a process.

In one test process (real bootstrap, real mutual TLS on loopback): two node hosts of four nodes and one
lone node.  The batch gives each node's answer exactly as a per-node call does, with one call per host;
a node whose command raises gives its own error only; a host that answers for a node it does not hold
is not believed (that node is asked on its own); a host that is gone leaves its nodes to per-node calls,
which report them unreachable.  (The whole flow across real processes, with a run: ``tests/runs/
test_runs_operator_batch.py``.)
"""

from __future__ import annotations

import asyncio
import pathlib
import time

import pytest
import uvloop
from helpers.net import inprocess_bootstrap  # noqa: E402

from hushnet.client.core import AsyncClient, ClientError  # noqa: E402
from hushnet.net.host import NodeHost, hosted_configs  # noqa: E402
from hushnet.net.node import Node  # noqa: E402
from hushnet.net.operator import OperatorCredentials, OperatorError  # noqa: E402

pytestmark = pytest.mark.timeout(150)

A = [f"a{i}" for i in range(4)]
B = [f"b{i}" for i in range(4)]
ALL = [*A, *B, "lone"]


def _configs(tmp: pathlib.Path, addr: str, ids: list[str]):
    return hosted_configs(
        [tmp / i for i in ids],
        "127.0.0.1:0",
        ids,
        bootstrap=addr,
        token="tok",
        ca_file=tmp / "b" / "ca.pem",
    )


async def _members(client: AsyncClient, n: int, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        await client.refresh()
        if len(client._members) >= n:
            return
        await asyncio.sleep(0.2)
    raise AssertionError("not every node joined")


def test_host_batch_answers_like_per_node_calls(tmp_path: pathlib.Path) -> None:
    async def go() -> None:
        addr, stop, btask = await inprocess_bootstrap(tmp_path, "ring:9")
        host_a = NodeHost(_configs(tmp_path, addr, A))
        host_b = NodeHost(_configs(tmp_path, addr, B))
        lone = Node(_configs(tmp_path, addr, ["lone"])[0])
        batch = per_node = None
        try:
            await asyncio.gather(host_a.start(), host_b.start(), lone.start())
            creds = OperatorCredentials.from_state_dir(tmp_path / "b")
            batch = AsyncClient(creds)
            per_node = AsyncClient(creds, batch=False)
            await _members(batch, len(ALL))
            await per_node.refresh()

            # b1's command raises: its error, exactly as a per-node call words it; the others answer
            def boom(payload: bytes) -> bytes:
                raise RuntimeError("status broke in b1")

            {n.node_id: n for n in host_b.running}["b1"].register_control(
                "status", boom, replace=True
            )
            first = await batch._all("status")
            calls = dict(batch.op.calls)
            again = await batch._all("status")
            # the hosts are known after the first call: one call per host, the lone node its own host
            assert batch.last_calls == 3, batch.last_calls
            assert batch.op.calls["host.batch"] - calls["host.batch"] == 3
            # (the first call may have asked one node on its own: a node of no known host that comes
            # after a full discovery wave naming nobody else — e.g. the lone node — is asked per node)
            assert batch.op.calls["status"] - calls.get("status", 0) == 0
            slow = await per_node._all("status")
            assert per_node.op.calls["status"] == len(ALL) and per_node.op.calls["host.batch"] == 0
            for res in (first, again):
                assert set(res) == set(ALL)
                for i in ALL:
                    if i == "b1":
                        assert isinstance(res[i], ClientError)
                        assert str(res[i]) == str(slow[i])
                        assert "RuntimeError: status broke in b1" in str(res[i])
                    else:
                        assert res[i]["node"] == i
                        assert res[i]["neighbors"] == slow[i]["neighbors"]

            # bad input to the batch itself: one clear line, the call refused (the client then asks per node)
            a0 = batch._members["a0"]
            for bad, why in (
                (
                    {"command": "run.submit", "nodes": A, "nonce": "x" * 32},
                    "cannot carry 'run.submit'",
                ),
                ({"command": "status", "nodes": A, "nonce": "short"}, "needs a nonce"),
                ({"command": "status", "nodes": "a0", "nonce": "x" * 32}, "list of node ids"),
            ):
                with pytest.raises(OperatorError, match=why):
                    await batch.op.control("a0", a0.address, "host.batch", bad)

            # a host whose replies fill up after one answer: the client asks for the rest page by page
            for n in host_a.running:
                n.controls._commands["host.batch"].budget = 1
            before = batch.op.calls["host.batch"]
            paged = await batch._all("status", nodes=A)
            assert batch.op.calls["host.batch"] - before == len(A)
            assert {i: r["neighbors"] for i, r in paged.items()} == {
                i: slow[i]["neighbors"] for i in A
            }
            for n in host_a.running:
                n.controls._commands["host.batch"].budget = None

            # a host that answers for a node it does not hold (a0 posing as the lone node): not believed
            real = host_a.peers
            host_a.peers = lambda: {**real(), "lone": real()["a0"]}
            for n in host_a.running:
                n.host_peers = host_a.peers
            batch._host_of["lone"] = host_a.host_id  # as if host A had claimed it
            # counted from here: the first sweep above may already have asked the lone node on its own
            asked = batch.op.calls.get("status", 0)
            res = await batch._all("status")
            assert res["lone"]["node"] == "lone"  # asked on its own after the bad signature
            assert batch.op.calls["status"] - asked == 1

            # host B is gone: its nodes are asked one by one and reported unreachable; the rest answer
            await host_b.stop()
            before = batch.op.calls["status"]
            res = await batch._all("status")
            for i in B:
                assert isinstance(res[i], ClientError) and "unreachable" in str(res[i]), res[i]
            for i in [*A, "lone"]:
                assert res[i]["node"] == i
            assert batch.op.calls["status"] - before == len(B)
        finally:
            for c in (batch, per_node):
                if c is not None:
                    await c.close()
            await asyncio.gather(host_a.stop(), host_b.stop(), lone.stop())
            stop.set()
            await btask

    uvloop.run(go())


def test_status_sweep_is_one_call_per_host(tmp_path: pathlib.Path, monkeypatch) -> None:
    """``network_status`` (``hushnet status``, ``hushnet up``'s start-up sweeps): each node's own ``Status``
    reply, fetched through one ``host.batch`` per host process instead of one ``Status`` call per node;
    a node whose host is gone is asked on its own and reported unreachable."""
    from hushnet.net.operator import Operator

    status_calls: list[str] = []
    real_status = Operator.status

    async def counted(self, node_id, address, timeout=3.0):
        status_calls.append(node_id)
        return await real_status(self, node_id, address, timeout=timeout)

    monkeypatch.setattr(Operator, "status", counted)

    async def go() -> None:
        addr, stop, btask = await inprocess_bootstrap(tmp_path, "ring:9")
        host_a = NodeHost(_configs(tmp_path, addr, A))
        host_b = NodeHost(_configs(tmp_path, addr, B))
        lone = Node(_configs(tmp_path, addr, ["lone"])[0])
        creds = OperatorCredentials.from_state_dir(tmp_path / "b")
        try:
            await asyncio.gather(host_a.start(), host_b.start(), lone.start())
            async with Operator(creds) as op, Operator(creds) as per_node:
                end = time.monotonic() + 60
                while len((await op.directory()).members) < len(ALL):
                    assert time.monotonic() < end, "not every node joined"
                    await asyncio.sleep(0.2)

                def stable(doc: dict) -> dict:
                    keep = ("id", "vertex", "serving", "neighbors", "version", "protocols")
                    return {e["id"]: {k: e.get(k) for k in keep} for e in doc["nodes"]}

                slow = await per_node.network_status(batch=False)
                assert sorted(status_calls) == sorted(ALL) and per_node.calls["host.batch"] == 0
                status_calls.clear()
                first = await op.network_status()  # learns the hosts from their replies
                before = op.calls["host.batch"]
                again = await op.network_status()
                # the hosts known after the first sweep: one call per host process (the lone node is its own)
                assert op.hosts.batches == 3 and op.calls["host.batch"] - before == 3
                only = await op.network_status(only={"a1", "b2"})
                assert op.hosts.batches == 2
                # every node answered through a batch: not one Status call
                assert status_calls == [], status_calls
                for doc in (first, again):
                    assert stable(doc) == stable(slow)
                    assert all(e["serving"] for e in doc["nodes"])
                assert stable(only) == {i: stable(slow)[i] for i in ("a1", "b2")}

                # host B is gone: its nodes are asked one by one and reported unreachable
                await host_b.stop()
                gone = await op.network_status(timeout=2.0)
                assert sorted(status_calls) == sorted(B), status_calls
                by_id = {e["id"]: e for e in gone["nodes"]}
                assert all(not by_id[i]["serving"] and "error" in by_id[i] for i in B)
                assert all(by_id[i]["serving"] for i in [*A, "lone"])
        finally:
            await asyncio.gather(host_a.stop(), host_b.stop(), lone.stop())
            stop.set()
            await btask

    uvloop.run(go())
