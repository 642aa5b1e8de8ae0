"""P-AD sums and histograms over a real local network (6 node processes, mutual TLS on 127.0.0.x).

Each of the four protocols finishes, its result equals the simulator's exactly (public-seed noise),
every node's ledger is charged what it projected (count × the certified per-contribution curve),
and a node whose budget is too small refuses with the reason.
"""
from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from runs_helpers import cluster  # noqa: E402

from node.client import Client, RunRefusedError  # noqa: E402
from node.protocols.registry import build_from_spec  # noqa: E402
from node.runs.accounting import dp_from_rdp  # noqa: E402
from node.runs.pad_runs import contributions, pad_cost, pad_projector  # noqa: E402
from node.runs.policy import NodePolicy, load_task  # noqa: E402
from node.runs.spec import Budget, RunSpec  # noqa: E402
from node.sim import Simulator  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

N = 6
VALUES = [0, 3, 1, 2, 2, 1]  # one value per node: a scalar for the sums, a bin for the histograms
IDS = [f"n{i}" for i in range(N)]


def spec_for(protocol: str, **kw) -> RunSpec:
    ring = protocol.startswith("pad-ring-")
    base: dict = dict(protocol=protocol, graph=f"ring:{N}" if ring else f"complete:{N}", seed=5,
                      budget=Budget(1e4, 1e-5), noise="public-seed")
    if ring:
        base.update(rounds=3, steps=0)
    else:
        base.update(steps=40)
    if protocol.endswith("-sum"):
        base.update(task="sum", task_params={"lo": 0.0, "hi": 4.0}, sigma=1.5)
    else:
        base.update(task="histogram", task_params={"bins": 4}, gamma=0.3)
    base.update(kw)
    return RunSpec(**base).with_run_id()


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    state = tmp_path_factory.mktemp("pad-net")
    shards = [(np.array([[float(v)]]), np.zeros(1)) for v in VALUES]
    with cluster(state, N, f"complete:{N}", shards, epsilon=1e4, delta=1e-5) as c:
        client = Client(state)
        try:
            yield {"state": state, "client": client}
        finally:
            client.close()


def _tasks(state: pathlib.Path, spec: RunSpec):
    """Each node's task exactly as the node builds it from its own data file."""
    return [load_task(spec, NodePolicy(None, state / "nodes" / f"n{i}" / "data.npz")) for i in range(N)]


@pytest.mark.parametrize("protocol", ["pad-ring-sum", "pad-ring-histogram", "pad-complete-sum", "pad-complete-histogram"])
def test_pad_run_over_the_network_equals_the_simulator(net, protocol):
    c: Client = net["client"]
    spec = spec_for(protocol)
    run_id = c.start_run(spec)
    out = c.watch(run_id, progress=False, timeout=120)
    assert out.state == "finished", out
    total = spec.total_steps()
    assert out.step == total and out.holder is not None
    got = c.model(run_id)

    sim = Simulator(build_from_spec(spec, _tasks(net["state"], spec))).run()
    assert sim.status == "finished"
    np.testing.assert_allclose(got, sim.model, rtol=0, atol=1e-12)
    assert f"n{sim.finish.node}" == out.holder
    if protocol == "pad-ring-sum":
        assert out.holder == f"n{N - 1}"  # the directed ring in vertex order ends at the last vertex

    rep = c.report(run_id)
    held = rep.per_node[out.holder]["result"]
    assert np.allclose(held["estimate"], np.asarray(sim.finish.result["estimate"]), rtol=0, atol=1e-12)
    kind = "value" if protocol.endswith("-sum") else "rr"
    counts = sim.ledger_counts(kind)
    assert counts.sum() == total
    for v in range(N):
        r = rep.per_node[IDS[v]]
        assert r["contributions"] == counts[v]
        cost = pad_cost(spec, v, IDS)
        curve = cost.curves() * counts[v]
        for j, t in enumerate(cost.targets):
            assert r["certified"][t] == pytest.approx(dp_from_rdp(cost.orders, curve[j], spec.budget.delta), rel=1e-12)
        assert r["certified_bound"] == cost.bound_name
        assert "NOT private" in r["noise_source"]
        if protocol.startswith("pad-ring-"):
            # exactly K contributions: charged = projected, target by target
            assert counts[v] == spec.rounds
            for t, e in r["projected"].items():
                assert r["certified"][t] == pytest.approx(e, rel=1e-9)
        else:
            assert counts[v] <= contributions(spec, N)[0]
            assert all(r["certified"][t] <= e * (1 + 1e-9) for t, e in r["projected"].items())


def test_pad_budget_too_small_is_refused_with_the_reason(net):
    c: Client = net["client"]
    n3 = net["state"] / "nodes" / "n3"
    NodePolicy.write(n3, epsilon=0.5, delta=1e-5, data_path="data.npz")
    try:
        spec = spec_for("pad-ring-sum", seed=6)
        with pytest.raises(RunRefusedError) as ei:
            c.start_run(spec)
        d = ei.value.decisions
        assert not d["n3"]["accept"] and "over budget" in d["n3"]["reason"] and "Thm 1" in d["n3"]["reason"]
        assert all(d[i]["accept"] for i in IDS if i != "n3")
    finally:
        NodePolicy.write(n3, epsilon=1e4, delta=1e-5, data_path="data.npz")


def test_ring_sum_refuses_deviation_and_undeclared_dimension():
    """No network needed: the projector's refusals are pure functions of the public spec."""
    dec = pad_projector(spec_for("pad-ring-sum", on_peer_down="deviate"), 0, None)
    assert not dec.accept and "deviate" in dec.reason
    # the certified ring row is the Gaussian mechanism composed K times: K·α·Δ²/(2σ²) at every order
    spec = spec_for("pad-ring-sum")
    cost = pad_cost(spec, 0, IDS)
    np.testing.assert_allclose(cost.curves()[0] * spec.rounds, spec.rounds * cost.orders * 16.0 / (2 * 1.5**2))
    dec = pad_projector(spec, 2, None)
    assert dec.accept and dec.epsilon_row[2] == 0.0 and np.all(dec.epsilon_row[[0, 1, 3, 4, 5]] > 0)
