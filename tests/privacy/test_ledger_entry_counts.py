"""A node's ``run.ledger`` answer counts its entries per run in SQL (``Ledger.entry_counts``) instead of
reading every entry's per-target costs (~20 ms a node at n = 1024, most of the answer's time): the
counts, the run order and each run's protocol are those :meth:`Ledger.entries` gives."""

from __future__ import annotations

import dataclasses
import pathlib

from hushnet.engine.actions import LedgerEntry as EngineEntry
from hushnet.families.gossip.accounting import gossip_cost
from hushnet.privacy.ledger import Ledger
from hushnet.runs.net_experiments import prepare


def test_entry_counts_equal_what_the_entries_say(tmp_path: pathlib.Path) -> None:
    spec, _ = prepare("muffliato-gd", 16)
    other = dataclasses.replace(spec, run_id=spec.run_id + "-b")
    ids = [f"n{i}" for i in range(16)]
    ledger = Ledger(tmp_path / "ledger.sqlite", orders=None, node_id="n3")
    assert ledger.entry_counts() == []
    # interleaved runs; later Muffliato-GD steps reuse a stored block, the first ones write costs
    for s, step in ((spec, 0), (other, 0), (spec, 1), (spec, 2), (other, 1)):
        cost = gossip_cost(s, 3, ids, orders=None)
        ev = EngineEntry(
            3, step, "gradient", s.view_model, 2.0, 2.0 * s.sigma, s.sigma, s.protocol, s.run_id,
        )  # fmt: skip
        ledger.charge(cost.entry(ev, s.run_id, "n3"), report=False)
    expected: dict[str, list] = {}
    for e in ledger.entries():
        expected.setdefault(e["run_id"], [e["protocol"], 0])[1] += 1
    assert ledger.entry_counts() == [(rid, p, n) for rid, (p, n) in expected.items()]
    assert [n for _, _, n in ledger.entry_counts()] == [3, 2]
