"""A target cleared by the pointwise maximum takes the maximum's best order as its hint, even when it
had one: the quick check had just failed at that old hint, and kept, it failed again at every later
charge, sending the target back to the maximum's conversion (a speed defect, found by the review of
wt-A; the quick check is an upper bound at any order, so the new hint is as sound as the old)."""

from __future__ import annotations

import numpy as np

import hushnet.privacy.ledger_math as lm
from hushnet.privacy.conversions import DEFAULT_ORDERS, rdp_epsilon
from hushnet.privacy.ledger import LedgerBudget, PrivacyEntry
from hushnet.privacy.ledger_math import _RTOL, LedgerState, sealed

O = DEFAULT_ORDERS


def test_a_walk_whose_cost_piles_up_at_the_first_hint_stops_needing_the_maximum(
    monkeypatch,
) -> None:
    """90 targets; after the first charge every hop's cost sits at the first hint's orders, so the
    quick check fails there and the maximum clears the rows.  Every decision equals the exact path's,
    and the maximum runs on a handful of hops, not on every one (297 of 300 with the stale hint)."""
    calls = []
    orig = lm.Projections._cleared_by_maximum

    def counting(self, sel):
        calls.append(sel.size)
        return orig(self, sel)

    monkeypatch.setattr(lm.Projections, "_cleared_by_maximum", counting)
    n, hops = 90, 120
    pool = [f"n{j}" for j in range(n)]
    rows = np.outer(np.linspace(1e-3, 2e-3, n), O)
    budget = LedgerBudget(float(rdp_epsilon(O, rows, 1e-5)[0].max()) * 12, 1e-5)
    fast, exact = LedgerState(O, "me", budget), LedgerState(O, "me", budget)
    near = None
    for hop in range(hops):
        if hop == 0:
            r = rows
        else:
            if near is None:
                near = np.abs(np.arange(O.size) - int(fast._hint[0])) <= 3
            r = np.where(near, rows * 6, rows * 0.05)
        entry = PrivacyEntry.from_row("r", "rw", "anonymous", "certified", pool, sealed(r))
        cf, ce = fast.validate(entry), exact.validate(entry)
        pf, pe = fast.projection(cf), exact.projection(ce)
        bad = LedgerState.violations(pf)
        want = {t: p for t, p in pe._all().items() if p[0] > p[3] * (1 + _RTOL) or p[5]}
        assert bad == want, hop
        assert not bad  # the budget is far: every hop is accepted
        fast.add_costs(cf, "certified", pf)
        exact.add_costs(ce, "certified", pe)
    assert np.array_equal(fast._rdp[:n], exact._rdp[:n])
    assert len(calls) <= 10, f"the maximum ran on {len(calls)} of {hops} hops"
