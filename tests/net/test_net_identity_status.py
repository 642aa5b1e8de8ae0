"""Identity pinning and what "healthy" means (issue 14, points 8 and 9c); bootstrap and nodes in one
event loop, real mutual TLS on 127.0.0.x.

Point 8: the network CA may have issued more than one certificate naming node X (a re-key, a
leaked CA key, an old enrolment).  A node accepts X only with the key in X's membership entry
(``Node._check_member``): a second certificate for an existing id with a new key is refused
``PERMISSION_DENIED`` on ``Deliver`` and on the status/control calls, while X's real certificate
works on the same calls.

Point 9c: ``hushnet status`` must not call a network healthy while a node serves but is not yet
connected to all its neighbours (a ``run start`` then is refused for missing links): the status
shows ``serving`` and ``wired`` separately, and ``healthy`` is both.
"""

from __future__ import annotations

import asyncio
import pathlib

import grpc
import pytest
import uvloop
from helpers.net import inprocess_bootstrap

from hushnet.bootstrap.authority import load_or_create
from hushnet.net import pki
from hushnet.net.node import Node, NodeConfig
from hushnet.net.operator import Operator, OperatorCredentials, format_table
from hushnet.net.wire import encode_envelope
from hushnet.v1 import peer_pb2 as ppb
from hushnet.v1 import peer_pb2_grpc as ppb_grpc

pytestmark = pytest.mark.timeout(120)


async def _bootstrap(tmp: pathlib.Path, topology: str):
    return await inprocess_bootstrap(tmp, topology)


def _node(tmp: pathlib.Path, i: int, bootstrap: str, **kw) -> Node:
    cfg = dict(probe_s=0.3, directory_refresh_s=0.3)
    cfg.update(kw)
    return Node(
        NodeConfig(
            tmp / f"n{i}",
            f"127.0.0.{80 + i}:0",
            bootstrap,
            "tok",
            tmp / "b" / "ca.pem",
            node_id=f"n{i}",
            **cfg,
        )
    )


async def _wired(nodes: list[Node], n: int) -> None:
    for _ in range(200):
        if all(
            len(nd.members) == n and nd.links and all(lk.healthy for lk in nd.links.values())
            for nd in nodes
        ):
            return
        await asyncio.sleep(0.1)
    raise AssertionError("network not wired")


def _channel(
    address: str, target: str, ca: bytes, key_pem: bytes, cert_pem: bytes
) -> grpc.aio.Channel:
    return grpc.aio.secure_channel(
        address,
        pki.channel_credentials(ca, key_pem, cert_pem),
        options=[
            ("grpc.ssl_target_name_override", pki.node_dns(target)),
            ("grpc.use_local_subchannel_pool", 1),
        ],
    )


async def _calls(ch: grpc.aio.Channel, sender: str, recipient: str, seq: int) -> dict[str, object]:
    """Deliver (a well-formed ping envelope), Status and Control on ``ch``: the reply or the status code."""
    out: dict[str, object] = {}
    deliver = ch.unary_unary(
        "/hushnet.v1.Peer/Deliver", request_serializer=None, response_deserializer=None
    )
    stub = ppb_grpc.PeerStub(ch)
    calls = {
        "deliver": lambda: deliver(
            encode_envelope("net.ping", "impostor", seq, b"hello", sender, recipient), timeout=10
        ),
        "status": lambda: stub.Status(ppb.StatusRequest(), timeout=10),
        "control": lambda: stub.Control(ppb.ControlRequest(command="inbox"), timeout=10),
    }
    for name, call in calls.items():
        try:
            out[name] = await call()
        except grpc.aio.AioRpcError as exc:
            out[name] = (exc.code(), exc.details())
    return out


def test_second_certificate_for_an_existing_node_id_is_refused(tmp_path: pathlib.Path) -> None:
    async def go():
        addr, stop, task = await _bootstrap(tmp_path, "ring:3")
        nodes = [_node(tmp_path, i, addr) for i in range(3)]
        await asyncio.gather(*(nd.start() for nd in nodes))
        try:
            await _wired(nodes, 3)
            n0 = nodes[0]
            auth = load_or_create(tmp_path / "b")
            ca = auth.ca_pem
            # the genuine n1: its own key and certificate (from its state directory) are accepted
            real = _channel(
                n0.address,
                "n0",
                ca,
                (tmp_path / "n1" / "node.key").read_bytes(),
                (tmp_path / "n1" / "node.pem").read_bytes(),
            )
            got = await _calls(real, "n1", "n0", seq=1)
            assert not isinstance(got["deliver"], tuple), got["deliver"]
            assert not isinstance(got["status"], tuple), got["status"]
            await real.close()
            # a second certificate the same CA issued for n1, with a new key
            key = pki.generate_key()
            cert = auth.issue_node_cert(key.public_key(), "n1", "127.0.0.81")
            fake = _channel(n0.address, "n0", ca, pki.key_to_pem(key), pki.cert_to_pem(cert))
            got = await _calls(fake, "n1", "n0", seq=2)
            await fake.close()
            for name in ("deliver", "status", "control"):
                assert (
                    isinstance(got[name], tuple)
                    and got[name][0] == grpc.StatusCode.PERMISSION_DENIED
                ), (name, got)
            assert "does not match its membership entry" in got["deliver"][1]
            assert "does not match its membership entry" in got["status"][1]
            assert (
                len(n0.store.inbox("net.ping", "impostor")) == 1
            )  # only the genuine n1's envelope
            # a certificate for an id the directory does not hold
            key9 = pki.generate_key()
            c9 = _channel(
                n0.address,
                "n0",
                ca,
                pki.key_to_pem(key9),
                pki.cert_to_pem(auth.issue_node_cert(key9.public_key(), "n9", "127.0.0.89")),
            )
            got = await _calls(c9, "n9", "n0", seq=3)
            await c9.close()
            assert (
                got["deliver"][0] == grpc.StatusCode.PERMISSION_DENIED
                and "not in the membership" in got["deliver"][1]
            )
            assert got["status"][0] == grpc.StatusCode.PERMISSION_DENIED
        finally:
            for nd in nodes:
                await nd.stop()
            stop.set()
            await task

    uvloop.run(go())


def test_status_is_not_healthy_until_every_node_is_wired(tmp_path: pathlib.Path) -> None:
    """A node that serves but has a neighbour it cannot reach is not healthy; wired again, it is.

    The unwired state is made by a neighbour that crashed (stopped without ``Leave``, so it stays in the
    directory): n0 and n1 still serve but cannot reach n2.  (An earlier version made n0 unwired by giving
    it a long directory-refresh period; that raced with n0's re-read on its neighbours' first call.)
    """

    async def go():
        addr, stop, task = await _bootstrap(tmp_path, "ring:3")
        nodes = [_node(tmp_path, i, addr) for i in range(3)]
        await asyncio.gather(*(nd.start() for nd in nodes))
        try:
            await _wired(nodes, 3)
            await nodes[2].stop(
                grace=0.0, leave=False
            )  # crashed: still a member, no longer answering
            async with Operator(OperatorCredentials.from_state_dir(tmp_path / "b")) as op:
                for _ in range(200):  # until n0's and n1's probes have seen the lost link
                    doc = await op.network_status()
                    by = {n["id"]: n for n in doc["nodes"]}
                    if not by["n0"]["wired"] and not by["n1"]["wired"]:
                        break
                    await asyncio.sleep(0.1)
                assert doc["healthy"] is False, (
                    "serving but not connected to its neighbours is not healthy"
                )
                for nid in ("n0", "n1"):
                    assert by[nid]["serving"] is True and by[nid]["wired"] is False, by[nid]
                assert by["n2"]["serving"] is False
                assert doc["serving"] is False and doc["wired"] is False
                table = format_table(doc)
                assert "WIRED" in table and "healthy: NO" in table
                nodes[2] = _node(tmp_path, 2, addr)  # restarted on its state directory
                await nodes[2].start()
                await _wired(nodes, 3)
                for _ in range(200):  # the operator's view follows the nodes' probes
                    doc = await op.network_status()
                    if doc["healthy"]:
                        break
                    await asyncio.sleep(0.1)
                assert doc["healthy"] is True and doc["serving"] is True and doc["wired"] is True
                assert all(n["serving"] and n["wired"] for n in doc["nodes"])
        finally:
            for nd in nodes:
                await nd.stop()
            stop.set()
            await task

    uvloop.run(go())


def test_a_callers_certificate_is_parsed_once_per_process(monkeypatch) -> None:
    """What a caller's certificate says (its node name, its key's fingerprint) is parsed once for all the
    nodes of a process: each node parsed each neighbour's certificate itself, and every node the
    operator's (2 048 parses of one certificate when a 2048-node start-up was checked)."""
    from hushnet.net import admission

    ca_key, ca_cert = pki.create_ca()
    key = pki.generate_key()
    pem = pki.cert_to_pem(pki.issue_cert(ca_key, ca_cert, key.public_key(), kind="node", name="n7"))
    parsed = []
    real = pki.load_cert
    monkeypatch.setattr(pki, "load_cert", lambda b: parsed.append(b) or real(b))
    monkeypatch.setattr(admission, "_CALLERS", {})

    class Context:
        def auth_context(self):
            return {"x509_pem_cert": [pem]}

    nodes = [admission.AdmissionMixin() for _ in range(3)]
    answers = {n._caller(Context()) for n in nodes for _ in range(2)}
    assert len(parsed) == 1
    ((who, key_sha),) = answers
    assert who.name == "n7" and who.is_node and key_sha == pki.key_sha256(key.public_key())
