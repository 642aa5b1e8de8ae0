"""Muffliato with secure neighbourhood summation over a real network of 6 nodes (mutual TLS, 127.0.0.x).

``protocol_params.view = "aggregate"``: every round each node leads a SecAgg sum over the neighbours
it heard (keys: the nodes' long-term X25519 keys from the bootstrap directory) and is a member of each
neighbour's sum.  The run finishes; every node's model matches the simulator's (simulation keys, same
seeds) within the fixed-point bound and the recorded schedules are the same; the report and the
decision say secure summation was on and certified with the neighbourhood view (the members'
fixed-point rounding, ``tests/privacy/test_gossip_secure_rounding.py``); the persistent ledgers hold
the plain-gossip projection of the same spec, and the report shows the lower aggregate-view value only
as an uncertified real-arithmetic figure; no message was refused.  A second run with seeded dropouts
(30 % per node and round) finishes with the simulator's schedule and settles on the realised schedule
with the neighbourhood view.  A third run loses a node mid-run (stopped): the
others finish (their sums drop it, SecAgg recovers or aborts), and its neighbours declare it gone.
"""

from __future__ import annotations

import asyncio
import pathlib
from dataclasses import replace

import numpy as np
import pytest
from helpers.gossipnet import ledger_curves, sim_records, simulate, spec  # noqa: E402

from hushnet.crypto.masks import FixedPoint  # noqa: E402
from hushnet.families.gossip.accounting import GossipCost, gossip_cost  # noqa: E402
from hushnet.families.gossip.node import schedule_records  # noqa: E402
from hushnet.families.gossip.operator import settle_run  # noqa: E402
from hushnet.families.gossip.secure import ACCOUNTING_LABEL  # noqa: E402
from hushnet.protocols.registry import transition_matrix  # noqa: E402
from hushnet.runs import local_net  # noqa: E402

pytestmark = [pytest.mark.integration]

N, GRAPH, D, T = 6, "grid:2x3", 4, 3


@pytest.mark.timeout(120)
def test_secure_summation_gossip_over_the_network(tmp_path: pathlib.Path) -> None:
    rng = np.random.default_rng(21)
    values = [rng.random(D) for _ in range(N)]
    sp = spec("muffliato", GRAPH, T, 31, timeout=5.0, view="aggregate")
    sp2 = spec("muffliato", GRAPH, 4, 32, timeout=5.0, view="aggregate", dropout=0.3)
    # long enough that node 1 is stopped mid-run: its rounds take milliseconds, so with a short run it
    # could finish every round between "reached round 2" and the stop taking effect
    sp3 = spec("muffliato", GRAPH, 60, 33, timeout=1.0, give_up_after=2, view="aggregate")
    gone = 1  # a middle node of the 2×3 grid: three neighbours

    async def go():
        async with local_net.network(tmp_path, GRAPH, N, values=values, base_ip=230) as net:
            ids = [nd.node_id for nd in net.ordered]
            run_id = await net.client.start_run(sp)
            await net.wait(
                lambda: all(net.driver(v, run_id).state == "finished" for v in range(N)),
                90,
                what="secure gossip run to finish",
            )
            out = (
                ids,
                {v: net.driver(v, run_id) for v in range(N)},
                {v: ledger_curves(net.svc_by_vertex[v], ids, v) for v in range(N)},
            )
            run2 = await net.client.start_run(sp2)
            await net.wait(
                lambda: all(net.driver(v, run2).state == "finished" for v in range(N)),
                90,
                what="secure gossip run with dropouts to finish",
            )
            settled = await settle_run(net.client, run2, ids)
            run3 = await net.client.start_run(sp3)
            await net.wait(
                lambda: net.driver(gone, run3).machine.t >= 2, 60, what="node 1 to reach round 2"
            )
            await next(nd for nd in net.nodes if nd.identity.vertex == gone).stop(grace=0.0)
            assert net.driver(gone, run3).state != "finished", (
                "node 1 finished before it was stopped"
            )
            alive = [v for v in range(N) if v != gone]
            await net.wait(
                lambda: all(net.driver(v, run3).state == "finished" for v in alive),
                90,
                what="the live nodes to finish without node 1",
            )
            return (
                out,
                {v: net.driver(v, run2) for v in range(N)},
                settled,
                {v: net.driver(v, run3) for v in alive},
            )

    (ids, drivers, ledgers), drivers2, settled, drivers3 = asyncio.run(go())
    res, ms = simulate(sp, values)
    assert res.status == "finished"
    srec = sim_records(ms)
    bound = T * 4 * FixedPoint(24).error_bound(1)  # ≤ 4 terms per sum on a 2×3 grid
    W = transition_matrix(sp.graph, sp.weights)
    plain = gossip_cost(replace(sp, protocol_params={"timeout": 5.0}), 0, ids, W)
    for v, d in drivers.items():
        assert not d.faults, d.faults
        recs = schedule_records(d.engine_entries)
        assert [(r["row"], r["self"]) for r in recs] == [(r["row"], r["self"]) for r in srec[v]]
        assert all(r["secure"]["status"] == "released" for r in recs)
        np.testing.assert_allclose(d.model, res.models[v], rtol=0, atol=bound)
        rep = d.report()
        av = rep["accounting_view"]
        assert av["label"] == ACCOUNTING_LABEL and av["certified_view"] == "neighbourhood"
        assert av["gossip_view"] == "aggregate" and av["bound"] == "certified"
        assert av["aggregate_real_arithmetic"]["bound"] == "uncertified"
        assert rep["result"]["secure"] == {"released": T, "aborted": 0, "view": "aggregate"}
        assert isinstance(d.cost, GossipCost)
        np.testing.assert_allclose(ledgers[v], d.cost.phase_curves.sum(axis=0), rtol=1e-12)
        if v == 0:  # charged what plain gossip costs; the aggregate value is below it, uncertified
            np.testing.assert_allclose(ledgers[0], plain.curves(sp.sigma), rtol=1e-12)
            real = np.array(av["aggregate_real_arithmetic"]["epsilon"])
            proj = rep["projected"]  # node id -> certified projected ε (acceptance record)
            assert any(real[u] < proj[ids[u]] * 0.99 for u in range(1, N)), (real, proj)

    # seeded dropouts: the same realised schedule as the simulator, settled with the neighbourhood view
    res2, ms2 = simulate(sp2, values)
    srec2 = sim_records(ms2)
    assert sum(not r["up"] for recs in srec2.values() for r in recs) > 0, "no dropout happened"
    for v, d in drivers2.items():
        recs = schedule_records(d.engine_entries)
        assert [(r["up"], r["row"], r["self"]) for r in recs] == [
            (r["up"], r["row"], r["self"]) for r in srec2[v]
        ]
        np.testing.assert_allclose(
            d.model, res2.models[v], rtol=0, atol=4 * 4 * FixedPoint(24).error_bound(1)
        )
    assert all(
        "error" not in s
        and s["view"] == "neighbourhood"
        and s["gossip_view"] == "aggregate"
        and s["bound"] == "certified"
        for s in settled.values()
    ), settled

    # a node stopped mid-run: no hang; its neighbours declared it gone and stopped using it
    W3 = transition_matrix(GRAPH)
    for v, d in drivers3.items():
        assert d.model is not None and np.all(np.isfinite(d.model))
        if W3[v, gone] > 0:
            assert gone in d.finish_result["gone"], d.finish_result
            last = schedule_records(d.engine_entries)[-1]
            assert str(gone) not in last["row"] and last["secure"]["status"] in (
                "released",
                "alone",
                "aborted",
            )
