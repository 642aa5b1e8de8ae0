"""Muffliato-GD charges its whole certified row at the first data action and zeros after it; the zero
rows are one sealed array, so a node's ledger stores one zero block per run, not one per step (at
n = 1024 the per-step zero blocks were 3 of each node's 4 ledger blocks, ~1.2 MB each)."""

from __future__ import annotations

import pathlib
import sqlite3

import numpy as np

from hushnet.engine.actions import LedgerEntry as EngineEntry
from hushnet.families.gossip.accounting import gossip_cost
from hushnet.privacy.ledger import Ledger
from hushnet.runs.net_experiments import prepare


def test_later_gd_steps_share_one_zero_block_and_charge_the_same(tmp_path: pathlib.Path) -> None:
    spec, _ = prepare("muffliato-gd", 16)
    ids = [f"n{i}" for i in range(16)]
    cost = gossip_cost(spec, 3, ids, orders=None)
    ledger = Ledger(tmp_path / "ledger.sqlite", orders=cost.orders, node_id="n3")
    steps = int(spec.steps)
    for step in range(steps):
        ev = EngineEntry(
            3, step, "gradient", spec.view_model, 2.0, 2.0 * spec.sigma, spec.sigma,
            spec.protocol, spec.run_id,
        )  # fmt: skip
        ledger.charge(cost.entry(ev, spec.run_id, "n3"), report=False)
    db = sqlite3.connect(tmp_path / "ledger.sqlite")
    assert db.execute("SELECT COUNT(*) FROM entries").fetchone()[0] == steps
    assert db.execute("SELECT COUNT(*) FROM blocks").fetchone()[0] == 2  # the row, one zero block
    # what is charged is unchanged: the whole run's row once, nothing after it
    assert np.array_equal(cost.charged, cost.phase_curves[0])
    once = Ledger(tmp_path / "once.sqlite", orders=cost.orders, node_id="n3")
    once.charge(
        gossip_cost(spec, 3, ids).entry(ev, spec.run_id, "n3"), report=False
    )  # step 0 alone
    spent, alone = ledger.spent(), once.spent()
    assert set(spent) == set(alone) == set(cost.targets)
    assert all(spent[t].epsilon == alone[t].epsilon for t in cost.targets)
    ledger.close()
    once.close()


def _gd_entries(spec, cost, vertex: int, node: str):
    for step in range(int(spec.steps)):
        ev = EngineEntry(
            vertex, step, "gradient", spec.view_model, 2.0, 2.0 * spec.sigma, spec.sigma,
            spec.protocol, spec.run_id,
        )  # fmt: skip
        yield cost.entry(ev, spec.run_id, node)


def test_gossip_cost_keeps_sensitivities_not_curves_and_charges_the_same_bits() -> None:
    """A hosted node's cost holds one (targets × orders) array for the run (what it charged), not the
    projected curves as well (159× its sensitivities: 1.3 MB a node at n = 1024); the curves it charges
    are bit for bit the ones built from the whole (phases, targets, orders) array, as before."""
    from hushnet.families.gossip.accounting import certified_sensitivities, rdp_curves
    from hushnet.protocols.registry import transition_matrix

    spec, _ = prepare("muffliato-gd", 16)
    ids = [f"n{i}" for i in range(16)]
    cost = gossip_cost(spec, 3, ids)
    big = len(cost.targets) * cost.orders.size
    entries = list(_gd_entries(spec, cost, 3, "n3"))
    held = [k for k, v in vars(cost).items() if isinstance(v, np.ndarray) and v.size >= big]
    assert held == ["charged"]
    sens = certified_sensitivities(spec, 3, transition_matrix(spec.graph, spec.weights))
    keep = [v for v in range(16) if v != 3]
    before = rdp_curves(sens[:, keep], spec.sigma, cost.orders)  # what the cost kept until now
    assert before.tobytes() == cost.phase_curves.tobytes() == cost.phase_row(0)[None].tobytes()
    assert entries[0].rows.tobytes() == before[0].tobytes()
    assert cost.charged.tobytes() == before[0].tobytes()  # the zero steps added nothing
    assert all(not e.rows.any() for e in entries[1:])


def test_driver_keeps_its_run_row_through_zero_steps() -> None:
    """The driver's run row (targets × orders) is not rebuilt for a step that charges nothing: the
    same array, the same values, after Muffliato-GD's later steps (each was a new n × 159 array)."""
    from hushnet.runs.driver import RunDriver

    spec, _ = prepare("muffliato-gd", 16)
    ids = [f"n{i}" for i in range(16)]
    cost = gossip_cost(spec, 3, ids)
    d = RunDriver(spec, 3, ids, None, None, cost=cost)  # no ledger: the run row only
    rows = []
    for step in range(int(spec.steps)):
        ev = EngineEntry(
            3, step, "gradient", spec.view_model, 2.0, 2.0 * spec.sigma, spec.sigma,
            spec.protocol, spec.run_id,
        )  # fmt: skip
        assert d._charge(ev)  # noqa: SLF001 - the charge path itself
        rows.append(d.run_rdp)
    assert all(r is rows[0] for r in rows)
    assert rows[0].tobytes() == cost.phase_row(0).tobytes()
    # one array for the run's charged row: the cost's and the driver's, read-only
    assert rows[0] is cost.charged and not rows[0].flags.writeable
