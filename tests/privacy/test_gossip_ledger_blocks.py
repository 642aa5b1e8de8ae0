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
