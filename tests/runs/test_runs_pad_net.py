"""P-AD sums and histograms, and the central DP-SGD baseline, over a real local network
(6 node processes, mutual TLS on 127.0.0.x; one cluster for both, to keep the suite's time budget).

Each of the four P-AD protocols finishes, its result equals the simulator's exactly (public-seed
noise), every node's ledger is charged what it projected (count × the certified per-contribution
curve), and a node whose budget is too small refuses with the reason.  The central baseline: the
operator's client is the trusted aggregator, the nodes answer its gradient requests over the
control channel; it trains and equals the simulator.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import numpy as np
import pytest
from helpers.runs import cluster, synthetic_shards  # noqa: E402

from hushnet.client import Client, ClientError, RunRefusedError  # noqa: E402
from hushnet.families.central.accounting import central_cost, central_projector  # noqa: E402
from hushnet.families.central.params import LABEL  # noqa: E402
from hushnet.families.pad.accounting import contributions, pad_cost, pad_projector  # noqa: E402
from hushnet.protocols.registry import build_from_spec  # noqa: E402
from hushnet.runs.accounting import dp_from_rdp  # noqa: E402
from hushnet.runs.policy import NodePolicy, load_task  # noqa: E402
from hushnet.runs.spec import Budget, RunSpec  # noqa: E402
from hushnet.sim import Simulator  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

N = 6
VALUES = [0, 3, 1, 2, 2, 1]  # one value per node: a scalar for the sums, a bin for the histograms
IDS = [f"n{i}" for i in range(N)]
REPO = pathlib.Path(__file__).resolve().parents[2]


def spec_for(protocol: str, **kw) -> RunSpec:
    ring = protocol.startswith("pad-ring-")
    base: dict = dict(
        protocol=protocol,
        graph=f"ring:{N}" if ring else f"complete:{N}",
        seed=5,
        budget=Budget(1e4, 1e-5),
        noise="public-seed",
    )
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
    with cluster(state, N, f"complete:{N}", shards, epsilon=1e4, delta=1e-5):
        client = Client(state)
        try:
            yield {"state": state, "client": client}
        finally:
            client.close()


def _tasks(state: pathlib.Path, spec: RunSpec, data: str = "data.npz"):
    """Each node's task exactly as the node builds it from its own data file."""
    return [load_task(spec, NodePolicy(None, state / "nodes" / f"n{i}" / data)) for i in range(N)]


@pytest.mark.parametrize(
    "protocol", ["pad-ring-sum", "pad-ring-histogram", "pad-complete-sum", "pad-complete-histogram"]
)
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
        assert (
            out.holder == f"n{N - 1}"
        )  # the directed ring in vertex order ends at the last vertex

    rep = c.report(run_id)
    held = rep.per_node[out.holder]["result"]
    assert np.allclose(
        held["estimate"], np.asarray(sim.finish.result["estimate"]), rtol=0, atol=1e-12
    )
    kind = "value" if protocol.endswith("-sum") else "rr"
    counts = sim.ledger_counts(kind)
    assert counts.sum() == total
    for v in range(N):
        r = rep.per_node[IDS[v]]
        assert r["contributions"] == counts[v]
        cost = pad_cost(spec, v, IDS)
        curve = cost.curves() * counts[v]
        for j, t in enumerate(cost.targets):
            assert r["certified"][t] == pytest.approx(
                dp_from_rdp(cost.orders, curve[j], spec.budget.delta), rel=1e-12
            )
        assert r["certified_bound"] == cost.bound_name
        assert r["paper_bound"] is None or r["paper_bound"].startswith(
            "paper:"
        )  # never mixed with the charge
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
        assert (
            not d["n3"]["accept"]
            and "over budget" in d["n3"]["reason"]
            and "Thm 1" in d["n3"]["reason"]
        )
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
    np.testing.assert_allclose(
        cost.curves()[0] * spec.rounds, spec.rounds * cost.orders * 16.0 / (2 * 1.5**2)
    )
    dec = pad_projector(spec, 2, None)
    assert dec.accept and dec.epsilon_row[2] == 0.0 and np.all(dec.epsilon_row[[0, 1, 3, 4, 5]] > 0)


def test_central_dpsgd_baseline_over_the_network_trains_and_equals_the_simulator(net, tmp_path):
    c: Client = net["client"]
    state = net["state"]
    shards, (Xt, yt) = synthetic_shards(N, per_node=20, d=4, seed=1)
    for i, (X, y) in enumerate(
        shards
    ):  # the nodes switch to labelled data for this run (policy read per submit)
        np.savez(state / "nodes" / f"n{i}" / "logreg.npz", X=X, y=y)
        NodePolicy.write(state / "nodes" / f"n{i}", epsilon=1e4, delta=1e-5, data_path="logreg.npz")
    try:
        spec = RunSpec(
            protocol="central-dpsgd",
            task="logreg",
            graph=f"complete:{N}",
            steps=40,
            seed=7,
            budget=Budget(1e4, 1e-5),
            sigma=0.05,
            clip=1.0,
            step_size=0.5,
            noise="public-seed",
        ).with_run_id()
        with pytest.raises(ClientError, match="run_central"):
            c.start_run(spec)  # nobody but the operator's aggregator can drive it
        o = c.run_central(spec, progress=False)
        assert o.state == "finished" and o.step == spec.steps, o
        assert "NOT decentralized" in o.label

        tasks = _tasks(state, spec, "logreg.npz")
        sim = Simulator(build_from_spec(spec, tasks)).run()
        assert sim.status == "finished"
        np.testing.assert_allclose(o.model, sim.model, rtol=0, atol=1e-12)
        np.testing.assert_array_equal(
            c.model(spec.run_id), o.model
        )  # the model lives with the operator
        assert tasks[0].evaluate(o.model, Xt, yt)["accuracy"] >= 0.85

        assert (
            c.watch(spec.run_id, progress=False, timeout=30).state == "finished"
        )  # closed everywhere = ended
        rep = c.report(spec.run_id)
        text = rep.format_table()
        assert "certified" in text and "view: central: other nodes see noisy models only" in text
        counts = np.zeros(N, dtype=int)
        for v, led in sim.ledgers.items():
            counts[v] = sum(e.kind == "gradient" for e in led)
        assert counts.sum() == spec.steps
        for v in range(N):
            r = rep.per_node[IDS[v]]
            assert r["contributions"] == counts[v] == o.requests[IDS[v]]
            assert LABEL in r["certified_bound"] and "in the clear" in r["certified_bound"]
            cost = central_cost(spec, v, IDS)
            curve = cost.curves(spec.sigma) * counts[v]
            for j, t in enumerate(cost.targets):
                assert r["certified"][t] == pytest.approx(
                    dp_from_rdp(cost.orders, curve[j], spec.budget.delta), rel=1e-12
                )
                assert r["certified"][t] <= r["projected"][t] * (1 + 1e-9)
            assert r["state"] == "closed"

        # the CLI drives the same aggregator: 'hushnet run start SPEC.toml' for a central-dpsgd spec
        spec_path = tmp_path / "central.toml"
        spec_path.write_text(f"""
[run]
protocol = "central-dpsgd"
graph = "complete:{N}"
steps = 20
sigma = 0.05
step_size = 0.5
seed = 8
[task]
name = "logreg"
[budget]
epsilon = 1000.0
delta = 1e-5
""")
        out_npy = tmp_path / "central.npy"
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "hushnet.cli",
                "run",
                "start",
                str(spec_path),
                "--state-dir",
                str(state),
                "--model-out",
                str(out_npy),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        assert "NOT decentralized" in r.stdout and "finished at step 20/20" in r.stdout, r.stdout
        assert np.load(out_npy).shape == o.model.shape
    finally:
        for i in range(N):
            NodePolicy.write(
                state / "nodes" / f"n{i}", epsilon=1e4, delta=1e-5, data_path="data.npz"
            )


def test_central_projector_refuses_over_budget_and_names_the_baseline():
    spec = RunSpec(
        protocol="central-dpsgd",
        task="logreg",
        graph=f"complete:{N}",
        steps=40,
        seed=7,
        budget=Budget(1.0, 1e-5),
        sigma=0.05,
        clip=1.0,
    ).with_run_id()
    dec = central_projector(spec, 0, None)
    assert not dec.accept and "over budget" in dec.reason and "NOT decentralized" in dec.reason
    ok = central_projector(RunSpec(**{**spec.__dict__, "sigma": 50.0, "run_id": ""}), 0, None)
    assert ok.accept and ok.epsilon_row[0] == 0.0 and ok.worst_epsilon < 1.0


@pytest.mark.parametrize("name", ["pad_ring_sum.toml", "central_baseline.toml"])
def test_examples_parse_and_fit_their_budget(name):
    from hushnet.families import family_of
    from hushnet.runs.spec import parse_spec_toml

    spec = parse_spec_toml((REPO / "examples" / name).read_text())
    dec = family_of(spec.protocol).project(spec, 0, None, None)
    assert dec.accept, dec.reason
    assert spec.noise == "secret"  # examples are private runs


def test_central_gradient_requests_replayed_or_malformed_are_refused_ledger_exact(net):
    """The node side of the baseline alone: the operator's control channel, one real request, then bad ones."""
    import base64

    from hushnet.families.central.wire import KIND_GRADIENT_REQUEST
    from hushnet.families.walk.wire import encode_token

    c: Client = net["client"]
    state = net["state"]
    shards, _ = synthetic_shards(N, per_node=10, d=4, seed=2)
    for i, (X, y) in enumerate(shards):
        np.savez(state / "nodes" / f"n{i}" / "logreg.npz", X=X, y=y)
        NodePolicy.write(state / "nodes" / f"n{i}", epsilon=1e4, delta=1e-5, data_path="logreg.npz")
    try:
        spec = RunSpec(
            protocol="central-dpsgd",
            task="logreg",
            graph=f"complete:{N}",
            steps=5,
            seed=9,
            budget=Budget(1e4, 1e-5),
            sigma=1.0,
            clip=1.0,
            step_size=0.1,
        ).with_run_id()
        _, decisions = c.submit(spec)
        assert all(d["accept"] for d in decisions.values()), decisions
        dim = decisions["n1"]["model_dim"]

        def ask(payload: bytes):
            return c._call(
                c.aio._control(
                    "n1",
                    "run.gradient",
                    {"run_id": spec.run_id, "request_b64": base64.b64encode(payload).decode()},
                )
            )

        req = encode_token(0, spec.steps, 0, N, np.zeros(dim), kind=KIND_GRADIENT_REQUEST)
        reply = ask(req)
        assert reply["node"] == "n1" and reply["reply_b64"]
        # the same request again (the operator's call failed after the node answered): the same reply,
        # not charged again; another request for the same step is a replay
        assert ask(req) == reply
        with pytest.raises(ClientError, match="(?i)replay|step 0"):
            ask(encode_token(0, spec.steps, 0, N, np.ones(dim), kind=KIND_GRADIENT_REQUEST))
        with pytest.raises(ClientError):
            ask(
                encode_token(1, spec.steps, 0, N, np.zeros(dim + 3), kind=KIND_GRADIENT_REQUEST)
            )  # wrong dimension
        st = c.statuses(spec.run_id)["n1"]
        assert st["contributions"] == 1 and st["faults"] >= 1  # one gradient left, one charge
        rep = c.report(spec.run_id).per_node["n1"]
        cost = central_cost(spec, 1, IDS)
        one = cost.curves(spec.sigma)
        for j, t in enumerate(cost.targets):  # exactly one contribution charged for this run
            assert rep["certified"][t] == pytest.approx(
                dp_from_rdp(cost.orders, one[j], spec.budget.delta), rel=1e-12
            )
    finally:
        c.cancel(spec.run_id)
        for i in range(N):
            NodePolicy.write(
                state / "nodes" / f"n{i}", epsilon=1e4, delta=1e-5, data_path="data.npz"
            )


def test_ring_charge_is_never_looser_than_thm1_it_rests_on():
    """Thm 1's argument in Rényi form vs the printed (ε, δ) advanced composition, at the same δ."""
    from hushnet.privacy.amplification import gaussian_sigma_local, ring_sum_guarantee

    for K, eps0 in ((3, 0.5), (10, 0.2), (1, 0.9)):
        d0, dp = 1e-6, 1e-6
        sigma = gaussian_sigma_local(eps0, d0, 4.0)  # Δ = hi − lo = 4 (dim 1)
        spec = spec_for("pad-ring-sum", rounds=K, sigma=sigma)
        g = ring_sum_guarantee(K, N, eps0, d0, dp)
        cost = pad_cost(spec, 0, IDS)
        ours = dp_from_rdp(cost.orders, cost.curves()[0] * K, g.delta)
        assert 0 < ours <= g.epsilon, (K, eps0, ours, g.epsilon)


def test_paper_values_are_labelled_and_only_where_the_theorem_applies():
    from hushnet.families.pad.accounting import pad_paper_bound

    ring = spec_for("pad-ring-sum", sigma=60.0)  # per-visit ε < 1: Thm 1's calibration applies
    row, label = pad_paper_bound(ring, 0)
    cert = pad_projector(ring, 0, None).epsilon_row
    assert label.startswith("paper: P-AD Thm 1") and row[0] == 0.0
    assert np.all(row[1:] >= cert[1:])  # the printed composition is looser than what is charged
    assert (
        pad_paper_bound(spec_for("pad-ring-sum"), 0) is None
    )  # σ=1.5: per-visit ε ≥ 1, outside Thm 1
    assert pad_paper_bound(spec_for("pad-ring-histogram"), 0) is None  # Thm 2 needs n ≥ 1000
    big = spec_for("pad-complete-sum", graph="complete:1000", steps=100_000, sigma=60.0)
    row, label = pad_paper_bound(big, 3)
    assert (
        "hidden sender and receiver" in label
        and "not a guarantee" in label
        and row[3] == 0.0
        and row[0] > 0
    )
