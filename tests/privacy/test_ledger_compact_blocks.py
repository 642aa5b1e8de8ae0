"""A cost block whose curves repeat is stored compact, and reads back bit for bit.

A walk's first charge of a run wrote its whole (n − 1) × 159 row (2.6 MB at n = 2048), most of that
charge's time (issue 12).  The row has few distinct curves (targets at equal distance on a
hypercube), so the block now holds the distinct curves and one index per target.  What must not
change: every entry's costs as read back, the sums a reopened ledger composes (bit for bit), the
recent-block shortcut, files written before (full blocks, or no ``block_rows`` table at all), and a
build from before compact blocks must stop on such a file instead of under-counting.
"""

from __future__ import annotations

import pathlib
import sqlite3

import numpy as np
import pytest

import hushnet.privacy.distinct as distinct
import hushnet.privacy.ledger_math as lm
import hushnet.privacy.ledger_store as ls
from hushnet.privacy.conversions import DEFAULT_ORDERS as O
from hushnet.privacy.ledger import Ledger, LedgerBudget, PrivacyEntry
from hushnet.privacy.ledger_math import sealed


def _walk_rows(
    n: int, distinct: int, seed: int, scale: float = 1.0, zero_rows: int = 0
) -> np.ndarray:
    """A walk-like row toward ``n`` targets with ``distinct`` slopes; its first ``zero_rows`` targets
    cost -0.0 everywhere (a negative zero is a value of its own: kept bit for bit)."""
    rng = np.random.default_rng(seed)
    s = rng.uniform(1e-4, 4e-3, distinct)[rng.integers(0, distinct, n)]
    rows = np.minimum(np.where(O <= 40, s[:, None] * O / 4, np.inf), O / 8) * scale
    rows[:zero_rows] = -0.0
    return rows


def _pool(n: int) -> list[str]:
    return [f"n{j}" for j in range(n)]


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, dtype=np.float64).tobytes()


def _sizes(path: pathlib.Path) -> list[tuple[int, int | None]]:
    db = sqlite3.connect(path)
    try:
        return db.execute(
            "SELECT length(b.rdp), length(r.rows) FROM blocks b "
            "LEFT JOIN block_rows r ON r.block_id = b.id ORDER BY b.id"
        ).fetchall()
    finally:
        db.close()


def test_a_repeating_row_is_stored_compact_and_reads_back_bit_for_bit(tmp_path) -> None:
    n, k = 300, O.size
    pool = _pool(n)
    first = sealed(_walk_rows(n, 12, seed=1))
    second = _walk_rows(n, 40, seed=2)  # not sealed: stored as charged, compact too
    path = tmp_path / "l.sqlite"
    budget = LedgerBudget(1e6, 1e-5, {"n3": (5e5, 1e-6)})
    with Ledger(path, node_id="me", budget=budget) as led:
        led.charge(PrivacyEntry.from_row("r1", "rw", "anonymous", "certified", pool, first))
        led.charge(PrivacyEntry.from_row("r2", "rw", "anonymous", "paper", pool, second))
        live = {t: led.rdp(t) for t in pool}
        spent = led.spent()
        listed = led.entries()
    sizes = _sizes(path)
    # 12 and 40 distinct curves of 159 float64, one uint32 per target: not the (n × 159) row
    assert sizes == [(12 * k * 8, 4 * n), (40 * k * 8, 4 * n)], sizes
    for got, rows in zip(listed, (first, second)):
        assert list(got["rdp"]) == pool
        assert _bits(np.stack([got["rdp"][t] for t in pool])) == _bits(rows)
    with Ledger(path) as again:
        assert again.spent() == spent
        for t in pool:
            assert _bits(again.rdp(t)) == _bits(live[t])


def test_the_first_charge_toward_a_walk_row_writes_its_distinct_curves_only(tmp_path) -> None:
    """What the change is for: a 2 047-target row with 460 distinct curves (hypercube:11) writes
    under a quarter of its 2.6 MB (before: every byte of it)."""
    n = 2047
    rows = sealed(_walk_rows(n, 460, seed=3))
    path = tmp_path / "l.sqlite"
    with Ledger(path, node_id="me", budget=LedgerBudget(100.0, 1e-5)) as led:
        led.charge(PrivacyEntry.from_row("r", "rw", "anonymous", "certified", _pool(n), rows))
    ((blob, index),) = _sizes(path)
    assert index == 4 * n and blob <= 460 * O.size * 8 < rows.nbytes / 4


def test_a_rebuilt_row_with_the_same_bits_points_at_the_compact_block(tmp_path) -> None:
    """The recent-block shortcut compares a row built again (the same bits, another array) with the
    compact block's rows; a row that differs in one bit gets a block of its own."""
    n = 200
    pool = _pool(n)
    base = _walk_rows(n, 9, seed=4)
    path = tmp_path / "l.sqlite"
    with Ledger(path, node_id="me") as led:
        for _ in range(3):  # sealed anew each time: compared with the stored block, not by identity
            led.charge(
                PrivacyEntry.from_row("r", "rw", "anonymous", "certified", pool, sealed(base))
            )
        other = base.copy()
        other[7, 5] = np.nextafter(other[7, 5], np.inf)
        led.charge(PrivacyEntry.from_row("r", "rw", "anonymous", "certified", pool, sealed(other)))
        live = {t: led.rdp(t) for t in pool}
    assert len(_sizes(path)) == 2
    with Ledger(path) as again:
        for t in pool:
            assert _bits(again.rdp(t)) == _bits(live[t])


def test_rows_that_share_a_hash_are_stored_in_full(tmp_path, monkeypatch) -> None:
    """A hash collision between different curves is caught by the bit-for-bit check: the block is
    written as the full row (never a wrong curve for a target)."""
    monkeypatch.setattr(distinct, "_weights", lambda k: np.zeros(k, dtype=np.uint64))
    n = 100
    rows = _walk_rows(n, 5, seed=5, zero_rows=3)
    path = tmp_path / "l.sqlite"
    with Ledger(path, node_id="me") as led:
        led.charge(PrivacyEntry.from_row("r", "rw", "anonymous", "certified", _pool(n), rows))
    assert _sizes(path) == [(n * O.size * 8, None)]
    with Ledger(path) as again:  # the sums: 0.0 + each stored curve (-0.0 adds up to +0.0)
        assert _bits(np.stack([again.rdp(t) for t in _pool(n)])) == _bits(0.0 + rows)
        assert _bits(np.stack(list(again.entries()[0]["rdp"].values()))) == _bits(rows)


def test_files_with_full_blocks_or_without_the_index_table_still_load(
    tmp_path, monkeypatch
) -> None:
    n = 120
    pool = _pool(n)
    rows = [_walk_rows(n, 6, seed=s, zero_rows=3 * s) for s in range(3)]
    path = tmp_path / "l.sqlite"
    monkeypatch.setattr(ls, "COMPACT_MIN_ROWS", 10**9)  # as the store wrote blocks before
    with Ledger(path, node_id="me") as led:
        led.charge(PrivacyEntry.from_row("r0", "rw", "anonymous", "certified", pool, rows[0]))
    db = sqlite3.connect(path)
    db.execute("DROP TABLE block_rows")  # a file from before compact blocks
    db.commit()
    db.close()
    monkeypatch.undo()
    with Ledger(path) as led:  # the old full block and a new compact one, side by side
        led.charge(PrivacyEntry.from_row("r1", "rw", "anonymous", "certified", pool, rows[1]))
        live = {t: led.rdp(t) for t in pool}
    assert _sizes(path) == [(n * O.size * 8, None), (7 * O.size * 8, 4 * n)]  # 6 slopes and -0.0
    with Ledger(path) as again:
        for t in pool:
            assert _bits(again.rdp(t)) == _bits(live[t])
            assert _bits(again.rdp(t)) == _bits(
                0.0 + rows[0][pool.index(t)] + rows[1][pool.index(t)]
            )


def test_a_reader_from_before_compact_blocks_cannot_read_one(tmp_path) -> None:
    """Downgrade safety: a build from before reads ``blocks.rdp`` as the (targets × orders) row and
    checks its size against the targets; a compact block never passes that check, so it stops
    ("does not match the ledger's orders") instead of charging targets the wrong curves."""
    n = 90
    path = tmp_path / "l.sqlite"
    with Ledger(path, node_id="me") as led:
        led.charge(
            PrivacyEntry.from_row(
                "r", "rw", "anonymous", "certified", _pool(n), _walk_rows(n, 4, 6)
            )
        )
    db = sqlite3.connect(path)
    (size,) = db.execute("SELECT length(rdp) FROM blocks").fetchone()
    db.close()
    assert size != n * O.size * 8  # the check the old reader makes
    # and a damaged index is refused with a one-line error, not read past its curves
    db = sqlite3.connect(path)
    db.execute("UPDATE block_rows SET rows = ?", (np.full(n, 99, dtype=np.uint32).tobytes(),))
    db.commit()
    db.close()
    with pytest.raises(lm.LedgerError, match="compact block does not match"):
        Ledger(path)


@pytest.mark.parametrize("seed", range(4))
def test_a_walk_charged_to_its_budget_equals_the_exact_path_live_and_reopened(
    tmp_path, monkeypatch, seed
) -> None:
    """Two runs' rows charged hop after hop until the budget refuses one, on a file ledger as it is and
    on one with the maximum bound and compact blocks switched off: the same refusals (step, target,
    message), the same ε toward every target live and after a reopen, the same sums bit for bit."""
    rng = np.random.default_rng(seed)
    n = 150
    pool = _pool(n)
    runs = [
        sealed(_walk_rows(n, int(rng.integers(3, 30)), seed=10 * seed + i, scale=8.0))
        for i in range(2)
    ]
    from hushnet.privacy.conversions import rdp_epsilon

    top = float(rdp_epsilon(O, runs[0] * 30, 1e-5)[0].max())  # about 30 hops' worth
    per = {
        str(t): (top * float(rng.uniform(0.3, 1)), 1e-6) for t in rng.choice(pool, 4, replace=False)
    }
    budget = LedgerBudget(top, 1e-5, per)
    out = {}
    for mode in ("ledger", "exact path"):
        if mode == "exact path":
            monkeypatch.setattr(lm, "_DOMINATING_MIN_ROWS", 10**9)
            monkeypatch.setattr(ls, "COMPACT_MIN_ROWS", 10**9)
        path = tmp_path / f"{mode}.sqlite"
        events = []
        with Ledger(path, node_id="me", budget=budget) as led:
            for hop in range(60):
                rows = runs[0] if hop < 20 or hop % 3 else runs[1]
                e = PrivacyEntry.from_row(
                    f"r{hop // 20}", "rw", "anonymous", "certified", pool, rows
                )
                try:
                    led.charge(e, report=False)
                    events.append((hop, "ok"))
                except lm.BudgetExceeded as exc:
                    events.append((hop, str(exc)))
            live = led.spent()
        with Ledger(path) as again:
            out[mode] = (events, live, again.spent(), _bits(np.stack([again.rdp(t) for t in pool])))
        monkeypatch.undo()
    assert any(msg != "ok" for _, msg in out["ledger"][0])  # the budget did refuse
    assert out["ledger"] == out["exact path"]
    assert out["ledger"][1] == out["ledger"][2]
