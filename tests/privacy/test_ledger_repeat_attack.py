"""An adversarial review of charges by reference (issue 12, ``Ledger.charge_repeat``): a certified bound
that is too small is a privacy breach, so every claim the shortcut rests on is attacked here with a test
that fails if the claim is false.

1. Soundness: nothing is recorded by reference that the exact path (``charge`` without a key) would
   refuse — :meth:`LedgerState.repeat_allowance` on adversarial floats (zero, subnormal, huge and +∞
   costs and totals, orders near 1 and +∞, ε = 0 budgets, RDP budget curves with 0 and +∞, several δ,
   allowances near :data:`REPEAT_CAP` with sums that round up at every addition).
2. Exactness: every read equals the exact path's bit for bit (the lockstep test reads at random
   moments, so a read that forgot to settle would show), and so does the reopened file.
3. Invalidation: other charges and keys, top-ups, new budgets, a key that is gone, charges that raised,
   a store write that fails (a full disk: SQLite's own error), a reopened ledger, two threads.
"""

from __future__ import annotations

import gc
import math
import sqlite3
import threading

import numpy as np
import pytest

from hushnet.privacy.conversions import DEFAULT_ORDERS, rdp_epsilon
from hushnet.privacy.ledger import (
    BudgetExceeded,
    Ledger,
    LedgerBudget,
    PrivacyEntry,
    RepeatKey,
)
from hushnet.privacy.ledger_math import (
    _RTOL,
    REPEAT_CAP,
    Costs,
    FrozenCurves,
    LedgerState,
    sealed,
)

O = np.asarray(DEFAULT_ORDERS, dtype=float)


def _walk_row(m: int, rng: np.random.Generator, sigma: float = 6.0, alpha_max=math.inf):
    """Walk-like curves (a slope per target, few distinct: rows repeat), capped by local DP."""
    slope = rng.choice(rng.uniform(0.02, 0.6, size=max(2, m // 6)), size=m)
    walk = slope[:, None] * O[None, :] / sigma**2
    walk = np.where(O[None, :] <= alpha_max, walk, np.inf)
    return np.minimum(walk, O[None, :] / (2 * sigma**2))


def _entry(keys, rows, note: str = "") -> PrivacyEntry:
    """A run's entry as the driver builds it: a frozen map over sealed rows (a new map each call)."""
    curves = FrozenCurves(tuple(keys), sealed(np.asarray(rows, dtype=np.float64)))
    return PrivacyEntry("run", "rw", "anonymous", "certified", curves, None, note, curves.rows)


def _no_costs(m: int) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(m), np.zeros(m, dtype=bool)


def _sequential_within(state: LedgerState, costs: Costs, T: np.ndarray, k: int) -> None:
    """Adds ``costs`` to ``T`` k times as the ledger adds them and asserts that the exact path accepts
    every one of those charges (each intermediate total within every (ε, δ) budget and RDP curve)."""
    if k == 0:
        return
    B = costs.rdp
    be, bd, curves, has = state.budget_arrays(costs)
    steps = np.empty((k,) + T.shape)
    tot = T.copy()
    for i in range(k):
        tot += B
        steps[i] = tot
    for d in np.unique(bd):
        sel = np.flatnonzero(bd == d)
        if not np.isfinite(be[sel]).any():
            continue
        eps, _ = rdp_epsilon(state.orders, steps[:, sel], float(d))
        over = eps > be[sel][None, :] * (1 + _RTOL)
        assert not over.any(), (
            f"charge {int(np.argwhere(over)[0][0]) + 1} of {k} proven by reference is over budget"
        )
    if curves is not None:
        bad = has[None, :] & np.any(steps > curves[None] * (1 + _RTOL), axis=2)
        assert not bad.any(), "a charge proven by reference is over its RDP budget curve"


# --------------------------------------------------------------------------- 1. soundness


def _adversarial(rng: np.random.Generator, shape, scale: float) -> np.ndarray:
    v = rng.uniform(0.0, 1.0, size=shape) * scale
    mask = rng.uniform(size=shape)
    kind = int(rng.integers(0, 6))
    if kind == 1:
        v = np.where(mask < 0.3, 0.0, v)
    elif kind == 2:
        v = np.where(mask < 0.2, math.inf, v)
    elif kind == 3:  # subnormal
        v = np.where(mask < 0.3, 5e-324 * rng.integers(1, 1000, size=shape), v)
    elif kind == 4:
        v = np.where(mask < 0.3, 1e300 * rng.uniform(size=shape), v)
    elif kind == 5:
        v = np.where(mask < 0.3, -0.0, v)
    return v


@pytest.mark.parametrize("seed", range(3))
def test_allowance_never_covers_a_charge_the_exact_path_refuses(seed):
    """Random adversarial totals, costs, orders and budgets; every covered charge checked exactly."""
    rng = np.random.default_rng(1000 + seed)
    covered = 0
    for _ in range(150):
        orders = [
            O,
            np.array([1.0000001, 1.005, 1.01, 1.0100000001, 1.5, 2.0, 8.0, 1e6, 1e300, math.inf]),
            np.array([2.0, math.inf]),
        ][int(rng.integers(0, 3))]
        m = int(rng.integers(1, 24))
        keys = [f"t{i}" for i in range(m)]
        scale = 10.0 ** rng.uniform(-12, 1)
        B = np.abs(_adversarial(rng, (m, orders.size), scale))
        T0 = np.abs(_adversarial(rng, (m, orders.size), scale * rng.uniform(0, 50)))
        delta = float(rng.choice([5e-324, 1e-12, 1e-6, 0.5, 0.999999]))
        zero = rng.uniform() < 0.15  # budgets of ε = 0 (or nearly): only nothing fits
        per = {
            t: (
                float(rng.choice([0.0, 1e-300] if zero else [0.1, 2.0, 30.0, math.inf])),
                float(rng.choice([1e-9, 1e-3, 0.3])),
            )
            for t in keys
            if rng.uniform() < 0.2
        }
        curve = None
        if rng.uniform() < 0.3:
            curve = np.abs(_adversarial(rng, orders.size, scale * rng.uniform(0, 100)))
        per_curve = {
            t: np.abs(_adversarial(rng, orders.size, scale * rng.uniform(0, 100)))
            for t in keys[:3]
            if rng.uniform() < 0.2
        }
        eps = float(rng.choice([0.0, 1e-300, 1e-9] if zero else [0.5, 3.0, 50.0, 1e6, math.inf]))
        state = LedgerState(orders, "me")
        state.budget = LedgerBudget(eps, delta, per, curve, per_curve)
        costs = Costs(keys, sealed(np.ascontiguousarray(B)), *_no_costs(m))
        state.add_costs(Costs(keys, T0.copy(), *_no_costs(m)), "certified")
        state.add_costs(costs, "certified")
        cap = int(rng.choice([1, 7, 300]))
        k = state.repeat_allowance(costs, cap=cap)
        assert 0 <= k <= cap
        if k:
            covered += 1
            _sequential_within(state, costs, state._rdp[:m].copy(), k)  # noqa: SLF001
    assert covered >= 15  # the attack reached the allowance, not only its refusals


@pytest.mark.parametrize("seed", range(2))
def test_allowance_at_the_budget_edge(seed):
    """Budgets set at the exact ε (or a hair above / below) of the totals after K more charges: the
    allowance must stop at or before the last charge the exact path accepts."""
    rng = np.random.default_rng(2000 + seed)
    tight = 0
    for _ in range(60):
        m = int(rng.integers(1, 5))
        keys = [f"t{i}" for i in range(m)]
        B = rng.uniform(0.2, 1.0, size=(m, O.size)) * 10.0 ** rng.uniform(-6, -2) * O[None, :]
        B = np.where(rng.uniform(size=B.shape) < 0.05, 0.0, B)
        delta = float(rng.choice([1e-9, 1e-5, 0.3]))
        K = int(rng.integers(1, 400))
        S = B + B
        for _ in range(K):
            S = S + B
        e, _ = rdp_epsilon(O, S, delta)
        factor = float(rng.choice([1.0, 1 + 1e-15, 1 + 1e-12, 1 - 1e-12]))
        state = LedgerState(O, "me")
        if rng.uniform() < 0.3:  # every target's own RDP curve: its totals after K more charges
            free = rng.uniform(size=O.size) < 0.5
            curves = {k: np.where(free, np.inf, S[i] * factor) for i, k in enumerate(keys)}
            state.budget = LedgerBudget(math.inf, delta, {}, None, curves)
        else:  # every target's own ε: its exact ε after K more charges
            per = {k: (float(e[i]) * factor, delta) for i, k in enumerate(keys)}
            state.budget = LedgerBudget(math.inf, delta, per)
        costs = Costs(keys, sealed(B), *_no_costs(m))
        state.add_costs(costs, "certified")
        state.add_costs(costs, "certified")
        k = state.repeat_allowance(costs, cap=600)
        if k:
            tight += k >= K - 2
            _sequential_within(state, costs, state._rdp[:m].copy(), k)  # noqa: SLF001
    assert tight >= 10  # the edge was reached


def test_allowance_near_the_cap_with_sums_that_round_up_at_every_addition():
    """A cost just over half an ulp of the total: each float addition adds a whole ulp (twice the cost),
    the worst case of the allowance's float slack; the budget curve leaves room for about REPEAT_CAP
    charges.  Every covered charge is checked exactly (the sums made as the ledger makes them)."""
    orders = np.array([2.0, 4.0, 8.0])
    ulp = np.spacing(1.0)
    B = np.array([[ulp / 2 * (1 + 2**-40), 1e-12, ulp / 2 * (1 + 2**-30)]])
    T = np.array([[1.0, 0.0, 1.0]])
    # the proposal keeps 1e-7 of the curve in reserve: a curve that leaves room for ~cap real additions
    curve = (T[0] + (REPEAT_CAP + 8) * 2 * B[0]) / (1 - 1e-7) * (1 + 1e-9)
    state = LedgerState(orders, "me")
    state.budget = LedgerBudget(math.inf, 1e-5, {}, curve)
    state.add_costs(Costs(["a"], T.copy(), *_no_costs(1)), "certified")
    costs = Costs(["a"], sealed(B), *_no_costs(1))
    k = state.repeat_allowance(costs)
    assert 0 < k <= REPEAT_CAP
    tot = state._rdp[:1].copy()  # noqa: SLF001
    chunk = 1 << 16
    done = 0
    while done < k:  # k sequential additions, in chunks (np.cumsum adds in sequence, as += does)
        n = min(chunk, k - done)
        seq = np.cumsum(np.concatenate([tot, np.broadcast_to(B, (n, 3))]), axis=0)[1:]
        assert not np.any(seq > curve[None, :] * (1 + _RTOL))
        tot = seq[-1:].copy()
        done += n
    assert tot[0, 0] == 1.0 + k * ulp  # every addition rounded up: the sums are twice the costs


@pytest.mark.parametrize("kind", ["eps", "curve"])
@pytest.mark.parametrize("rounding", ["fine", "round_up"])
def test_allowance_with_charges_finer_than_any_slack(kind, rounding):
    """Charges that move the total by ~1e-11 of itself ("fine"), or by one ulp while costing half of one
    ("round_up": every addition rounds up, the sums grow twice as fast as the costs), at one order (so
    the allowance's order is the exact conversion's): an allowance that took any slack — a 1e-9
    tolerance, or no room for the roundings of many additions — would cover charges that the exact
    path (relative 1e-12) refuses, at the budget set at the totals after K charges."""
    orders = np.array([8.0])
    if rounding == "fine":
        T, K = np.array([[0.5]]), 3000
        B = T * 1e-11
    else:
        T, K = np.array([[1.0]]), 200_000
        B = np.array([[np.spacing(1.0) / 2 * (1 + 2**-40)]])
    S = np.cumsum(np.concatenate([T, np.broadcast_to(B, (K, 1))]), axis=0)[-1:]
    delta = 1e-6
    state = LedgerState(orders, "me")
    if kind == "eps":
        state.budget = LedgerBudget(
            math.inf, delta, {"a": (float(rdp_epsilon(orders, S, delta)[0][0]), delta)}
        )
    else:
        state.budget = LedgerBudget(math.inf, delta, {}, None, {"a": S[0]})
    state.add_costs(Costs(["a"], T.copy(), *_no_costs(1)), "certified")
    costs = Costs(["a"], sealed(B), *_no_costs(1))
    k = state.repeat_allowance(costs, cap=4 * K)
    _sequential_within(state, costs, state._rdp[:1].copy(), k)  # noqa: SLF001


def test_edge_budgets_and_costs():
    """ε = 0 toward a target the cost does not touch (exactly 0 stays ε = 0), a total already over its
    budget (after a top-up: nothing may be covered), and a cost of +∞ at every order the budget curve
    limits (refused by the exact path: nothing may be covered)."""
    keys = ["a", "b"]
    B = np.tile(O / 2e4, (2, 1))
    state = LedgerState(O, "me")
    state.budget = LedgerBudget(5.0, 1e-5, {"b": (0.0, 1e-5)})
    zero_b = B.copy()
    zero_b[1] = 0.0  # ε = 0 toward b: only a cost of exactly nothing fits, which is ε = 0 exactly
    costs = Costs(keys, sealed(zero_b), *_no_costs(2))
    state.add_costs(costs, "certified")
    k = state.repeat_allowance(costs, cap=50)
    _sequential_within(state, costs, state._rdp[:2].copy(), k)  # noqa: SLF001
    over = LedgerState(O, "me")
    over.budget = LedgerBudget(0.5, 1e-5)
    big = Costs(keys, sealed(B * 1e3), *_no_costs(2))
    over.add_costs(big, "certified")  # a top-up past the budget
    assert over.repeat_allowance(Costs(keys, sealed(B), *_no_costs(2))) == 0
    inf = LedgerState(O, "me")
    curve = np.full(O.size, 1.0)
    curve[-1] = np.inf
    inf.budget = LedgerBudget(math.inf, 1e-5, {}, curve)
    inf.add_costs(Costs(keys, np.zeros((2, O.size)), *_no_costs(2)), "certified")
    c = np.full((2, O.size), np.inf)
    c[:, -1] = 1.0
    assert inf.repeat_allowance(Costs(keys, sealed(c), *_no_costs(2))) == 0


def test_equal_rows_with_different_budgets_are_not_merged():
    """Twenty targets with the same totals and cost (the allowance groups equal rows), the last one with
    a tighter budget (δ or ε): its own budget bounds the allowance, not its group's first row's."""
    m = 20
    keys = [f"t{i}" for i in range(m)]
    B = np.tile(O / 2e3, (m, 1))
    for tight in [(1.0, 1e-5), (3.0, 1e-12)]:
        state = LedgerState(O, "me")
        state.budget = LedgerBudget(3.0, 1e-5, {keys[-1]: tight})
        costs = Costs(keys, sealed(B), *_no_costs(m))
        state.add_costs(costs, "certified")
        state.add_costs(costs, "certified")
        k = state.repeat_allowance(costs, cap=2000)
        loose = LedgerState(O, "me")
        loose.budget = LedgerBudget(3.0, 1e-5)
        loose.add_costs(costs, "certified")
        loose.add_costs(costs, "certified")
        assert 0 < k < loose.repeat_allowance(costs, cap=2000)
        _sequential_within(state, costs, state._rdp[:m].copy(), k)  # noqa: SLF001


def test_per_node_budgets_keyed_by_non_string_ids(tmp_path):
    """Targets named by integers (keyed as strings) and a per-node budget given with an integer key:
    charges by reference stop where the exact path stops, at that node's own budget."""
    targets = list(range(1, 21))
    rows = _walk_row(len(targets), np.random.default_rng(2), sigma=20.0)
    budget = LedgerBudget(50.0, 1e-5, {7: (1.0, 1e-5)})
    led = Ledger(tmp_path / "fast.sqlite", budget=budget, node_id="0")
    exact = Ledger(tmp_path / "exact.sqlite", budget=budget, node_id="0")
    key = RepeatKey("k")

    def entry() -> PrivacyEntry:
        return PrivacyEntry.from_row("run", "rw", "anonymous", "certified", targets, rows)

    n = {"fast": 0, "exact": 0, "by_reference": 0}
    for _ in range(400):
        if led.charge_repeat(key, "run", "rw", "anonymous"):
            n["fast"] += 1
            n["by_reference"] += 1
        else:
            try:
                led.charge(entry(), report=False, repeat=key)
                n["fast"] += 1
            except BudgetExceeded as exc:
                assert exc.target == "7"
                break
    while True:
        try:
            exact.charge(entry(), report=False)
            n["exact"] += 1
        except BudgetExceeded:
            break
    assert n["fast"] == n["exact"] and n["by_reference"] > 0, n
    assert led.spent(7).epsilon <= 1.0 < led.spent(7).epsilon + 0.2
    assert np.array_equal(led.rdp(7), exact.rdp(7))
    led.close()
    exact.close()


# --------------------------------------------------------------------------- 2 + 3. lockstep


def _same_reads(fast: Ledger, exact: Ledger, keys, rng) -> None:
    """Every read of the fast ledger equals the exact one's, bit for bit (one reader picked at random
    first, so that each of them is at some point the first read after charges by reference)."""
    readers = ["columns", "spent", "spent_one", "rdp", "remaining", "would_exceed", "delta"]
    first = str(rng.choice(readers))
    order = [first] + [r for r in readers if r != first]
    for r in order:
        if r == "columns":
            a, b = fast.spent_columns(), exact.spent_columns()
            assert a.keys == b.keys
            for f in ("epsilon", "delta", "best_order"):
                assert np.array_equal(
                    getattr(a, f).view(np.uint64), getattr(b, f).view(np.uint64)
                ), f
            for f in ("gdp", "paper", "entries"):
                assert np.array_equal(getattr(a, f), getattr(b, f)), f
        elif r == "spent":
            assert fast.spent() == exact.spent()
        elif r == "spent_one":
            t = str(rng.choice(keys))
            assert fast.spent(t) == exact.spent(t)
        elif r == "rdp":
            for t in keys:
                assert np.array_equal(fast.rdp(t).view(np.uint64), exact.rdp(t).view(np.uint64))
        elif r == "remaining":
            assert fast.remaining(keys) == exact.remaining(keys)
        elif r == "would_exceed":
            e = _entry(keys[:5], np.tile(O / 3e3, (5, 1)))
            assert fast.would_exceed(e) == exact.would_exceed(e)
        elif r == "delta":
            assert fast.spent(delta=1e-3) == exact.spent(delta=1e-3)


def _budgets(keys) -> list[LedgerBudget]:
    curve = np.full(O.size, np.inf)
    curve[10:60] = 3.0
    tight = np.where(np.isinf(curve), np.inf, 1.1)
    return [
        LedgerBudget(3.0, 1e-5),
        # n99: a budget (ε = 0) toward a node nothing is charged toward
        LedgerBudget(6.0, 1e-6, {keys[1]: (1.2, 1e-6), keys[2]: (4.0, 1e-3), "n99": (0.0, 0.5)}),
        LedgerBudget(math.inf, 1e-5, {}, curve),
        LedgerBudget(8.0, 1e-5, {keys[4]: (2.0, 1e-9)}, None, {keys[5]: tight}),
        LedgerBudget(1e-9, 1e-5),
        LedgerBudget(1e3, 1e-5),
    ]


@pytest.mark.parametrize("seed", range(4))
def test_lockstep_with_the_exact_path_under_random_operations(tmp_path, seed):
    """A fast ledger (keys, charges by reference) and an exact one (no keys) take the same random
    operations: visits of two walks, other charges, top-ups, new budgets, keys that die, reopened
    files, reads at random moments.  They must accept and refuse the same charges, and every read and
    every entry must be the same bit for bit.  Without top-ups or budget changes, every target's exact
    (ε, δ) stays within its budget after every operation."""
    rng = np.random.default_rng(seed)
    keys = [f"n{i}" for i in range(1, 25)]  # ≥ 16 targets: the allowance groups equal rows
    budgets = _budgets(keys)
    tame = seed % 2 == 1  # no top-ups, no budget changes: a budget that holds throughout
    b0 = budgets[seed % 4]
    paths = {w: tmp_path / f"{w}.sqlite" for w in ("fast", "exact")}
    fast = Ledger(paths["fast"], budget=b0, node_id="me")
    exact = Ledger(paths["exact"], budget=b0, node_id="me")
    walk1 = _walk_row(len(keys), rng, sigma=25.0)
    zero_b = walk1.copy()
    zero_b[2] = 0.0  # nothing toward n3 (whose budget may be ε = 0)
    walk2 = _walk_row(12, rng, sigma=20.0, alpha_max=30.0)
    walks = {"w1": (keys, walk1), "w1z": (keys, zero_b), "w2": (keys[6:18], walk2)}
    rkeys = {w: RepeatKey(w) for w in walks}
    counts = {"by_reference": 0, "accepted": 0, "refused": 0}
    ops = []
    for step in range(260):
        op = str(
            rng.choice(
                ["visit"] * 14 + ["other", "topup", "budget", "read", "reopen", "gone", "raise"]
            )
        )
        if tame and op in ("topup", "budget"):
            op = "visit"
        ops.append(op)
        if op == "visit":
            w = str(rng.choice(["w1"] * 6 + ["w1z", "w2"]))
            ks, rows = walks[w]
            by_ref = fast.charge_repeat(rkeys[w], "run", "rw", "anonymous", f"v{step}")
            ok_fast = by_ref
            if not by_ref:
                try:
                    fast.charge(_entry(ks, rows, f"v{step}"), report=False, repeat=rkeys[w])
                    ok_fast = True
                except BudgetExceeded:
                    ok_fast = False
            try:
                exact.charge(_entry(ks, rows, f"v{step}"), report=False)
                ok_exact = True
            except BudgetExceeded:
                ok_exact = False
            assert ok_fast == ok_exact, (step, ops[-12:], by_ref)
            counts["by_reference"] += by_ref
            counts["accepted" if ok_exact else "refused"] += 1
        elif op in ("other", "topup"):
            sub = sorted(rng.choice(len(keys), size=int(rng.integers(1, 6)), replace=False))
            e = _entry([keys[i] for i in sub], walk1[sub] * rng.uniform(0.5, 3.0), op)
            enforce = op == "other"
            res = []
            for led in (fast, exact):
                try:
                    led.charge(e, report=False, enforce_budget=enforce)
                    res.append(True)
                except BudgetExceeded:
                    res.append(False)
            assert res[0] == res[1]
        elif op == "budget":
            b = budgets[int(rng.integers(0, len(budgets)))]
            fast.set_budget(b)
            exact.set_budget(b)
        elif op == "read":
            _same_reads(fast, exact, keys, rng)
        elif op == "reopen":
            fast.close()
            exact.close()
            fast, exact = Ledger(paths["fast"]), Ledger(paths["exact"])
        elif op == "gone":
            w = str(rng.choice(list(walks)))
            rkeys[w] = None
            gc.collect()
            rkeys[w] = RepeatKey(w)
        elif op == "raise":  # charges that raise: a bad entry, and a refused one
            bad = _entry(keys[:2], np.full((2, O.size), -1.0))
            for led in (fast, exact):
                with pytest.raises(ValueError):
                    led.charge(bad, report=False, repeat=rkeys["w1"])
            huge = _entry(keys[:3], np.full((3, O.size), 1e6))
            res = []
            for led in (fast, exact):
                try:
                    led.charge(huge, report=False, repeat=rkeys["w1"])
                    res.append(True)
                except BudgetExceeded:
                    res.append(False)
            assert res[0] == res[1]
        if tame:  # the budget holds toward every target after every operation (read on the exact
            # ledger: the fast one is read only at random moments, so that charges by reference pile up)
            b = exact.budget
            for t, s in exact.spent().items():
                assert s.epsilon <= b.for_target(t)[0] * (1 + _RTOL), (step, t)
                c = b.curve_for(t)
                if c is not None:
                    assert not np.any(exact.rdp(t) > c * (1 + _RTOL)), (step, t)
    assert counts["by_reference"] > 10 and counts["accepted"] > 40, counts
    _same_reads(fast, exact, keys, rng)
    ea, eb = fast.entries(), exact.entries()
    assert len(ea) == len(eb)
    for x, y in zip(ea, eb):
        assert (x["run_id"], x["bound"], x["note"]) == (y["run_id"], y["bound"], y["note"])
        assert list(x["rdp"]) == list(y["rdp"])
        assert all(np.array_equal(x["rdp"][t], y["rdp"][t]) for t in x["rdp"])
    assert fast.entry_counts() == exact.entry_counts()
    fast.close()
    exact.close()
    with Ledger(paths["fast"]) as a, Ledger(paths["exact"]) as b:
        _same_reads(a, b, keys, rng)


# --------------------------------------------------------------------------- 3. failures, threads


def _primed(path, budget: LedgerBudget, m: int = 20):
    keys = [f"n{i}" for i in range(1, m + 1)]
    rows = _walk_row(m, np.random.default_rng(5), sigma=20.0)
    led = Ledger(path, budget=budget, node_id="me")
    key = RepeatKey("k")
    for _ in range(2):
        led.charge(_entry(keys, rows), report=False, repeat=key)
    return led, key, keys, rows


def _fill_until_full(led: Ledger) -> None:
    """Make the file's next growth fail as a full disk would (SQLite's own SQLITE_FULL)."""
    db = led._store._db  # noqa: SLF001 - the file's limit, not the ledger's logic
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(f"PRAGMA max_page_count = {pages}")


READERS = {
    "spent_columns": lambda led, keys: led.spent_columns().epsilon.tobytes(),
    "spent": lambda led, keys: led.spent(),
    "spent_target": lambda led, keys: led.spent(keys[3]),
    "spent_delta": lambda led, keys: led.spent(keys[3], delta=1e-3),
    "rdp": lambda led, keys: led.rdp(keys[3]).tobytes(),
    "remaining": lambda led, keys: led.remaining(),
    "would_exceed": lambda led, keys: led.would_exceed(_entry(keys[:4], np.tile(O / 2.0, (4, 1)))),
    "charge_report": lambda led, keys: led.charge(_entry(keys[:2], np.tile(O / 1e6, (2, 1)))),
}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_read_composes_the_charges_made_by_reference_first(tmp_path, reader):
    """Charges by reference pending, then one read as the very first: it must see them all."""
    budget = LedgerBudget(3.0, 1e-5)
    led, key, keys, rows = _primed(tmp_path / "fast.sqlite", budget)
    exact = Ledger(tmp_path / "exact.sqlite", budget=budget, node_id="me")
    for _ in range(2):
        exact.charge(_entry(keys, rows), report=False)
    for _ in range(4):
        assert led.charge_repeat(key, "run", "rw", "anonymous")
        exact.charge(_entry(keys, rows), report=False)
    assert READERS[reader](led, keys) == READERS[reader](exact, keys)
    led.close()
    exact.close()


def test_a_tighter_budget_ends_the_allowance(tmp_path):
    """An allowance proven against a loose budget covers nothing once a tighter one is set: the next
    visit is checked exactly, and refused where the exact path refuses it."""
    led, key, keys, rows = _primed(tmp_path / "fast.sqlite", LedgerBudget(1e3, 1e-5))
    assert led.charge_repeat(key, "run", "rw", "anonymous")
    spent = max(s.epsilon for s in led.spent().values())
    led.set_budget(LedgerBudget(spent * (1 + 1e-9), 1e-5))  # room for nothing more
    assert not led.charge_repeat(key, "run", "rw", "anonymous")
    with pytest.raises(BudgetExceeded):
        led.charge(_entry(keys, rows), report=False, repeat=key)
    led.set_budget(LedgerBudget(1e3, 1e-5))
    led.charge(_entry(keys, rows), report=False, repeat=key)
    led.charge(_entry(keys, rows), report=False, repeat=key)
    assert led.charge_repeat(key, "run", "rw", "anonymous")
    per = {keys[0]: (led.spent(keys[0]).epsilon * (1 + 1e-9), 1e-5)}  # the same, toward one node
    led.set_budget(LedgerBudget(1e3, 1e-5, per))
    assert not led.charge_repeat(key, "run", "rw", "anonymous")
    led.close()


def test_a_store_write_that_fails_records_nothing_and_says_why(tmp_path):
    """A full disk while charging by reference: the error is SQLite's 'full' (not a rollback's 'no
    transaction is active' that hides it), nothing is recorded for that charge, and the totals, the
    file and the allowance go on exactly as if it had never been tried."""
    led, key, keys, rows = _primed(tmp_path / "l.sqlite", LedgerBudget(1e6, 1e-5))
    with pytest.raises(sqlite3.IntegrityError):  # a statement that fails inside the transaction
        led.charge_repeat(key, None, "rw", "anonymous")  # type: ignore[arg-type]
    assert len(led.entries()) == 2
    _fill_until_full(led)
    ok = 0
    with pytest.raises(sqlite3.OperationalError, match="full"):
        for _ in range(100_000):
            assert led.charge_repeat(key, "run", "rw", "anonymous", "a note " * 40)
            ok += 1
    assert len(led.entries()) == 2 + ok
    db = led._store._db  # noqa: SLF001 - the file's limit
    db.execute("PRAGMA max_page_count = 1073741823")  # space again
    assert led.charge_repeat(key, "run", "rw", "anonymous")  # the allowance is intact
    ref = rows + rows
    for _ in range(ok + 1):
        ref = ref + rows
    assert np.array_equal(np.stack([led.rdp(t) for t in keys]), ref)
    _fill_until_full(led)
    with pytest.raises(sqlite3.OperationalError, match="full"):  # the exact path: the same
        for i in range(100_000):
            led.charge(_entry(keys, rows * (2.0 + i / 7)), report=False)
            ref = ref + rows * (2.0 + i / 7)
    assert np.array_equal(np.stack([led.rdp(t) for t in keys]), ref)
    n = len(led.entries())
    led.close()
    with Ledger(tmp_path / "l.sqlite") as again:
        assert len(again.entries()) == n
        assert np.array_equal(np.stack([again.rdp(t) for t in keys]), ref)


def test_two_threads_charging_one_ledger_stop_at_the_exact_paths_count(tmp_path):
    """Two threads visit with one key (by reference where proven, else the exact charge) while a third
    reads: they are accepted exactly as often as the exact path accepts the same charges in a row, and
    the totals are its totals, bit for bit."""
    budget = LedgerBudget(2.0, 1e-5)
    led, key, keys, rows = _primed(tmp_path / "fast.sqlite", budget)
    exact = Ledger(tmp_path / "exact.sqlite", budget=budget, node_id="me")
    n_exact = 0
    while True:
        try:
            exact.charge(_entry(keys, rows), report=False)
            n_exact += 1
        except BudgetExceeded:
            break
    assert n_exact > 20
    accepted = [0, 0]
    stop = threading.Event()

    def visit(i: int) -> None:
        for _ in range(n_exact):
            if led.charge_repeat(key, "run", "rw", "anonymous"):
                accepted[i] += 1
                continue
            try:
                led.charge(_entry(keys, rows), report=False, repeat=key)
                accepted[i] += 1
            except BudgetExceeded:
                pass

    def read() -> None:
        while not stop.is_set():
            led.spent_columns()

    threads = [threading.Thread(target=visit, args=(i,)) for i in range(2)]
    reader = threading.Thread(target=read)
    reader.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    reader.join()
    assert 2 + sum(accepted) == n_exact
    a, b = led.spent_columns(), exact.spent_columns()
    assert np.array_equal(a.epsilon, b.epsilon) and np.array_equal(a.entries, b.entries)
    for t in keys:
        assert np.array_equal(led.rdp(t), exact.rdp(t))
    led.close()
    exact.close()
