"""A host process's nodes that stop together leave together: one ``LeaveHost`` for all (issue 12).

Why: 5 host processes of 410 nodes stopping at once sent 2 048 ``Leave`` calls, and only ~190 reached the
bootstrap within their 1.5 s timeout; the others stayed in the directory until their leases expired.
Real TLS on loopback, a bootstrap and a node host in one event loop.  The lease is a minute long, so a
node the directory lists as gone after the stop has left, not expired.
"""

from __future__ import annotations

import collections
import pathlib
import time

import grpc
import pytest
import uvloop
from helpers.net import inprocess_bootstrap

from hushnet.bootstrap.service import BootstrapService
from hushnet.net import pki
from hushnet.net.host import NodeHost, hosted_configs
from hushnet.v1 import bootstrap_pb2 as bpb
from hushnet.v1 import bootstrap_pb2_grpc as bpb_grpc

pytestmark = pytest.mark.timeout(120)
LEASE = 60.0  # far longer than the test: nobody expires


@pytest.fixture
def calls(monkeypatch) -> dict[str, list[int]]:
    """The bootstrap's Leave and LeaveHost requests as they arrive: how many leaves each carried."""
    seen: dict[str, list[int]] = collections.defaultdict(list)
    for name in ("Leave", "LeaveHost"):
        real = getattr(BootstrapService, name)

        async def counted(self, request, context, _real=real, _name=name):
            seen[_name].append(len(request.leaves) if _name == "LeaveHost" else 1)
            return await _real(self, request, context)

        monkeypatch.setattr(BootstrapService, name, counted)
    return seen


def _configs(tmp: pathlib.Path, addr: str, ids: list[str]):
    return hosted_configs(
        [tmp / i for i in ids],
        "127.0.0.1:0",
        ids,
        bootstrap=addr,
        token="tok",
        ca_file=tmp / "b" / "ca.pem",
    )


async def _directory(tmp: pathlib.Path, addr: str) -> bpb.Directory:
    async with grpc.aio.secure_channel(
        addr,
        pki.channel_credentials((tmp / "b" / "ca.pem").read_bytes()),
        options=[("grpc.ssl_target_name_override", pki.BOOTSTRAP_DNS)],
    ) as ch:
        return await bpb_grpc.BootstrapStub(ch).GetDirectory(bpb.DirectoryRequest(), timeout=5)


def test_a_stopped_hosts_nodes_leave_together(tmp_path: pathlib.Path, calls) -> None:
    async def go():
        addr, stop, btask = await inprocess_bootstrap(tmp_path, "hypercube:3", lease_seconds=LEASE)
        ids = [f"n{i}" for i in range(8)]
        host = NodeHost(_configs(tmp_path, addr, ids))
        try:
            await host.start()
            before = await _directory(tmp_path, addr)
            assert {m.node_id: m.alive for m in before.members} == {i: True for i in ids}
            await host.stop()
            after = await _directory(tmp_path, addr)
            # every node is gone from the directory now, a minute before its lease would run out
            assert {m.node_id: m.alive for m in after.members} == {i: False for i in ids}
            # ... by batched leaves (each node's own signed Leave inside), not one call per node
            assert calls["Leave"] == [], calls
            assert sum(calls["LeaveHost"]) == len(ids), calls
            assert len(calls["LeaveHost"]) < len(ids), calls
            # one directory change per batch, not one per node
            assert after.epoch - before.epoch == len(calls["LeaveHost"]), (
                before.epoch,
                after.epoch,
            )
        finally:
            await host.stop()
            stop.set()
            await btask

    uvloop.run(go())


def test_a_forged_leave_in_a_batch_is_refused_alone(tmp_path: pathlib.Path, calls) -> None:
    async def go():
        addr, stop, btask = await inprocess_bootstrap(tmp_path, "ring:4", lease_seconds=LEASE)
        host = NodeHost(_configs(tmp_path, addr, ["n0", "n1", "n2"]))
        try:
            await host.start()
            n0, n1, n2 = sorted(host.running, key=lambda x: x.node_id)
            ms = int(time.time() * 1000)
            forged = bpb.SignedRequest(  # n1's leave signed by a key that is not n1's
                node_id="n1",
                unix_ms=ms,
                signature=pki.sign(pki.generate_key(), pki.signed_message("Leave", "n1", ms)),
            )
            stale_ms = ms - 10 * 60 * 1000  # n2's own signature, ten minutes old: a replay
            stale = bpb.SignedRequest(
                node_id="n2",
                unix_ms=stale_ms,
                signature=pki.sign(n2.identity.key, pki.signed_message("Leave", "n2", stale_ms)),
            )
            other = bpb.SignedRequest(  # n0's signature over another method's message
                node_id="n0",
                unix_ms=ms,
                signature=pki.sign(n0.identity.key, pki.signed_message("Heartbeat", "n0", ms)),
            )
            unknown = bpb.SignedRequest(node_id="n9", unix_ms=ms, signature=b"x")
            async with grpc.aio.secure_channel(
                addr,
                pki.channel_credentials((tmp_path / "b" / "ca.pem").read_bytes()),
                options=[("grpc.ssl_target_name_override", pki.BOOTSTRAP_DNS)],
            ) as ch:
                stub = bpb_grpc.BootstrapStub(ch)
                reply = await stub.LeaveHost(
                    bpb.HostLeave(leaves=[forged, n0._signed("Leave"), stale, other, unknown]),
                    timeout=5,
                )
            assert list(reply.left) == ["n0"]
            why = {r.node_id: r.reason for r in reply.refused}
            assert why == {
                "n1": "Leave from n1: bad signature",
                "n2": "Leave from n2: timestamp outside the allowed clock skew",
                "n0": "Leave from n0: bad signature",
                "n9": "unknown node 'n9'; join first",
            }, why
            d = await _directory(tmp_path, addr)
            assert {m.node_id: m.alive for m in d.members} == {"n0": False, "n1": True, "n2": True}
        finally:
            await host.stop()
            stop.set()
            await btask

    uvloop.run(go())
