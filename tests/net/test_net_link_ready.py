"""A new link is confirmed by its channel reaching READY, not by a Health RPC (issue 12: 2048 nodes
healthy in ≤ 60 s; the first RPC was ~0.9 ms of CPU a directed link, both ends).

That is only the same "connected over mutual TLS" if READY means the neighbour accepted our certificate:
gRPC's client reports READY once the server's HTTP/2 SETTINGS arrived, which its server sends only after
its TLS handshake verified the client certificate.  These tests hold gRPC to that (a gRPC that said READY
earlier would fail the first one) and check that later probes still use the RPC.  Real TLS on loopback.
"""

from __future__ import annotations

import pathlib

import grpc
import pytest
import uvloop
from test_net_inprocess import _network, _shutdown  # noqa: E402

from hushnet.net import pki
from hushnet.net.config import PEER_SERVICE
from hushnet.v1 import bootstrap_pb2 as bpb
from hushnet.v1 import peer_pb2 as ppb

pytestmark = pytest.mark.timeout(120)


async def _impostor_server(identity, client_ca_pem: bytes, calls: list):
    """A server holding the neighbour's own key and certificate, trusting ``client_ca_pem`` for clients;
    it counts the Health RPCs it answers."""

    async def health(request, context):
        calls.append(1)
        return ppb.HealthReply(ok=True, node_id="n1")

    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                PEER_SERVICE,
                {
                    "Health": grpc.unary_unary_rpc_method_handler(
                        health,
                        request_deserializer=ppb.HealthRequest.FromString,
                        response_serializer=ppb.HealthReply.SerializeToString,
                    )
                },
            ),
        )
    )
    port = server.add_secure_port(
        "127.0.0.1:0", pki.server_credentials(identity.key_pem, identity.cert_pem, client_ca_pem)
    )
    await server.start()
    return server, port


def test_a_link_is_healthy_once_ready_and_never_while_the_neighbour_refuses_us(
    tmp_path: pathlib.Path,
) -> None:
    async def go():
        nodes, stop, task = await _network(tmp_path, "complete:2", 2)
        n0, n1 = nodes
        servers = []
        try:
            assert n0.links["n1"].healthy  # started: confirmed when its channel went READY
            assert n0._load.counts["probe_ready"] >= 1
            n0.config.probe_s = 1.0  # a probe waits at most 1 s
            _, other_ca = pki.create_ca()
            for trusted, expect in ((pki.cert_to_pem(other_ca), False), (n1.identity.ca_pem, True)):
                calls: list = []
                server, port = await _impostor_server(n1.identity, trusted, calls)
                servers.append(server)
                member = bpb.Member()
                member.CopyFrom(n0.members["n1"])
                member.address = f"127.0.0.1:{port}"
                link = n0._open_link(member)
                try:
                    await n0._probe(link)
                    # refused: the TLS handshake failed, the channel never went READY; accepted: READY,
                    # and no RPC was needed for it
                    assert link.healthy is expect and (link.state() == "READY") is expect
                    assert calls == []
                    if expect:
                        await n0._probe(
                            link
                        )  # a later probe of a lone node is a Health RPC, as before
                        assert link.healthy and calls == [1]
                finally:
                    await link.channel.close()
        finally:
            for server in servers:
                await server.stop(None)
            await _shutdown(nodes, stop, task)

    uvloop.run(go())
