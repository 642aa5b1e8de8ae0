"""Onion-relayed RW DP-SGD (``rw-dpsgd-onion``) over real nodes (mutual TLS on 127.0.0.x).

Checks: every hop of the token travels through at least 3 relays along graph edges; the receiver's
handler sees the last relay as its authenticated peer and gRPC connection (drawn whatever the sender), and
the bytes it gets are whole fixed-size cells carrying nothing that names the sender; a replayed,
a tampered, a truncated, an oversized packet and one for an unknown key epoch are each refused
with a counted fault; the run finishes and every node's ledger holds exactly one local-DP charge
per contribution — its first ``cap`` visits; later visits add noise only and charge nothing (the
cap is small, so every run has such visits: 30 visits among 10 nodes); every onion message is
delivered exactly once; the report names the view; the anonymous view is refused without onion
relaying.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import uvloop
from helpers.anonnet import network

from hushnet.client.core import RunRefusedError
from hushnet.net.node import DeliveryError
from hushnet.runs.accounting import contribution_cost
from hushnet.runs.service import RUN_PROTOCOL
from hushnet.runs.spec import Budget, RunSpec
from hushnet.runs.synthetic import planted_logistic_shards

GRAPH, N, HOPS = "regular:10:4:1", 10, 3
#: per-node contribution cap.  The walk's coin flips are secret (fresh each run), so how often a node
#: is visited varies; with cap 10 some node got 11 of the 30 visits in ≈ 1.8 % of runs (Monte Carlo on
#: this W), its 11th visit was noise-only and "30 contributions" failed.  With cap 2 every run has
#: ≥ 10 over-cap visits (pigeonhole), so the cap's accounting is checked every time, exactly.
CAP = 2


def _spec(**kw) -> RunSpec:
    base = dict(
        protocol="rw-dpsgd-onion",
        task="logreg",
        graph=GRAPH,
        steps=30,
        seed=11,
        budget=Budget(1e6, 1e-5),
        sigma=2.0,
        step_size=0.05,
        cap=CAP,
        view_model="anonymous",
        protocol_params={"hops": HOPS},
    )
    base.update(kw)
    return RunSpec(**base).with_run_id()


@pytest.mark.timeout(150)
def test_onion_run_receiver_view_replay_tamper_exact_ledgers(tmp_path: pathlib.Path) -> None:
    async def go():
        async with network(
            tmp_path, GRAPH, N, shards=planted_logistic_shards(N, m=12, d=4, seed=0), base_ip=40
        ) as net:
            # the anonymous view without onion relaying is refused by every node, with the reason
            with pytest.raises(RunRefusedError) as ei:
                await net.client.start_run(_spec(protocol="rw-dpsgd", protocol_params={}))
            assert all("needs onion relaying" in d["reason"] for d in ei.value.decisions.values())

            spec = _spec()
            run_id = await net.client.start_run(spec)
            drivers = {v: net.driver(v, run_id) for v in range(N)}
            await net.wait(
                lambda: any(d.state == "finished" for d in drivers.values()),
                90,
                what="the walk to finish",
            )
            holder = next(v for v, d in drivers.items() if d.state == "finished")
            assert drivers[holder].model is not None and drivers[holder].finish_step == spec.steps

            # --- the receiver's view: who the handler sees, and the bytes ------------------------
            ids = drivers[0].ids
            addr = {nd.identity.vertex: nd.address for nd in net.nodes}
            assert len(set(addr.values())) == N
            xpub = {nd.identity.vertex: nd.identity.x25519_public for nd in net.nodes}
            sizes = set()
            peers: dict[int, dict[str, set]] = {}
            for v, spy in net.spies.items():
                for r in spy.seen:
                    peers.setdefault(v, {}).setdefault(r["sender"], set()).add(r["peer"])
            for u, d in drivers.items():
                layer = d.machine
                for (
                    path
                ) in layer.paths:  # the sender's own record of its paths (never sent anywhere)
                    relays, dst = path[:-1], path[-1]
                    assert (
                        HOPS <= len(relays) <= layer.plan.relays
                    )  # k(recipient, last relay) ≥ hops
                    hopseq = [u] + path
                    A = layer.adj
                    assert all(A[a, b] for a, b in zip(hopseq, hopseq[1:])), (
                        "relay path leaves the graph's edges"
                    )
                    assert (
                        dst not in relays
                    )  # the last relay may be the sender: drawn whatever the sender
                    got = [
                        r
                        for r in net.spies[dst].seen
                        if r["run_id"] == run_id
                        and r["payload"][:1] == b"O"
                        and r["sender"] == ids[relays[-1]]
                    ]
                    assert got, "the recipient never got a packet from the path's last relay"
                    for r in got:
                        # the gRPC peer (connection address) is the last relay's channel
                        assert r["peer"] in peers[dst][ids[relays[-1]]]
                        if relays[-1] != u:
                            assert r["peer"] not in peers[dst].get(ids[u], set())
                        # nothing in the clear names the sender (its id is 2 bytes: too short to test on
                        # 64 KiB of ciphertext; the envelope's own sender field is the relay's, checked above)
                        for secret in (
                            xpub[u],
                            addr[u].encode(),
                            f"hushnet://node/{ids[u]}".encode(),
                        ):
                            assert secret not in r["payload"]
            # every onion message reached its recipient's walk exactly once (retransmissions are refused
            # as replays at the next hop), and the walk moved between nodes at most once per step
            sent = sum(len(d.machine.paths) for d in drivers.values())
            assert sum(d.machine.delivered for d in drivers.values()) == sent
            assert 1 <= sent <= spec.steps - 1
            for spy in net.spies.values():
                for r in spy.seen:
                    if r["run_id"] == run_id and r["payload"][:1] == b"O":
                        sizes.add(len(r["payload"]))
            assert len(sizes) == 1, (
                f"onion packets of several sizes {sizes}: size would reveal hop position"
            )

            # --- replay and tamper: taken from what a relay really processed ---------------------
            relay_v = next(
                v
                for v in range(N)
                if v != holder and drivers[v].machine.relayed > 0 and drivers[v].state == "running"
            )
            rec = next(
                r
                for r in net.spies[relay_v].seen
                if r["run_id"] == run_id and r["payload"][:1] == b"O"
            )
            prev = net.by_id[rec["sender"]]
            faults0 = len(drivers[relay_v].faults)
            relayed0 = drivers[relay_v].machine.relayed
            with pytest.raises(DeliveryError) as replay:
                await prev.send(
                    ids[relay_v], rec["payload"], protocol=RUN_PROTOCOL, run_id=run_id, timeout=10
                )
            assert (
                "replay" in replay.value.details.lower()
                or "already" in replay.value.details.lower()
            )
            tampered = bytearray(rec["payload"])
            tampered[1 + 9 + 200] ^= (
                0x01  # inside the first cell's data (header β): the layer MAC fails
            )
            with pytest.raises(DeliveryError) as tamper:
                await prev.send(
                    ids[relay_v], bytes(tampered), protocol=RUN_PROTOCOL, run_id=run_id, timeout=10
                )
            # truncated, oversized, and a cell for a key epoch this node holds no key for
            epoch = bytearray(rec["payload"])
            # packet = version(1) ‖ epoch(4) ‖ …, after kind(1) + cell header(9); the epoch's top byte, so the
            # result is never an epoch the node holds (with per-epoch keys it holds e−1..e+1)
            epoch[1 + 9 + 1] ^= 0x40
            cell = len(rec["payload"]) - 1
            for bad in (rec["payload"][:-100], rec["payload"] + bytes(cell), bytes(epoch)):
                with pytest.raises(DeliveryError):
                    await prev.send(
                        ids[relay_v], bad, protocol=RUN_PROTOCOL, run_id=run_id, timeout=10
                    )
            faults = drivers[relay_v].faults[faults0:]
            codes = [f["code"] for f in faults]
            assert codes[2:] == ["bad-cell", "bad-cell", "unknown-epoch"], faults
            faults = faults[:2]
            codes = codes[:2]
            assert codes[1] == "integrity", faults
            assert (
                codes[0] in ("replay", "replayed", "duplicate")
                or "replay" in faults[0]["message"].lower()
            ), faults
            assert (
                "integrity" in tamper.value.details.lower()
                or "tamper" in tamper.value.details.lower()
                or "mac" in tamper.value.details.lower()
            )
            assert drivers[relay_v].machine.relayed == relayed0  # nothing refused was forwarded

            outcome = await net.client.watch(run_id, progress=False, timeout=30)
            assert outcome.state == "finished"

            # --- exact ledgers: one local-DP charge per contribution, nothing else (relays see the walk's
            # trajectory, so no walk bound is certified for onion runs) ----------------------------------
            total = noise = 0
            for v, d in drivers.items():
                led = net.svc_by_vertex[v].ledger
                entries = led.entries(run_id)
                assert len(entries) == d.contributions
                # a node's first CAP visits use its data; later ones add noise only ("contribute then
                # noise") and charge nothing
                visits = d.machine.inner.visits
                assert d.contributions == min(visits, CAP), (v, visits, d.contributions)
                assert d.noise_visits == visits - d.contributions, (v, visits, d.noise_visits)
                total += d.contributions
                noise += d.noise_visits
                assert "local-DP" in d.cost.bound_name
                cost = contribution_cost(spec, v, ids, d.W, led.orders)
                if d.contributions:
                    want = cost.curves(spec.sigma) * d.contributions
                    np.testing.assert_allclose(d.run_rdp, want, rtol=1e-12)
                    for j, t in enumerate(cost.targets):
                        np.testing.assert_allclose(led.rdp(t), want[j], rtol=1e-9)
                view = d.report()["accounting_view"]  # the report says which view, and why
                assert (
                    view["view_model"] == "local"
                    and view["relays"] >= HOPS
                    and "trajectory" in view["reason"]
                )
                assert view["sender_hidden_per_delivery"] is True
            assert total + noise == spec.steps  # every step was one visit, charged iff it used data
            assert noise >= spec.steps - N * CAP  # the cap was reached (pigeonhole)
            assert drivers[holder].finish_result["accounting_view"]["view_model"] == "local"

    uvloop.run(go())
