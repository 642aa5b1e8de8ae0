"""Randomized Muffliato ([M] Alg. 2) over a real in-process network of 8 nodes (mutual TLS on 127.0.0.x).

The activations are a seeded PUBLIC schedule of the network's own edges; each activation is one
pairwise exchange over the real link.  Checks, on one network:

* parity: same seed → every node's estimate equals the simulator's to 1e-12, the recorded activations
  equal the simulator's, every persistent ledger holds exactly the certified projection on the public
  schedule (which equals the accountant's replay of the records) and the settlement tops nothing up;
* a node stopped mid-run: the others finish, its partners skip their activations with it (recorded as
  not used, an ``activation-timeout`` deviation, then ``neighbour-gone``) and only those (live partners
  held up by it heartbeat: no cascade), settling without its records is refused with a reason, and with
  them every ledger is topped up to max(projection, replay).
"""

from __future__ import annotations

import asyncio
import pathlib

import numpy as np
import pytest
from helpers.gossipnet import ledger_curves, noisy_inputs, replay_curves, simulate, spec  # noqa: E402

from hushnet.families.gossip.accounting import GossipCost, check_network_spec, pairwise_row  # noqa: E402
from hushnet.families.gossip.node import schedule_records, settle  # noqa: E402
from hushnet.families.gossip.operator import settle_run  # noqa: E402
from hushnet.families.gossip.schedule import (  # noqa: E402
    activation_schedule,
    public_activations,
    realised_activations,
)
from hushnet.protocols.registry import transition_matrix  # noqa: E402
from hushnet.runs import local_net  # noqa: E402

pytestmark = [pytest.mark.integration]

N = 8
GRAPH = "hypercube:3"
D = 2


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.allclose(a, b, rtol=1e-9, atol=1e-12))


def test_randomized_refuses_the_aggregate_view_and_round_options() -> None:
    why = check_network_spec(spec("muffliato-randomized", GRAPH, 10, 1, view="aggregate"))
    assert why is not None and "no neighbourhood sum" in why
    why = check_network_spec(spec("muffliato-randomized", GRAPH, 10, 1, dropout=0.3))
    assert why is not None and "no simulated dropouts" in why


def test_realised_activations_complete_a_crash_safely() -> None:
    sp = spec("muffliato-randomized", GRAPH, 30, 22)
    W = transition_matrix(GRAPH, "hamilton")
    sched = activation_schedule(sp, W)
    pub = public_activations(sched)
    full = {
        v: [
            {"round": t, "partner": r[v]["partner"], "used": True, "sent": True}
            for t, r in sorted(pub.items())
            if v in r
        ]
        for v in range(N)
    }
    rec, completed = realised_activations(sp, full, W)
    assert rec == pub and completed == {}
    # node 5 crashed after its first activation: its next one is completed as "sent", and its partner's
    # record there says not used; the replay never under-counts the bare records (views only grow)
    crashed = {**full, 5: full[5][:1]}
    t1 = full[5][1]["round"]
    p1 = full[5][1]["partner"]
    crashed[p1] = [dict(r, used=False) if r["round"] == t1 else r for r in full[p1]]
    rec, completed = realised_activations(sp, crashed, W)
    assert completed == {5: t1} and rec[t1][5] == {"partner": p1, "used": False, "sent": True}
    bare = {
        t: {v: r for v, r in ends.items() if not (v == 5 and t == t1)} for t, ends in rec.items()
    }
    for u in range(N):
        assert np.all(pairwise_row(sp, u, W, rec) >= pairwise_row(sp, u, W, bare) - 1e-12)
    # a value a partner used was sent, whatever the sender recorded
    lying = {**full, 0: [dict(r, sent=False) for r in full[0]]}
    rec, _ = realised_activations(sp, lying, W)
    assert all(rec[r["round"]][0]["sent"] for r in full[0])
    # records that are not a prefix of the node's public activations are refused
    with pytest.raises(ValueError, match="not a prefix"):
        realised_activations(sp, {**full, 3: full[3][1:]}, W)


@pytest.mark.timeout(200)
def test_randomized_muffliato_network_parity_and_stopped_node(tmp_path: pathlib.Path) -> None:
    rng = np.random.default_rng(3)
    values = [rng.random(D) for _ in range(N)]

    gone = 5
    stop_in: dict[
        str, object
    ] = {}  # run id -> None until node 5 was told to stop (then its stop task)

    def observe(nd, svc):
        """Node 5 stops itself (its real transport) once it has averaged its first activation of the run
        named in ``stop_in``: a deterministic "mid-run", whatever the speed of the machine."""
        if (
            nd.config.node_id != f"n{gone}"
        ):  # before start: the identity (and nd.node_id) is not set yet
            return None
        inner = svc.handle

        def handle(envelope):
            out = inner(envelope)
            run = svc.runs.get(envelope.run_id)
            if (
                envelope.run_id in stop_in
                and stop_in[envelope.run_id] is None
                and run.machine.ptr >= 1
            ):
                stop_in[envelope.run_id] = asyncio.get_running_loop().create_task(
                    nd.stop(grace=0.0)
                )
            return out

        svc.handle = handle
        return None

    async def go():
        async with local_net.network(
            tmp_path, GRAPH, N, values=values, base_ip=180, observe=observe
        ) as net:
            ids = [nd.node_id for nd in net.ordered]
            svcs = [net.svc_by_vertex[v] for v in range(N)]

            async def finish(run_id, vertices, timeout=90):
                await net.wait(
                    lambda: all(
                        net.driver(v, run_id) is not None
                        and net.driver(v, run_id).state == "finished"
                        for v in vertices
                    ),
                    timeout,
                    what=f"randomized run {run_id} to finish",
                )

            # ---- 1. parity with the simulator, no dropout ------------------------------------------------
            sp = spec("muffliato-randomized", GRAPH, 40, 21, timeout=5.0)
            run_id = await net.client.start_run(sp)
            await finish(run_id, range(N))
            res, _ = simulate(sp, values)
            assert res.status == "finished"
            np.testing.assert_allclose(
                np.stack([net.driver(v, run_id).model for v in range(N)]),
                res.models,
                rtol=0,
                atol=1e-12,
            )
            # the activations really mixed: pairwise averages keep the sum and shrink the spread
            noisy = noisy_inputs(sp, values)
            np.testing.assert_allclose(
                res.models.sum(axis=0), noisy.sum(axis=0), rtol=1e-12, atol=1e-12
            )
            assert np.var(res.models, axis=0).sum() < 0.5 * np.var(noisy, axis=0).sum()
            srec = {v: schedule_records(res.sim.ledgers[v]) for v in range(N)}
            assert sum(len(r) for r in srec.values()) >= 2 * 20, (
                "too few activations: the test checks little"
            )
            for v in range(N):
                d = net.driver(v, run_id)
                mine = schedule_records(d.engine_entries)
                assert mine == srec[v] and all(r["used"] and r["sent"] for r in mine)
                assert isinstance(d.cost, GossipCost)
                proj = d.cost.phase_curves.sum(axis=0)
                assert proj.any()
                assert _close(ledger_curves(svcs[v], ids, v), proj)
                assert _close(replay_curves(sp, v, ids, srec, d.cost.orders), proj)
                assert d.report()["accounting_view"]["bound"] == "certified"
            settled = await settle_run(net.client, run_id, ids)
            assert all(
                "error" not in s and not s["topped_up"] and s["records_from"] == list(range(N))
                for s in settled.values()
            ), settled

            # ---- 2. a node stopped mid-run ----------------------------------------------------------------
            sp2 = spec("muffliato-randomized", GRAPH, 30, 22, timeout=1.0, give_up_after=2)
            stop_in[sp2.run_id] = None
            run2 = await net.client.start_run(sp2)
            assert run2 == sp2.run_id
            await net.wait(
                lambda: stop_in[run2] is not None, 60, what="node 5 to stop after an activation"
            )
            await stop_in[run2]
            alive = [v for v in range(N) if v != gone]
            await finish(run2, alive, timeout=120)
            recs = {v: schedule_records(net.driver(v, run2).engine_entries) for v in range(N)}
            skipped = [
                (v, r) for v in alive for r in recs[v] if r["partner"] == gone and not r["used"]
            ]
            assert skipped, (
                "no activation with the stopped node was skipped: the test checks nothing"
            )
            # heartbeats: a live partner held up by the dead node is slow, not silent — no cascade of skips
            assert all(r["used"] for v in alive for r in recs[v] if r["partner"] != gone), [
                (v, r) for v in alive for r in recs[v] if r["partner"] != gone and not r["used"]
            ]
            for v in {v for v, _ in skipped}:
                devs = net.driver(v, run2).deviations
                assert any(
                    dv["reason"] in ("activation-timeout", "neighbour-gone") for dv in devs
                ), devs
            partial = await settle_run(net.client, run2, [ids[v] for v in alive])
            assert all(
                "error" in s and "records of vertices [5]" in s["error"] for s in partial.values()
            ), partial
            differs = 0
            for v in alive:
                d = net.driver(v, run2)
                out = settle(d, recs)
                proj = d.cost.phase_curves.sum(axis=0)
                replay = replay_curves(sp2, v, ids, recs, d.cost.orders)
                assert _close(d.cost.charged, np.maximum(proj, replay)), out
                # the persistent ledger: run 1's projection plus run 2's projection and top-up
                first = net.driver(v, run_id).cost.phase_curves.sum(axis=0)
                assert _close(ledger_curves(svcs[v], ids, v), first + d.cost.charged)
                assert out["records_from"] == list(range(N)) and out["bound"] == "certified"
                differs += not _close(replay, proj)
            assert differs > 0, (
                "the skipped activations changed nobody's certified loss: the settlement tested nothing"
            )

    asyncio.run(go())
