"""The ledger's lifetime totals as columns, each distinct curve converted once (issue 12): bit for bit the old path.

At n = 2048 a node's report and its ``hushnet run ledger`` answer spent most of their CPU in
``Ledger.spent()``: every target's curve converted, one :class:`Spent` per target.  ``spent_columns``
converts each distinct (curve, μ², δ) once and returns arrays; ``Ledger.spent()`` is built from it.  The
totals are a privacy claim, so they are compared here, bit for bit, with the old path
(``LedgerState.spent_many`` over every target at its δ): walk rows whose curves repeat, Gaussian entries
with μ (GDP wins for some targets), per-target δ, paper-bound entries, zero-spend targets, infinite orders,
an explicit δ, and hashes that collide.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from hushnet.privacy import distinct
from hushnet.privacy.conversions import DEFAULT_ORDERS
from hushnet.privacy.distinct import distinct_rows
from hushnet.privacy.ledger import Ledger, LedgerBudget, PrivacyEntry, Spent

O = DEFAULT_ORDERS


def _bits(x) -> object:
    return None if x is None else struct.pack("<d", x)


def _key(s: Spent) -> tuple:
    """A Spent with its floats as their bytes (NaN orders compare equal, -0.0 and 0.0 do not)."""
    return (
        s.target,
        _bits(s.epsilon),
        _bits(s.delta),
        s.method,
        _bits(s.best_order),
        s.bound,
        s.entries,
    )


def _old(led: Ledger, delta: float | None) -> dict[str, Spent]:
    """``Ledger.spent()`` as it was: every target's curve converted by ``spent_many``."""
    st = led._state  # noqa: SLF001 - the reference path over the same state
    keys = st.targets()
    d = [st.default_delta(t) if delta is None else delta for t in keys]
    return st.spent_many(keys, np.asarray(d, dtype=float))


def _check(led: Ledger, delta: float | None = None) -> dict[str, Spent]:
    old = _old(led, delta)
    new = led.spent(delta=delta)
    assert list(new) == list(old)
    assert [_key(s) for s in new.values()] == [_key(s) for s in old.values()]
    cols = led.spent_columns(delta)
    assert cols.keys == list(old)
    assert cols.epsilon.tobytes() == np.array([s.epsilon for s in old.values()]).tobytes()
    assert cols.methods() == [s.method for s in old.values()]
    assert cols.bounds() == [s.bound for s in old.values()]
    return new


def _ledger(tmp_path, n: int, seed: int) -> Ledger:
    """A node's ledger toward n − 1 targets: a walk-like row whose curves repeat (twice), Gaussian entries
    with μ toward some targets (only μ entries toward a few: GDP can win there), a paper-bound entry,
    all-zero curves toward others (an entry costs something toward someone), infinite orders, and a budget with per-target δ."""
    rng = np.random.default_rng(seed)
    ids = [f"n{i}" for i in range(1, n)]
    per = {ids[i]: (1e9, 1e-8) for i in range(0, len(ids), 7)}
    led = Ledger(tmp_path / f"l{n}_{seed}.sqlite", node_id="n0")
    led.set_budget(LedgerBudget(1e9, 1e-5, per_target=per))
    base = rng.random((12, O.size)) * rng.choice([1e-4, 0.05, 3.0], (12, 1)) * O
    base[2, 100:] = np.inf
    base[3] = 0.0  # zero spend toward every target that draws this curve
    pick = rng.integers(0, 12, len(ids))
    pick[0] = 3  # n1: nothing else is charged toward it
    row = base[pick]
    for _ in range(2):
        led.charge(PrivacyEntry.from_row("walk", "rw-dpsgd", "local", "certified", ids, row))
    gauss = ids[1 : len(ids) : 3]
    mus = {t: float(rng.choice([0.2, 0.5])) for t in gauss}
    led.charge(PrivacyEntry.gaussian("g", "muffliato-gd", "local", "certified", mus))
    only_mu = [f"m{i}" for i in range(max(2, n // 20))]  # every entry carries a μ: GDP may win
    led.charge(
        PrivacyEntry.gaussian(
            "g2", "muffliato-gd", "local", "certified", dict.fromkeys(only_mu, 0.3)
        )
    )
    led.charge(
        PrivacyEntry.gaussian(
            "g3", "muffliato-gd", "local", "certified", dict.fromkeys(only_mu, 0.3)
        )
    )
    paper = ids[2 : len(ids) : 5] or ids[-1:]
    led.charge(
        PrivacyEntry.from_row("p", "rw-dpsgd", "local", "paper", paper, base[pick[: len(paper)]])
    )
    return led


@pytest.mark.parametrize("n", [3, 70, 300, 2048])
def test_columns_equal_the_old_path_bit_for_bit(tmp_path, n) -> None:
    led = _ledger(tmp_path, n, seed=n)
    try:
        got = _check(led)
        _check(led, delta=1e-3)
        _check(led, delta=0.2)
        methods = {s.method for s in got.values()}
        bounds = {s.bound for s in got.values()}
        assert methods == {"rdp", "gdp"} and bounds == {"certified", "paper"}
        assert any(s.epsilon == 0.0 for s in got.values())
        st = led._state  # noqa: SLF001
        rows = st._rdp[: len(st._keys)]  # noqa: SLF001
        if n > 200:  # curves repeat: what the conversion saves
            assert len({r.tobytes() for r in rows}) < len(st._keys) // 2  # noqa: SLF001
        # a subset of targets in another order: the gathered path
        keys = st.targets()[::-3]
        cols = st.spent_columns(keys, st.deltas(keys))
        ref = st.spent_many(keys, st.deltas(keys))
        assert [_key(s) for s in cols.as_spent().values()] == [_key(s) for s in ref.values()]
    finally:
        led.close()


def test_columns_when_every_hash_collides(tmp_path, monkeypatch) -> None:
    led = _ledger(tmp_path, 200, seed=3)
    try:
        monkeypatch.setattr(distinct, "_weights", lambda k: np.zeros(k, dtype=np.uint64))
        _check(led)
    finally:
        led.close()


def test_distinct_rows_checks_every_bit_and_the_extras() -> None:
    rng = np.random.default_rng(4)
    a = rng.random((50, O.size))[rng.integers(0, 5, 300)]
    first, inv = distinct_rows(a)
    assert first.size == 5 and a[first][inv].tobytes() == a.tobytes()
    # rows equal but for their δ are apart
    d = np.where(np.arange(300) % 2 == 0, 1e-5, 1e-6)
    first, inv = distinct_rows(a, d)
    assert first.size == 10 and d[first][inv].tobytes() == d.tobytes()
    # -0.0 and +0.0 differ in their bits: apart
    z = np.zeros((4, 3))
    z[1, 2] = -0.0
    assert distinct_rows(z)[0].size == 2
    # rows that differ only outside the sampled columns: found by the full hash
    b = np.zeros((100, O.size))
    b[np.arange(100), 1 + np.arange(100) % 3] = 1.0
    first, inv = distinct_rows(b)
    assert first.size == 3 and b[first][inv].tobytes() == b.tobytes()
    assert distinct_rows(np.zeros((0, O.size)))[0].size == 0


def test_a_known_conversion_is_used_only_when_it_is_the_totals(tmp_path, monkeypatch) -> None:
    """A report converts its run row first and hands the conversion to the ledger: after a node's first
    run its totals are that row, and its conversion must then give the old path's columns bit for bit —
    and be ignored when the δ, the curves or a GDP total make it another conversion."""
    import hushnet.privacy.ledger_math as lm
    from hushnet.privacy.distinct import convert_distinct

    rng = np.random.default_rng(7)
    ids = [f"n{i}" for i in range(1, 400)]
    base = rng.random((9, O.size)) * O * 0.01
    base[0] = 0.0
    row = base[rng.integers(0, 9, len(ids))]
    led = Ledger(tmp_path / "k.sqlite", node_id="n0")
    led.set_budget(LedgerBudget(1e9, 1e-5))
    try:
        led.charge(PrivacyEntry.from_row("walk", "rw-dpsgd", "local", "certified", ids, row))
        conv = convert_distinct(led.orders, row.copy(), 1e-5)
        want = [_key(s) for s in _old(led, 1e-5).values()]
        with monkeypatch.context() as mp:  # used: nothing else is converted
            mp.setattr(lm.LedgerState, "convert_rows", None)
            got = led.spent_columns(1e-5, conv)
        assert [_key(s) for s in got.as_spent().values()] == want
        # another δ, other curves (one bit), a matrix of another shape: converted as without it
        assert [_key(s) for s in led.spent_columns(1e-6, conv).as_spent().values()] == [
            _key(s) for s in _old(led, 1e-6).values()
        ]
        other = row.copy()
        other[5, 3] = np.nextafter(other[5, 3], 1.0)
        for c in (
            convert_distinct(led.orders, other, 1e-5),
            convert_distinct(led.orders, row[1:], 1e-5),
        ):
            assert [_key(s) for s in led.spent_columns(1e-5, c).as_spent().values()] == want
        # a target whose every entry carries a μ may take the GDP curve: not the run row's conversion
        led.charge(PrivacyEntry.gaussian("g", "muffliato-gd", "local", "certified", {"x1": 0.2}))
        led.charge(PrivacyEntry.gaussian("g", "muffliato-gd", "local", "certified", {"x1": 0.2}))
        got = led.spent_columns(1e-5, conv).as_spent()
        assert got["x1"].method == "gdp"
        assert [_key(s) for s in got.values()] == [_key(s) for s in _old(led, 1e-5).values()]
    finally:
        led.close()
