"""Charges by reference (issue 12): a walk's later visits are charged without checking and composing
every target's totals, on an allowance the ledger proves once (``LedgerState.repeat_allowance``).

What must hold: the ledger accepts exactly the charges the exact path accepts (the allowance only ever
covers charges the exact check would take, the rest go the exact way), its totals, file and reopened
replay are the exact path's bit for bit, and the allowance is dropped by anything that changes what it
was proven against.
"""

from __future__ import annotations

import gc
import math

import numpy as np
import pytest

from hushnet.privacy.conversions import DEFAULT_ORDERS, rdp_to_dp
from hushnet.privacy.ledger import (
    BudgetExceeded,
    Ledger,
    LedgerBudget,
    PrivacyEntry,
    RepeatKey,
)
from hushnet.privacy.ledger_math import Costs, FrozenCurves, LedgerState, sealed

O = np.asarray(DEFAULT_ORDERS, dtype=float)


def _row(n: int, seed: int, alpha_max: float = math.inf, sigma: float = 8.0) -> np.ndarray:
    """A walk-like row: per target a slope times α/σ², capped by local DP, +∞ above ``alpha_max``."""
    rng = np.random.default_rng(seed)
    slope = rng.choice(rng.uniform(0.02, 0.6, size=max(2, n // 8)), size=n)
    walk = slope[:, None] * O[None, :] / sigma**2
    walk = np.where(O[None, :] <= alpha_max, walk, np.inf)
    return np.minimum(walk, O[None, :] / (2 * sigma**2))


def _entry(keys: tuple[str, ...], rows: np.ndarray, step: int = 0) -> PrivacyEntry:
    curves = FrozenCurves(keys, sealed(rows))
    return PrivacyEntry(
        "run", "rw", "anonymous", "certified", curves, None, f"step {step}", curves.rows
    )


def _budgets(keys: tuple[str, ...]) -> list[LedgerBudget]:
    per = {keys[1]: (0.9, 1e-6), keys[2]: (3.0, 1e-3)}
    curve = np.full(O.size, np.inf)
    curve[5:40] = 2.0
    return [
        LedgerBudget(2.5, 1e-5),
        LedgerBudget(4.0, 1e-6, per),
        LedgerBudget(math.inf, 1e-5, {}, curve),
        LedgerBudget(6.0, 1e-5, per, None, {keys[3]: np.where(np.isinf(curve), np.inf, 1.2)}),
    ]


def _run_both(tmp_path, budget, rows, keys, hops):
    """Charge ``hops`` times with a key (by reference where proven) and without (the exact path)."""
    fast = Ledger(tmp_path / "fast.sqlite", budget=budget, node_id="me")
    exact = Ledger(tmp_path / "exact.sqlite", budget=budget, node_id="me")
    key = RepeatKey("test")
    taken = {"fast": 0, "exact": 0, "by_reference": 0}
    for h in range(hops):
        e = _entry(keys, rows, h)
        if fast.charge_repeat(key, "run", "rw", "anonymous", f"step {h}"):
            taken["fast"] += 1
            taken["by_reference"] += 1
        else:
            try:
                fast.charge(e, report=False, repeat=key)
                taken["fast"] += 1
            except BudgetExceeded:
                pass
        try:
            exact.charge(e, report=False)
            taken["exact"] += 1
        except BudgetExceeded:
            pass
    return fast, exact, taken


@pytest.mark.parametrize("which", range(4))
@pytest.mark.parametrize("alpha_max", [math.inf, 40.0])
def test_same_charges_and_bits_as_the_exact_path(tmp_path, which, alpha_max):
    keys = tuple(f"n{i}" for i in range(1, 81))
    rows = _row(len(keys), seed=which, alpha_max=alpha_max)
    budget = _budgets(keys)[which]
    fast, exact, taken = _run_both(tmp_path, budget, rows, keys, hops=400)
    assert taken["fast"] == taken["exact"]
    assert 0 < taken["exact"] < 400  # the budget was reached: refusals happened on both
    assert taken["by_reference"] > 0
    a, b = fast.spent_columns(), exact.spent_columns()
    assert a.keys == b.keys
    assert np.array_equal(a.epsilon, b.epsilon)
    for k in keys:
        assert np.array_equal(fast.rdp(k), exact.rdp(k))
    assert len(fast.entries()) == len(exact.entries()) == taken["exact"]
    fast.close()
    exact.close()
    again = Ledger(tmp_path / "fast.sqlite")  # the file replays to the same sums
    for k in keys:
        assert np.array_equal(again.rdp(k), LedgerState_rdp(tmp_path / "exact.sqlite", k))
    again.close()


def LedgerState_rdp(path, k):  # noqa: N802 - a reopened exact ledger's curve
    with Ledger(path) as led:
        return led.rdp(k)


def test_allowance_is_proven_against_the_exact_conversion():
    """Random totals, costs and budgets: k more sequential additions stay within every budget when
    converted exactly, and (where k < cap) the allowance is not absurdly short of the exact count."""
    rng = np.random.default_rng(7)
    proven = 0
    for trial in range(60):
        m = int(rng.integers(1, 40))
        keys = [f"t{i}" for i in range(m)]
        B = _row(m, seed=trial, alpha_max=float(rng.choice([math.inf, 20.0, 3.0])))
        B *= rng.uniform(0.01, 3.0)
        state = LedgerState(O, "me")
        eps = float(rng.uniform(0.3, 8.0))
        delta = float(rng.choice([1e-3, 1e-5, 1e-7]))
        per = {keys[0]: (eps / 2, delta)} if m > 1 else {}
        state.budget = LedgerBudget(eps, delta, per)
        costs = Costs(keys, sealed(B), np.zeros(m), np.zeros(m, dtype=bool))
        for _ in range(int(rng.integers(1, 4))):
            state.add_costs(costs, "certified")
        k = state.repeat_allowance(costs, cap=10_000)
        tot = state._rdp[:m].copy()  # noqa: SLF001 - the totals, summed as the ledger sums them
        if k == 0:  # nothing proven (the totals may already be over: added here without checks)
            continue
        proven += 1
        for _ in range(k):
            tot = tot + B
        for i, t in enumerate(keys):
            be, bd = state.budget.for_target(t)
            assert rdp_to_dp(O, tot[i], bd)[0] <= be, (trial, t, k)
        if k < 10_000:  # one more would break (or nearly break) some target's budget
            nxt = tot + 1.2 * B  # 20 % beyond the next charge
            over = [
                rdp_to_dp(O, nxt[i], state.budget.for_target(t)[1])[0]
                > state.budget.for_target(t)[0] * 0.9
                for i, t in enumerate(keys)
            ]
            assert any(over), (trial, k)
    assert proven >= 20


def _primed(tmp_path, budget=None):
    keys = tuple(f"n{i}" for i in range(1, 33))
    rows = _row(len(keys), seed=3)
    led = Ledger(tmp_path / "l.sqlite", budget=budget or LedgerBudget(50.0, 1e-5), node_id="me")
    key = RepeatKey("k")
    led.charge(_entry(keys, rows), report=False, repeat=key)  # the first charge here proves one
    assert led.charge_repeat(key, "run", "rw", "anonymous")
    return led, key, keys, rows


def test_anything_that_changes_the_totals_or_budget_drops_the_allowance(tmp_path):
    led, key, keys, rows = _primed(tmp_path)
    other = RepeatKey("other")
    assert not led.charge_repeat(other, "run", "rw", "anonymous")  # another key
    led.charge(_entry(keys[:3], rows[:3]), report=False)  # another charge
    assert not led.charge_repeat(key, "run", "rw", "anonymous")
    led.charge(_entry(keys, rows), report=False, repeat=key)  # the streak starts again
    assert not led.charge_repeat(key, "run", "rw", "anonymous")
    led.charge(_entry(keys, rows), report=False, repeat=key)
    assert led.charge_repeat(key, "run", "rw", "anonymous")
    led.set_budget(LedgerBudget(50.0, 1e-5))  # a new budget
    assert not led.charge_repeat(key, "run", "rw", "anonymous")
    led.charge(_entry(keys, rows), report=False, repeat=key)
    assert led.charge_repeat(key, "run", "rw", "anonymous")
    before = led.spent_columns().epsilon.copy()  # reading composes; the allowance survives it
    assert led.charge_repeat(key, "run", "rw", "anonymous")
    assert (led.spent_columns().epsilon > before).all()
    led.charge(_entry(keys, rows), enforce_budget=False, report=False, repeat=key)
    assert not led.charge_repeat(key, "run", "rw", "anonymous")  # a top-up proves nothing
    led.close()


def test_a_key_that_is_gone_charges_nothing(tmp_path):
    led, key, keys, rows = _primed(tmp_path)
    n = len(led.entries())
    del key
    gc.collect()
    assert not led.charge_repeat(RepeatKey("k"), "run", "rw", "anonymous")
    assert len(led.entries()) == n
    led.close()


def test_charges_by_reference_are_durable_before_they_return(tmp_path):
    led, key, keys, rows = _primed(tmp_path)
    for _ in range(5):
        assert led.charge_repeat(key, "run", "rw", "anonymous", "later")
    # a second connection (another process after a crash) sees every charge without this one settling
    with Ledger(tmp_path / "l.sqlite") as other:
        assert other.entry_counts() == [("run", "rw", 7)]
        expect = rows[0] + rows[0]
        for _ in range(5):
            expect = expect + rows[0]
        assert np.array_equal(other.rdp(keys[0]), expect)
    led.close()


def test_nothing_is_charged_past_the_budget_by_reference(tmp_path):
    """Charged by reference until the allowance ends: the next charge is checked exactly and refused
    when it would go over — the same hop the exact path refuses."""
    keys = tuple(f"n{i}" for i in range(1, 17))
    rows = _row(len(keys), seed=11)
    budget = LedgerBudget(1.5, 1e-5)
    led = Ledger(tmp_path / "l.sqlite", budget=budget, node_id="me")
    key = RepeatKey("k")
    n = 0
    while True:
        if led.charge_repeat(key, "run", "rw", "anonymous"):
            n += 1
            continue
        try:
            led.charge(_entry(keys, rows), report=False, repeat=key)
            n += 1
        except BudgetExceeded:
            break
    worst = max(s.epsilon for s in led.spent().values())
    assert worst <= 1.5
    tot = led.rdp(keys[0])
    for k in keys:  # the next one would break some target's budget
        tot = led.rdp(k) + rows[keys.index(k)]
        if rdp_to_dp(O, tot, 1e-5)[0] > 1.5:
            break
    else:
        pytest.fail("stopped although every target had room")
    led.close()


def test_a_prepared_run_charges_its_first_visit_by_reference(tmp_path):
    """``prepare_repeat`` at acceptance: no charge recorded, the block stored; the first charge is by
    reference, and the totals, file and refusals are the exact path's — also with spending toward some
    of the targets already there, and a budget the run reaches."""
    keys = tuple(f"n{i}" for i in range(1, 41))
    rows = _row(len(keys), seed=5)
    budget = LedgerBudget(2.0, 1e-5, {keys[4]: (1.1, 1e-6)})
    fast = Ledger(tmp_path / "fast.sqlite", budget=budget, node_id="me")
    exact = Ledger(tmp_path / "exact.sqlite", budget=budget, node_id="me")
    earlier = _entry(keys[:7], rows[20:27] * 3.0)  # another run's spending toward 7 of the targets
    fast.charge(earlier, report=False)
    exact.charge(earlier, report=False)
    key = RepeatKey("run")
    assert fast.prepare_repeat(_entry(keys, rows), key) > 0
    assert len(fast.entries()) == 1  # nothing charged by preparing
    taken = {"fast": 0, "exact": 0, "ref": 0}
    for h in range(300):
        if fast.charge_repeat(key, "run", "rw", "anonymous", f"step {h}"):
            taken["fast"] += 1
            taken["ref"] += 1
        else:
            try:
                fast.charge(_entry(keys, rows, h), report=False, repeat=key)
                taken["fast"] += 1
            except BudgetExceeded:
                pass
        try:
            exact.charge(_entry(keys, rows, h), report=False)
            taken["exact"] += 1
        except BudgetExceeded:
            pass
        if h == 0:
            assert taken["ref"] == 1  # the very first visit
    assert taken["fast"] == taken["exact"] and 0 < taken["exact"] < 300
    for k in keys:
        assert np.array_equal(fast.rdp(k), exact.rdp(k))
    fast.close()
    exact.close()
    with Ledger(tmp_path / "fast.sqlite") as a, Ledger(tmp_path / "exact.sqlite") as b:
        assert np.array_equal(a.spent_columns().epsilon, b.spent_columns().epsilon)


def test_a_charge_between_preparing_and_the_first_visit_drops_it(tmp_path):
    keys = tuple(f"n{i}" for i in range(1, 9))
    rows = _row(len(keys), seed=6)
    led = Ledger(tmp_path / "l.sqlite", budget=LedgerBudget(50.0, 1e-5), node_id="me")
    key = RepeatKey("run")
    assert led.prepare_repeat(_entry(keys, rows), key) > 0
    led.charge(_entry(keys[:2], rows[:2]), report=False)  # another run's charge
    assert not led.charge_repeat(key, "run", "rw", "anonymous")
    # a budget with no room: nothing is prepared
    led.set_budget(LedgerBudget(0.0, 1e-5))
    assert led.prepare_repeat(_entry(keys, rows), key) == 0
    assert not led.charge_repeat(key, "run", "rw", "anonymous")
    led.close()
