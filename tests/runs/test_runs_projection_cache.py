"""Acceptance projections computed once per process for the public parameters (issue 12).

Every node of a run projects its own certified row; the walk accountant computes all pairs at once.
The per-process cache must (a) compute the all-pairs matrix once for K nodes, (b) give every node
exactly the row of an uncached computation, (c) miss whenever any public input differs — noise,
walk length, contributions, view model, or the transition matrix itself — and (d) hand out
read-only arrays, so one hosted node cannot change another's accounting.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import hushnet.privacy.randomwalk as rw
from hushnet.families.walk import accounting as walk_acc
from hushnet.families.walk.accounting import evaluate_policy, projected_row
from hushnet.protocols.registry import transition_matrix
from hushnet.runs.spec import Budget, RunSpec

N, GRAPH = 16, "hypercube:4"


def _spec(**kw) -> RunSpec:
    base = dict(
        protocol="rw-dpsgd",
        task="logreg",
        graph=GRAPH,
        steps=400,
        seed=5,
        budget=Budget(50.0, 1e-5),
        sigma=8.0,
        clip=1.0,
        step_size=0.05,
        cap=40,
    )
    base.update(kw)
    return RunSpec(**base).with_run_id()


@pytest.fixture
def counted(monkeypatch) -> list:
    walk_acc._SLOPES.clear()
    calls: list = []
    real = rw.rw_pndp_matrix

    def counting(*a, **kw):
        calls.append(a[1:4])
        return real(*a, **kw)

    monkeypatch.setattr(rw, "rw_pndp_matrix", counting)
    yield calls
    walk_acc._SLOPES.clear()


def _uncached_row(spec: RunSpec, node: int) -> np.ndarray:
    walk_acc._SLOPES.clear()
    row, _ = projected_row(spec, node)
    walk_acc._SLOPES.clear()
    return row


def test_one_all_pairs_computation_for_all_hosted_nodes(counted) -> None:
    spec = _spec()
    fresh = [_uncached_row(spec, u) for u in range(N)]
    assert len(counted) == N  # the uncached way: one all-pairs computation per node
    counted.clear()
    W = transition_matrix(spec.graph, spec.weights)
    rows = [evaluate_policy(spec, u, None, W).epsilon_row for u in range(N)]
    assert len(counted) == 1
    for u in range(N):
        np.testing.assert_array_equal(rows[u], fresh[u])
        assert rows[u][u] == 0.0 and rows[u].max() > 0
    # a copy of W with the same entries (another node's own transition_matrix call) shares the entry
    projected_row(spec, 3, transition_matrix(spec.graph, spec.weights).copy())
    assert len(counted) == 1


@pytest.mark.parametrize(
    "change",
    [
        dict(sigma=9.0),
        dict(steps=500),
        dict(cap=20),
        dict(view_model="anonymous-sender"),
        dict(graph="ring:16"),
    ],
)
def test_any_public_change_misses(counted, change) -> None:
    spec = _spec()
    projected_row(spec, 0)
    other = dataclasses.replace(spec, **change)
    row, _ = projected_row(other, 0)
    assert len(counted) == 2, change
    np.testing.assert_array_equal(row, _uncached_row(other, 0))


def test_a_different_matrix_for_the_same_graph_name_misses(counted) -> None:
    spec = _spec()
    W = transition_matrix(spec.graph, spec.weights).toarray()
    projected_row(spec, 0, W)
    W2 = W.copy()
    e = 0.01  # still symmetric and bi-stochastic, other entries
    W2[0, 1] -= e
    W2[1, 0] -= e
    W2[0, 0] += e
    W2[1, 1] += e
    projected_row(spec, 0, W2)
    assert len(counted) == 2


def test_shared_slopes_are_read_only(counted) -> None:
    spec = _spec()
    W = transition_matrix(spec.graph, spec.weights)
    slopes, _ = walk_acc._walk_slopes(spec, W, rw.alpha_max(spec.sigma, spec.constraint), 40.0)
    with pytest.raises(ValueError):
        slopes[0, 1] = 0.0
    row, _ = projected_row(spec, 2, W)
    row[:] = 0.0  # a node's own row is its own copy
    assert projected_row(spec, 2, W)[0].max() > 0


# ---- the ledger cost's all-pairs matrix and the row's conversion (issue 12, acceptance at n = 1024) ----


def _fresh_cost_slope(spec: RunSpec, vertex: int, W) -> np.ndarray:
    """What :func:`walk_cost` charged before its matrix was shared: a fresh all-pairs computation."""
    S = rw.rw_single_loss_matrix(
        W, spec.steps, 1.0, 1.0, horizon="exact", sender_known=spec.view_model == "sender-known"
    )
    return np.delete(S[vertex], vertex)


@pytest.mark.parametrize("graph", [GRAPH, "ring:16", "regular:16:4:3"])
def test_ledger_cost_rows_equal_an_uncached_computation(graph, monkeypatch) -> None:
    spec = _spec(graph=graph)
    W = transition_matrix(spec.graph, spec.weights)
    ids = [f"n{i}" for i in range(N)]
    walk_acc._SINGLE.clear()
    calls: list = []
    real = rw.rw_single_loss_matrix

    def counting(*a, **kw):
        calls.append(a[1:])
        return real(*a, **kw)

    monkeypatch.setattr(rw, "rw_single_loss_matrix", counting)
    costs = [walk_acc.walk_cost(spec, u, ids, W) for u in range(N)]
    assert len(calls) == 1  # one all-pairs matrix for every hosted node
    monkeypatch.setattr(rw, "rw_single_loss_matrix", real)
    for u in range(N):
        np.testing.assert_array_equal(costs[u].walk_slope, _fresh_cost_slope(spec, u, W))
        assert costs[u].targets == [ids[v] for v in range(N) if v != u]
    # the cost's row is sealed (its rows are built from it again when asked): nobody can change it,
    # so neither the cache nor another node's row can change through it
    with pytest.raises(ValueError):
        costs[0].walk_slope[:] = -1.0
    with pytest.raises(ValueError):
        costs[0].walk_slope.flags.writeable = True
    np.testing.assert_array_equal(
        walk_acc.walk_cost(spec, 0, ids, W).walk_slope, _fresh_cost_slope(spec, 0, W)
    )
    walk_acc._SINGLE.clear()


@pytest.mark.parametrize("change", [dict(steps=500), dict(view_model="anonymous-sender")])
def test_ledger_cost_cache_misses_on_a_public_change(change) -> None:
    spec = _spec()
    other = dataclasses.replace(spec, **change)
    W = transition_matrix(spec.graph, spec.weights)
    ids = [f"n{i}" for i in range(N)]
    walk_acc._SINGLE.clear()
    walk_acc.walk_cost(spec, 1, ids, W)
    np.testing.assert_array_equal(
        walk_acc.walk_cost(other, 1, ids, W).walk_slope, _fresh_cost_slope(other, 1, W)
    )
    assert len(walk_acc._SINGLE) == 2
    with pytest.raises(ValueError):
        next(iter(walk_acc._SINGLE.values()))[0, 1] = 0.0  # shared: read-only
    walk_acc._SINGLE.clear()


def test_row_conversion_by_distinct_values_equals_the_full_conversion() -> None:
    """Every projected entry equals the one-by-one-vector conversion bit for bit (hypercube rows repeat
    values; random slopes with repeats, zeros and extremes do too)."""
    from hushnet.runs.spec import _best_order_dp

    spec = _spec(graph="hypercube:8", steps=2048, cap=50)
    W = transition_matrix(spec.graph, spec.weights)
    amax = rw.alpha_max(spec.sigma, spec.constraint)
    slopes, _ = walk_acc._walk_slopes(spec, W, amax, 50.0)
    li = float(np.log(1e5))
    for u in range(0, 256, 17):
        np.testing.assert_array_equal(
            walk_acc._best_order_dp_distinct(slopes[u], amax, li),
            _best_order_dp(slopes[u], amax, li),
        )
    rng = np.random.default_rng(3)
    s = rng.choice(np.concatenate([rng.exponential(0.01, 40), [0.0, 1e-300, 5.0, 1e3]]), 997)
    for a in (1.5, amax, np.inf):
        np.testing.assert_array_equal(
            walk_acc._best_order_dp_distinct(s, a, li), _best_order_dp(s, a, li)
        )


def test_report_paper_rows_equal_an_uncached_computation(monkeypatch) -> None:
    """The report's (labelled, uncertified) Theorem 3 row reads the shared ln T matrix: same values."""
    from hushnet.privacy.paper.randomwalk import theorem3_printed_row

    spec = _spec()
    W = transition_matrix(spec.graph, spec.weights)
    walk_acc._SINGLE.clear()
    calls: list = []
    real = rw.rw_single_loss_matrix

    def counting(*a, **kw):
        calls.append(kw.get("horizon"))
        return real(*a, **kw)

    monkeypatch.setattr(rw, "rw_single_loss_matrix", counting)
    rows = {
        (u, k): walk_acc.paper_row(spec, u, 7.0, W, sender_known=k)
        for u in range(N)
        for k in (True, False)
    }
    assert calls == ["lnT", "lnT"]  # one matrix per view for all nodes
    monkeypatch.setattr(rw, "rw_single_loss_matrix", real)
    for (u, k), row in rows.items():
        fresh = theorem3_printed_row(
            W, spec.steps, spec.sigma, u, 7.0, spec.budget.delta, sender_known=k
        )
        np.testing.assert_array_equal(row, fresh)
    walk_acc._SINGLE.clear()


def test_hosted_nodes_accepting_at_once_compute_each_matrix_once(counted, monkeypatch) -> None:
    """A host's nodes accept in the executor's threads at the same moment: one computes, the rest wait."""
    import threading

    spec = _spec()
    ids = [f"n{i}" for i in range(N)]
    walk_acc._SINGLE.clear()
    single: list = []
    real = rw.rw_single_loss_matrix

    def counting(*a, **kw):
        single.append(kw.get("horizon"))
        return real(*a, **kw)

    monkeypatch.setattr(rw, "rw_single_loss_matrix", counting)
    go = threading.Barrier(8)
    out: dict = {}

    def accept(u: int) -> None:
        W = transition_matrix(spec.graph, spec.weights)  # each node builds its own W
        go.wait()
        out[u] = (
            evaluate_policy(spec, u, None, W).epsilon_row,
            walk_acc.walk_cost(spec, u, ids, W),
        )

    threads = [threading.Thread(target=accept, args=(u,)) for u in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(counted) == 1  # the projection's all-pairs slopes
    assert single.count("exact") == 2  # one inside that computation, one for the ledger cost
    monkeypatch.setattr(rw, "rw_single_loss_matrix", real)
    for u in range(8):
        np.testing.assert_array_equal(out[u][0], _uncached_row(spec, u))
    walk_acc._SINGLE.clear()
