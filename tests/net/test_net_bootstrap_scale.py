"""Bootstrap load that stays bounded per host process (issue 12): batched leases, directory fetched on change.

Real TLS on loopback: a bootstrap and a node host of 16 nodes in one event loop.  Checks that a host
process renews all its nodes' leases with one signed ``HeartbeatHost`` per period (no per-node
``Heartbeat``), that no node polls the directory (one long-poll per process, answered when a node joins,
with only the changed member), and that forged or malformed lease requests are refused or ignored.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import pathlib
import time

import grpc
import pytest
import uvloop

from hushnet.bootstrap.service import BootstrapConfig, BootstrapService  # noqa: E402
from hushnet.bootstrap.service import serve as serve_bootstrap
from hushnet.net import pki  # noqa: E402
from hushnet.net.host import NodeHost, hosted_configs  # noqa: E402
from hushnet.v1 import bootstrap_pb2 as bpb  # noqa: E402
from hushnet.v1 import bootstrap_pb2_grpc as bpb_grpc  # noqa: E402

pytestmark = pytest.mark.timeout(120)
LEASE = 3.0


@pytest.fixture
def calls(monkeypatch) -> collections.Counter:
    """Count the bootstrap's RPCs as they arrive (the real service still answers every one)."""
    seen: collections.Counter = collections.Counter()
    for name in ("Join", "Heartbeat", "HeartbeatHost", "GetDirectory", "WatchDirectory"):
        real = getattr(BootstrapService, name)

        async def counted(self, request, context, _real=real, _name=name):
            seen[_name] += 1
            return await _real(self, request, context)

        monkeypatch.setattr(BootstrapService, name, counted)
    return seen


async def _bootstrap(tmp: pathlib.Path, spec: str):
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(
        serve_bootstrap(
            BootstrapConfig(tmp / "b", "127.0.0.1:0", spec, "tok", lease_seconds=LEASE), stop, ready
        )
    )
    await asyncio.wait(
        [task, asyncio.create_task(ready.wait())], return_when=asyncio.FIRST_COMPLETED
    )
    if task.done():
        task.result()
    return json.loads((tmp / "b" / "bootstrap.json").read_text())["address"], stop, task


def _configs(tmp: pathlib.Path, addr: str, ids: list[str]):
    return hosted_configs(
        [tmp / i for i in ids],
        "127.0.0.1:0",
        ids,
        bootstrap=addr,
        token="tok",
        ca_file=tmp / "b" / "ca.pem",
    )


async def _until(pred, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)
    return time.monotonic() - t0


def test_leases_batched_per_process_and_directory_pushed_on_change(
    tmp_path: pathlib.Path, calls
) -> None:
    async def go():
        addr, stop, btask = await _bootstrap(tmp_path, "hypercube:5")
        ids = [f"n{i}" for i in range(16)]
        host = NodeHost(_configs(tmp_path, addr, ids))
        await host.start()
        try:
            nodes = host.running
            assert len(nodes) == 16
            await _until(
                lambda: all(len(x.members) == 16 for x in nodes), 20, "every node to see 16 members"
            )
            before = dict(calls)
            window = 3 * LEASE  # three leases long: a node not renewed would have expired twice
            await asyncio.sleep(window)
            during = {k: calls[k] - before.get(k, 0) for k in calls}
            # one renewal per lease / 3 for the whole process, not one per node
            assert during.get("Heartbeat", 0) == 0, during
            assert 1 <= during.get("HeartbeatHost", 0) <= window / (LEASE / 3) + 2, during
            # nothing changed: the directory was neither polled nor re-read
            assert during.get("GetDirectory", 0) == 0 and during.get("WatchDirectory", 0) <= 2, (
                during
            )
            async with grpc.aio.secure_channel(
                addr,
                pki.channel_credentials((tmp_path / "b" / "ca.pem").read_bytes()),
                options=[("grpc.ssl_target_name_override", pki.BOOTSTRAP_DNS)],
            ) as ch:
                stub = bpb_grpc.BootstrapStub(ch)
                d = await stub.GetDirectory(bpb.DirectoryRequest(), timeout=5)
                assert {m.node_id: m.alive for m in d.members} == {i: True for i in ids}
                epoch = d.epoch

                # a join reaches every hosted node through the process's long poll, as the changed member only
                late = NodeHost(_configs(tmp_path, addr, ["n16"]))
                t0 = time.monotonic()
                await late.start()
                try:
                    latency = await _until(
                        lambda: all("n16" in x.members for x in nodes), 10, "the join to arrive"
                    )
                    assert latency < 2.0, latency
                    assert time.monotonic() - t0 < 10
                    diff = await stub.WatchDirectory(
                        bpb.DirectoryWatch(since_epoch=epoch), timeout=5
                    )
                    assert not diff.snapshot and [m.node_id for m in diff.changed] == ["n16"]
                    full = await stub.WatchDirectory(bpb.DirectoryWatch(since_epoch=0), timeout=5)
                    assert full.snapshot and len(full.directory.members) == 17
                    # an unchanged version is held (long poll), then answered empty
                    t1 = time.monotonic()
                    idle = await stub.WatchDirectory(
                        bpb.DirectoryWatch(since_epoch=diff.epoch, wait_seconds=0.6), timeout=5
                    )
                    assert time.monotonic() - t1 >= 0.5 and not idle.snapshot and not idle.changed
                    # a node whose heartbeat task stops (alone) expires; the others stay alive
                    silent = nodes[3]
                    for t in silent._tasks:
                        if t.get_name() == "heartbeat":
                            t.cancel()

                    async def alive() -> dict:
                        return {
                            m.node_id: m.alive
                            for m in (
                                await stub.GetDirectory(bpb.DirectoryRequest(), timeout=5)
                            ).members
                        }

                    for _ in range(100):
                        state = await alive()
                        if not state[silent.node_id]:
                            break
                        await asyncio.sleep(0.2)
                    assert [k for k, v in state.items() if not v] == [silent.node_id], state
                finally:
                    await late.stop()
        finally:
            await host.stop()
            stop.set()
            await btask

    uvloop.run(go())


def test_host_heartbeat_refuses_forgeries(tmp_path: pathlib.Path) -> None:
    """Bad host signature, malformed key: refused; an undelegated or forged-delegation node is not renewed."""

    async def go():
        addr, stop, btask = await _bootstrap(tmp_path, "ring:4")
        host = NodeHost(_configs(tmp_path, addr, ["n0", "n1"]))
        await host.start()
        try:
            n0, n1 = host.running
            async with grpc.aio.secure_channel(
                addr,
                pki.channel_credentials((tmp_path / "b" / "ca.pem").read_bytes()),
                options=[("grpc.ssl_target_name_override", pki.BOOTSTRAP_DNS)],
            ) as ch:
                stub = bpb_grpc.BootstrapStub(ch)
                key = pki.generate_key()
                der = pki.public_key_der(key)
                sha = hashlib.sha256(der).hexdigest()

                def req(ids, delegations=(), *, signer=key, ms=None, der_=der):
                    ms = int(time.time() * 1000) if ms is None else ms
                    return bpb.HostHeartbeat(
                        host_public_key=der_,
                        unix_ms=ms,
                        node_ids=ids,
                        delegations=list(delegations),
                        signature=pki.sign(signer, pki.host_lease_message(ids, sha, ms)),
                    )

                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.HeartbeatHost(req(["n0"], signer=pki.generate_key()), timeout=5)
                assert (
                    err.value.code() == grpc.StatusCode.UNAUTHENTICATED
                    and "bad host signature" in err.value.details()
                )
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.HeartbeatHost(req(["n0"], der_=b"not a key"), timeout=5)
                assert (
                    err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                    and "malformed public key" in err.value.details()
                )
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.HeartbeatHost(req(["n0"], ms=1), timeout=5)
                assert (
                    err.value.code() == grpc.StatusCode.UNAUTHENTICATED
                    and "clock skew" in err.value.details()
                )
                # n0 never delegated to this key; n1's "delegation" is signed by n0's key; nobody is "ghost"
                forged = n0._signed(f"Delegate:{sha}")
                forged.node_id = "n1"
                reply = await stub.HeartbeatHost(req(["ghost", "n0", "n1"], [forged]), timeout=5)
                assert list(reply.unknown) == ["ghost"] and sorted(reply.undelegated) == [
                    "n0",
                    "n1",
                ]
                assert reply.renewed == 0
                # a real delegation (n0's own signature over this key) is accepted once, then renews alone
                reply = await stub.HeartbeatHost(
                    req(["n0"], [n0._signed(f"Delegate:{sha}")]), timeout=5
                )
                assert reply.renewed == 1 and not reply.undelegated
                reply = await stub.HeartbeatHost(req(["n0", "n1"]), timeout=5)
                assert reply.renewed == 1 and list(reply.undelegated) == ["n1"]
        finally:
            await host.stop()
            stop.set()
            await btask

    uvloop.run(go())
