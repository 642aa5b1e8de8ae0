"""The run's charged row in a durable walk's checkpoint: a replay log, not a (targets × orders) array.

A hop used to write the whole row (1 MB at n = 2048) into the checkpoint; it now writes
``[[σ, count], …]`` and a restart replays the same additions.  The sum must be the one the driver
held — bit for bit — through a restart, a deviation top-up, and a checkpoint written before the log.
"""

from __future__ import annotations

import asyncio

import numpy as np

from hushnet.privacy.ledger_math import sealed
from hushnet.protocols.registry import make_machine, transition_matrix
from hushnet.runs.accounting import ContributionCost
from hushnet.runs.driver import RunDriver
from hushnet.runs.run_store import RunStore, pack, unpack
from hushnet.runs.service import network_walk_options
from tests.runs.test_runs_driver import N, _drivers, _pump, _spec


def _stacked_sum(d: RunDriver) -> np.ndarray | None:
    """The row as the driver summed it before the log: every data entry's curves, stacked, in order."""
    r = None
    for ev in d.engine_entries:
        if not ev.uses_data:
            continue
        e = d.cost.entry(ev, d.run_id, d.node_id)
        c = np.stack([e.rdp[t] for t in d.cost.targets])
        r = c if r is None else r + c
    return r


def _durable(drivers, tmp_path) -> list[RunStore]:
    stores = []
    for d in drivers:
        s = RunStore(tmp_path / f"{d.node_id}.runs.sqlite")
        s.accept(d.run_id, b"signed", d.vertex, {})
        d.store = s
        stores.append(s)
    return stores


def _restarted(d: RunDriver, store: RunStore, cost=None) -> RunDriver:
    """A fresh driver and machine for ``d``'s vertex, restored from what ``store`` holds (``cost``: the
    cost as the restarted process computed it; default ``d``'s own)."""
    spec, W = d.spec, transition_matrix(d.spec.graph)
    m = make_machine(
        spec.protocol,
        d.vertex,
        N,
        d.machine.task,
        run_seed=spec.seed,
        run_id=spec.run_id,
        params=spec.machine_params(),
        W=W,
        options=network_walk_options(spec, progress_every=1),
    )

    async def send(dst, data, **kw):
        return None

    again = RunDriver(
        spec, d.vertex, d.ids, m, send, ledger=d.ledger, cost=cost or d.cost, W=W, store=store
    )
    (row,) = [r for r in store.runs() if r["run_id"] == d.run_id]
    charged = len([e for e in d.ledger.entries(d.run_id)])
    again.restore(row["driver"], row["machine"], row["state"], row["reason"], charged)
    return again


def test_the_checkpoint_logs_the_row_and_a_restart_replays_it_bit_for_bit(tmp_path):
    async def go():
        spec = _spec(steps=60, cap=None)
        drivers, outbox = _drivers(tmp_path, spec)
        stores = _durable(drivers, tmp_path)
        for d in drivers:
            d.start()
        await _pump(drivers, outbox, until_step=30)
        for d, s in zip(drivers, stores):
            if d.contributions == 0:
                continue
            np.testing.assert_array_equal(d.run_rdp, _stacked_sum(d))
            d.persist()
            (row,) = s.runs()
            assert row["driver"]["run_rdp"] is None  # not the (targets × orders) array
            assert row["driver"]["run_rdp_log"]["ops"] == [[spec.sigma, d.contributions]]
            again = _restarted(d, s)
            np.testing.assert_array_equal(again.run_rdp, d.run_rdp)
            assert again.report()["certified"] == d.report()["certified"]
            # the log keeps what the rows are built from (the cost's slopes, not the 2.6 MB rows)
            log = row["driver"]["run_rdp_log"]
            (src,) = log["sources"]
            np.testing.assert_array_equal(src["slope"], d.cost.walk_slope)
            assert src["alpha_max"] == d.cost.alpha_max and "rows" not in log
            # logs written before: with the rows themselves, and [[σ, count]] only (the cost's rows)
            rows = d.cost.rows(spec.sigma).tobytes()
            bare = {k: v for k, v in log.items() if k != "sources"}
            for old_log in (dict(bare, rows=[rows]), bare):
                old = dict(row["driver"], run_rdp_log=old_log)
                s.checkpoint(d.run_id, row["state"], row["reason"], old, row["machine"])
                legacy = _restarted(d, s)
                np.testing.assert_array_equal(legacy.run_rdp, d.run_rdp)
                assert legacy._rdp_srcs == [d.cost]  # noqa: SLF001 - its own rows: not kept twice
                legacy.shutdown()
            for dd in (d, again):
                dd.shutdown()

    asyncio.run(go())


def test_a_top_up_then_charges_and_an_older_checkpoint_restore_exactly(tmp_path):
    async def go():
        spec = _spec(steps=60, cap=None)
        drivers, outbox = _drivers(tmp_path, spec)
        stores = _durable(drivers, tmp_path)
        for d in drivers:
            d.start()
        await _pump(drivers, outbox, until_step=20)
        d, s = max(zip(drivers, stores), key=lambda p: p[0].contributions)
        assert d.contributions >= 2
        # changed outside the log (as a deviation top-up or a family's settlement does): the next
        # charge starts a new log from that array, which the checkpoint keeps as the log's base
        extra = np.full_like(d.run_rdp, 0.125)
        d.run_rdp = d.run_rdp + extra
        base = d.run_rdp
        d._charge(next(ev for ev in d.engine_entries if ev.uses_data))  # noqa: SLF001
        want = base + d.cost.rows(spec.sigma)
        np.testing.assert_array_equal(d.run_rdp, want)
        d.persist()
        (row,) = s.runs()
        np.testing.assert_array_equal(row["driver"]["run_rdp_log"]["base"], base)
        assert row["driver"]["run_rdp_log"]["ops"] == [[spec.sigma, 1]]
        again = _restarted(d, s)
        np.testing.assert_array_equal(again.run_rdp, d.run_rdp)
        # a checkpoint written before the log (the array itself) restores as it was, and charges go on
        old = dict(row["driver"], run_rdp=d.run_rdp.copy())
        del old["run_rdp_log"]
        s.checkpoint(d.run_id, row["state"], row["reason"], unpack(pack(old)), row["machine"])
        again = _restarted(d, s)
        np.testing.assert_array_equal(again.run_rdp, d.run_rdp)
        ev = next(ev for ev in d.engine_entries if ev.uses_data)
        again._charge(ev)  # noqa: SLF001
        again.persist()
        later = _restarted(again, s)
        np.testing.assert_array_equal(later.run_rdp, d.run_rdp + d.cost.rows(1.0))
        for dd in drivers + [again, later]:
            dd.shutdown()

    asyncio.run(go())


def test_a_restart_whose_recomputed_rows_come_out_lower_reports_no_less(tmp_path):
    """The restarted process computes the per-σ rows again (the walk's all-pairs matrix: an
    eigendecomposition and products whose rounding depends on the BLAS thread count — measured ≤ 1.7e-14
    relative).  A replay from those rows could report a certified sum a few ulps below the one the run
    had before the restart; the reported value must never shrink through a restart."""

    async def go():
        spec = _spec(steps=60, cap=None)
        drivers, outbox = _drivers(tmp_path, spec)
        stores = _durable(drivers, tmp_path)
        for d in drivers:
            # on a 4-node ring the walk bound is above local DP (the row is α/2σ², exact arithmetic):
            # a tenth of its slope makes the rows the walk's, as at the network sizes it pays off
            c = d.cost
            d.cost = ContributionCost(
                c.targets, c.orders, sealed(c.walk_slope / 10), c.alpha_max, c.bound_name
            )
            d.start()
        await _pump(drivers, outbox, until_step=30)
        d, s = max(zip(drivers, stores), key=lambda p: p[0].contributions)
        assert d.contributions >= 2
        d.persist()
        c = d.cost
        # the same cost, its walk slopes rounded 1e-14 relative lower (as another BLAS thread count did)
        lower = ContributionCost(
            c.targets, c.orders, c.walk_slope * (1 - 1e-14), c.alpha_max, c.bound_name
        )
        assert (lower.rows(spec.sigma) < c.rows(spec.sigma)).any()  # the premise: rows that differ
        again = _restarted(d, s, cost=lower)
        assert (again.run_rdp >= d.run_rdp).all()
        np.testing.assert_array_equal(again.run_rdp, d.run_rdp)  # the very sum, bit for bit
        before, after = d.report()["certified"], again.report()["certified"]
        assert all(after[t] >= before[t] for t in before), (before, after)
        # charges after the restart add the restarted process's rows, as its ledger entries hold them
        ev = next(ev for ev in d.engine_entries if ev.uses_data)
        again._charge(ev)  # noqa: SLF001
        np.testing.assert_array_equal(again.run_rdp, d.run_rdp + lower.rows(spec.sigma))
        again.persist()
        later = _restarted(again, s, cost=c)  # and back on the first process's rounding
        np.testing.assert_array_equal(later.run_rdp, again.run_rdp)
        for dd in drivers + [again, later]:
            dd.shutdown()

    asyncio.run(go())
