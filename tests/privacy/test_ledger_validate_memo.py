"""The ledger takes a walk hop's curves as validated when they are the very read-only map it checked
last (issue 12: re-checking n keys and an n × orders matrix was most of a hop's charge at n = 2048).

The shortcut must change nothing: a run charged through :class:`ContributionCost` entries (the
shortcut) leaves the ledger exactly as the same curves charged as fresh, writable entries (checked
every time); a map or matrix the caller could change is never taken on trust; and the budget still
refuses the charge that would exceed it.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from hushnet.privacy.ledger import BudgetExceeded, Ledger, LedgerBudget, PrivacyEntry
from hushnet.protocols.registry import transition_matrix
from hushnet.runs.accounting import contribution_cost
from hushnet.runs.spec import Budget, RunSpec

N = 16


def _cost():
    spec = RunSpec(
        protocol="rw-dpsgd",
        task="logreg",
        graph="hypercube:4",
        steps=400,
        seed=1,
        budget=Budget(50.0, 1e-5),
        sigma=8.0,
        clip=1.0,
        step_size=0.05,
        cap=40,
    ).with_run_id()
    ids = [f"n{i}" for i in range(N)]
    return spec, ids, contribution_cost(spec, 0, ids, transition_matrix(spec.graph))


def _ev(step: int, sigma: float = 8.0):
    return SimpleNamespace(
        sigma=sigma, protocol="rw-dpsgd", view_model="sender-known", kind="gradient", step=step
    )


def test_charges_through_the_shortcut_equal_fresh_checked_entries(tmp_path) -> None:
    spec, ids, cost = _cost()
    budget = LedgerBudget(3.0, 1e-5)
    memo = Ledger(tmp_path / "memo.sqlite", node_id="n0", budget=budget)
    fresh = Ledger(tmp_path / "fresh.sqlite", node_id="n0", budget=budget)
    refused = {}
    for step in range(200):
        e = cost.entry(_ev(step), spec.run_id, "n0")
        f = PrivacyEntry.from_row(
            spec.run_id, "rw-dpsgd", "sender-known", "certified", cost.targets, np.array(e.rows)
        )
        for name, led, entry in (("memo", memo, e), ("fresh", fresh, f)):
            try:
                led.charge(entry, report=False)
            except BudgetExceeded as exc:
                refused.setdefault(name, (step, str(exc)))
    assert memo._state._valid is not None  # noqa: SLF001 - the shortcut was taken
    assert refused["memo"] == refused["fresh"]  # the budget refuses at the same step, same reason
    a, b = memo.spent(delta=1e-5), fresh.spent(delta=1e-5)
    assert a.keys() == b.keys()
    for t in a:
        assert a[t] == b[t]
    np.testing.assert_array_equal(memo.rdp("n5"), fresh.rdp("n5"))
    assert len(memo.entries()) == len(fresh.entries())


def test_curves_a_caller_could_change_are_checked_every_time(tmp_path) -> None:
    spec, ids, cost = _cost()
    led = Ledger(tmp_path / "l.sqlite", node_id="n0")
    rows = np.array(cost.rows(8.0))  # writable
    e = PrivacyEntry.from_row(
        spec.run_id, "rw-dpsgd", "sender-known", "certified", cost.targets, rows
    )
    led.charge(e, report=False)
    assert led._state._valid is None  # noqa: SLF001
    rows[3, 2] = np.nan  # the same entry, changed after its first charge: refused
    with pytest.raises(Exception, match="non-negative"):
        led.charge(e, report=False)
    # a read-only matrix behind a plain dict is not taken on trust either (the dict could change)
    ro = np.array(cost.rows(8.0))
    ro.flags.writeable = False
    d = PrivacyEntry.from_row(
        spec.run_id, "rw-dpsgd", "sender-known", "certified", cost.targets, ro
    )
    led.charge(d, report=False)
    assert led._state._valid is None  # noqa: SLF001
    # the map of a ContributionCost entry is read-only
    with pytest.raises(TypeError):
        cost.entry(_ev(1), spec.run_id, "n0").rdp["n1"] = np.zeros(3)  # type: ignore[index]


def test_memoised_rows_cannot_be_made_writeable_again(tmp_path) -> None:
    """``flags.writeable = False`` alone can be undone by the array's owner; a cost's per-σ rows (shared,
    and taken as validated when the same entry comes again) are sealed: backed by immutable bytes, so no
    holder can change them under the ledger's memo. A read-only array that could be made writeable
    again behind a read-only map is checked every time."""
    from types import MappingProxyType

    from hushnet.privacy.ledger_math import is_sealed

    spec, ids, cost = _cost()
    rows = cost.rows(8.0)
    assert is_sealed(rows) and is_sealed(rows[3])
    with pytest.raises(ValueError):
        rows.flags.writeable = True
    # an owned read-only array behind a read-only map: not trusted
    led = Ledger(tmp_path / "l.sqlite", node_id="n0")
    owned = np.array(rows)
    owned.flags.writeable = False
    assert not is_sealed(owned)
    e = PrivacyEntry.from_row(
        spec.run_id, "rw-dpsgd", "sender-known", "certified", cost.targets, owned
    )
    e = PrivacyEntry(
        e.run_id, e.protocol, e.view_model, e.bound, MappingProxyType(dict(e.rdp)), None, "", owned
    )
    led.charge(e, report=False)
    assert led._state._valid is None  # noqa: SLF001
    owned.flags.writeable = True
    owned[3, 2] = np.nan  # changed after its first charge: refused, not taken from the memo
    with pytest.raises(Exception, match="non-negative"):
        led.charge(e, report=False)
