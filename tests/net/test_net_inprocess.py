"""In-process network (bootstrap + nodes in one event loop, real TLS on 127.0.0.x): handler API,
duplicates, size limits, directory-driven neighbours."""

from __future__ import annotations

import asyncio
import json
import pathlib

import grpc
import pytest
import uvloop

from hushnet.bootstrap.service import BootstrapConfig
from hushnet.bootstrap.service import serve as serve_bootstrap
from hushnet.net import pki
from hushnet.net.handlers import OutgoingEnvelope
from hushnet.net.node import DeliveryError, Node, NodeConfig, NotANeighbour, PayloadTooLarge
from hushnet.v1 import envelope_pb2 as epb

MiB = 1024 * 1024


class Echo:
    """Replies to every envelope with the reversed payload (exercises handler → outgoing envelopes)."""

    protocol = "test.echo"

    def __init__(self) -> None:
        self.seen: list[epb.Envelope] = []

    def handle(self, envelope: epb.Envelope) -> list[OutgoingEnvelope]:
        self.seen.append(envelope)
        if envelope.payload.startswith(b"reply:"):
            return []
        return [
            OutgoingEnvelope(
                to=envelope.sender,
                payload=b"reply:" + envelope.payload[::-1],
                run_id=envelope.run_id,
            )
        ]


class AsyncCollector:
    protocol = "test.echo"

    def __init__(self) -> None:
        self.got: asyncio.Queue = asyncio.Queue()

    async def handle(self, envelope: epb.Envelope) -> None:
        await self.got.put(envelope)


async def _network(
    tmp: pathlib.Path, spec: str, n: int, max_message_bytes: int = 128 * MiB, lease: float = 15.0
):
    stop = asyncio.Event()
    ready = asyncio.Event()
    task = asyncio.create_task(
        serve_bootstrap(
            BootstrapConfig(tmp / "b", "127.0.0.1:0", spec, "tok", lease_seconds=lease), stop, ready
        )
    )
    await asyncio.wait(
        [task, asyncio.create_task(ready.wait())], return_when=asyncio.FIRST_COMPLETED
    )
    if task.done():
        task.result()
    addr = json.loads((tmp / "b" / "bootstrap.json").read_text())["address"]
    nodes = [
        Node(
            NodeConfig(
                tmp / f"n{i}",
                f"127.0.0.{20 + i}:0",
                addr,
                "tok",
                tmp / "b" / "ca.pem",
                node_id=f"n{i}",
                probe_s=0.3,
                directory_refresh_s=0.3,
                max_message_bytes=max_message_bytes,
            )
        )
        for i in range(n)
    ]
    await asyncio.gather(*(node.start() for node in nodes))
    # wait until every node sees all its graph neighbours healthy
    for _ in range(200):
        if all(
            len(node.members) == n
            and len(node.neighbors) == len(node.links)
            and node.links
            and all(l.healthy for l in node.links.values())
            for node in nodes
        ):
            break
        await asyncio.sleep(0.1)
    return nodes, stop, task


async def _shutdown(nodes, stop, task) -> None:
    for node in nodes:
        await node.stop()
    stop.set()
    await task


@pytest.mark.timeout(120)
def test_handler_api_replies_duplicates_and_runtime_registration(tmp_path: pathlib.Path) -> None:
    async def go():
        nodes, stop, task = await _network(tmp_path, "ring:3", 3)
        try:
            a, b, c = nodes
            assert set(a.neighbors) == {"n1", "n2"}
            echo_b = Echo()
            b.register_handler(echo_b)
            collector = AsyncCollector()
            a.register_handler(collector)
            ack = await a.send("n1", b"hello", protocol="test.echo", run_id="r1")
            assert ack.accepted and not ack.duplicate and ack.produced == 1
            reply = await asyncio.wait_for(collector.got.get(), 20)
            assert reply.payload == b"reply:olleh" and reply.sender == "n1" and reply.run_id == "r1"
            # the same (sender, protocol, run, seq) again is acknowledged but not delivered twice
            ack2 = await a.send(
                "n1", b"hello", protocol="test.echo", run_id="r1", seq=ack_seq(echo_b)
            )
            assert ack2.duplicate and len(echo_b.seen) == 1
            # unregister at runtime -> unknown protocol, with a clear error; node keeps serving
            b.unregister_handler("test.echo")
            with pytest.raises(DeliveryError) as info:
                await a.send("n1", b"x", protocol="test.echo", run_id="r2")
            assert info.value.code == grpc.StatusCode.UNIMPLEMENTED
            assert (await a.send("n1", b"x", protocol="net.ping", run_id="r2")).accepted
            # only neighbours can be addressed
            with pytest.raises(NotANeighbour):
                await a.send("n9", b"x", protocol="net.ping")
            # sequence numbers carry the incarnation (never reused after a restart)
            assert a.next_seq("p", "r") >> 32 == a.incarnation >= 1
            st = b.status()
            assert st.node_id == "n1" and set(st.neighbors) == {"n0", "n2"} and st.delivered >= 2
            assert st.rejected >= 1 and "net.ping" in st.protocols
        finally:
            await _shutdown(nodes, stop, task)

    def ack_seq(echo: Echo) -> int:
        return echo.seen[0].seq

    uvloop.run(go())


@pytest.mark.timeout(120)
def test_oversized_payload_is_refused_on_both_sides(tmp_path: pathlib.Path, caplog) -> None:
    limit = 1 * MiB

    async def go():
        nodes, stop, task = await _network(tmp_path, "complete:2", 2, max_message_bytes=limit)
        try:
            a, b = nodes
            # the sender refuses before sending
            with pytest.raises(PayloadTooLarge):
                await a.send("n1", bytes(limit + 1), protocol="net.ping")
            # a payload at the limit goes through
            assert (
                await a.send("n1", bytes(limit), protocol="net.ping", run_id="at-limit")
            ).accepted
            # a misbehaving sender that skips the check: the receiver refuses with RESOURCE_EXHAUSTED
            a.config.max_message_bytes = 2 * limit
            with pytest.raises(DeliveryError) as info:
                await a.send("n1", bytes(limit + 1000), protocol="net.ping", run_id="over")
            assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "exceeds the limit" in info.value.details
            assert b.rejected >= 1
            assert (
                await a.send("n1", b"still serving", protocol="net.ping", run_id="after")
            ).accepted
        finally:
            await _shutdown(nodes, stop, task)

    with caplog.at_level("WARNING"):
        uvloop.run(go())
    assert any(
        "exceeds the limit" in r.getMessage() and getattr(r, "node", "") == "n1"
        for r in caplog.records
    )


@pytest.mark.timeout(60)
def test_pki_identities_and_grpc_accepts_p256_not_ed25519(tmp_path: pathlib.Path) -> None:
    """ECDSA P-256 certificates work for mutual TLS in grpc; Ed25519 ones do not (hence P-256)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    ca_key, ca = pki.create_ca()
    ca_pem = pki.cert_to_pem(ca)

    def leaf(name: str, key=None):
        key = key or pki.generate_key()
        cert = pki.issue_cert(
            ca_key, ca, key.public_key(), kind="node", name=name, dns_names=[pki.node_dns(name)]
        )
        return cert

    s_key = pki.generate_key()
    s_cert = leaf("n0", s_key)
    assert pki.identity_of(s_cert) == pki.PeerIdentity("node", "n0")
    op_cert = pki.issue_cert(
        ca_key, ca, pki.generate_key().public_key(), kind="operator", name="admin"
    )
    assert pki.identity_of(op_cert).is_operator
    assert (
        not pki.valid_node_id("N0") and not pki.valid_node_id("a/b") and pki.valid_node_id("n-12")
    )

    async def go():
        seen = {}

        async def echo(req, ctx):
            seen["id"] = pki.peer_identity(ctx)
            return req

        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "t.T", {"E": grpc.unary_unary_rpc_method_handler(echo)}
                ),
            )
        )
        port = server.add_secure_port(
            "127.0.0.1:0",
            pki.server_credentials(pki.key_to_pem(s_key), pki.cert_to_pem(s_cert), ca_pem),
        )
        await server.start()
        opts = [("grpc.ssl_target_name_override", pki.node_dns("n0"))]
        try:
            c_key = pki.generate_key()
            creds = pki.channel_credentials(
                ca_pem, pki.key_to_pem(c_key), pki.cert_to_pem(leaf("n1", c_key))
            )
            async with grpc.aio.secure_channel(f"127.0.0.1:{port}", creds, options=opts) as ch:
                assert await ch.unary_unary("/t.T/E")(b"ok", timeout=10) == b"ok"
            assert seen["id"] == pki.PeerIdentity("node", "n1")
            e_key = ed25519.Ed25519PrivateKey.generate()
            e_cert = pki.issue_cert(
                ca_key,
                ca,
                e_key.public_key(),
                kind="node",
                name="n2",
                dns_names=[pki.node_dns("n2")],
            )
            e_pem = e_key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
            creds = pki.channel_credentials(ca_pem, e_pem, pki.cert_to_pem(e_cert))
            async with grpc.aio.secure_channel(f"127.0.0.1:{port}", creds, options=opts) as ch:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await ch.unary_unary("/t.T/E")(b"x", timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            # a server certificate for another node id fails the client's name check
            async with grpc.aio.secure_channel(
                f"127.0.0.1:{port}",
                pki.channel_credentials(
                    ca_pem, pki.key_to_pem(c_key), pki.cert_to_pem(leaf("n1", c_key))
                ),
                options=[("grpc.ssl_target_name_override", pki.node_dns("n5"))],
            ) as ch:
                with pytest.raises(grpc.aio.AioRpcError):
                    await ch.unary_unary("/t.T/E")(b"x", timeout=5)
        finally:
            await server.stop(None)

    uvloop.run(go())


@pytest.mark.timeout(120)
def test_membership_leave_and_lease_expiry(tmp_path: pathlib.Path) -> None:
    """Leave marks a member not alive at once; a silent member expires with its lease."""
    from hushnet.net.operator import Operator, OperatorCredentials

    async def alive() -> dict[str, bool]:
        async with Operator(OperatorCredentials.from_state_dir(tmp_path / "b")) as op:
            return {m.node_id: m.alive for m in (await op.directory()).members}

    async def go():
        nodes, stop, task = await _network(tmp_path, "ring:3", 3, lease=4.0)
        try:
            assert await alive() == {"n0": True, "n1": True, "n2": True}
            await nodes[0].stop(leave=True)
            assert (await alive())["n0"] is False
            nodes[
                1
            ].config.heartbeat_s = 3600.0  # effective after its current sleep; then it falls silent
            for task_ in nodes[1]._tasks:
                if task_.get_name() == "heartbeat":
                    task_.cancel()
            for _ in range(150):
                state = await alive()
                if state["n1"] is False:
                    break
                await asyncio.sleep(0.2)
            assert state == {"n0": False, "n1": False, "n2": True}
            # the member entries (identity, keys) remain: a restart re-joins with the same id
            node = Node(
                NodeConfig(
                    tmp_path / "n0",
                    "127.0.0.20:0",
                    nodes[2].config.bootstrap,
                    ca_file=tmp_path / "b" / "ca.pem",
                )
            )  # no token, no id: all from state
            await node.start()
            try:
                assert node.node_id == "n0" and node.identity.vertex == 0
                assert (await alive())["n0"] is True
            finally:
                await node.stop()
        finally:
            await _shutdown(nodes[1:], stop, task)

    uvloop.run(go())


@pytest.mark.timeout(120)
def test_send_says_once_when_the_delivery_is_under_way(tmp_path: pathlib.Path) -> None:
    """``Node.send(started=…)`` is called once, when the gRPC call exists and before its answer: what
    it schedules on the loop runs after the call's own start (a run driver holds zero-delay timers for
    it: ``hushnet.runs.driver._Soon``)."""

    async def go():
        nodes, stop, task = await _network(tmp_path, "ring:3", 3)
        try:
            a = nodes[0]
            log: list[str] = []
            loop = asyncio.get_running_loop()

            def started() -> None:
                log.append("started")
                loop.call_soon(log.append, "scheduled by started")

            ack = await a.send("n1", b"x" * 80_000, protocol="net.ping", started=started)
            log.append("answered")
            assert ack.accepted
            assert log == ["started", "scheduled by started", "answered"]
            # no callable: as before
            assert (await a.send("n1", b"y", protocol="net.ping")).accepted
        finally:
            await _shutdown(nodes, stop, task)

    uvloop.run(go())
