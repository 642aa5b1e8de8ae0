"""Hitting times recorded by a real-network ``anon-walk-sgd`` run follow the simulator's law.

16 real in-process nodes (mutual TLS, own keys) on a random 3-regular graph run the sealed-token walk
for a few dozen model updates; the (source, destination, hops) samples come from the nodes' own event
streams (:func:`hushnet.families.anonymity.operator.walk_iterations`).  They must form one chain (each destination is
the next source), respect the distance band and ``hops ≥ distance``, and the hop counts must be
consistent with the simulator's machines on the same public setup: a two-sample KS test with a fixed,
generous threshold (p > 1e-3; the walk's draws come from the OS CSPRNG, so the sample is random).  A
hop-counting bug (a relay counted twice, an update counted as a hop) shifts the law by far more than
this test tolerates at this sample size.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import uvloop
from scipy import stats

from hushnet.families.anonymity.anonymous_walk import AnonWalkParams, build_walk, iterations
from hushnet.families.anonymity.operator import walk_iterations
from hushnet.runs import local_net
from hushnet.runs.spec import Budget, RunSpec
from hushnet.runs.synthetic import planted_logistic_shards
from hushnet.sim.simulator import Simulator
from hushnet.tasks.logistic import LogisticRegressionTask

GRAPH, N, ELL1, ELL2 = "regular:16:3:3", 16, 2, 4


def _simulated_hops(setup) -> np.ndarray:
    rng = np.random.default_rng(0)
    tasks = [
        LogisticRegressionTask(
            rng.standard_normal((4, 2)), np.where(rng.random(4) > 0.5, 1.0, -1.0)
        )
        for _ in range(setup.n)
    ]
    params = AnonWalkParams(
        updates_per_node=10**9, step_size=0.05, sigma=1.0, cell_body=256, reliable=False
    )
    ms, _ = build_walk(setup, tasks, params, run_seed=3, secret_seed=11)
    # ≈ 1000 samples (deterministic: seeded), 3.4 s of CPU; the KS test's power is set by the network's
    # ≈ 64 samples, and 60 000 events (2434 samples, 6.5 s) timed the test out under a loaded CI
    res = Simulator(ms, latency=1e-3).run(max_events=25_000)
    return iterations(res.metrics, start=0)["hops"]


@pytest.mark.timeout(180)  # a hang guard: the walk's own bound is the 90 s wait below
def test_network_hitting_times_match_the_simulator(tmp_path: pathlib.Path) -> None:
    async def go():
        async with local_net.network(
            tmp_path, GRAPH, N, shards=planted_logistic_shards(N, m=6, d=3, seed=2), base_ip=225
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
                    "updates_per_node": 4,
                    "ell1": ELL1,
                    "ell2": ELL2,
                    "cell_body": 1024,
                },
            ).with_run_id()
            run_id = await net.client.start_run(spec)
            drivers = {v: net.driver(v, run_id) for v in range(N)}
            await net.wait(
                lambda: any(d.state == "finished" for d in drivers.values()),
                90,
                what="the walk to end",
            )
            it = walk_iterations([d.events for d in drivers.values()], spec.start)
            return it, drivers[0].machine.setup, sum(d.machine.updates for d in drivers.values())

    it, setup, updates = uvloop.run(go())
    src, dst, hops = it["source"], it["destination"], it["hops"]
    assert src.size == updates >= 10
    assert src[0] == 0 and np.array_equal(
        src[1:], dst[:-1]
    )  # one chain: each destination is the next source
    d = setup.dist[src, dst]
    assert np.all((d >= ELL1) & (d <= ELL2)) and np.all(hops >= d)
    sim = _simulated_hops(setup)
    assert sim.size > 500
    ks = stats.ks_2samp(hops, sim)
    assert ks.pvalue > 1e-3, (ks, hops.mean(), sim.mean())
