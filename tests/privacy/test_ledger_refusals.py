"""Entries and budgets the ledger must refuse in one line rather than resolve silently.

Two defects (on main too, found by the review of wt-A): targets that map to one ledger key after
``as_key`` (``1`` and ``"1"``) collapsed to the LAST curve given — an entry stating a larger cost first
was charged the smaller one; and a NaN budget (ε, a per-node ε, an RDP curve) compared false with
everything, so nothing was ever refused — SQLite even stores a NaN as NULL, so a reopened per-node NaN
budget fell back to the uniform one.  Each is refused now, where the value comes in and where it is
read back from a file an older build wrote.
"""

from __future__ import annotations

import math
import sqlite3

import numpy as np
import pytest

import hushnet.privacy.ledger_math as lm
from hushnet.privacy.conversions import DEFAULT_ORDERS
from hushnet.privacy.ledger import Ledger, LedgerBudget, PrivacyEntry
from hushnet.privacy.ledger_math import LedgerError, LedgerState, sealed

O = DEFAULT_ORDERS


def _rows(n: int) -> np.ndarray:
    return np.outer(np.arange(1, n + 1, dtype=float), O) * 1e-3


# ---------------------------------------------------------------- repeated targets
@pytest.mark.parametrize("n", [2, 40])  # below and above the pointwise-maximum threshold
def test_from_row_refuses_a_target_named_twice(n: int) -> None:
    targets = [str(i) for i in range(n - 1)] + [0]  # 0 and "0": one ledger key
    with pytest.raises(LedgerError, match="names target '0' twice"):
        PrivacyEntry.from_row("r", "rw", "anonymous", "certified", targets, _rows(n))


def test_a_dict_entry_with_two_keys_for_one_target_is_refused_on_every_path() -> None:
    """The fast path (rows given), the per-target path (no rows) and with a μ: all refuse, none picks
    one of the two curves; and a charge through a Ledger records nothing."""
    big, small = O * 10.0, O * 0.0
    rdp = {1: big, "1": small, "2": small}
    st = LedgerState(O, "me", LedgerBudget(1.0, 1e-5))
    for entry in (
        PrivacyEntry("r", "x", "anonymous", "certified", rdp),
        PrivacyEntry("r", "x", "anonymous", "certified", rdp, rows=np.stack([big, small, small])),
        PrivacyEntry("r", "x", "anonymous", "certified", rdp, {"1": 0.1}),
    ):
        with pytest.raises(LedgerError, match="names target '1' twice"):
            st.validate(entry)
    with Ledger(":memory:", node_id="me") as led:
        with pytest.raises(LedgerError, match="twice"):
            led.charge(PrivacyEntry("r", "x", "anonymous", "certified", rdp))
        assert led.entries() == [] and led.spent() == {}


def test_a_mu_named_twice_is_refused() -> None:
    """A repeated μ key would keep the last μ, and the GDP side would under-count as the RDP one did."""
    st = LedgerState(O, "me")
    entry = PrivacyEntry("r", "x", "anonymous", "certified", {"1": O * 0.5}, {1: 2.0, "1": 0.01})
    with pytest.raises(LedgerError, match="gdp_mu names target '1' twice"):
        st.validate(entry)
    with pytest.raises(LedgerError, match="names target '1' twice"):
        PrivacyEntry.gaussian("r", "x", "anonymous", "certified", {1: 2.0, "1": 0.01})


def test_distinct_targets_still_take_the_fast_path_and_the_memo() -> None:
    """The refusal costs the usual entry nothing: rows stay the given matrix, the memo still hits."""
    keys = tuple(str(i) for i in range(50))
    rows = sealed(_rows(50))
    curves = lm.FrozenCurves(keys, rows)
    st = LedgerState(O, "me")
    entry = PrivacyEntry("r", "x", "anonymous", "certified", curves, rows=rows)
    c1 = st.validate(entry)
    assert c1.rdp is rows and st._valid is not None
    assert st.validate(entry).rdp is rows
    e2 = PrivacyEntry.from_row("r", "x", "anonymous", "certified", list(range(50)), _rows(50))
    assert e2.rows is not None and st.validate(e2).keys_ == list(keys)


# ---------------------------------------------------------------- budgets
BAD_BUDGETS = {
    "nan epsilon": LedgerBudget(math.nan, 1e-5),
    "negative epsilon": LedgerBudget(-1.0, 1e-5),
    "nan delta": LedgerBudget(1.0, math.nan),
    "inf delta": LedgerBudget(1.0, math.inf),
    "zero delta": LedgerBudget(1.0, 0.0),
    "non-number epsilon": LedgerBudget("1", 1e-5),  # type: ignore[arg-type]
    "per-node nan epsilon": LedgerBudget(1.0, 1e-5, {"a": (math.nan, 1e-5)}),
    "per-node negative epsilon": LedgerBudget(1.0, 1e-5, {"a": (-0.5, 1e-5)}),
    "per-node nan delta": LedgerBudget(1.0, 1e-5, {"a": (1.0, math.nan)}),
    "per-node not a pair": LedgerBudget(1.0, 1e-5, {"a": 1.0}),  # type: ignore[dict-item]
    "per-node twice": LedgerBudget(1.0, 1e-5, {1: (0.1, 1e-5), "1": (5.0, 1e-5)}),
    "curve nan": LedgerBudget(math.inf, 1e-5, rdp_curve=np.where(O > 8, np.nan, 1.0)),
    "curve negative": LedgerBudget(math.inf, 1e-5, rdp_curve=np.where(O > 8, -1.0, 1.0)),
    "per-node curve nan": LedgerBudget(1.0, 1e-5, per_target_rdp={"a": O * np.nan}),
    "per-node curve twice": LedgerBudget(1.0, 1e-5, per_target_rdp={1: O * 0.1, "1": O * 9.0}),
}


@pytest.mark.parametrize("name", list(BAD_BUDGETS))
def test_an_absurd_budget_is_refused_in_one_line(name: str) -> None:
    with pytest.raises(LedgerError) as err:
        lm.check_budget(BAD_BUDGETS[name], O)
    assert "\n" not in str(err.value)
    with Ledger(":memory:") as led:
        with pytest.raises(LedgerError):
            led.set_budget(BAD_BUDGETS[name])
        assert led.budget is None


def test_sensible_budgets_still_pass() -> None:
    """+∞ ε (no (ε, δ) limit beside an RDP curve) and +∞ in a curve (no limit at that order) are kept."""
    for b in (
        LedgerBudget(0.0, 1e-9),
        LedgerBudget(math.inf, 1e-6, rdp_curve=np.where(O > 64, np.inf, O * 0.1)),
        LedgerBudget(2.0, 1e-5, {"a": (math.inf, 1e-6)}, per_target_rdp={"b": O * 0.01}),
    ):
        lm.check_budget(b, O)


def _older_build_budget(path, rows: list[tuple]) -> None:
    """Write budget rows as a build that let a NaN through did: SQLite stores the NaN as NULL."""
    db = sqlite3.connect(path)
    db.execute("DELETE FROM budget")
    db.executemany("INSERT INTO budget VALUES (?, ?, ?, ?)", rows)
    db.commit()
    stored = db.execute("SELECT epsilon FROM budget WHERE epsilon IS NULL").fetchall()
    db.close()
    assert stored or all(r[1] is not None for r in rows)


@pytest.mark.parametrize(
    "rows",
    [
        [("*", math.nan, 1e-5, None)],  # uniform NaN ε: enforced nothing
        [("*", 1.0, 1e-5, None), ("a", math.nan, 1e-5, None)],  # per-node: fell back to the uniform
        [("*", 1.0, 1e-5, None), ("a", 1.0, None, None)],
        [("*", 1.0, 1e-5, None), ("a", None, None, None)],
        [("*", -1.0, 1e-5, None)],
        [("*", math.inf, 1e-5, np.full(O.size, np.nan).tobytes())],
        [("*", 1.0, 1e-5, None), ("a", None, None, b"\x00" * 7)],
    ],
    ids=[
        "uniform-nan",
        "per-node-nan",
        "per-node-no-delta",
        "empty",
        "negative",
        "curve-nan",
        "blob",
    ],
)
def test_a_stored_absurd_budget_is_refused_on_open_not_ignored(tmp_path, rows) -> None:
    path = tmp_path / "l.sqlite"
    with Ledger(path, node_id="me", budget=LedgerBudget(1.0, 1e-5)) as led:
        led.charge(
            PrivacyEntry.from_row("r", "x", "anonymous", "certified", ["a"], O[None, :] * 0.01)
        )
    _older_build_budget(path, rows)
    with pytest.raises(LedgerError) as err:
        Ledger(path)
    assert "\n" not in str(err.value)
    # opened with a new budget, the bad stored one is replaced; the spending is all there
    with Ledger(path, budget=LedgerBudget(0.5, 1e-6)) as led:
        assert led.budget.epsilon == 0.5 and led.spent("a").entries == 1
    with Ledger(path) as led:
        assert led.budget.epsilon == 0.5 and led.budget.per_target == {}


def test_a_sound_stored_budget_reopens_the_same(tmp_path) -> None:
    """Per-node ε, +∞ ε and curve-only per-node rows (NULL ε and δ) still reopen as they were set."""
    path = tmp_path / "l.sqlite"
    curve = np.where(O > 64, np.inf, O * 0.1)
    b = LedgerBudget(math.inf, 1e-5, {"a": (0.5, 1e-6)}, curve, {"b": O * 0.01})
    with Ledger(path, node_id="me", budget=b):
        pass
    with Ledger(path) as led:
        got = led.budget
    assert got.epsilon == math.inf and got.delta == 1e-5 and got.per_target == {"a": (0.5, 1e-6)}
    assert np.array_equal(got.rdp_curve, curve) and np.array_equal(
        got.per_target_rdp["b"], O * 0.01
    )
