"""A node's memory during a run: the charged row and the ledger's sums are not extra copies (issue 12).

At n = 2048 a (targets × orders) array is 2.6 MB, and every hosted node held three during a walk — its
cost rows, the run's charged row, the ledger's running sums.  The charged row is now summed from the
replay log when asked, and the ledger's sums are the sealed first charge itself until something else
is added.  Both must give the very numbers the old running sums gave, bit for bit.
"""

from __future__ import annotations

import pathlib
import tracemalloc

import numpy as np
import pytest

from hushnet.engine.actions import LedgerEntry as EngineEntry
from hushnet.privacy.ledger import Ledger
from hushnet.privacy.ledger_math import Costs, LedgerState, sealed
from hushnet.protocols.registry import transition_matrix
from hushnet.runs.accounting import contribution_cost
from hushnet.runs.driver import RunDriver
from hushnet.runs.run_store import RunStore
from hushnet.runs.spec import Budget, RunSpec


def _walk(n: int, sigma: float = 8.0) -> tuple[RunSpec, list[str], object]:
    d = int(np.log2(n))
    spec = RunSpec(
        protocol="rw-dpsgd",
        task="logreg",
        graph=f"hypercube:{d}",
        steps=16 * n,
        seed=3,
        budget=Budget(1e6, 1e-5),
        sigma=sigma,
        cap=None,
    ).with_run_id()
    return spec, [f"n{i}" for i in range(n)], transition_matrix(spec.graph)


def _event(spec: RunSpec, v: int, step: int, sigma: float) -> EngineEntry:
    return EngineEntry(
        v, step, "gradient", spec.view_model, 2.0, 2.0 * sigma, sigma, spec.protocol, spec.run_id
    )


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint64), b.view(np.uint64))


def test_the_derived_charged_row_is_the_old_running_sum_bit_for_bit(tmp_path):
    """Random charges at two noise levels, changes outside the log (as a top-up makes) and restarts from
    the checkpoint: the row the driver reports equals the running sum the old driver kept, and the
    ledger (also reopened from its file) holds the running sums of its charges, bit for bit."""
    spec, ids, W = _walk(64)
    v = 5
    rng = np.random.default_rng(11)
    led_path = tmp_path / "ledger.sqlite"
    ledger = Ledger(led_path, node_id=ids[v])
    cost = contribution_cost(spec, v, ids, W, ledger.orders)
    store = RunStore(tmp_path / "runs.sqlite")
    store.accept(spec.run_id, b"signed", v, {})

    def driver() -> RunDriver:
        return RunDriver(spec, v, ids, None, None, ledger=ledger, cost=cost, W=W)

    d = driver()
    ref = None  # the old driver's running sum
    led_ref = None  # the old ledger's running sums (its charges only)
    step = 0
    kinds = []
    for _ in range(60):
        op = rng.choice(["charge", "charge", "charge", "outside", "restart", "reopen"])
        kinds.append(str(op))
        if op == "charge":
            sigma = float(rng.choice([spec.sigma, 2.0 * spec.sigma]))
            assert d._charge(_event(spec, v, step, sigma))  # noqa: SLF001 - the node's charge path
            step += 1
            c = cost.rows(sigma)
            ref = c.copy() if ref is None else ref + c
            led_ref = (0.0 + c) if led_ref is None else led_ref + c
        elif op == "outside" and ref is not None:
            extra = rng.random(ref.shape) * 1e-3
            d.run_rdp = d.run_rdp + extra
            ref = ref + extra
        elif op == "restart":
            store.checkpoint(spec.run_id, "stopped", "", d.durable_state(), None)
            (row,) = store.runs()
            charged = len(ledger.entries(spec.run_id))
            d = driver()
            d.restore(row["driver"], None, "stopped", "", charged)
            assert d.ledger_credit == 0
        elif op == "reopen":
            ledger.close()
            ledger = Ledger(led_path)
            d.ledger = ledger
        if ref is None:
            assert d.run_rdp is None
        else:
            assert _same(d.run_rdp, ref), kinds
        if led_ref is not None:
            got = np.stack([ledger.rdp(t) for t in cost.targets])
            assert _same(got, led_ref), kinds
    assert {"charge", "outside", "restart", "reopen"} <= set(kinds)
    ledger.close()
    store.close()


def test_a_walk_node_visited_holds_its_cost_rows_and_at_most_one_sum(tmp_path):
    """After its first visit a node holds no (targets × orders) array beyond its cost's rows (the ledger's
    sums are those rows, the charged row is a log); after later visits, one: the ledger's sums."""
    spec, ids, W = _walk(256)
    v = 17
    ledger = Ledger(tmp_path / "ledger.sqlite", node_id=ids[v])
    cost = contribution_cost(spec, v, ids, W, ledger.orders)
    rows = cost.rows(spec.sigma)  # the cost's rows: built before, not counted below
    cost.entry(_event(spec, v, 0, spec.sigma), spec.run_id, ids[v])
    d = RunDriver(spec, v, ids, None, None, ledger=ledger, cost=cost, W=W)
    tracemalloc.start()
    try:
        t0 = tracemalloc.get_traced_memory()[0]
        assert d._charge(_event(spec, v, 0, spec.sigma))  # noqa: SLF001
        first = tracemalloc.get_traced_memory()[0] - t0
        for step in range(1, 4):
            assert d._charge(_event(spec, v, step, spec.sigma))  # noqa: SLF001
        later = tracemalloc.get_traced_memory()[0] - t0
    finally:
        tracemalloc.stop()
    # before: the ledger's sums and the charged row, 2 × rows.nbytes at the first visit already
    assert first < 0.5 * rows.nbytes, (first, rows.nbytes)
    assert later < 1.5 * rows.nbytes, (later, rows.nbytes)
    np.testing.assert_array_equal(d.run_rdp, rows + rows + rows + rows)
    ledger.close()


def _costs(keys: list[str], rdp: np.ndarray) -> Costs:
    return Costs(keys, rdp, np.zeros(len(keys)), np.zeros(len(keys), dtype=bool))


def test_ledger_sums_that_share_a_sealed_first_charge_are_the_copied_sums():
    """The ledger state fed sealed arrays (shared as its sums until something is added) and the same
    state fed writeable copies (always summed in its own array, as before) hold the same bits, through
    zero entries, new targets, -0.0 entries and infinite orders."""
    orders = np.array([1.5, 2.0, 4.0, 16.0])
    rng = np.random.default_rng(5)
    for trial in range(40):
        shared = LedgerState(orders)
        copied = LedgerState(orders)
        keys = [f"t{i}" for i in range(int(rng.integers(1, 40)))]
        for _ in range(int(rng.integers(1, 6))):
            kind = rng.choice(["zeros", "random", "negzero", "inf", "more"])
            ks = keys + ([f"x{trial}_{rng.integers(1e9)}"] if kind == "more" else [])
            a = rng.random((len(ks), orders.size)) * 3
            if kind == "zeros":
                a[:] = 0.0
            elif kind == "negzero":
                a[0, 0] = -0.0
            elif kind == "inf":
                a[-1, -1] = np.inf
            shared.add_costs(_costs(ks, sealed(a)), "certified")
            copied.add_costs(_costs(ks, a.copy()), "certified")
            assert shared.targets() == copied.targets()
            m = len(shared._keys)  # noqa: SLF001
            assert _same(shared._rdp[:m], copied._rdp[:m])  # noqa: SLF001
        first = sealed(rng.random((3, orders.size)))
        s = LedgerState(orders)
        s.add_costs(_costs(["a", "b", "c"], first), "certified")
        assert s._rdp is first  # noqa: SLF001 - shared, not copied
        s.add_costs(_costs(["a", "b", "c"], sealed(np.zeros((3, orders.size)))), "certified")
        assert s._rdp is first  # noqa: SLF001 - a zero entry changes nothing
        s.add_costs(_costs(["a", "b", "c"], first), "certified")
        assert s._rdp is not first and _same(s._rdp[:3], first + first)  # noqa: SLF001


def test_cost_rows_built_again_are_the_same_bits_as_every_target_computed_alone():
    """The rows are computed once per distinct slope (by its bits) and gathered: the same element-wise
    arithmetic as the direct formula, so the same bits — for -0.0, zeros, repeats, huge slopes, an
    order limit or none, and several noise multipliers."""
    from hushnet.privacy.conversions import DEFAULT_ORDERS
    from hushnet.runs.accounting import ContributionCost

    orders = np.asarray(DEFAULT_ORDERS, dtype=float)
    rng = np.random.default_rng(7)
    for trial in range(20):
        m = int(rng.integers(1, 300))
        slope = rng.choice(rng.random(max(1, m // 4)) * 10.0 ** rng.integers(-6, 3), m)
        slope[rng.random(m) < 0.1] = 0.0
        slope[rng.random(m) < 0.1] = -0.0
        slope[rng.random(m) < 0.05] = 1e300
        amax = float(rng.choice([np.inf, 3.0, 40.0, 1.5]))
        c = ContributionCost([f"t{i}" for i in range(m)], orders, sealed(slope), amax, "test")
        for sigma in (0.5, 1.0, 8.0, 13.7):
            ldp = np.broadcast_to(orders / (2.0 * sigma**2), (m, orders.size))
            walk = slope[:, None] * orders[None, :] / sigma**2
            walk = np.where(orders[None, :] <= amax, walk, np.inf)
            assert _same(c.curves(sigma), np.minimum(walk, ldp)), (trial, sigma)
            assert _same(c.rows(sigma), np.minimum(walk, ldp))


def test_hosted_nodes_keep_one_sum_each_and_the_process_a_bounded_set_of_rows(
    tmp_path, monkeypatch
):
    """Many nodes of one process visited in turn: the rows live in one bounded cache per process, the
    ledger's memo and recent block refer to them weakly, so a node holds its ledger's sums and no rows of
    its own; rows built again for a later visit still point the ledger at its existing block (one block
    per node and run, not one per visit), and the sums are those of fresh, checked entries."""
    import gc

    from hushnet.runs.accounting import rows_held

    spec, ids, W = _walk(256)
    nodes = [3, 40, 77, 101, 150, 222]
    ledgers, drivers = [], []
    for v in nodes:
        led = Ledger(tmp_path / f"l{v}.sqlite", node_id=ids[v])
        cost = contribution_cost(spec, v, ids, W, led.orders)
        ledgers.append(led)
        drivers.append(RunDriver(spec, v, ids, None, None, ledger=led, cost=cost, W=W))
    nbytes = drivers[0].cost.rows(spec.sigma).nbytes
    monkeypatch.setenv("HUSHNET_COST_ROWS_MB", str(2.5 * nbytes / 2**20))  # two nodes' rows
    gc.collect()
    tracemalloc.start()
    try:
        t0 = tracemalloc.get_traced_memory()[0]
        for step in range(3):
            for d in drivers:
                assert d._charge(_event(spec, d.vertex, step, spec.sigma))  # noqa: SLF001
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - t0
    finally:
        tracemalloc.stop()
    entries, held = rows_held()
    assert held <= 2.5 * nbytes
    # each node: its ledger's sums (one matrix) and small things; before: its rows and sums, and the
    # driver's own sum — 3 matrices a node
    assert grown < len(nodes) * 1.3 * nbytes + held, (grown / nbytes, held / nbytes)
    for d, led in zip(drivers, ledgers):
        rows = d.cost.rows(spec.sigma)
        np.testing.assert_array_equal(d.run_rdp, rows + rows + rows)
        fresh = LedgerState(led.orders, d.node_id)
        for _ in range(3):
            fresh.add_costs(_costs(list(d.cost.targets), np.array(rows)), "certified")
        got = np.stack([led.rdp(t) for t in d.cost.targets])
        assert _same(got, fresh._rdp[: len(d.cost.targets)])  # noqa: SLF001
        (n_blocks,) = led._store._db.execute("SELECT COUNT(*) FROM blocks").fetchone()  # noqa: SLF001
        assert n_blocks == 1  # the rows built again were recognised as the block already written
        led.close()


def test_the_ledger_memo_never_takes_an_unchecked_map():
    """The memo refers to the validated map weakly: a map that is gone is never matched again (a new map
    at the same address is checked), a FrozenCurves cannot be changed nor built over rows that could."""
    import gc

    import pytest

    from hushnet.privacy.ledger_math import FrozenCurves, LedgerError, PrivacyEntry

    orders = np.array([2.0, 4.0])
    st = LedgerState(orders, "me")
    keys = ("a", "b")
    good = FrozenCurves(keys, sealed(np.ones((2, 2))))
    st.validate(PrivacyEntry("r", "p", "v", "certified", good, None, "", good.rows))
    assert st._valid is not None and st._valid[0]() is good  # noqa: SLF001
    del good
    gc.collect()
    assert st._valid[0]() is None  # noqa: SLF001 - the memo kept nothing alive
    for _ in range(50):  # whatever address the next map gets, its curves are checked
        bad = FrozenCurves(keys, sealed(np.array([[1.0, np.nan], [1.0, 1.0]])))
        with pytest.raises(LedgerError, match="non-negative"):
            st.validate(PrivacyEntry("r", "p", "v", "certified", bad, None, "", bad.rows))
        del bad
    f = FrozenCurves(keys, sealed(np.ones((2, 2))))
    with pytest.raises(AttributeError):
        f._rows = sealed(np.zeros((2, 2)))  # noqa: SLF001
    with pytest.raises(TypeError):
        f["a"] = np.zeros(2)  # type: ignore[index]
    with pytest.raises(ValueError):
        FrozenCurves(keys, np.ones((2, 2)))  # writeable rows: not frozen
    with pytest.raises(ValueError):
        FrozenCurves(("a", "a"), sealed(np.ones((2, 2))))


def test_the_report_shows_the_projected_row_the_node_accepted_with(tmp_path):
    """The acceptance record's projected row is kept as a float array (not n − 1 Python floats in a dict)
    and the report shows the very same dict; a row of another shape is kept as it came."""
    import json

    spec, ids, W = _walk(64)
    v = 9
    rng = np.random.default_rng(2)
    row = {ids[u]: float(rng.random() * 3) for u in range(64) if u != v}
    row[ids[3]] = float("inf")
    dec = {"accept": True, "row": dict(row), "accounting_view": {"view": "x"}}
    ledger = Ledger(tmp_path / "l.sqlite", node_id=ids[v])
    cost = contribution_cost(spec, v, ids, W, ledger.orders)
    d = RunDriver(spec, v, ids, None, None, ledger=ledger, cost=cost, W=W, decision=dec)
    assert "row" not in d.decision and d._projected is not None  # noqa: SLF001
    rep = d.report()
    assert list(rep["projected"]) == list(row) and rep["projected"] == row
    assert json.dumps(rep["projected"]) == json.dumps(row)
    assert rep["accounting_view"] == {"view": "x"}
    odd = {"row": {ids[1]: 1.0}}  # not one value per other node: kept as it is
    e = RunDriver(spec, v, ids, None, None, ledger=ledger, cost=cost, W=W, decision=odd)
    assert e.report()["projected"] == {ids[1]: 1.0}
    ledger.close()


def test_drivers_of_one_process_share_one_read_only_public_matrix(tmp_path):
    """Two nodes that each built the run's W keep one read-only copy between them; the report's paper row
    is the one computed from a W of their own, and no caller can change the shared one in place."""
    import pytest

    from hushnet.runs.accounting import paper_bound

    spec, ids, _ = _walk(64)
    drivers = []
    for v in (2, 30):
        W = transition_matrix(spec.graph, spec.weights)  # each node builds its own
        led = Ledger(tmp_path / f"l{v}.sqlite", node_id=ids[v])
        cost = contribution_cost(spec, v, ids, W, led.orders)
        drivers.append(RunDriver(spec, v, ids, None, None, ledger=led, cost=cost, W=W))
    a, b = drivers
    assert a.W is b.W
    with pytest.raises(ValueError):
        a.W.data[0] = 0.5
    d = transition_matrix(spec.graph, spec.weights)
    d.data[0] += 1e-3  # another matrix: never matched to the shared one
    other = RunDriver(spec, 5, ids, None, None, ledger=a.ledger, cost=a.cost, W=d)
    assert other.W is not a.W and np.array_equal(other.W.toarray(), d.toarray())
    want = paper_bound(spec, 30, 0.0, transition_matrix(spec.graph, spec.weights))[0]
    got = b.report()["paper"]
    assert got == {ids[v]: float(want[v]) for v in range(64) if v != 30}
    for x in drivers:
        x.ledger.close()


@pytest.mark.parametrize("bad", ["lots", "-1", "nan", "inf"])
def test_a_bad_cost_rows_limit_stops_the_run_service_at_its_start(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    """Read when a node's run service is made, not at the first cache miss: a bad value found there
    stopped a report, or a top-up between its ledger charge and its checkpoint."""
    from types import SimpleNamespace

    from hushnet.runs.service import RunService

    monkeypatch.setenv("HUSHNET_COST_ROWS_MB", bad)
    with pytest.raises(ValueError, match="HUSHNET_COST_ROWS_MB must be a number of megabytes"):
        RunService(SimpleNamespace(state_dir=tmp_path))
