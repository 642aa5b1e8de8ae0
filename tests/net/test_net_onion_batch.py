"""Onion keys published per host process (issue 12: 2048 hosted nodes healthy in ≤ 60 s).

Every node published its onion keys with its own ``PublishOnionKeys`` right after joining: at n = 2048,
2 048 calls and as many directory changes on the bootstrap.  The nodes of a process now share the call
(``PublishOnionKeysHost``); each publication keeps its node's own signature, checked alone, and a bad one
is refused alone.  Real TLS on loopback: a bootstrap and a node host in one event loop.
"""

from __future__ import annotations

import asyncio
import collections
import pathlib
import time

import grpc
import pytest
import uvloop
from helpers.net import inprocess_bootstrap

from hushnet.bootstrap.service import MAX_ONION_BATCH, BootstrapService
from hushnet.net import pki
from hushnet.net.host import NodeHost, hosted_configs
from hushnet.net.onion_keys import epoch_at, keys_digest
from hushnet.net.shared import OnionKeysRefused
from hushnet.v1 import bootstrap_pb2 as bpb
from hushnet.v1 import bootstrap_pb2_grpc as bpb_grpc

pytestmark = pytest.mark.timeout(120)
PERIOD = 3600.0


@pytest.fixture
def calls(monkeypatch) -> collections.Counter:
    """Count the bootstrap's onion-key RPCs as they arrive (the real service answers every one)."""
    seen: collections.Counter = collections.Counter()
    for name in ("PublishOnionKeys", "PublishOnionKeysHost"):
        real = getattr(BootstrapService, name)

        async def counted(self, request, context, _real=real, _name=name):
            seen[_name] += 1
            return await _real(self, request, context)

        monkeypatch.setattr(BootstrapService, name, counted)
    return seen


def _host(tmp: pathlib.Path, addr: str, ids: list[str]) -> NodeHost:
    return NodeHost(
        hosted_configs(
            [tmp / i for i in ids],
            "127.0.0.1:0",
            ids,
            bootstrap=addr,
            token="tok",
            ca_file=tmp / "b" / "ca.pem",
        )
    )


def _request(signer, node_id: str, keys: list[tuple[int, bytes]]) -> bpb.OnionKeysRequest:
    """A publication as a node signs it (``LeaseMixin.maintain_onion_keys``), signed by ``signer``."""
    ms = int(time.time() * 1000)
    method = f"PublishOnionKeys:{keys_digest(keys)}"
    return bpb.OnionKeysRequest(
        auth=bpb.SignedRequest(
            node_id=node_id,
            unix_ms=ms,
            signature=pki.sign(signer, pki.signed_message(method, node_id, ms)),
        ),
        keys=[bpb.OnionKey(epoch=e, public_key=pk) for e, pk in keys],
    )


async def _published(nodes) -> bool:
    for node in nodes:
        mine = node.members.get(node.node_id)
        if mine is None or not mine.onion_keys:
            return False
    return True


def test_a_host_publishes_its_nodes_onion_keys_in_shared_calls(tmp_path, calls) -> None:
    async def go():
        addr, stop, btask = await inprocess_bootstrap(
            tmp_path, "hypercube:3", onion_epoch_seconds=PERIOD
        )
        host = _host(tmp_path, addr, [f"n{i}" for i in range(8)])
        await host.start()
        try:
            nodes = host.running
            assert len(nodes) == 8
            for _ in range(200):
                if await _published(nodes):
                    break
                await asyncio.sleep(0.05)
            # every node's own keys are in the directory; no node made a call of its own
            for node in nodes:
                listed = sorted(
                    (int(k.epoch), bytes(k.public_key))
                    for k in node.members[node.node_id].onion_keys
                )
                assert listed == node.onion_keys.published(), node.node_id
            assert calls["PublishOnionKeys"] == 0 and 1 <= calls["PublishOnionKeysHost"] <= 8
            assert nodes[0]._boot.onion.calls == calls["PublishOnionKeysHost"]
        finally:
            await host.stop()
            stop.set()
            await btask

    uvloop.run(go())


def test_a_bad_publication_is_refused_alone(tmp_path, calls) -> None:
    async def go():
        addr, stop, btask = await inprocess_bootstrap(
            tmp_path, "ring:4", onion_epoch_seconds=PERIOD
        )
        host = _host(tmp_path, addr, ["n0", "n1", "n2", "n3"])
        await host.start()
        try:
            n0, n1, n2, n3 = host.running
            before = calls["PublishOnionKeysHost"]
            cur = epoch_at(time.time(), PERIOD)
            fresh = {n.node_id: bytes([i + 1]) * 32 for i, n in enumerate((n0, n1, n2, n3))}
            requests = [
                _request(n0.identity.key, "n0", [(cur, fresh["n0"])]),
                _request(n0.identity.key, "n1", [(cur, fresh["n1"])]),  # n1's, signed by n0's key
                _request(n2.identity.key, "n2", [(cur + 5, fresh["n2"])]),  # outside the window
                _request(n3.identity.key, "n3", [(cur, fresh["n3"])]),
            ]
            onion = n0._boot.onion
            # queued together: one call carries all four
            results = await asyncio.gather(
                *(onion.publish(r) for r in requests), return_exceptions=True
            )
            assert calls["PublishOnionKeysHost"] == before + 1
            assert results[0] is None and results[3] is None
            assert isinstance(results[1], OnionKeysRefused) and results[1].code == "UNAUTHENTICATED"
            assert "bad signature" in results[1].reason
            assert (
                isinstance(results[2], OnionKeysRefused) and results[2].code == "INVALID_ARGUMENT"
            )
            assert "outside the published window" in results[2].reason
            async with grpc.aio.secure_channel(
                addr,
                pki.channel_credentials((tmp_path / "b" / "ca.pem").read_bytes()),
                options=[("grpc.ssl_target_name_override", pki.BOOTSTRAP_DNS)],
            ) as ch:
                stub = bpb_grpc.BootstrapStub(ch)
                d = await stub.GetDirectory(bpb.DirectoryRequest(), timeout=5)
                keys = {
                    m.node_id: {int(k.epoch): bytes(k.public_key) for k in m.onion_keys}
                    for m in d.members
                }
                assert keys["n0"][cur] == fresh["n0"] and keys["n3"][cur] == fresh["n3"]
                assert keys["n1"][cur] != fresh["n1"] and cur + 5 not in keys["n2"]
                # the same member twice in one batch: the second is refused; too many: the call is refused
                twice = await stub.PublishOnionKeysHost(
                    bpb.OnionKeysBatch(requests=[requests[3], requests[3]]), timeout=5
                )
                assert list(twice.published) == ["n3"] and [r.node_id for r in twice.refused] == [
                    "n3"
                ]
                assert "appears twice" in twice.refused[0].reason
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.PublishOnionKeysHost(
                        bpb.OnionKeysBatch(requests=[requests[0]] * (MAX_ONION_BATCH + 1)),
                        timeout=5,
                    )
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert f"at most {MAX_ONION_BATCH}" in err.value.details()
        finally:
            await host.stop()
            stop.set()
            await btask

    uvloop.run(go())


def test_nodes_publish_one_by_one_to_a_bootstrap_without_the_batched_call(
    tmp_path, calls, monkeypatch
) -> None:
    async def go():
        # an older bootstrap: the servicer's generated default answers UNIMPLEMENTED
        monkeypatch.delattr(BootstrapService, "PublishOnionKeysHost")
        addr, stop, btask = await inprocess_bootstrap(
            tmp_path, "ring:4", onion_epoch_seconds=PERIOD
        )
        host = _host(tmp_path, addr, ["n0", "n1", "n2", "n3"])
        await host.start()
        try:
            nodes = host.running
            for _ in range(200):
                if await _published(nodes):
                    break
                await asyncio.sleep(0.05)
            assert await _published(nodes)
            assert calls["PublishOnionKeys"] >= 4 and not nodes[0]._boot.onion.batched
        finally:
            await host.stop()
            stop.set()
            await btask

    uvloop.run(go())
