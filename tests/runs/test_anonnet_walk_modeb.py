"""Mode B of ``anon-walk-sgd`` (onion random walk, docs/design/spec/anonymity.md §6.3) over 12 real nodes (mutual TLS).

The sealed model travels as an onion along the walk its source sampled: every hop's packet was
received from the path's previous node (the authenticated link peer) and is a fresh ciphertext
(no packet is seen twice, anywhere); each packet peels only with the onion key of the node that
received it (every other node's key fails the layer MAC), and only the final layer yields a token,
which opens only with the destination's key; the recorded hitting times are the sampled walks'
lengths; a replayed packet (same handoff, or the same layer under a fresh hop id) and a tampered
one are refused with counted faults; each update is charged once, as attributable, on the
updater's own ledger.
"""

from __future__ import annotations

import pathlib

import pytest
import uvloop
from helpers.anonnet import network

from hushnet.crypto.cells import from_cells, to_cells
from hushnet.crypto.errors import IntegrityError
from hushnet.crypto.onion import OnionKeyring, onion_ad, peel
from hushnet.crypto.sealed import try_open_token
from hushnet.families.anonymity.anonymous_walk import sealing_info
from hushnet.families.anonymity.operator import walk_iterations
from hushnet.families.anonymity.wire import HOP_ID, KIND_ONION
from hushnet.net.node import DeliveryError
from hushnet.runs.node_keys import node_keypair
from hushnet.runs.service import RUN_PROTOCOL
from hushnet.runs.spec import Budget, RunSpec
from hushnet.runs.synthetic import planted_logistic_shards

GRAPH, N, CELL = "regular:12:3:1", 12, 4096


@pytest.mark.timeout(150)
def test_onion_walk_over_real_nodes(tmp_path: pathlib.Path) -> None:
    async def go():
        async with network(
            tmp_path, GRAPH, N, shards=planted_logistic_shards(N, m=10, d=4, seed=2), base_ip=210
        ) as net:
            spec = RunSpec(
                protocol="anon-walk-sgd",
                task="logreg",
                graph=GRAPH,
                steps=1,
                seed=5,
                budget=Budget(1e6, 1e-5),
                sigma=2.0,
                step_size=0.05,
                start=0,
                protocol_params={
                    "updates_per_node": 1,
                    "ell1": 2,
                    "ell2": 5,
                    "cell_body": CELL,
                    "mode": "B",
                },
            ).with_run_id()
            run_id = await net.client.start_run(spec)
            drivers = {v: net.driver(v, run_id) for v in range(N)}
            await net.wait(
                lambda: any(d.state == "finished" for d in drivers.values()),
                90,
                what="the walk to end",
            )
            holder = next(v for v, d in drivers.items() if d.state == "finished")
            assert drivers[holder].finish_result["walk_mode"] == "B"
            ids = drivers[0].ids
            vertex = {nid: v for v, nid in enumerate(ids)}
            keys = {nd.identity.vertex: node_keypair(nd) for nd in net.nodes}
            m0 = drivers[0].machine
            slots, plen, info = m0.l_max, m0.payload_len, sealing_info(run_id, 0)

            # every onion packet any handler saw: (receiver, link peer) per distinct packet
            seen: dict[bytes, set[tuple[int, int]]] = {}
            wires: dict[bytes, tuple[int, int, bytes]] = {}
            sizes = set()
            for v, spy in net.spies.items():
                for r in spy.seen:
                    if r["run_id"] != run_id or r["payload"][:1] == b"A":
                        continue
                    sizes.add(len(r["payload"]))
                    data = from_cells(r["payload"], CELL)
                    assert data[0] == KIND_ONION
                    pkt = bytes(data[1 + HOP_ID :])
                    seen.setdefault(pkt, set()).add((v, vertex[r["sender"]]))
                    wires[pkt] = (v, vertex[r["sender"]], r["payload"])
            assert len(sizes) == 1  # one size for every hop position and path length
            # fresh bytes at every hop: no packet reached two nodes (retransmissions aside), no shared ephemeral key
            assert all(len({v for v, _ in s}) == 1 for s in seen.values())
            assert len({p[5:37] for p in seen}) == len(seen)

            # the packets travelled exactly the source-sampled walks, along the links they name
            paths = {v: list(d.machine.paths) for v, d in drivers.items()}
            hops_sent = {(a, b) for s in seen.values() for (b, a) in s}
            n_hops = 0
            for u, ps in paths.items():
                for p in ps:
                    seq = [u] + p
                    assert all((a, b) in hops_sent for a, b in zip(seq, seq[1:]))
                    n_hops += len(p)
            assert len(seen) == n_hops

            # each packet peels only under the receiving node's onion key; only final layers carry the
            # token, and it opens only at the destination
            finals = []
            for pkt, s in seen.items():
                ((v, _),) = s
                for w in range(N):
                    ring = OnionKeyring.single(
                        keys[w], 0
                    )  # a fresh replay cache: the check is the key alone
                    if w != v:
                        with pytest.raises(IntegrityError):
                            peel(ring, pkt, slots=slots, payload_len=plen, ad=onion_ad(run_id))
                        continue
                    with pytest.raises(IntegrityError):  # the layers are bound to their run
                        peel(ring, pkt, slots=slots, payload_len=plen, ad=onion_ad("another-run"))
                    res = peel(ring, pkt, slots=slots, payload_len=plen, ad=onion_ad(run_id))
                    if res.final:
                        finals.append(v)
                        assert [
                            x
                            for x in range(N)
                            if try_open_token(keys[x], res.message, info) is not None
                        ] == [v]
            it = walk_iterations([d.events for d in drivers.values()], spec.start)
            assert (
                it["source"].size
                == len(finals)
                == sum(d.machine.updates for d in drivers.values())
                >= 1
            )
            assert sorted(finals) == sorted(it["destination"].tolist())
            order = {u: list(ps) for u, ps in paths.items()}
            for s, j, h in zip(it["source"], it["destination"], it["hops"]):
                p = order[int(s)].pop(0)
                assert p[-1] == j and len(p) == h  # the hitting time is the sampled walk's length
                assert j in drivers[int(s)].machine.chosen

            # replay and tamper, taken from what a relay really processed
            relay_pkt = next(
                p
                for p, s in seen.items()
                if next(iter(s))[0] != holder and drivers[next(iter(s))[0]].state == "running"
            )
            v, a, wire = wires[relay_pkt]
            faults0 = len(drivers[v].faults)
            data = bytearray(from_cells(wire, CELL))
            fresh_id = bytearray(data)
            fresh_id[1 : 1 + HOP_ID] = bytes(
                range(HOP_ID)
            )  # the same layer under a new hop id: the tag τ stops it
            tampered = bytearray(fresh_id)
            tampered[1] ^= 1  # yet another hop id
            tampered[1 + HOP_ID + 5 + 100] ^= 1  # and a bit of the header β: the layer MAC fails
            for bad in (wire, to_cells(bytes(fresh_id), CELL), to_cells(bytes(tampered), CELL)):
                with pytest.raises(DeliveryError):
                    await net.by_id[ids[a]].send(
                        ids[v], bad, protocol=RUN_PROTOCOL, run_id=run_id, timeout=10
                    )
            codes = [f["code"] for f in drivers[v].faults[faults0:]]
            assert codes == ["replay", "replay", "integrity"], drivers[v].faults[faults0:]

            # one attributable charge per update, on the updater's own ledger
            for u, d in drivers.items():
                assert (
                    len(net.svc_by_vertex[u].ledger.entries(run_id))
                    == d.machine.updates
                    == d.contributions
                )
                assert d.report()["accounting_view"]["dp_credit"] is False
            outcome = await net.client.watch(run_id, progress=False, timeout=30)
            assert outcome.state == "finished"

    uvloop.run(go())
