"""Muffliato over a real in-process network of 12 nodes (mutual TLS on 127.0.0.x, one event loop).

Checks, on one network: simulator/network parity (same seed → same estimates to 1e-12, same recorded
schedules, persistent ledgers equal to the exact accountant's replay); runs with seeded dropouts
(10, 30 and 50 %, the rates of Muffliato's Table 3) that finish, matches the simulator bit for bit and whose settled ledgers match the replay of
the recorded schedule; a node stopped mid-run: the others finish, the neighbours declare it gone,
and the settlement tops every ledger up to the certified loss on what really happened (and refuses
to settle while the stopped node's records are missing).
"""

from __future__ import annotations

import asyncio
import pathlib

import numpy as np
import pytest
from helpers.gossipnet import ledger_curves, replay_curves, sim_records, simulate, spec  # noqa: E402

from hushnet.families.gossip.accounting import GossipCost  # noqa: E402
from hushnet.families.gossip.node import schedule_records, settle  # noqa: E402
from hushnet.families.gossip.operator import settle_run  # noqa: E402
from hushnet.runs import local_net  # noqa: E402

pytestmark = [pytest.mark.integration]

N = 12
GRAPH = "grid:3x4"
D = 3


def _curves_close(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.allclose(a, b, rtol=1e-9, atol=1e-12))


@pytest.mark.timeout(200)
def test_muffliato_network_parity_dropouts_and_stopped_node(tmp_path: pathlib.Path) -> None:
    rng = np.random.default_rng(7)
    values = [rng.random(D) for _ in range(N)]

    async def go():
        async with local_net.network(tmp_path, GRAPH, N, values=values, base_ip=120) as net:
            ids = [nd.node_id for nd in net.ordered]
            svcs = [net.svc_by_vertex[v] for v in range(N)]

            async def finish(run_id, vertices, timeout=90):
                await net.wait(
                    lambda: all(net.driver(v, run_id).state == "finished" for v in vertices),
                    timeout,
                    what=f"gossip run {run_id} to finish",
                )

            # ---- 1. parity, no dropouts ------------------------------------------------------------------
            sp = spec("muffliato", GRAPH, 6, 11, timeout=5.0)
            run_id = await net.client.start_run(sp)
            await finish(run_id, range(N))
            res, ms = simulate(sp, values)
            assert res.status == "finished"
            net_models = np.stack([net.driver(v, run_id).model for v in range(N)])
            np.testing.assert_allclose(net_models, res.models, rtol=0, atol=1e-12)
            srec = sim_records(ms)
            for v in range(N):
                d = net.driver(v, run_id)
                assert schedule_records(d.engine_entries) == srec[v]
                assert isinstance(d.cost, GossipCost)
                rep = d.report()
                assert rep["accounting_view"]["gossip_view"] == "neighbourhood"
                assert rep["accounting_view"]["bound"] == "certified"
                # the ledger holds the exact certified loss on the simulator's schedule (= the public one)
                assert _curves_close(
                    ledger_curves(svcs[v], ids, v), replay_curves(sp, v, ids, srec, d.cost.orders)
                )
            settled = await settle_run(net.client, run_id, ids)
            assert all(
                not s["topped_up"] and s["records_from"] == list(range(N)) for s in settled.values()
            ), settled
            assert (
                settled[ids[0]]["view"] == "neighbourhood"
                and settled[ids[0]]["bound"] == "certified"
            )

            # ---- 2. seeded dropouts at the rates of Muffliato's Table 3 (10 %, 30 %, 50 % per node and round):
            # each run finishes, equals the simulator bit for bit, and settles on the recorded schedule
            for rate, seed in ((0.1, 12), (0.3, 12), (0.5, 14)):
                sp2 = spec("muffliato", GRAPH, 8, seed, timeout=5.0, dropout=rate)
                run2 = await net.client.start_run(sp2)
                await finish(run2, range(N))
                res2, ms2 = simulate(sp2, values)
                assert res2.status == "finished"
                np.testing.assert_allclose(
                    np.stack([net.driver(v, run2).model for v in range(N)]),
                    res2.models,
                    rtol=0,
                    atol=1e-12,
                )
                srec2 = sim_records(ms2)
                assert sum(not r["up"] for recs in srec2.values() for r in recs) > 0, (
                    f"no dropout happened at {rate}"
                )
                for v in range(N):
                    assert schedule_records(net.driver(v, run2).engine_entries) == srec2[v]
                settled2 = await settle_run(net.client, run2, ids)
                assert all("error" not in s for s in settled2.values()), settled2
                differs = 0
                for v in range(N):
                    d = net.driver(v, run2)
                    replay = replay_curves(sp2, v, ids, srec2, d.cost.orders)
                    differs += not _curves_close(replay, d.cost.phase_curves.sum(axis=0))
                    proj = d.cost.phase_curves.sum(axis=0)
                    # run 2's charges = max(projection, replay of the recorded schedule) per target and order
                    charged = d.cost.charged
                    assert _curves_close(charged, np.maximum(proj, replay))
                    assert np.all(charged >= replay * (1 - 1e-9) - 1e-12)
                    spent = svcs[v].ledger.entries(run2)
                    assert spent, f"node {v} has no ledger entry for the dropout run"
                assert differs > 0, (
                    "the dropouts did not change any node's certified loss: the settlement tested nothing"
                )
                assert any(s["topped_up"] for s in settled2.values()) == any(
                    np.any(
                        net.driver(v, run2).cost.charged
                        > net.driver(v, run2).cost.phase_curves.sum(axis=0) * (1 + 1e-9)
                    )
                    for v in range(N)
                )

            # ---- 3. a node stopped mid-run ----------------------------------------------------------------
            sp3 = spec("muffliato", GRAPH, 10, 13, timeout=1.0, give_up_after=2)
            gone = 5
            run3 = await net.client.start_run(sp3)
            await net.wait(
                lambda: net.driver(gone, run3).machine.t >= 2, 60, what="node 5 to reach round 2"
            )
            stopped = next(nd for nd in net.nodes if nd.identity.vertex == gone)
            await stopped.stop(grace=0.0)
            alive = [v for v in range(N) if v != gone]
            await finish(run3, alive, timeout=120)
            nbrs = [
                v for v in alive if gone in net.driver(v, run3).machine.topo.neighbour_set(v, 0)
            ]
            for v in nbrs:
                devs = net.driver(v, run3).deviations
                assert any(
                    dv["reason"] == "neighbour-gone" and dv["detail"]["neighbour"] == gone
                    for dv in devs
                ), devs
                assert gone in net.driver(v, run3).finish_result["gone"]
            # the operator cannot reach node 5: settling without its records is refused with a reason
            live_ids = [ids[v] for v in alive]
            partial = await settle_run(net.client, run3, live_ids)
            assert all(
                "error" in s and "records of vertices [5]" in s["error"] for s in partial.values()
            ), partial
            # with node 5's records (its state survives the stop), every live ledger settles exactly
            recs = {v: schedule_records(net.driver(v, run3).engine_entries) for v in range(N)}
            assert (
                len(recs[gone]) >= 2
            )  # its machine kept its own clock after the transport stopped
            for v in alive:
                d = net.driver(v, run3)
                out = settle(d, recs)
                replay = replay_curves(sp3, v, ids, recs, d.cost.orders)
                assert _curves_close(
                    d.cost.charged, np.maximum(d.cost.phase_curves.sum(axis=0), replay)
                ), out
                assert out["records_from"] == list(range(N))

    asyncio.run(go())
