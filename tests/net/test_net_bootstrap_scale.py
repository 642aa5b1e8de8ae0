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
import pathlib
import time

import grpc
import pytest
import uvloop
from helpers.net import inprocess_bootstrap

from hushnet.bootstrap.service import BootstrapService  # noqa: E402
from hushnet.net import pki  # noqa: E402
from hushnet.net.host import NodeHost, hosted_configs  # noqa: E402
from hushnet.net.operator import Operator, OperatorCredentials  # noqa: E402
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
    return await inprocess_bootstrap(tmp, spec, lease_seconds=LEASE)


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


def test_hosted_nodes_follow_changes_without_rebuilding_the_directory(
    tmp_path: pathlib.Path,
) -> None:
    """A process applies each directory change in place (issue 12): the graph's adjacency is built once, and
    after joins, a leave and a move every node's neighbours, links and full directory match the bootstrap's."""

    async def go():
        addr, stop, btask = await _bootstrap(tmp_path, "hypercube:3")
        host = NodeHost(_configs(tmp_path, addr, [f"n{i}" for i in range(6)]))
        await host.start()
        late = NodeHost(_configs(tmp_path, addr, ["n6", "n7"]))
        moved = None
        try:
            nodes = host.running
            shared = nodes[0]._boot
            assert all(x._boot is shared for x in nodes)  # one copy of the directory per process
            await _until(lambda: all(len(x.members) == 6 for x in nodes), 20, "6 members")
            adjacency = shared.view.adjacency
            op = Operator(OperatorCredentials.from_state_dir(tmp_path / "b"))
            first = await op.followed_directory()
            assert len(first.members) == 6
            await late.start()
            await _until(lambda: all(len(x.members) == 8 for x in nodes), 20, "the joins")
            await late.stop()  # n6 and n7 leave: their entries change (no longer alive)
            await _until(
                lambda: not any(x.members["n7"].alive for x in nodes), 20, "n7 to have left"
            )
            # n7 comes back on another port with its stored identity: its neighbours must re-link there
            moved = NodeHost(_configs(tmp_path, addr, ["n7"]))
            await moved.start()
            new_address = moved.running[0].address
            await _until(
                lambda: nodes[0].members["n7"].address == new_address, 20, "n7's new address"
            )
            assert shared.view.adjacency is adjacency  # the topology's index was not rebuilt

            async with grpc.aio.secure_channel(
                addr,
                pki.channel_credentials((tmp_path / "b" / "ca.pem").read_bytes()),
                options=[("grpc.ssl_target_name_override", pki.BOOTSTRAP_DNS)],
            ) as ch:
                truth = await bpb_grpc.BootstrapStub(ch).GetDirectory(
                    bpb.DirectoryRequest(), timeout=5
                )
            await _until(
                lambda: all(x.directory_epoch == truth.epoch for x in nodes), 20, "every node"
            )
            by_vertex = {m.vertex: m for m in truth.members}
            nbrs: dict[int, set[int]] = collections.defaultdict(set)
            for e in truth.edges:
                nbrs[e.u].add(e.v)
                nbrs[e.v].add(e.u)
            for x in nodes:
                want = {by_vertex[v].node_id for v in nbrs[x.identity.vertex]}
                assert set(x.neighbors) == set(x.links) == want, x.node_id
                for peer, link in x.links.items():
                    assert link.address == by_vertex[x.members[peer].vertex].address
                got = x.directory  # the full message, built on demand from the process's copy
                assert got.epoch == truth.epoch and list(got.edges) == list(truth.edges)
                assert [(m.node_id, m.address, m.vertex, m.alive) for m in got.members] == [
                    (m.node_id, m.address, m.vertex, m.alive) for m in truth.members
                ]
            assert nodes[0].directory is nodes[1].directory  # built once for the process
            # the operator's followed copy (wait_healthy's sweeps) moved by the changes to the same state
            followed = await op.followed_directory()
            await op.close()
            assert followed.epoch == truth.epoch and list(followed.edges) == list(truth.edges)
            assert [(m.node_id, m.address, m.vertex, m.cert_sha256) for m in followed.members] == [
                (m.node_id, m.address, m.vertex, m.cert_sha256) for m in truth.members
            ]
        finally:
            if moved is not None:
                await moved.stop()
            await host.stop()
            stop.set()
            await btask

    uvloop.run(go())


def test_onion_keys_read_for_the_changed_members_only(tmp_path: pathlib.Path) -> None:
    """A directory change reads the onion keys of the members it names, from the lowest epoch still listed,
    not every node's keys (a quarter of the bootstrap's time in a 2048-node join storm)."""
    from hushnet.bootstrap.store import BootstrapStore

    store = BootstrapStore(tmp_path / "b.sqlite")
    try:
        for i in range(600):  # more than one SQLite parameter batch
            store.put_onion_keys(f"n{i}", [(5, b"a%d" % i), (3, b"b%d" % i), (4, b"c%d" % i)])
        everyone = store.onion_keys()
        assert len(everyone) == 600 and everyone["n7"] == [(3, b"b7"), (4, b"c7"), (5, b"a7")]
        ids = [f"n{i}" for i in range(0, 600, 2)] + ["ghost"]
        some = store.onion_keys(ids, min_epoch=4)
        assert set(some) == {f"n{i}" for i in range(0, 600, 2)}
        assert all(some[i] == [e for e in everyone[i] if e[0] >= 4] for i in some)
        assert store.onion_keys([]) == {}
    finally:
        store.close()


def test_directory_view_says_which_neighbourhoods_a_change_touched() -> None:
    """A change of one member concerns its own vertex and its neighbours only; a snapshot concerns everyone;
    a member that moves vertex touches both its old and its new neighbourhood."""
    from hushnet.net.shared import DirectoryView

    ring = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 0)]  # ring:6
    d = bpb.Directory(
        epoch=3,
        members=[bpb.Member(node_id=f"n{v}", vertex=v, address=f"a{v}") for v in range(5)],
        edges=[bpb.Edge(u=u, v=v) for u, v in ring],
    )
    view = DirectoryView(d)
    view.snapshot_epoch = 3
    assert all(view.changed_since(2, v) for v in range(6))
    assert not any(view.changed_since(3, v) for v in range(6))
    view.update([bpb.Member(node_id="n5", vertex=5, address="a5")], 4)  # a join at vertex 5
    assert [v for v in range(6) if view.changed_since(3, v)] == [0, 4, 5]
    assert view.members["n5"].address == "a5" and view.by_vertex[5].node_id == "n5"
    view.update(
        [bpb.Member(node_id="n1", vertex=2, address="b1")], 5
    )  # n1 moves from vertex 1 to 2
    assert [v for v in range(6) if view.changed_since(4, v)] == [0, 1, 2, 3]
    assert 1 not in view.by_vertex and view.by_vertex[2].node_id == "n1"


def test_a_change_wakes_only_the_nodes_of_its_neighbourhood() -> None:
    """A directory change wakes the hosted nodes whose own or a neighbour's entry it changed, not all of the
    process's nodes (at K = 410 each node woke on every change of a 2048-node join storm to find nothing of
    its own); the others still report the process's version as theirs, having nothing to redo."""
    from hushnet.net.shared import SharedBootstrap

    ring = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 0)]  # ring:6

    async def go() -> None:
        shared = SharedBootstrap("127.0.0.1:9", b"")  # never dialed: the changes are merged by hand
        try:
            shared._merge(
                bpb.DirectoryChanges(
                    epoch=3,
                    snapshot=True,
                    directory=bpb.Directory(
                        epoch=3,
                        members=[bpb.Member(node_id=f"n{v}", vertex=v) for v in range(5)],
                        edges=[bpb.Edge(u=u, v=v) for u, v in ring],
                    ),
                )
            )
            shared._watcher = asyncio.get_running_loop().create_future()  # no watch: merged by hand
            woken: dict[int, int] = {}

            async def follow(vertex: int) -> None:
                woken[vertex] = await shared.next_change(3, vertex)

            tasks = [asyncio.create_task(follow(v)) for v in range(6)]
            await asyncio.sleep(0.01)
            assert woken == {}
            shared._merge(
                bpb.DirectoryChanges(epoch=4, changed=[bpb.Member(node_id="n5", vertex=5)])
            )
            await asyncio.sleep(0.01)
            assert woken == {0: 4, 4: 4, 5: 4}  # vertex 5 and its neighbours; 1, 2, 3 sleep on
            # a snapshot may change anyone's neighbourhood: everyone wakes
            shared._merge(
                bpb.DirectoryChanges(
                    epoch=6,
                    snapshot=True,
                    directory=bpb.Directory(
                        epoch=6,
                        members=[bpb.Member(node_id=f"n{v}", vertex=v) for v in range(6)],
                        edges=[bpb.Edge(u=u, v=v) for u, v in ring],
                    ),
                )
            )
            await asyncio.gather(*tasks)
            assert woken == {0: 4, 4: 4, 5: 4, 1: 6, 2: 6, 3: 6}
        finally:
            await shared.channel.close()

    uvloop.run(go())


def test_a_node_not_woken_reports_the_process_directory_version(tmp_path: pathlib.Path) -> None:
    """``directory_epoch`` of a node whose neighbourhood did not change is the process's version (what
    ``hushnet status`` shows), although the node was not woken to apply it."""
    from hushnet.net.directory import DirectoryMixin
    from hushnet.net.shared import DirectoryView

    ring = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 0)]
    d = bpb.Directory(
        epoch=3,
        members=[bpb.Member(node_id=f"n{v}", vertex=v) for v in range(5)],
        edges=[bpb.Edge(u=u, v=v) for u, v in ring],
    )

    class Source:
        epoch = 3
        view = DirectoryView(d)

    Source.view.snapshot_epoch = 3

    class Ident:
        vertex = 2

    node = DirectoryMixin()
    node._dir_source, node._dir_epoch, node.identity = Source, 3, Ident
    Source.view.update([bpb.Member(node_id="n5", vertex=5)], 4)
    Source.epoch = 4
    assert node.directory_epoch == 4  # vertex 5 is no neighbour of 2: nothing to redo
    Ident.vertex = 0
    assert node.directory_epoch == 3  # vertex 0 neighbours 5: it has to apply version 4 first
