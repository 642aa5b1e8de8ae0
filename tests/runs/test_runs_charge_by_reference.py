"""A walk's later visits are charged by reference (issue 12): at n = 2048 a hop's charge checked and
composed 2 047 targets' totals (≈ 4 ms of the hop) and, in a host of 410 nodes whose process keeps only a
few nodes' cost rows, built the node's (targets × orders) rows again at every visit.

After the ledger has proven an allowance (at the run's first charge), a visit builds no
rows and adds nothing to the totals until they are read — and the totals, the run's charged row and the
reopened file are the exact path's, bit for bit; the budget still stops the run at the same visit.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.driver_loop import driver_loop  # noqa: F401 - autouse: the driver's event loop

import hushnet.runs.accounting as acc
from hushnet.engine.actions import LedgerEntry as EngineEntry
from hushnet.privacy.ledger import Ledger, LedgerBudget
from hushnet.protocols.registry import transition_matrix
from hushnet.runs.accounting import contribution_cost
from hushnet.runs.driver import RunDriver
from hushnet.runs.spec import Budget, RunSpec


def _spec(n: int, eps: float) -> RunSpec:
    return RunSpec(
        protocol="rw-dpsgd",
        task="logreg",
        graph=f"hypercube:{int(np.log2(n))}",
        steps=16 * n,
        seed=3,
        budget=Budget(eps, 1e-5),
        sigma=8.0,
        cap=None,
    ).with_run_id()


def _event(spec: RunSpec, v: int, step: int) -> EngineEntry:
    s = spec.sigma
    return EngineEntry(
        v, step, "gradient", spec.view_model, 2.0, 2.0 * s, s, spec.protocol, spec.run_id
    )


def _drivers(tmp_path, spec, n, nodes, tag):
    ids = [f"n{i}" for i in range(n)]
    W = transition_matrix(spec.graph)
    out = []
    for v in nodes:
        led = Ledger(tmp_path / f"{tag}-{v}.sqlite", node_id=ids[v])
        led.set_budget(LedgerBudget(spec.budget.epsilon, spec.budget.delta))
        cost = contribution_cost(spec, v, ids, W, led.orders)
        out.append((led, RunDriver(spec, v, ids, None, None, ledger=led, cost=cost, W=W)))
    return out


def test_later_visits_build_no_rows(tmp_path, monkeypatch):
    """Two nodes visited in turn with a process that keeps one node's rows (as a host of hundreds of
    nodes keeps a few): from the second visit on, no visit builds its node's rows."""
    monkeypatch.setenv(acc.ROWS_ENV, "0")
    n = 64
    spec = _spec(n, 1e6)
    built = []
    real = acc.ContributionCost.curves

    def counting(self, sigma):
        built.append(id(self))
        return real(self, sigma)

    monkeypatch.setattr(acc.ContributionCost, "curves", counting)
    nodes = _drivers(tmp_path, spec, n, [3, 40], "a")
    per_visit = []
    for visit in range(8):
        before = len(built)
        for _, d in nodes:
            assert d._charge(_event(spec, d.vertex, visit))  # noqa: SLF001 - the receiver's charge
        per_visit.append(len(built) - before)
    assert per_visit[1:] == [0] * 7, per_visit
    for led, d in nodes:
        assert d.contributions == 8
        assert len(led.entries()) == 8
        led.close()


def test_same_totals_and_the_same_last_visit_as_the_exact_path(tmp_path, monkeypatch):
    """A budget that stops the run: the node charged by reference stops at the visit the exact path
    stops at, with the same totals, run row and file, bit for bit."""
    n = 64
    spec = _spec(n, 1.2)
    ((led, d),) = _drivers(tmp_path, spec, n, [9], "fast")
    stops = []
    for visit in range(400):
        if not d._charge(_event(spec, 9, visit)):  # noqa: SLF001
            stops.append(visit)
            break
    # the exact path: the same charges with the ledger never given a key
    monkeypatch.setattr(acc.ContributionCost, "repeat_key", lambda self, sigma: None)
    ((led2, d2),) = _drivers(tmp_path, spec, n, [9], "exact")
    for visit in range(400):
        if not d2._charge(_event(spec, 9, visit)):  # noqa: SLF001
            stops.append(visit)
            break
    assert len(stops) == 2 and stops[0] == stops[1] > 2, stops
    assert d.contributions == d2.contributions
    a, b = led.spent_columns(), led2.spent_columns()
    assert a.keys == b.keys and np.array_equal(a.epsilon, b.epsilon)
    assert np.array_equal(d.run_rdp, d2.run_rdp)
    for k in a.keys:
        assert np.array_equal(led.rdp(k), led2.rdp(k))
    led.close()
    led2.close()
    with Ledger(tmp_path / "fast-9.sqlite") as again:
        assert np.array_equal(again.spent_columns().epsilon, b.epsilon)


def test_a_float32_sigma_charges_the_rows_of_its_float64_value():
    """The cache key and the ledger's repeat key take σ as a float; so must the rows built for it."""
    n = 16
    spec = _spec(n, 1e6)
    ids = [f"n{i}" for i in range(n)]
    cost = contribution_cost(spec, 2, ids, transition_matrix(spec.graph))
    s32 = np.float32(8.3)
    ev = EngineEntry(
        2, 0, "gradient", spec.view_model, 2.0, 2.0 * s32, s32, spec.protocol, spec.run_id
    )
    rows32 = np.array(cost.entry(ev, spec.run_id, ids[2]).rows)
    acc._ROWS.clear()  # noqa: SLF001 - built again from the float64 value
    acc._ROWS_BYTES[0] = 0  # noqa: SLF001
    assert np.array_equal(rows32, cost.rows(float(s32)))
    assert cost.repeat_key(s32) is cost.repeat_key(float(s32))


def test_an_accepted_walk_charges_even_its_first_visit_by_reference(tmp_path, monkeypatch):
    """The run service prepares a walk's charges when it accepts it (``RunDriver.prepare_charges``, at the
    σ the machine reports): no visit builds rows, and the file is the exact path's."""
    monkeypatch.setenv(acc.ROWS_ENV, "0")
    n = 64
    spec = _spec(n, 1e6)
    ((led, d),) = _drivers(tmp_path, spec, n, [5], "prep")
    assert d.prepare_charges() == 0  # no machine says its σ: nothing prepared
    d.machine = _machine(spec, 5)
    assert d.prepare_charges() > 0
    built = []
    real = acc.ContributionCost.curves
    monkeypatch.setattr(
        acc.ContributionCost, "curves", lambda self, s: built.append(1) or real(self, s)
    )
    for visit in range(5):
        assert d._charge(_visit(d.machine, visit))  # noqa: SLF001
    assert built == []
    assert len(led.entries()) == 5
    led.close()


def _machine(spec: RunSpec, v: int):
    """A real walk machine of node ``v`` (the σ it reports is derived, not the spec's number)."""
    from hushnet.engine.protocol import NodeContext
    from hushnet.families.walk.hops import TransitionRow
    from hushnet.families.walk.machines import RWDPSGD
    from hushnet.families.walk.params import RWParams
    from hushnet.tasks.logistic import LogisticRegressionTask

    rng = np.random.default_rng(v)
    X = rng.normal(size=(8, 3))
    task = LogisticRegressionTask(X, np.where(X[:, 0] > 0, 1.0, -1.0), clip=0.3)
    ctx = NodeContext(v, 64, spec.run_id, rng, spec.view_model)
    W = transition_matrix(spec.graph)
    return RWDPSGD(ctx, TransitionRow.from_matrix(W, v), task, RWParams(100, 0.1, 7.3))


def _visit(m, step: int) -> EngineEntry:
    """The ledger entry of a data visit, as the machine emits it."""
    return m.ledger(step, "gradient", m.sens, m.noise_std)


def test_the_walk_machine_reports_the_sigma_of_its_visits():
    """``contribution_sigma`` is bit for bit the σ of the entries its data visits emit (0.6 · 7.3 / 0.6
    need not be 7.3)."""
    m = _machine(_spec(64, 1.0), 3)
    assert _visit(m, 0).sigma == m.contribution_sigma


def _logreg_tasks(n: int):
    from hushnet.tasks.logistic import LogisticRegressionTask

    rng = np.random.default_rng(1)
    out = []
    for _ in range(n):
        X = rng.standard_normal((6, 3))
        X /= np.linalg.norm(X, axis=1, keepdims=True)
        out.append(LogisticRegressionTask(X, np.where(X[:, 0] > 0, 1.0, -1.0), clip=0.7))
    return out


WALKS = {
    "rw-dpsgd": dict(steps=40, step_size=0.1, sigma=3.3),
    "rw-dpsgd-onion": dict(
        steps=40, step_size=0.1, sigma=3.3, onion_hops=2, onion_cell_body=1024, secret_seed=1
    ),
    "anon-walk-sgd": dict(
        updates_per_node=1, step_size=0.1, sigma=3.3, ell1=2, ell2=4, cell_body=512, secret_seed=2
    ),
}


@pytest.mark.parametrize("protocol", sorted(WALKS))
def test_every_walk_machine_reports_the_sigma_its_visits_charge(protocol, tmp_path, monkeypatch):
    """The onion-relayed walk and the source-anonymous walk report ``contribution_sigma`` too (their outer
    machines were not prepared: their first charge took the exact path), and it is the σ of every data
    entry they emit, bit for bit — a prepared σ that differed would only waste the allowance, but one
    that matches is what lets the first visit be charged by reference."""
    from hushnet.protocols.registry import build_machines
    from hushnet.sim import Simulator

    W = transition_matrix("regular:24:3:1")
    ms = build_machines(protocol, _logreg_tasks(24), run_seed=5, W=W, params=WALKS[protocol])
    res = Simulator(ms).run()
    assert res.status == "finished"
    data = [(v, e) for v, es in res.ledgers.items() for e in es if e.uses_data]
    assert len(data) >= 5  # seeded (secret_seed): the same walk every time
    for v, e in data:
        sigma = ms[v].contribution_sigma
        assert 0 < sigma < float("inf")
        assert e.sigma == sigma
    # and a node's driver prepares at that σ: its visits then build no rows, the first one included
    monkeypatch.setenv(acc.ROWS_ENV, "0")
    v = data[0][0]
    spec = RunSpec(
        protocol=protocol, task="logreg", graph="regular:24:3:1", steps=40, seed=5,
        budget=Budget(1e6, 1e-5), sigma=3.3,
    ).with_run_id()  # fmt: skip
    ((led, d),) = _drivers(tmp_path, spec, 24, [v], protocol)
    d.machine = ms[v]
    assert d.prepare_charges() > 0
    built = []
    real = acc.ContributionCost.curves
    monkeypatch.setattr(
        acc.ContributionCost, "curves", lambda self, s: built.append(1) or real(self, s)
    )
    mine = [e for u, e in data if u == v]
    for e in mine:
        assert d._charge(e)  # noqa: SLF001
    assert built == [] and len(led.entries()) == len(mine)
    led.close()
