"""Muffliato-GD and streaming gossip DP-GD over a real in-process network of 8 nodes (mutual TLS).

One network, two runs with a tiny logistic model (d = 3) and reproducible noise (``public-seed``):

* Muffliato-GD ([M] Alg. 3): 3 noisy gradient steps, K = 2 gossip rounds each;
* streaming gossip ([K] §5): 5 rounds, fresh noise every round, ``θ ← W(θ + x + u)``.

Each finishes; every node's model equals the simulator's (same seeds, same public parameters) to
1e-12 and so do the recorded schedules; every persistent ledger holds exactly the projected certified
curves (no dropout: the realised schedule is the public one) and the settlement tops nothing up.
"""
from __future__ import annotations

import asyncio
import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from gossipnet_helpers import ledger_curves, sim_records, spec  # noqa: E402

from node.protocols.gossip_sim import build_gossip_machines, run_gossip  # noqa: E402
from node.protocols.registry import transition_matrix  # noqa: E402
from node.runs import local_net  # noqa: E402
from node.runs.gossip_runs import GossipCost, gossip_params, schedule_records, settle_run  # noqa: E402
from node.tasks.registry import make_task  # noqa: E402

pytestmark = [pytest.mark.integration]

N = 8
GRAPH = "hypercube:3"
D = 3


def _shards(seed: int):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(D)
    out = []
    for _ in range(N):
        X = rng.standard_normal((6, D))
        X /= np.linalg.norm(X, axis=1, keepdims=True)
        out.append((X, np.where(X @ w > 0, 1.0, -1.0)))
    return out


def _simulate(sp, shards):
    tasks = [make_task(sp.task, {"X": X, "y": y}, sp.task_kwargs()) for X, y in shards]
    W = transition_matrix(sp.graph, sp.weights)
    ms = build_gossip_machines(sp.protocol, tasks, run_seed=sp.seed, run_id=sp.run_id, params=gossip_params(sp),
                               W=W, view_model=sp.view_model)
    return run_gossip(ms), ms


@pytest.mark.timeout(200)
def test_muffliato_gd_and_streaming_gossip_over_the_network(tmp_path: pathlib.Path) -> None:
    shards = _shards(4)
    gd = spec("muffliato-gd", GRAPH, 3, 31, sigma=2.0, task="logreg", K=2, timeout=5.0)
    stream = spec("gossip-stream", GRAPH, 5, 32, sigma=2.0, task="logreg", timeout=5.0)

    async def go():
        async with local_net.network(tmp_path, GRAPH, N, shards=shards, base_ip=160) as net:
            ids = [nd.node_id for nd in net.ordered]
            out = {}
            for sp in (gd, stream):
                run_id = await net.client.start_run(sp)
                await net.wait(lambda: all(net.driver(v, run_id) is not None
                                           and net.driver(v, run_id).state == "finished" for v in range(N)),
                               90, what=f"{sp.protocol} run to finish")
                drivers = [net.driver(v, run_id) for v in range(N)]
                ledgers = [ledger_curves(net.svc_by_vertex[v], ids, v) for v in range(N)]
                settled = await settle_run(net.client, run_id, ids)
                out[sp.protocol] = (drivers, ledgers, settled)
            return out

    out = asyncio.run(go())
    for sp in (gd, stream):
        drivers, ledgers, settled = out[sp.protocol]
        res, ms = _simulate(sp, shards)
        assert res.status == "finished"
        net_models = np.stack([d.model for d in drivers])
        assert np.all(np.isfinite(net_models))
        np.testing.assert_allclose(net_models, res.models, rtol=0, atol=1e-12)
        srec = sim_records(ms)
        for v, d in enumerate(drivers):
            assert schedule_records(d.engine_entries) == srec[v], (sp.protocol, v)
            assert isinstance(d.cost, GossipCost)
            proj = d.cost.phase_curves.sum(axis=0)
            assert proj.any(), "nothing projected: the test checks nothing"
            # the persistent ledger (this node only ran these runs, GD first) holds the projection exactly
            np.testing.assert_allclose(d.cost.charged, proj, rtol=1e-12, atol=0)
        assert all("error" not in s and not s["topped_up"] for s in settled.values()), (sp.protocol, settled)
    # ledgers after both runs = the sum of both projections (each node charged exactly what it projected)
    for v in range(N):
        both = sum(out[sp.protocol][0][v].cost.phase_curves.sum(axis=0) for sp in (gd, stream))
        np.testing.assert_allclose(out[stream.protocol][1][v], both, rtol=1e-9, atol=1e-15)
        np.testing.assert_allclose(out[gd.protocol][1][v], out[gd.protocol][0][v].cost.phase_curves.sum(axis=0),
                                   rtol=1e-9, atol=1e-15)
    # GD charged one entry per step (its noisy iterate leaves once per step), streaming one for the run
    assert sum(e.uses_data for e in out[gd.protocol][0][0].engine_entries) == 3
