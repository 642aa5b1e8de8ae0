"""Integration tests on a real 8-node network started with ``hushnet up`` (real processes, real TLS).

One network (hypercube:3 on 127.0.0.2-9) is shared by the tests of this module; tests that
restart processes run last. The fixture always stops everything.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import pathlib
import signal

import grpc
import pytest
import uvloop
from helpers.net import (
    UpProcess,
    cli,
    log_text,
    node_creds,
    pid_alive,
    raw_deliver,
    secure_channel,
    wait_for,
)

from hushnet.net import pki
from hushnet.v1 import bootstrap_pb2 as bpb
from hushnet.v1 import bootstrap_pb2_grpc as bpb_grpc
from hushnet.v1 import envelope_pb2 as epb
from hushnet.v1 import peer_pb2 as ppb
from hushnet.v1 import peer_pb2_grpc as ppb_grpc

pytestmark = [pytest.mark.integration]

N = 8
TOPOLOGY = "hypercube:3"
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def net(tmp_path_factory) -> UpProcess:
    state = tmp_path_factory.mktemp("net") / "cluster"
    up = UpProcess(state, N, TOPOLOGY)
    try:
        up.wait_up(timeout=180)
        yield up
    finally:
        up.close()


def status_json(net: UpProcess) -> dict:
    proc = cli("status", "--state-dir", str(net.state_dir), "--json", timeout=60)
    assert proc.returncode in (0, 3), proc.stderr
    return json.loads(proc.stdout)


def all_connected(doc: dict) -> bool:
    return len(doc["nodes"]) == N and all(
        n["healthy"] and n["all_neighbors_connected"] for n in doc["nodes"]
    )


def operator_control(net: UpProcess, node: str, command: str, args: dict, timeout: float = 120.0):
    from hushnet.net.operator import Operator, OperatorCredentials

    async def go():
        async with Operator(OperatorCredentials.from_state_dir(net.state_dir)) as op:
            d = await op.directory()
            m = {x.node_id: x for x in d.members}[node]
            return await op.control(node, m.address, command, args, timeout=timeout)

    return uvloop.run(go())


def graph_neighbours() -> dict[str, set[str]]:
    from hushnet.privacy.graphs import parse_graph

    g = parse_graph(TOPOLOGY)
    return {f"n{i}": {f"n{int(j)}" for j in g.neighbors(i)} for i in range(g.n)}


# ---------------------------------------------------------------------------- healthy network


@pytest.mark.timeout(200)
def test_up_status_every_node_reaches_every_neighbour(net: UpProcess) -> None:
    doc = status_json(net)
    assert [n["id"] for n in doc["nodes"]] == [f"n{i}" for i in range(N)]
    addresses = [n["address"] for n in doc["nodes"]]
    assert len({a.rsplit(":", 1)[0] for a in addresses}) == N, "each node on its own 127.0.0.x"
    assert all(a.startswith("127.0.0.") for a in addresses)
    expected = graph_neighbours()
    for n in doc["nodes"]:
        assert n["healthy"] is True
        assert set(n["neighbors"]) == expected[n["id"]]
        assert set(n["connected"]) == expected[n["id"]], f"{n['id']} links: {n['connections']}"
    # the text table of `hushnet up` was printed
    assert "network up: 8 nodes" in net.output() and "n7" in net.output()


@pytest.mark.timeout(200)
def test_envelope_along_each_edge_arrives_exactly_once(net: UpProcess) -> None:
    from hushnet.demo import exchange_on_every_edge

    result = uvloop.run(exchange_on_every_edge(net.state_dir, run_id="edge-test", size=2048))
    assert result["edges"] == 12 and result["directed_edges"] == 24
    assert result["failed"] == [] and result["missing"] == [] and result["duplicates"] == []
    assert result["corrupted"] == [] and result["unexpected"] == []
    assert result["delivered"] == 24 and result["ok"]


@pytest.mark.timeout(300)
def test_64mb_payload_crosses_one_edge_intact(net: UpProcess) -> None:
    size = 64 * MiB
    sent = operator_control(
        net,
        "n0",
        "ping_neighbors",
        {"run_id": "big", "size": size, "to": ["n1"], "timeout": 200},
        timeout=240,
    )
    res = sent["sent"]["n1"]
    assert res["ok"], res
    box = operator_control(net, "n1", "inbox", {"protocol": "net.ping", "run_id": "big"})["inbox"]
    assert len(box) == 1
    assert box[0]["size"] == size and box[0]["sender"] == "n0"
    assert box[0]["sha256"] == res["sha256"]


@pytest.mark.timeout(200)
def test_ping_neighbors_discard_measures_the_transport_alone(net: UpProcess) -> None:
    """``protocol: net.discard`` sends the same envelope, counted and dropped by the receiver, so the
    round trip has no inbox write in it (issue 12: a receiver's first ``net.ping`` record, not the link,
    made a link's "first use" look 2 ms slow); anything else is refused with one clear line."""
    from hushnet.net.operator import OperatorError

    sent = operator_control(
        net, "n0", "ping_neighbors", {"run_id": "discarded", "size": 100, "protocol": "net.discard"}
    )
    assert set(sent["sent"]) == graph_neighbours()["n0"]
    assert all(r["ok"] and not r["duplicate"] for r in sent["sent"].values()), sent
    for peer in sent["sent"]:  # dropped, not recorded
        box = operator_control(net, peer, "inbox", {"run_id": "discarded"})["inbox"]
        assert box == []
    with pytest.raises(OperatorError, match="sends net.ping or net.discard, not 'net.run'"):
        operator_control(net, "n0", "ping_neighbors", {"protocol": "net.run"})


# ---------------------------------------------------------------------------- refused connections


def _assert_refused(channel: grpc.Channel) -> grpc.RpcError:
    stub = ppb_grpc.PeerStub(channel)
    with pytest.raises(grpc.RpcError) as info:
        stub.Health(ppb.HealthRequest(), timeout=20)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    return info.value


def _still_serving(net: UpProcess, node: str) -> None:
    wait_for(
        lambda: {n["id"]: n for n in status_json(net)["nodes"]}[node]["healthy"],
        60,
        what=f"{node} answering Status",
    )


@pytest.mark.timeout(120)
def test_foreign_ca_and_plaintext_clients_are_refused(net: UpProcess) -> None:
    addr = {n["id"]: n["address"] for n in net.cluster()["nodes"]}["n0"]
    ca_pem = (net.state_dir / "bootstrap" / "ca.pem").read_bytes()
    # a complete foreign network: its own CA, a certificate that even claims to be n1
    f_ca_key, f_ca = pki.create_ca("foreign CA")
    f_key = pki.generate_key()
    f_cert = pki.issue_cert(
        f_ca_key, f_ca, f_key.public_key(), kind="node", name="n1", dns_names=[pki.node_dns("n1")]
    )
    err = _assert_refused(
        secure_channel(addr, "n0", ca_pem, pki.key_to_pem(f_key), pki.cert_to_pem(f_cert))
    )
    assert (
        "failed to connect" in err.details()
        or "Socket closed" in err.details()
        or "handshake" in err.details().lower()
    )
    # no client certificate at all (TLS, but not mutual)
    _assert_refused(secure_channel(addr, "n0", ca_pem, None, None))
    # plain text
    err = _assert_refused(grpc.insecure_channel(addr))
    # the node logged the failed handshakes (gRPC core writes them to the node's log) and keeps serving
    wait_for(
        lambda: "Handshake failed" in log_text(net.state_dir, "n0"), 10, what="handshake log line"
    )
    _still_serving(net, "n0")


@pytest.mark.timeout(120)
def test_expired_certificate_is_refused(net: UpProcess) -> None:
    from hushnet.bootstrap.authority import load_or_create

    addr = {n["id"]: n["address"] for n in net.cluster()["nodes"]}["n0"]
    auth = load_or_create(net.state_dir / "bootstrap")
    key = pki.generate_key()
    old = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=10)
    cert = pki.issue_cert(
        auth.ca_key,
        auth.ca_cert,
        key.public_key(),
        kind="node",
        name="n1",
        dns_names=[pki.node_dns("n1")],
        days=1,
        not_before=old,
    )
    _assert_refused(
        secure_channel(addr, "n0", auth.ca_pem, pki.key_to_pem(key), pki.cert_to_pem(cert))
    )
    wait_for(
        lambda: "certificate has expired" in log_text(net.state_dir, "n0"),
        10,
        what="expired-cert log line",
    )
    _still_serving(net, "n0")


# ---------------------------------------------------------------------------- bad envelopes


@pytest.mark.timeout(120)
def test_bad_envelopes_get_clear_errors_and_node_keeps_serving(net: UpProcess) -> None:
    addrs = {n["id"]: n["address"] for n in net.cluster()["nodes"]}
    ca, key, cert = node_creds(net.state_dir, "n0")

    def deliver(target: str, env: epb.Envelope | bytes) -> grpc.RpcError:
        raw = env if isinstance(env, bytes) else env.SerializeToString()
        with pytest.raises(grpc.RpcError) as info:
            raw_deliver(secure_channel(addrs[target], target, ca, key, cert), raw)
        return info.value

    # n0 and n7 are not adjacent in the 3-cube
    e = deliver(
        "n7",
        epb.Envelope(
            protocol="net.ping", run_id="x", seq=1, payload=b"hi", sender="n0", recipient="n7"
        ),
    )
    assert e.code() == grpc.StatusCode.PERMISSION_DENIED and "not a neighbour" in e.details()
    e = deliver(
        "n1",
        epb.Envelope(
            protocol="no.such.protocol",
            run_id="x",
            seq=1,
            payload=b"hi",
            sender="n0",
            recipient="n1",
        ),
    )
    assert e.code() == grpc.StatusCode.UNIMPLEMENTED and "unknown protocol" in e.details()
    e = deliver("n1", b"\xff\xff\xff\xff garbage that is not protobuf")
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "malformed" in e.details()
    e = deliver(
        "n1",
        epb.Envelope(
            protocol="net.ping", run_id="x", seq=1, payload=b"hi", sender="n3", recipient="n1"
        ),
    )
    assert e.code() == grpc.StatusCode.PERMISSION_DENIED and "certificate names" in e.details()
    # a node certificate cannot use the operator entry point
    stub = ppb_grpc.PeerStub(secure_channel(addrs["n1"], "n1", ca, key, cert))
    with pytest.raises(grpc.RpcError) as info:
        stub.Control(ppb.ControlRequest(command="inbox"), timeout=10)
    assert (
        info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        and "operator" in info.value.details()
    )
    # the operator certificate cannot inject envelopes
    bdir = net.state_dir / "bootstrap"
    op = secure_channel(
        addrs["n1"],
        "n1",
        ca,
        (bdir / "operator.key").read_bytes(),
        (bdir / "operator.pem").read_bytes(),
    )
    with pytest.raises(grpc.RpcError) as info:
        raw_deliver(
            op, epb.Envelope(protocol="net.ping", sender="n0", recipient="n1").SerializeToString()
        )
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED

    logs = log_text(net.state_dir, "n1")
    for needle in (
        "unknown protocol",
        "malformed Envelope",
        "certificate names",
        "Control requires an operator",
    ):
        assert needle in logs, needle
    assert "not a neighbour" in log_text(net.state_dir, "n7")
    _still_serving(net, "n1")
    _still_serving(net, "n7")


# ---------------------------------------------------------------------------- bootstrap refusals


def _bootstrap_stub(net: UpProcess) -> bpb_grpc.BootstrapStub:
    bdir = net.state_dir / "bootstrap"
    info = json.loads((bdir / "bootstrap.json").read_text())
    ch = grpc.secure_channel(
        info["address"],
        pki.channel_credentials((bdir / "ca.pem").read_bytes()),
        options=[("grpc.ssl_target_name_override", pki.BOOTSTRAP_DNS)],
    )
    return bpb_grpc.BootstrapStub(ch)


@pytest.mark.timeout(120)
def test_join_refusals_wrong_token_duplicate_id_full(net: UpProcess) -> None:
    stub = _bootstrap_stub(net)
    token = (net.state_dir / "bootstrap" / "join_token").read_text().strip()
    x = pki.x25519_public_bytes(pki.generate_x25519())

    def join(**kw) -> grpc.RpcError:
        req = dict(
            token=token,
            csr_pem=pki.make_csr(pki.generate_key()),
            address="127.0.0.50:9999",
            x25519_public=x,
        )
        req.update(kw)
        with pytest.raises(grpc.RpcError) as info:
            stub.Join(bpb.JoinRequest(**req), timeout=10)
        return info.value

    e = join(token="wrong-token")
    assert e.code() == grpc.StatusCode.UNAUTHENTICATED and "wrong join token" in e.details()
    e = join(requested_id="n3")
    assert e.code() == grpc.StatusCode.ALREADY_EXISTS and "duplicate node id" in e.details()
    e = join(requested_id="extra")
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "network full" in e.details()
    e = join(
        csr_pem=b"-----BEGIN CERTIFICATE REQUEST-----\nnot a csr\n-----END CERTIFICATE REQUEST-----\n"
    )
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    logs = log_text(net.state_dir, "bootstrap")
    assert "wrong join token" in logs and "duplicate node id" in logs
    # still serving
    assert len(stub.GetDirectory(bpb.DirectoryRequest(), timeout=10).members) == N


@pytest.mark.timeout(60)
def test_directory_publishes_graph_and_metropolis_hastings_weights(net: UpProcess) -> None:
    import numpy as np

    from hushnet.privacy.graphs import metropolis_hastings, parse_graph

    d = _bootstrap_stub(net).GetDirectory(bpb.DirectoryRequest(), timeout=10)
    assert d.topology == TOPOLOGY and d.n_vertices == N and d.weight_rule == "hamilton"
    W = np.zeros((N, N))
    for w in d.weights:
        W[w.u, w.v] = w.w
    np.testing.assert_allclose(
        W, metropolis_hastings(parse_graph(TOPOLOGY), variant="hamilton").toarray()
    )
    np.testing.assert_allclose(W.sum(axis=1), 1.0)
    assert W[0, 1] == pytest.approx(1 / (1 + 3)) and W[0, 0] == pytest.approx(1 - 3 / 4)
    for m in d.members:
        assert len(m.x25519_public) == 32 and len(m.cert_sha256) == 64 and m.alive


# ---------------------------------------------------------------------------- restarts (run last)


@pytest.mark.timeout(240)
def test_sigkill_node_restarts_with_same_identity(net: UpProcess) -> None:
    before = {n["id"]: n for n in net.cluster()["nodes"]}["n3"]
    ident_before = json.loads((pathlib.Path(before["state_dir"]) / "identity.json").read_text())
    os.kill(before["pid"], signal.SIGKILL)
    # the supervisor notices and restarts it
    after = wait_for(
        lambda: (lambda n: n if n["pid"] != before["pid"] and pid_alive(n["pid"]) else None)(
            {n["id"]: n for n in net.cluster()["nodes"]}["n3"]
        ),
        60,
        what="n3 restarted",
    )
    assert after["restarts"] >= 1
    doc = wait_for(
        lambda: (lambda d: d if all_connected(d) else None)(status_json(net)),
        120,
        what="all links up again",
    )
    ident_after = json.loads((pathlib.Path(after["state_dir"]) / "identity.json").read_text())
    assert ident_after["node_id"] == "n3"
    assert ident_after["key_sha256"] == ident_before["key_sha256"]
    assert ident_after["x25519_public"] == ident_before["x25519_public"]
    n3 = {n["id"]: n for n in doc["nodes"]}["n3"]
    assert n3["vertex"] == 3 and n3["x25519_public"] == ident_before["x25519_public"]
    for peer in graph_neighbours()["n3"]:
        assert "n3" in {n["id"]: n for n in doc["nodes"]}[peer]["connected"]
    assert "re-joined as n3" in log_text(net.state_dir, "n3")
    # and the edge carries envelopes again
    sent = operator_control(net, "n1", "ping_neighbors", {"run_id": "after-restart", "to": ["n3"]})
    assert sent["sent"]["n3"]["ok"]


@pytest.mark.timeout(240)
def test_bootstrap_restart_keeps_membership(net: UpProcess) -> None:
    stub = _bootstrap_stub(net)
    before = {
        m.node_id: m.key_sha256
        for m in stub.GetDirectory(bpb.DirectoryRequest(), timeout=10).members
    }
    old = net.cluster()["bootstrap"]
    os.kill(old["pid"], signal.SIGKILL)
    wait_for(
        lambda: (
            net.cluster()["bootstrap"]["pid"] != old["pid"]
            and pid_alive(net.cluster()["bootstrap"]["pid"])
        ),
        60,
        what="bootstrap restarted",
    )

    def members():
        d = _bootstrap_stub(net).GetDirectory(bpb.DirectoryRequest(), timeout=5)
        return {m.node_id: m.key_sha256 for m in d.members}

    after = wait_for(members, 60, what="bootstrap serving again")
    assert after == before
    wait_for(
        lambda: (lambda d: d if all_connected(d) else None)(status_json(net)),
        90,
        what="network healthy after bootstrap restart",
    )
    wait_for(
        lambda: all(n["alive_in_directory"] for n in status_json(net)["nodes"]),
        30,
        what="leases renewed at the restarted bootstrap",
    )
    d = _bootstrap_stub(net).GetDirectory(bpb.DirectoryRequest(), timeout=5)
    assert d.topology == TOPOLOGY


@pytest.mark.timeout(120)
def test_down_stops_everything(net: UpProcess) -> None:
    doc = net.cluster()
    proc = cli("down", "--state-dir", str(net.state_dir), timeout=90)
    assert proc.returncode == 0, proc.stderr
    assert "stopped the network" in proc.stdout
    net.proc.wait(timeout=30)
    for child in [doc["bootstrap"], *doc["nodes"]]:
        wait_for(lambda: not pid_alive(child["pid"]), 20, what=f"{child['id']} gone")
    assert "stopping" in net.output()
    assert "left" in log_text(net.state_dir, "bootstrap")
