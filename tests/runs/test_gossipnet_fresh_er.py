"""Muffliato-GD with a fresh Erdős–Rényi graph per step ([M] Fig. 1c) over a real network of 6 nodes.

Only possible when every ER edge is a network link: the network is ``complete:6``, every node draws the
same public step graphs (a subgraph of its links) and its rounds of step r use graph r.  Checks: the
run finishes; every node's model equals the simulator's to 1e-12 and so do the recorded rows (each
round's row is supported on that step's graph, and the steps' graphs differ); every persistent ledger
holds exactly the certified projection, which is the exact accountant on the per-step graphs; the
settlement tops nothing up.  The same spec on a non-complete network is refused with the reason.
"""

from __future__ import annotations

import asyncio
import pathlib
from dataclasses import replace

import numpy as np
import pytest
from helpers.gossipnet import ledger_curves, replay_curves, sim_records, spec  # noqa: E402

from hushnet.families.gossip.accounting import (  # noqa: E402
    GossipCost,
    certified_sensitivities,
    check_network_spec,
)
from hushnet.families.gossip.build import build_gossip_machines, run_gossip  # noqa: E402
from hushnet.families.gossip.node import schedule_records  # noqa: E402
from hushnet.families.gossip.operator import settle_run  # noqa: E402
from hushnet.families.gossip.params import gossip_params  # noqa: E402
from hushnet.families.gossip.realised import gd_sensitivity  # noqa: E402
from hushnet.families.gossip.schedule import public_schedule, round_matrices, topology  # noqa: E402
from hushnet.protocols.registry import transition_matrix  # noqa: E402
from hushnet.runs import local_net  # noqa: E402
from hushnet.tasks.registry import make_task  # noqa: E402

pytestmark = [pytest.mark.integration]

N = 6
GRAPH = f"complete:{N}"


def _er_spec(graph: str = GRAPH):
    sp = spec("muffliato-gd", graph, 3, 41, sigma=2.0, task="logreg", K=2, timeout=5.0)
    return replace(
        sp, protocol_params={**sp.protocol_params, "graph": "er-per-step", "q": 0.5}, run_id=""
    ).with_run_id()


def _shards(seed: int):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(1)
    out = []
    for _ in range(N):
        X = rng.standard_normal((6, 1))
        X /= np.linalg.norm(X, axis=1, keepdims=True)
        out.append((X, np.where(X @ w > 0, 1.0, -1.0)))
    return out


def test_fresh_er_needs_a_complete_topology() -> None:
    assert check_network_spec(_er_spec()) is None
    why = check_network_spec(_er_spec(f"ring:{N}"))
    assert (
        why is not None
        and "needs a complete network topology" in why
        and "outside the network's links" in why
    )


def test_fresh_er_accountant_is_the_exact_one_on_the_step_graphs() -> None:
    sp = _er_spec()
    W = transition_matrix(GRAPH, sp.weights)
    Ws = round_matrices(sp, W)
    assert len(Ws) == 3 * 2
    topo = topology(sp, W)
    graphs = [topo.graph(r).toarray() for r in range(3)]
    assert any(not np.array_equal(graphs[0], g) for g in graphs[1:]), (
        "the step graphs are all the same"
    )
    assert all(g.sum() < N * (N - 1) for g in graphs), (
        "a step graph is the complete graph: nothing is tested"
    )
    sched = public_schedule(Ws, 6)
    for u in (0, 3):
        row = certified_sensitivities(sp, u, W)[0]
        want = [
            gd_sensitivity(sched, u, v, [[0, 1], [2, 3], [4, 5]], [np.ones(6)] * 3)["value"]
            if v != u
            else 0.0
            for v in range(N)
        ]
        np.testing.assert_allclose(row, want, rtol=1e-12, atol=1e-15)
        # not the fixed complete graph's value
        fixed = replace(
            sp,
            protocol_params={
                k: v for k, v in sp.protocol_params.items() if k not in ("graph", "q")
            },
        )
        assert not np.allclose(row, certified_sensitivities(fixed, u, W)[0])


@pytest.mark.timeout(200)
def test_fresh_er_muffliato_gd_over_the_network(tmp_path: pathlib.Path) -> None:
    shards = _shards(5)
    sp = _er_spec()

    async def go():
        async with local_net.network(tmp_path, GRAPH, N, shards=shards, base_ip=195) as net:
            ids = [nd.node_id for nd in net.ordered]
            run_id = await net.client.start_run(sp)
            await net.wait(
                lambda: all(
                    net.driver(v, run_id) is not None and net.driver(v, run_id).state == "finished"
                    for v in range(N)
                ),
                90,
                what="fresh-ER Muffliato-GD run to finish",
            )
            drivers = [net.driver(v, run_id) for v in range(N)]
            ledgers = [ledger_curves(net.svc_by_vertex[v], ids, v) for v in range(N)]
            settled = await settle_run(net.client, run_id, ids)
            return ids, drivers, ledgers, settled

    ids, drivers, ledgers, settled = asyncio.run(go())
    tasks = [make_task(sp.task, {"X": X, "y": y}, sp.task_kwargs()) for X, y in shards]
    W = transition_matrix(GRAPH, sp.weights)
    ms = build_gossip_machines(
        sp.protocol,
        tasks,
        run_seed=sp.seed,
        run_id=sp.run_id,
        params=gossip_params(sp),
        W=W,
        view_model=sp.view_model,
    )
    res = run_gossip(ms)
    assert res.status == "finished"
    net_models = np.stack([d.model for d in drivers])
    assert np.all(np.isfinite(net_models))
    np.testing.assert_allclose(net_models, res.models, rtol=0, atol=1e-12)
    srec = sim_records(ms)
    topo = topology(sp, W)
    for v, d in enumerate(drivers):
        mine = schedule_records(d.engine_entries)
        assert mine == srec[v]
        for r in mine:  # each round mixed over that step's ER graph only
            assert {int(j) for j in r["row"]} == {int(j) for j in topo.neighbours(v, r["round"])}
        assert isinstance(d.cost, GossipCost)
        proj = d.cost.phase_curves.sum(axis=0)
        assert proj.any()
        np.testing.assert_allclose(ledgers[v], proj, rtol=1e-9, atol=1e-15)
        np.testing.assert_allclose(
            replay_curves(sp, v, ids, srec, d.cost.orders), proj, rtol=1e-9, atol=1e-12
        )
    assert all("error" not in s and not s["topped_up"] for s in settled.values()), settled
