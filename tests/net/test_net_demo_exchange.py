"""``make net-demo``'s check (:func:`hushnet.demo.exchange_on_every_edge`), on nodes in this process.

The demo's verdict is the operator's only end-to-end proof that every edge of a fresh network
carries envelopes: it must say ``ok`` when each directed edge delivered exactly one intact envelope,
and must not when an edge carried more (or bytes other than the ones sent).  The cluster test (``test_net_cluster.py``) runs it over
node processes; this one runs a bootstrap and three nodes in one event loop (real mutual TLS on
127.0.0.x), so the suite's quick part reaches the module too (issue 13: every module reached).
"""

from __future__ import annotations

import asyncio
import pathlib

import pytest
import uvloop
from helpers.net import inprocess_bootstrap

from hushnet.demo import exchange_on_every_edge
from hushnet.net.node import Node, NodeConfig

pytestmark = pytest.mark.timeout(120)


async def _bootstrap(tmp: pathlib.Path, topology: str):
    return await inprocess_bootstrap(tmp, topology)


async def _wired(nodes: list[Node], n: int) -> None:
    for _ in range(300):
        if all(
            len(nd.members) == n and nd.links and all(lk.healthy for lk in nd.links.values())
            for nd in nodes
        ):
            return
        await asyncio.sleep(0.1)
    raise AssertionError("network not wired")


def test_demo_exchange_verifies_every_directed_edge_and_flags_duplicates(
    tmp_path: pathlib.Path,
) -> None:
    async def go():
        addr, stop, task = await _bootstrap(tmp_path, "ring:3")
        nodes = [
            Node(
                NodeConfig(
                    tmp_path / f"n{i}",
                    f"127.0.0.{90 + i}:0",
                    addr,
                    "tok",
                    tmp_path / "b" / "ca.pem",
                    node_id=f"n{i}",
                    probe_s=0.3,
                    directory_refresh_s=0.3,
                )
            )
            for i in range(3)
        ]
        await asyncio.gather(*(nd.start() for nd in nodes))
        try:
            await _wired(nodes, 3)
            first = await exchange_on_every_edge(tmp_path / "b", run_id="edges", size=512)
            # the same run id again: every inbox now holds two envelopes per directed edge
            again = await exchange_on_every_edge(tmp_path / "b", run_id="edges", size=512)
        finally:
            for nd in nodes:
                await nd.stop()
            stop.set()
            await task
        return first, again

    first, again = uvloop.run(go())
    assert first["edges"] == 3 and first["directed_edges"] == 6, first
    assert first["sent"] == 6 and first["delivered"] == 6, first
    for key in ("missing", "duplicates", "corrupted", "unexpected", "failed"):
        assert first[key] == [], (key, first)
    assert first["ok"] is True and first["rtt_ms_median"] > 0
    assert again["ok"] is False and again["delivered"] == 12
    every = ["n0->n1", "n0->n2", "n1->n0", "n1->n2", "n2->n0", "n2->n1"]
    assert sorted(again["duplicates"]) == every
    # and each edge's older envelope (other random bytes) fails the SHA-256 check of the new one
    assert sorted(again["corrupted"]) == every
