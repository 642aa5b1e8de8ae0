"""Durable walk runs (issue 14): real node processes, mutual TLS on 127.0.0.x, ``kill -9``.

1. The token's holder is SIGKILLed mid-walk and restarted on its state directory: it takes the run
   up from its checkpoint and the run finishes with the *same model as the simulator* (public-seed
   noise: bit-identical) and every node's ledger holds exactly the simulator's number of charges —
   no token lost, no contribution charged twice.  (Before: "running 572/2700" forever.)
2. The holder never comes back: ``watch`` ends with ``holder-lost`` naming it, ``run list`` shows it,
   ``resume`` continues the walk from the last durable copy, and the close tops every node up to
   the local-DP bound; the dead node is reported as not yet accounted.
"""

from __future__ import annotations

import pathlib
import time

import numpy as np
import pytest
from helpers.runs import cluster, synthetic_shards, wait_for  # noqa: E402

from hushnet.client import Client  # noqa: E402
from hushnet.privacy.ledger import Ledger  # noqa: E402
from hushnet.protocols.registry import build_from_spec  # noqa: E402
from hushnet.runs.spec import Budget, RunSpec  # noqa: E402
from hushnet.sim import Simulator  # noqa: E402
from hushnet.tasks import LogisticRegressionTask  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

N = 4
GRAPH = "hypercube:2"


def spec_for(**kw) -> RunSpec:
    base = dict(
        protocol="rw-dpsgd",
        task="logreg",
        graph=GRAPH,
        steps=1500,
        seed=5,
        budget=Budget(1e6, 1e-5),
        sigma=0.3,
        clip=1.0,
        step_size=0.05,
        cap=None,
        noise="public-seed",
        on_peer_down="pause",
    )
    base.update(kw)
    return RunSpec(**base).with_run_id()


def holder_now(c: Client, run_id: str) -> tuple[str, int]:
    """The node that has most recently accepted the token (highest processed step), and that step."""
    st = {i: s for i, s in c.statuses(run_id).items() if isinstance(s, dict)}
    best = max(st.values(), key=lambda s: (s.get("token") or {}).get("last_step", -1))
    return best["node"], (best.get("token") or {}).get("last_step", -1)


def data_charges(state: pathlib.Path, node: str, run_id: str) -> int:
    led = Ledger(state / "nodes" / node / "privacy_ledger.sqlite")
    try:
        return sum(1 for e in led.entries(run_id) if not e["note"].startswith("deviation top-up"))
    finally:
        led.close()


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    state = tmp_path_factory.mktemp("durable-net")
    shards, _ = synthetic_shards(N, per_node=20, d=4, seed=1)
    with cluster(state, N, GRAPH, shards, epsilon=1e6, delta=1e-5) as c:
        client = Client(state)
        try:
            yield {"state": state, "cluster": c, "client": client, "shards": shards}
        finally:
            client.close()


def test_holder_killed_and_restarted_finishes_identically(net):
    c: Client = net["client"]
    cl = net["cluster"]
    spec = spec_for()
    run_id = c.start_run(spec)
    wait_for(lambda: holder_now(c, run_id)[1] > 200, timeout=60, every=0.05)
    victim_id, at = holder_now(c, run_id)
    victim = cl.nodes[int(victim_id[1:])]
    victim.proc.kill()  # SIGKILL
    victim.proc.wait(timeout=10)
    time.sleep(1.0)
    victim.spawn()  # same state directory
    out = c.watch(run_id, progress=False, timeout=240, pause_timeout=60)
    assert out.state == "finished", out
    assert out.step == spec.steps
    st = c.statuses(run_id)[victim_id]
    assert st["restored"] >= 1, st
    w_net = c.model(run_id)

    tasks = [LogisticRegressionTask(X, y, clip=1.0) for X, y in net["shards"]]
    sim = Simulator(build_from_spec(spec, tasks)).run()
    assert sim.status == "finished"
    np.testing.assert_allclose(w_net, sim.model, rtol=0, atol=1e-12)
    counts = sim.ledger_counts("gradient")
    got = [data_charges(net["state"], f"n{v}", run_id) for v in range(N)]
    assert got == [int(counts[v]) for v in range(N)], (got, counts, victim_id, at)


def test_holder_never_back_is_reported_and_resumed(net):
    c: Client = net["client"]
    cl = net["cluster"]
    spec = spec_for(seed=6, steps=3000, noise="secret")
    run_id = c.start_run(spec)
    wait_for(lambda: holder_now(c, run_id)[1] > 200, timeout=60, every=0.05)
    victim_id, _ = holder_now(c, run_id)
    victim = cl.nodes[int(victim_id[1:])]
    victim.proc.kill()
    victim.proc.wait(timeout=10)
    try:
        out = c.watch(run_id, progress=False, timeout=120, pause_timeout=8)
        if (
            out.state == "holder-lost"
        ):  # it held the token (acknowledged): named, with the copy's place
            assert victim_id in out.reason and out.lost_holder["holder"] == victim_id, out
            rows = {r["run_id"]: r for r in c.list_runs()}
            assert rows[run_id]["state"] == "holder-lost", rows[run_id]
        else:  # it died before acknowledging: its sender pauses on it, naming it
            assert out.state == "paused" and victim_id in out.reason, out
        r = c.resume(run_id)
        assert r["lost"] == victim_id, r
        out2 = c.watch(run_id, progress=False, timeout=240, pause_timeout=30)
        assert out2.state == "finished", out2
        assert out2.step == spec.steps
        assert any(d.get("reason") == "holder-lost" for d in out2.deviations), out2.deviations
        # the dead node's top-up is owed, and said so
        assert victim_id in out2.unaccounted, out2
        rep = c.report(run_id)
        for node, r in rep.per_node.items():
            if node != victim_id:
                assert r.get("deviation_accounted") is True, (node, r)
    finally:
        victim.spawn()
    # when it comes back, it has the run (durable), and a close reaches it: the top-up is applied once
    wait_for(lambda: isinstance(c.statuses(run_id).get(victim_id), dict), timeout=90, every=0.5)
    assert c.close_run(run_id, deviated=True) == {}
    st = c.statuses(run_id)[victim_id]
    assert st["deviation_accounted"] is True, st
    before = data_charges(net["state"], victim_id, run_id)
    assert c.close_run(run_id, deviated=True) == {}
    led = Ledger(net["state"] / "nodes" / victim_id / "privacy_ledger.sqlite")
    try:
        tops = [e for e in led.entries(run_id) if e["note"].startswith("deviation top-up")]
    finally:
        led.close()
    assert len(tops) <= 1 and data_charges(net["state"], victim_id, run_id) == before


def test_seeded_kills_and_restarts_leave_the_walk_exact(net):
    """A seeded chaos driver SIGKILLs and restarts random nodes (holders or not) during one walk: the run
    finishes with the simulator's model bit for bit, and every node's ledger holds exactly the
    realised schedule's charges (the simulator's replay of the same seeded walk)."""
    c: Client = net["client"]
    cl = net["cluster"]
    rng = np.random.default_rng(2024)
    spec = spec_for(seed=9, steps=2500)
    run_id = c.start_run(spec)
    kills = []
    for _ in range(3):
        target = 150 + int(rng.integers(0, 400)) + (kills[-1][1] if kills else 0)
        wait_for(lambda: holder_now(c, run_id)[1] >= target, timeout=120, every=0.05)
        victim = cl.nodes[int(rng.integers(0, N))]
        victim.proc.kill()
        victim.proc.wait(timeout=10)
        kills.append((victim.name, holder_now(c, run_id)[1]))
        time.sleep(float(rng.uniform(0.2, 1.5)))
        victim.spawn()
    out = c.watch(run_id, progress=False, timeout=300, pause_timeout=60)
    assert out.state == "finished" and out.step == spec.steps, (out, kills)
    tasks = [LogisticRegressionTask(X, y, clip=1.0) for X, y in net["shards"]]
    sim = Simulator(build_from_spec(spec, tasks)).run()
    np.testing.assert_allclose(c.model(run_id), sim.model, rtol=0, atol=1e-12)
    counts = sim.ledger_counts("gradient")
    got = [data_charges(net["state"], f"n{v}", run_id) for v in range(N)]
    assert got == [int(counts[v]) for v in range(N)], (got, counts, kills)
