"""SQLite persistence of a node's privacy ledger: entries, per-target costs, the budget, the orders.

One file per node (WAL mode, ``synchronous=NORMAL``: a committed charge survives a process crash)
so that a node restarting mid-run still knows what it has spent.  This module only stores and
reads back; the arithmetic (composition, conversion, budget checks) is in
:mod:`hushnet.privacy.ledger_math`, and :class:`hushnet.privacy.ledger.Ledger` joins the two under
one lock.  Curves are stored as raw little-endian float64 blobs on the ledger's orders.
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from hushnet.privacy.ledger_math import DEFAULT_DELTA, LedgerBudget, PrivacyEntry, as_key

__all__ = ["LedgerStore"]

#: the budget row that applies to every target without its own
_UNIFORM = "*"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, protocol TEXT NOT NULL,
    view_model TEXT NOT NULL, bound TEXT NOT NULL, note TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS costs (
    entry_id INTEGER NOT NULL REFERENCES entries(id), target TEXT NOT NULL,
    rdp BLOB NOT NULL, gdp_mu REAL, PRIMARY KEY (entry_id, target));
CREATE TABLE IF NOT EXISTS budget (
    target TEXT PRIMARY KEY, epsilon REAL, delta REAL, rdp_curve BLOB);
"""


def _blob(c) -> bytes | None:
    return None if c is None else np.asarray(c, dtype=np.float64).tobytes()


class LedgerStore:
    """The ledger's SQLite file.  Not locked: the owning :class:`~hushnet.privacy.ledger.Ledger`
    serialises every call."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    # ---------------------------------------------------------------- meta
    def meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def set_meta(self, key: str, value: str) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value))

    def orders(self) -> np.ndarray | None:
        """The Rényi orders the file was created with (``None``: a new file)."""
        stored = self.meta("orders")
        return None if stored is None else np.asarray(json.loads(stored), dtype=float)

    def init_meta(self, orders: np.ndarray, node_id: str) -> None:
        self.set_meta("orders", json.dumps(orders.tolist()))
        self.set_meta("node_id", node_id)

    # ---------------------------------------------------------------- costs
    def costs(self) -> Iterator[tuple[str, np.ndarray, float | None, str]]:
        """Every stored cost as (target, RDP curve, μ or None, bound label), oldest first."""
        rows = self._db.execute(
            "SELECT c.target, c.rdp, c.gdp_mu, e.bound FROM costs c JOIN entries e ON e.id = c.entry_id"
        )
        for target, blob, mu, bound in rows:
            yield target, np.frombuffer(blob, dtype=np.float64), mu, bound

    def append(
        self, entry: PrivacyEntry, costs: Mapping[str, tuple[np.ndarray, float | None]]
    ) -> int:
        """Record one entry and its validated costs in one transaction; returns the entry id."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            cur = self._db.execute(
                "INSERT INTO entries(run_id, protocol, view_model, bound, note, created) VALUES (?,?,?,?,?,?)",
                (
                    entry.run_id,
                    entry.protocol,
                    entry.view_model,
                    entry.bound,
                    entry.note,
                    time.time(),
                ),
            )
            eid = cur.lastrowid
            self._db.executemany(
                "INSERT INTO costs(entry_id, target, rdp, gdp_mu) VALUES (?,?,?,?)",
                [(eid, t, v.tobytes(), mu) for t, (v, mu) in costs.items()],
            )
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        return int(eid)

    def entries(self, run_id: str | None = None) -> list[dict]:
        """The recorded entries (metadata and per-target costs), oldest first."""
        q = "SELECT id, run_id, protocol, view_model, bound, note, created FROM entries"
        args: tuple = ()
        if run_id is not None:
            q += " WHERE run_id = ?"
            args = (run_id,)
        out = []
        for eid, rid, proto, view, bound, note, created in self._db.execute(
            q + " ORDER BY id", args
        ).fetchall():
            costs = self._db.execute(
                "SELECT target, rdp, gdp_mu FROM costs WHERE entry_id = ?", (eid,)
            ).fetchall()
            out.append(
                {
                    "id": eid,
                    "run_id": rid,
                    "protocol": proto,
                    "view_model": view,
                    "bound": bound,
                    "note": note,
                    "created": created,
                    "rdp": {t: np.frombuffer(b, dtype=np.float64).copy() for t, b, _ in costs},
                    "gdp_mu": {t: mu for t, _, mu in costs if mu is not None},
                }
            )
        return out

    # ---------------------------------------------------------------- budget
    def read_budget(self) -> LedgerBudget | None:
        rows = self._db.execute("SELECT target, epsilon, delta, rdp_curve FROM budget").fetchall()
        if not rows:
            return None
        per, per_curve, uni, curve = {}, {}, (math.inf, DEFAULT_DELTA), None
        for target, e, d, blob in rows:
            c = None if blob is None else np.frombuffer(blob, dtype=np.float64).copy()
            if target == _UNIFORM:
                uni, curve = (e, d), c
            else:
                if e is not None:
                    per[target] = (e, d)
                if c is not None:
                    per_curve[target] = c
        return LedgerBudget(uni[0], uni[1], per, curve, per_curve)

    def write_budget(self, budget: LedgerBudget) -> None:
        """Replace the stored budget in one transaction (the caller has validated it)."""
        rows: dict[str, list] = {_UNIFORM: [budget.epsilon, budget.delta, _blob(budget.rdp_curve)]}
        for t, (e, d) in budget.per_target.items():
            rows[as_key(t)] = [e, d, None]
        for t, c in budget.per_target_rdp.items():
            rows.setdefault(as_key(t), [None, None, None])[2] = _blob(c)
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.execute("DELETE FROM budget")
            self._db.executemany(
                "INSERT INTO budget VALUES (?, ?, ?, ?)", [(t, *r) for t, r in rows.items()]
            )
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self._db.close()
