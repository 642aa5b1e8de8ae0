"""The vectorised ledger (issue 12) decides and reports exactly what the scalar ledger did.

A walk hop charges its holder toward every other node; the ledger used to validate, project and
convert each target on its own, in Python.  It now keeps (targets × orders) arrays, converts many
curves at once and skips converting a target whose value at one order (an upper bound on the
conversion's minimum) is already within budget.  ``_ScalarState`` below is the scalar ledger as it
was (kept here, not in the library) and every number and decision is compared with it, bit for bit:
random entries with μ and without, infinite orders, per-target budgets and per-target RDP curves.
The persistent store writes one block per entry now; a file in the old per-target format must
still load to the same state.
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest

import hushnet.privacy.ledger_math as lm
from hushnet.privacy.conversions import DEFAULT_ORDERS, gdp_epsilon, rdp_to_dp
from hushnet.privacy.ledger import Ledger

O = DEFAULT_ORDERS
_RTOL = 1e-12


class _ScalarState:
    """The scalar ledger state before issue 12 (reference): one dict entry per target."""

    def __init__(self, orders, node_id="", budget=None):
        self.orders, self.node_id, self.budget = orders, node_id, budget
        self._rdp, self._gdp_sq, self._n_entries, self._n_gdp, self._paper = {}, {}, {}, {}, {}

    def add(self, target, vec, mu, bound):
        self._rdp[target] = self._rdp.get(target, 0.0) + vec
        self._n_entries[target] = self._n_entries.get(target, 0) + 1
        if mu is not None:
            self._gdp_sq[target] = self._gdp_sq.get(target, 0.0) + mu * mu
            self._n_gdp[target] = self._n_gdp.get(target, 0) + 1
        if bound != "certified":
            self._paper[target] = self._paper.get(target, 0) + 1

    def convert(self, rdp, gdp_sq, delta):
        eps, order = rdp_to_dp(self.orders, rdp, delta)
        if gdp_sq is not None:
            g = gdp_epsilon(math.sqrt(gdp_sq), delta)
            if g <= eps:
                return g, "gdp", None
        return eps, "rdp", order

    def validate(self, entry):
        if entry.bound not in lm.BOUND_LABELS:
            raise lm.LedgerError(f"bound must be one of {lm.BOUND_LABELS}, got {entry.bound!r}")
        if not entry.rdp:
            raise lm.LedgerError("an entry must cost something toward at least one target")
        mus = {lm.as_key(k): m for k, m in entry.gdp_mu.items()} if entry.gdp_mu else {}
        out = {}
        for t, vec in entry.rdp.items():
            key = lm.as_key(t)
            if self.node_id and key == self.node_id:
                raise lm.LedgerError("a node does not account a loss toward itself")
            v = np.asarray(vec, dtype=np.float64)
            if v.shape != self.orders.shape:
                raise lm.LedgerError(
                    f"RDP curve toward {key!r} has shape {v.shape}, expected {self.orders.shape}"
                )
            if np.any(np.isnan(v)) or np.any(v < 0):
                raise lm.LedgerError(f"RDP curve toward {key!r} must be non-negative (inf allowed)")
            mu = None
            if key in mus:
                mu = float(mus[key])
                if not mu >= 0:
                    raise lm.LedgerError("gdp_mu must be >= 0")
            out[key] = (v, mu)
        return out

    def projection(self, costs):
        res, b = {}, self.budget
        for t, (vec, mu) in costs.items():
            rdp = self._rdp.get(t, 0.0) + vec
            n_e = self._n_entries.get(t, 0) + 1
            n_g = self._n_gdp.get(t, 0) + (mu is not None)
            gdp_sq = (
                (self._gdp_sq.get(t, 0.0) + (mu * mu if mu is not None else 0.0))
                if n_g == n_e
                else None
            )
            be, bd = b.for_target(t) if b is not None else (math.inf, lm.DEFAULT_DELTA)
            eps, method, order = self.convert(rdp, gdp_sq, bd)
            curve = b.curve_for(t) if b is not None else None
            curve_bad = curve is not None and bool(np.any(rdp > curve * (1 + _RTOL)))
            res[t] = (eps, method, order, be, bd, curve_bad)
        return res

    @staticmethod
    def violations(proj):
        return {t: p for t, p in proj.items() if p[0] > p[3] * (1 + _RTOL) or p[5]}

    def spent(self, t, delta):
        n_e = self._n_entries.get(t, 0)
        if n_e == 0:
            return lm.Spent(t, 0.0, delta, "none", None, "certified", 0)
        gdp_sq = self._gdp_sq.get(t) if self._n_gdp.get(t, 0) == n_e else None
        eps, method, order = self.convert(self._rdp[t], gdp_sq, delta)
        bound = "paper" if self._paper.get(t, 0) else "certified"
        return lm.Spent(t, eps, delta, method, order, bound, n_e)


def _same(a, b) -> bool:
    """Equal, bit for bit, with NaN equal to NaN (the best order of a curve infinite everywhere)."""
    if isinstance(a, lm.Spent):
        a, b = list(vars(a).values()), list(vars(b).values())
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return type(a) is type(b) and a == b


def _curve(rng: np.random.Generator) -> tuple[np.ndarray, float | None]:
    kind = rng.integers(6)
    if kind == 0:  # a walk row: linear up to the noise condition's α_max, the local-DP curve above
        s, amax, sigma = rng.uniform(1e-4, 0.05), rng.uniform(5, 80), rng.uniform(0.7, 3)
        walk = np.where(O <= amax, s * O / sigma**2, np.inf)
        return np.minimum(walk, O / (2 * sigma**2)), None
    if kind == 1:  # a Gaussian view with its μ
        mu = float(rng.uniform(0.02, 0.6))
        return O * mu * mu / 2, mu
    if kind == 2:  # a walk row capped at α_max with nothing above (infinite orders)
        return np.where(O <= rng.uniform(2, 30), rng.uniform(1e-3, 0.05) * O, np.inf), None
    if kind == 3:  # a random non-negative curve with some infinite orders
        v = rng.exponential(0.05, O.size) * O ** rng.uniform(0, 1)
        v[rng.random(O.size) < 0.1] = np.inf
        return v, None
    if kind == 4:  # nothing toward this target (μ = 0)
        return np.zeros(O.size), 0.0
    return np.full(O.size, np.inf), None  # no bound at all (rare: refused under any budget)


def _entry(rng: np.random.Generator, i: int, pool: list[str]) -> lm.PrivacyEntry:
    m = int(rng.integers(1, len(pool) + 1))
    targets = [str(t) for t in rng.choice(pool, size=m, replace=False)]
    rdp, mus = {}, {}
    for t in targets:
        v, mu = _curve(rng) if rng.random() > 0.02 else (np.full(O.size, np.inf), None)
        if rng.random() < 0.9 and v is not None:
            rdp[t] = v * (1 if rng.random() < 0.8 else rng.uniform(0.1, 3))
            if mu is not None and np.all(rdp[t] == v):
                mus[t] = mu
    bound = "paper" if rng.random() < 0.1 else "certified"
    return lm.PrivacyEntry(f"r{i}", "walk", "anonymous", bound, rdp, mus or None)


def _budget(rng: np.random.Generator, pool: list[str]) -> lm.LedgerBudget | None:
    kind = rng.integers(4)
    if kind == 0:
        return None
    per = {
        t: (float(rng.uniform(0.2, 6)), float(rng.choice([1e-5, 1e-6, 1e-3])))
        for t in pool
        if rng.random() < 0.3
    }
    curve = O * rng.uniform(0.05, 0.5) if kind == 2 else None
    per_curve = {t: O * rng.uniform(0.02, 0.4) for t in pool if kind >= 2 and rng.random() < 0.2}
    return lm.LedgerBudget(float(rng.uniform(0.5, 8)), 1e-6, per, curve, per_curve)


@pytest.mark.parametrize("seed", range(12))
def test_projection_and_decisions_equal_the_scalar_ledger(seed: int) -> None:
    rng = np.random.default_rng(seed)
    pool = [f"n{j}" for j in range(int(rng.integers(2, 40)))]
    budget = _budget(rng, pool)
    new, ref = lm.LedgerState(O, "me", budget), _ScalarState(O, "me", budget)
    refusals = 0
    for i in range(40):
        e = _entry(rng, i, pool)
        if not e.rdp:
            continue
        costs, ref_costs = new.validate(e), ref.validate(e)
        assert list(costs) == list(ref_costs)
        proj, ref_proj = new.projection(costs), ref.projection(ref_costs)
        bad, ref_bad = lm.LedgerState.violations(proj), ref.violations(ref_proj)
        assert list(bad) == list(ref_bad) and _same(list(bad.values()), list(ref_bad.values()))
        if i % 3 == 0:  # every projected number, not only the violations
            assert _same([proj[t] for t in costs], [ref_proj[t] for t in costs])
        if bad:
            refusals += 1
            assert _same(
                vars(lm.LedgerState.refusal(bad, e.run_id)),
                vars(lm.LedgerState.refusal(ref_bad, e.run_id)),
            )
            if rng.random() < 0.7:
                continue  # refused; otherwise recorded past the budget (enforce_budget=False)
        new.add_costs(costs, e.bound, proj)
        for t, (v, mu) in ref_costs.items():
            ref.add(t, v, mu, e.bound)
        spent = new.spent_many(list(costs), proj.deltas)
        for t in costs:
            assert _same(spent[t], ref.spent(t, proj[t][4])), (spent[t], ref.spent(t, proj[t][4]))
    for t in pool:
        d = new.default_delta(t)
        assert _same(new.spent(t, d), ref.spent(t, d))
        np.testing.assert_array_equal(new.rdp(t), ref._rdp.get(t, np.zeros(O.size)))
    assert new.targets() == sorted(ref._rdp)
    if budget is not None and seed % 4 == 1:
        assert refusals  # the budgets do bite in these draws


def test_a_walk_run_up_to_its_budget_decides_as_the_scalar_ledger() -> None:
    """The shortcut at work: the same walk row charged until the budget refuses it."""
    rng = np.random.default_rng(3)
    pool = [f"n{j}" for j in range(64)]
    s = rng.uniform(1e-4, 0.02, len(pool))
    rows = np.minimum(np.where(O <= 40, s[:, None] * O / 4, np.inf), O / 8)
    entry = lm.PrivacyEntry.from_row("run", "rw", "anonymous", "certified", pool, rows)
    per = {"n5": (1.0, 1e-6), "n7": (2.0, 1e-3)}
    budget = lm.LedgerBudget(3.0, 1e-5, per)
    new, ref = lm.LedgerState(O, "me", budget), _ScalarState(O, "me", budget)
    converted: list[int] = []  # rows converted exactly per budget check
    exact = new.convert_rows
    new.convert_rows = lambda rdp, *a: converted.append(len(rdp)) or exact(rdp, *a)  # type: ignore[method-assign]
    for hop in range(400):
        costs, ref_costs = new.validate(entry), ref.validate(entry)
        proj = new.projection(costs)
        bad = lm.LedgerState.violations(proj)
        ref_bad = ref.violations(ref.projection(ref_costs))
        assert _same(list(bad.items()), list(ref_bad.items()))
        if bad:
            break
        new.add_costs(costs, "certified", proj)
        for t, (v, mu) in ref_costs.items():
            ref.add(t, v, mu, "certified")
    assert bad and hop > 10  # it did run a while, then stopped where the scalar ledger stops
    # the first hop knows no best order: its pointwise maximum clears the targets under the uniform
    # budget (n5 and n7, with their own budgets and δ, are checked on their own); later hops convert
    # only the few the quick bound does not clear (a hop that converts none does not call the
    # conversion at all)
    assert sum(converted) <= 2 * hop and max(converted) <= 2, (converted, hop)


@pytest.mark.parametrize(
    "rdp, mu, msg",
    [
        ({"a": O, "me": O}, None, "toward itself"),
        ({"a": O, "b": np.ones(3)}, None, "toward 'b' has shape"),
        ({"a": O, "b": -O}, None, "toward 'b' must be non-negative"),
        ({"a": O * np.nan, "b": -O}, None, "toward 'a' must be non-negative"),
        ({"a": O, "b": O}, {"b": -1.0}, "gdp_mu must be >= 0"),
        ({"a": O, "b": O}, {"b": math.nan}, "gdp_mu must be >= 0"),
    ],
)
def test_invalid_entries_name_the_same_first_bad_target(rdp, mu, msg) -> None:
    e = lm.PrivacyEntry("r", "walk", "anonymous", "certified", rdp, mu)
    for state in (lm.LedgerState(O, "me"), _ScalarState(O, "me")):
        with pytest.raises(lm.LedgerError, match=msg):
            state.validate(e)


_OLD_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE entries (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, protocol TEXT NOT NULL,
    view_model TEXT NOT NULL, bound TEXT NOT NULL, note TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE costs (
    entry_id INTEGER NOT NULL REFERENCES entries(id), target TEXT NOT NULL,
    rdp BLOB NOT NULL, gdp_mu REAL, PRIMARY KEY (entry_id, target));
CREATE TABLE budget (target TEXT PRIMARY KEY, epsilon REAL, delta REAL, rdp_curve BLOB);
"""


def _write_old_format(path: Path, entries: list[lm.PrivacyEntry]) -> None:
    """A ledger file as the scalar ledger wrote it: one ``costs`` row per target."""
    db = sqlite3.connect(path)
    db.executescript(_OLD_SCHEMA)
    db.execute("INSERT INTO meta VALUES ('orders', ?)", (json.dumps(O.tolist()),))
    db.execute("INSERT INTO meta VALUES ('node_id', 'me')")
    for e in entries:
        eid = db.execute(
            "INSERT INTO entries(run_id, protocol, view_model, bound, note, created) "
            "VALUES (?,?,?,?,?,?)",
            (e.run_id, e.protocol, e.view_model, e.bound, e.note, time.time()),
        ).lastrowid
        for t, v in e.rdp.items():
            mu = (e.gdp_mu or {}).get(t)
            db.execute(
                "INSERT INTO costs VALUES (?,?,?,?)",
                (eid, t, np.asarray(v, dtype=np.float64).tobytes(), mu),
            )
    db.commit()
    db.close()


def test_old_format_file_loads_and_grows_in_blocks(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    pool = [f"n{j}" for j in range(12)]
    entries = [e for e in (_entry(rng, i, pool) for i in range(30)) if e.rdp]
    old, later = entries[:20], entries[20:]
    path = tmp_path / "old.sqlite"
    _write_old_format(path, old)
    ref = _ScalarState(O, "me")
    with Ledger(path) as led:
        for e in old:
            for t, (v, mu) in ref.validate(e).items():
                ref.add(t, v, mu, e.bound)
        for t in pool:  # the old rows replay to the same sums
            assert _same(led.spent(t), ref.spent(t, lm.DEFAULT_DELTA))
        for e in later:  # new entries go in as blocks, beside the old rows
            led.charge(e, enforce_budget=False)
            for t, (v, mu) in ref.validate(e).items():
                ref.add(t, v, mu, e.bound)
        listed = led.entries()
    assert [x["run_id"] for x in listed] == [e.run_id for e in entries]
    for x, e in zip(listed, entries):  # what each entry cost, whichever format holds it
        assert sorted(x["rdp"]) == sorted(e.rdp)
        assert all(np.array_equal(x["rdp"][t], e.rdp[t]) for t in e.rdp)
        assert x["gdp_mu"] == dict(e.gdp_mu or {})
    with Ledger(path) as again:
        for t in pool:
            assert _same(again.spent(t), ref.spent(t, lm.DEFAULT_DELTA))
            np.testing.assert_array_equal(again.rdp(t), ref._rdp.get(t, np.zeros(O.size)))


def test_a_repeated_hop_writes_its_curves_once_and_reopens_exactly(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    pool = [f"n{j}" for j in range(200)]
    rows = np.where(O <= 30, rng.uniform(1e-4, 0.01, (len(pool), 1)) * O, np.inf)
    other_rows = rows * 2
    # as a walk's per-contribution rows: computed once and sealed (``flags.writeable = False`` alone can be
    # undone by the arrays' owner, so such rows are compared with the stored block every time instead)
    rows, other_rows = lm.sealed(rows), lm.sealed(other_rows)
    hop = lm.PrivacyEntry.from_row("run", "rw", "anonymous", "certified", pool, rows)
    other = lm.PrivacyEntry.from_row("run", "rw", "anonymous", "certified", pool, other_rows)
    path = tmp_path / "l.sqlite"
    with Ledger(path, node_id="me") as led:
        for i in range(30):
            led.charge(other if i % 10 == 9 else hop, report=False)
        before = {t: led.spent(t) for t in pool}
    db = sqlite3.connect(path)
    n = [db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in ("entries", "blocks")]
    assert n == [30, 2]  # one block for hop, one for other: later hops point at them
    with Ledger(path) as again:
        assert {t: again.spent(t) for t in pool} == before


def test_curves_the_caller_may_change_are_never_pointed_at(tmp_path: Path) -> None:
    pool = ["a", "b", "c"]
    rows = np.outer([1.0, 2.0, 3.0], O) * 1e-3  # writeable: the caller changes it between charges
    ref = _ScalarState(O)
    path = tmp_path / "l.sqlite"
    with Ledger(path) as led:
        for i in range(4):
            e = lm.PrivacyEntry.from_row(f"r{i}", "rw", "anonymous", "certified", pool, rows)
            led.charge(e, report=False)
            for t, (v, mu) in ref.validate(e).items():
                ref.add(t, v, mu, "certified")
            rows *= 1.5 if i % 2 else 1.0  # in place: a block kept by reference would now lie
    with Ledger(path) as again:
        for t in pool:
            np.testing.assert_array_equal(again.rdp(t), ref._rdp[t])


def test_a_reports_rows_convert_as_one_at_a_time() -> None:
    from hushnet.runs.accounting import dp_from_rdp, dp_from_rdp_rows

    rng = np.random.default_rng(2)
    rows = np.stack([_curve(rng)[0] for _ in range(300)])
    rows[::7] = 0.0  # nothing toward these nodes
    for delta in (1e-5, 1e-3):
        got = dp_from_rdp_rows(O, rows, delta)
        assert [float(e) for e in got] == [dp_from_rdp(O, r, delta) for r in rows]
    assert dp_from_rdp_rows(O, np.zeros((0, O.size)), 1e-5).size == 0


def test_every_targets_spent_at_once_equals_one_at_a_time(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    pool = [f"n{j}" for j in range(30)]
    budget = lm.LedgerBudget(50.0, 1e-6, per_target={"n3": (40.0, 1e-3)})
    with Ledger(tmp_path / "l.sqlite", budget=budget) as led:
        for i in range(15):
            e = _entry(rng, i, pool)
            if e.rdp:
                led.charge(e, enforce_budget=False)
        for delta in (None, 1e-4):
            every = led.spent(delta=delta)
            assert list(every) == sorted(every)
            assert all(_same(every[t], led.spent(t, delta)) for t in every)


def test_a_build_before_blocks_cannot_open_a_file_with_blocks(tmp_path) -> None:
    """Downgrade safety: a ledger build from before cost blocks reads only per-target rows, so it
    would under-count a file with blocks.  It parses ``meta.orders`` as JSON on open: the file's
    mark makes that fail, while this build reads the orders from ``orders_v2``."""
    from hushnet.privacy.ledger import Ledger
    from hushnet.privacy.ledger_store import FORMAT_MARK

    path = tmp_path / "l.sqlite"
    with Ledger(path, node_id="n0") as led:
        orders = led.orders.copy()
    db = sqlite3.connect(path)
    (mark,) = db.execute("SELECT value FROM meta WHERE key = 'orders'").fetchone()
    (v2,) = db.execute("SELECT value FROM meta WHERE key = 'orders_v2'").fetchone()
    db.close()
    assert mark == FORMAT_MARK and np.array_equal(json.loads(v2), orders)
    with pytest.raises(json.JSONDecodeError):
        json.loads(mark)  # what the old build does on open
    with Ledger(path, node_id="n0") as led:  # this build reopens it
        assert np.array_equal(led.orders, orders)


def test_the_dominating_bound_is_above_every_curve_under_it() -> None:
    """``rdp_epsilon_dominating`` bounds the exact conversion of every curve under the maximum, at
    every δ (the total-variation case included: large δ, tiny curves) and with infinite orders."""
    from hushnet.privacy.conversions import rdp_epsilon, rdp_epsilon_dominating

    rng = np.random.default_rng(21)
    for trial in range(300):
        m = np.stack([_curve(rng)[0] for _ in range(int(rng.integers(1, 6)))]).max(axis=0)
        m = m * 10.0 ** rng.uniform(-6, 1)
        under = m * rng.uniform(0, 1, (50, O.size)) ** rng.uniform(0, 4)
        under[0], under[1] = m, 0.0
        under[2, rng.random(O.size) < 0.5] = 0.0  # equal to the maximum at some orders, 0 elsewhere
        under[2] = np.where(under[2] > 0, m, 0.0)
        for delta in (1e-9, 1e-5, 1e-2, 0.3, 0.9):
            bound, j, scale = rdp_epsilon_dominating(O, m, delta)
            exact = rdp_epsilon(O, under, delta)[0]
            assert np.all(exact <= bound + 1e-9 * scale), (trial, delta)
            if math.isfinite(bound):
                assert 0 <= j < O.size and scale > 0
    assert rdp_epsilon_dominating(O, np.full(O.size, np.inf), 1e-5)[0] == math.inf
    with pytest.raises(ValueError, match="delta must be in"):
        rdp_epsilon_dominating(O, O, 1.0)


def _first_charge_case(rng: np.random.Generator, n: int):
    """A walk-like row toward ``n`` targets (few distinct curves) and a budget near what it costs."""
    pool = [f"n{j}" for j in range(n)]
    slopes = rng.uniform(1e-4, 0.02, int(rng.integers(3, 30)))
    s = slopes[rng.integers(0, slopes.size, n)]
    sigma, amax = rng.uniform(0.8, 3), rng.uniform(8, 60)
    rows = np.minimum(np.where(O <= amax, s[:, None] * O / sigma**2, np.inf), O / (2 * sigma**2))
    if rng.random() < 0.2:  # a target with no bound at all
        rows[int(rng.integers(n))] = np.inf
    rows = lm.sealed(rows * rng.choice([1.0, 5.0, 40.0]))
    mu = None
    if rng.random() < 0.3:  # every target a Gaussian view with its μ: the GDP side may win
        mus = rng.uniform(0.01, 0.5, n)
        rows = lm.sealed(O[None, :] * mus[:, None] ** 2 / 2)
        mu = {t: float(v) for t, v in zip(pool, mus)}
    eps_row = rdp_epsilon_rows(rows, 1e-5)
    finite = eps_row[np.isfinite(eps_row)]
    top = float(finite.max()) if finite.size else 1.0
    per, per_curve, curve = {}, {}, None
    for t in pool:  # some targets with their own (often smaller) budget, or another δ
        if rng.random() < 0.02:
            per[t] = (float(top * rng.uniform(0.5, 4)), float(rng.choice([1e-5, 1e-6, 1e-3])))
    if rng.random() < 0.3:
        curve = rows.max(axis=0) * rng.uniform(0.9, 3)
        curve[~np.isfinite(curve)] = 1e9
    if rng.random() < 0.3:
        for t in rng.choice(pool, 3, replace=False):
            per_curve[str(t)] = np.where(np.isfinite(rows[0]), rows[0], 1.0) * rng.uniform(0.5, 2)
    budget = lm.LedgerBudget(float(top * rng.uniform(0.8, 8)), 1e-5, per, curve, per_curve)
    return pool, rows, mu, budget


def rdp_epsilon_rows(rows: np.ndarray, delta: float) -> np.ndarray:
    from hushnet.privacy.conversions import rdp_epsilon

    return rdp_epsilon(O, rows, delta)[0]


@pytest.mark.parametrize("seed", range(40))
def test_a_first_charge_decides_and_reports_as_the_scalar_ledger(seed: int, monkeypatch) -> None:
    """A node's first charge of a run toward many targets, cleared by their pointwise maximum where it
    can be: accepted, refused, the refusal's target, ε and reason all as the scalar ledger's — with
    targets under their own smaller budgets, another δ, RDP budget curves, μ, and a ledger that
    already holds another run's spending; and the same as the exact path (the bound switched off)."""
    rng = np.random.default_rng(1000 + seed)
    n = int(rng.integers(20, 300))
    pool, rows, mu, budget = _first_charge_case(rng, n)
    states = {
        "bound": lm.LedgerState(O, "me", budget),
        "exact": lm.LedgerState(O, "me", budget),
    }
    ref = _ScalarState(O, "me", budget)
    if seed % 3 == 0:  # an earlier run's spending toward some of the targets
        prior = lm.PrivacyEntry.from_row(
            "r0", "rw", "anonymous", "certified", pool[: n // 2], rows[: n // 2] * 0.5
        )
        for st in states.values():
            c = st.validate(prior)
            st.add_costs(c, "certified", st.projection(c))
        for t, (v, m) in ref.validate(prior).items():
            ref.add(t, v, m, "certified")
    entry = lm.PrivacyEntry.from_row(
        "r1", "rw", "anonymous", "certified", pool, rows, None if mu is None else list(mu.values())
    )
    for hop in range(8):
        got = {}
        for name, st in states.items():
            monkeypatch.setattr(lm, "_DOMINATING_MIN_ROWS", 16 if name == "bound" else 10**9)
            costs = st.validate(entry)
            proj = st.projection(costs)
            got[name] = (costs, proj, lm.LedgerState.violations(proj))
        ref_costs = ref.validate(entry)
        ref_bad = ref.violations(ref.projection(ref_costs))
        for name, (_, _, bad) in got.items():
            assert list(bad) == list(ref_bad) and _same(list(bad.values()), list(ref_bad.values()))
            if bad:
                assert _same(
                    vars(lm.LedgerState.refusal(bad, "r1")),
                    vars(lm.LedgerState.refusal(ref_bad, "r1")),
                )
        if ref_bad:
            break
        for name, (costs, proj, _) in got.items():
            states[name].add_costs(costs, "certified", proj)
        for t, (v, m) in ref_costs.items():
            ref.add(t, v, m, "certified")
    for st in states.values():
        for t in pool:
            d = st.default_delta(t)
            assert _same(st.spent(t, d), ref.spent(t, d))


def test_a_first_charge_within_budget_converts_no_target(monkeypatch) -> None:
    """At n = 512 a run's first charge, well within a uniform budget, is cleared by one conversion of
    the row's maximum: no target is converted exactly (before: all 511 — (n − 1) × 159 orders)."""
    rng = np.random.default_rng(4)
    pool = [f"n{j}" for j in range(511)]
    s = rng.uniform(1e-4, 4e-3, len(pool))
    rows = lm.sealed(np.minimum(np.where(O <= 40, s[:, None] * O / 64, np.inf), O / 128))
    entry = lm.PrivacyEntry.from_row("run", "rw", "anonymous", "certified", pool, rows)
    st = lm.LedgerState(O, "me", lm.LedgerBudget(100.0, 1e-5, {"n9": (50.0, 1e-6)}))
    converted: list[int] = []
    exact = st.convert_rows
    st.convert_rows = lambda rdp, *a: converted.append(len(rdp)) or exact(rdp, *a)  # type: ignore[method-assign]
    costs = st.validate(entry)
    proj = st.projection(costs)
    assert lm.LedgerState.violations(proj) == {}
    assert converted == []
    st.add_costs(costs, "certified", proj)
    assert (st._hint[: len(pool)] >= 0).all()  # the next charge's quick check has an order to try
    assert lm.LedgerState.violations(st.projection(st.validate(entry))) == {}
    assert converted == []
