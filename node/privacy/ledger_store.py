"""SQLite persistence of a node's privacy ledger: entries, per-target costs, the budget, the orders.

One file per node (WAL mode, ``synchronous=NORMAL``: a committed charge survives a process crash)
so that a node restarting mid-run still knows what it has spent.  This module only stores and
reads back; the arithmetic (composition, conversion, budget checks) is in
:mod:`hushnet.privacy.ledger_math`, and :class:`hushnet.privacy.ledger.Ledger` joins the two under
one lock.  Curves are stored as raw float64 blobs on the ledger's orders.

An entry's costs are one **block**: its targets, their curves as one (targets × orders) matrix and
their μ.  An entry whose costs are bit for bit those of a recent entry (every hop of a walk charges
the same row) points at that block instead of writing it again, so a hop toward n targets writes
two small rows, not n curves (issue 12: 512 rows of 1.4 kB per hop).  Files written before
blocks (one ``costs`` row per target) still load: their entries replay from those rows.

A block whose curves repeat (a walk's row: a few hundred distinct curves among 2 047 targets on
hypercube:11) is written **compact**: its distinct curves in ``blocks.rdp`` and, in ``block_rows``,
the index of each target's curve (uint32) — read back, ``distinct[index]`` is the row bit for bit.
Why: the run's first charge wrote the whole 2.6 MB row at n = 2048, most of that charge's time.  A
build from before compact blocks reads only ``blocks.rdp``, whose size then does not match the
targets: it stops with its "does not match the ledger's orders" error, never under-counts.
"""

from __future__ import annotations

import json
import math
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from hushnet.privacy.distinct import distinct_rows
from hushnet.privacy.ledger_math import (
    DEFAULT_DELTA,
    Costs,
    LedgerBudget,
    LedgerError,
    PrivacyEntry,
    StoredBudgetError,
    as_key,
    is_sealed,
    sealed,
)
from hushnet.storage import BIND_MAX, insert_large_blob, open_store, rollback

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
CREATE TABLE IF NOT EXISTS blocks (
    id INTEGER PRIMARY KEY AUTOINCREMENT, targets TEXT NOT NULL, rdp BLOB NOT NULL, gdp_mu BLOB);
CREATE TABLE IF NOT EXISTS entry_blocks (
    entry_id INTEGER PRIMARY KEY REFERENCES entries(id),
    block_id INTEGER NOT NULL REFERENCES blocks(id));
CREATE TABLE IF NOT EXISTS block_rows (
    block_id INTEGER PRIMARY KEY REFERENCES blocks(id), rows BLOB NOT NULL);
"""

#: a block of at least this many targets is looked at for repeated curves (see the module docstring)
COMPACT_MIN_ROWS = 64
#: and written compact when its distinct curves and index take at most this share of the full row
_COMPACT_MAX_SHARE = 0.75

#: how many recent blocks an append compares its costs with before writing a new one
_RECENT_BLOCKS = 2


#: what ``meta.orders`` holds in a file with blocks: not JSON, so a build from before blocks (which
#: would miss the block-stored spending and under-count) stops on open instead of reading it
FORMAT_MARK = "ledger format 2 (cost blocks): needs a hushnet ledger that reads blocks"


def _blob(c) -> bytes | None:
    return None if c is None else np.asarray(c, dtype=np.float64).tobytes()


class LedgerStore:
    """The ledger's SQLite file.  Not locked: the owning :class:`~hushnet.privacy.ledger.Ledger`
    serialises every call."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        self._db = open_store(self.path)
        self._db.executescript(_SCHEMA)
        #: (block id, targets, weak reference to the curves, their shape, μ blob) of the blocks this
        #: connection wrote last — weak: the store keeps no (targets × orders) matrix alive (issue 12)
        self._recent: list[tuple[int, list[str], weakref.ref, tuple, bytes | None]] = []

    def _rollback(self) -> None:
        """Undo the open transaction after a failed statement (:func:`hushnet.storage.rollback`)."""
        rollback(self._db)

    # ---------------------------------------------------------------- meta
    def meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def set_meta(self, key: str, value: str) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value))

    def orders(self) -> np.ndarray | None:
        """The Rényi orders the file was created with (``None``: a new file).

        A file written before blocks keeps them under ``orders``; on open they move to
        ``orders_v2`` and ``orders`` becomes :data:`FORMAT_MARK`.  A build from before blocks reads
        only the per-target rows, so it would see none of the spending stored in blocks and
        under-count; it parses ``orders`` as JSON on open, so the mark makes it fail loudly instead."""
        stored = self.meta("orders_v2")
        if stored is None:
            stored = self.meta("orders")
            if stored is None:
                return None
            self._mark_format(stored)
        return np.asarray(json.loads(stored), dtype=float)

    def _mark_format(self, orders_json: str) -> None:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self.set_meta("orders_v2", orders_json)
            self.set_meta("orders", FORMAT_MARK)
            self._db.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise

    def init_meta(self, orders: np.ndarray, node_id: str) -> None:
        self._mark_format(json.dumps(orders.tolist()))
        self.set_meta("node_id", node_id)

    # ---------------------------------------------------------------- costs
    def replay(self, k: int) -> Iterator[tuple[str, Costs]]:
        """Every stored entry's (bound label, costs), oldest first — the order the sums were
        built in, so a reopened ledger composes bit for bit the same curves.  ``k``: the number of
        orders (a stored curve of another length is a :class:`LedgerError`)."""
        rows: dict[int, list] = {}
        for eid, target, blob, mu in self._db.execute(  # files written before blocks
            "SELECT entry_id, target, rdp, gdp_mu FROM costs ORDER BY entry_id, rowid"
        ):
            rows.setdefault(eid, []).append((target, blob, mu))
        blocks: dict[int, Costs] = {}
        for eid, bound, bid in self._db.execute(
            "SELECT e.id, e.bound, b.block_id FROM entries e "
            "LEFT JOIN entry_blocks b ON b.entry_id = e.id ORDER BY e.id"
        ).fetchall():
            if bid is not None:
                if bid not in blocks:
                    blocks[bid] = self._block(bid, k)
                yield bound, blocks[bid]
            elif eid in rows:
                yield bound, _costs_of_rows(rows[eid], k)

    def _block(self, bid: int, k: int) -> Costs:
        targets, blob, mu_blob, index = self._db.execute(
            "SELECT b.targets, b.rdp, b.gdp_mu, r.rows FROM blocks b "
            "LEFT JOIN block_rows r ON r.block_id = b.id WHERE b.id = ?",
            (bid,),
        ).fetchone()
        keys = json.loads(targets)
        rdp = _block_curves(blob, index, len(keys), k)
        if mu_blob is None:  # no target carries a μ
            mu, has = np.zeros(len(keys)), np.zeros(len(keys), dtype=bool)
        else:  # NaN marks a target without one (a stored μ is never NaN: validate refuses it)
            mu = np.frombuffer(mu_blob, dtype=np.float64)
            if mu.size != len(keys):
                raise LedgerError("stored gdp_mu does not match the entry's targets")
            has = ~np.isnan(mu)
        return Costs(keys, rdp, np.where(has, mu, 0.0), has)

    def append(self, entry: PrivacyEntry, costs: Costs) -> int:
        """Record one entry and its validated costs in one transaction; returns the entry id.

        The costs go in as one block, or as a reference to a recent block with the very same
        bytes (targets, curves, μ) — what a walk's hops charge over and over."""
        return self._write(entry, costs)[0]

    def put_block(self, costs: Costs) -> int:
        """Store validated costs as a block no entry points at yet (or find a recent one with the same
        bytes); returns its id.  Nothing counts until an entry points at it: replay composes entries.

        Why: a run's contribution rows can be stored when the node accepts the run, so that even its
        first visit is charged by reference (issue 12)."""
        return self._write(None, costs)[1]

    def _write(self, entry: PrivacyEntry | None, costs: Costs) -> tuple[int, int]:
        """(entry id or 0, block id): :meth:`append` and :meth:`put_block` in one transaction."""
        mu_blob = np.where(costs.has_mu, costs.mu, np.nan).tobytes() if costs.has_mu.any() else None
        bid = self._recent_block(costs, mu_blob)
        if bid is None:  # found outside the transaction: its write lock is not held while hashing
            rdp, index = _compact(costs.rdp)
        self._db.execute("BEGIN IMMEDIATE")
        try:
            eid = 0
            if entry is not None:
                eid = self._db.execute(
                    "INSERT INTO entries(run_id, protocol, view_model, bound, note, created) "
                    "VALUES (?,?,?,?,?,?)",
                    (
                        entry.run_id,
                        entry.protocol,
                        entry.view_model,
                        entry.bound,
                        entry.note,
                        time.time(),
                    ),
                ).lastrowid
            new = bid is None
            if new:
                if rdp.nbytes > BIND_MAX:  # written in place: no copy stays with the statement
                    bid = insert_large_blob(
                        self._db,
                        "INSERT INTO blocks(targets, rdp, gdp_mu) VALUES (?,zeroblob(?),?)",
                        (json.dumps(costs.keys_), rdp.nbytes, mu_blob),
                        "blocks",
                        "rdp",
                        rdp,
                    )
                else:
                    bid = self._db.execute(
                        "INSERT INTO blocks(targets, rdp, gdp_mu) VALUES (?,?,?)",
                        (json.dumps(costs.keys_), rdp.tobytes(), mu_blob),
                    ).lastrowid
                if index is not None:
                    self._db.execute(
                        "INSERT INTO block_rows(block_id, rows) VALUES (?,?)",
                        (bid, index.tobytes()),
                    )
            if entry is not None:
                self._db.execute(
                    "INSERT INTO entry_blocks(entry_id, block_id) VALUES (?,?)", (eid, bid)
                )
            self._db.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise
        if new and is_sealed(costs.rdp):  # only once committed: a rolled-back block must never be
            # pointed at; and only curves nobody can change (a walk's rows for a σ), referred to weakly
            ref = weakref.ref(costs.rdp)
            self._recent = [(int(bid), costs.keys_, ref, costs.rdp.shape, mu_blob)] + self._recent[
                : _RECENT_BLOCKS - 1
            ]
        return int(eid), int(bid)

    def append_repeat(
        self, run_id: str, protocol: str, view_model: str, bound: str, note: str, block: int
    ) -> int:
        """Record one entry whose costs are the stored ``block`` (the caller knows they are); returns its
        id.  The same two rows :meth:`append` writes for a repeated block, in one transaction — replayed
        like any other entry."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            eid = self._db.execute(
                "INSERT INTO entries(run_id, protocol, view_model, bound, note, created) VALUES (?,?,?,?,?,?)",
                (run_id, protocol, view_model, bound, note, time.time()),
            ).lastrowid
            self._db.execute(
                "INSERT INTO entry_blocks(entry_id, block_id) VALUES (?,?)", (eid, int(block))
            )
            self._db.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise
        return int(eid)

    def block_of(self, entry_id: int) -> int:
        """The block an entry's costs are stored in."""
        row = self._db.execute(
            "SELECT block_id FROM entry_blocks WHERE entry_id = ?", (int(entry_id),)
        ).fetchone()
        if row is None:
            raise LedgerError(f"entry {entry_id} has no cost block")
        return int(row[0])

    def block_costs(self, block: int, k: int) -> Costs:
        """A stored block's costs (sealed curves), as replay composes them."""
        return self._block(int(block), k)

    def _recent_block(self, costs: Costs, mu_blob: bytes | None) -> int | None:
        """The id of a recent block with exactly these costs (bitwise), else ``None``.

        The very curves it wrote (alive, and nobody can change them: a walk's rows for a σ) are that
        block; other curves of the same shape, targets and μ are compared with the block's stored bytes
        (a hosted node's rows, built again for a later visit after the process let them go)."""
        for i, (bid, keys, ref, shape, mu) in enumerate(self._recent):
            if mu != mu_blob or shape != costs.rdp.shape:
                continue
            if ref() is costs.rdp:
                if keys == costs.keys_:
                    return bid
                continue
            if keys != costs.keys_ or not is_sealed(costs.rdp):
                continue
            row = self._db.execute(
                "SELECT b.rdp, r.rows FROM blocks b LEFT JOIN block_rows r ON r.block_id = b.id "
                "WHERE b.id = ?",
                (bid,),
            ).fetchone()
            if row is None:
                continue
            try:
                stored = _block_curves(row[0], row[1], shape[0], shape[1], seal=False)
            except LedgerError:
                continue
            if np.array_equal(
                stored.view(np.uint64), np.ascontiguousarray(costs.rdp).view(np.uint64)
            ):
                # the new curves stand for that block now (checked by identity at the next charge)
                self._recent[i] = (bid, keys, weakref.ref(costs.rdp), shape, mu)
                return bid
        return None

    def entry_counts(self) -> list[tuple[str, str, int]]:
        """``(run_id, protocol of its first entry, entries)`` per run, in the order of each run's first
        entry: what :meth:`entries` would say, without reading a single cost (a node's ``run.ledger``
        answer built it from :meth:`entries` — every entry's per-target curves, ~20 ms a node at n = 1024)."""
        # SQLite takes a bare column's value from the row MIN() picked: the protocol of the first entry
        return [
            (rid, proto, int(n))
            for rid, proto, _, n in self._db.execute(
                "SELECT run_id, protocol, MIN(id) AS first, COUNT(*) FROM entries "
                "GROUP BY run_id ORDER BY first"
            ).fetchall()
        ]

    def entries(self, run_id: str | None = None) -> list[dict]:
        """The recorded entries (metadata and per-target costs), oldest first."""
        q = (
            "SELECT e.id, e.run_id, e.protocol, e.view_model, e.bound, e.note, e.created, "
            "b.block_id FROM entries e LEFT JOIN entry_blocks b ON b.entry_id = e.id"
        )
        args: tuple = ()
        if run_id is not None:
            q += " WHERE e.run_id = ?"
            args = (run_id,)
        out = []
        k = len(self.orders() if self.orders() is not None else [])
        blocks: dict[int, Costs] = {}
        for eid, rid, proto, view, bound, note, created, bid in self._db.execute(
            q + " ORDER BY e.id", args
        ).fetchall():
            if bid is not None:
                c = blocks.get(bid) or blocks.setdefault(bid, self._block(bid, k))
                rdp = {t: c.rdp[i].copy() for i, t in enumerate(c.keys_)}
                mus = {t: float(c.mu[i]) for i, t in enumerate(c.keys_) if c.has_mu[i]}
            else:
                rows = self._db.execute(
                    "SELECT target, rdp, gdp_mu FROM costs WHERE entry_id = ?", (eid,)
                ).fetchall()
                rdp = {t: np.frombuffer(b, dtype=np.float64).copy() for t, b, _ in rows}
                mus = {t: mu for t, _, mu in rows if mu is not None}
            out.append(
                {
                    "id": eid,
                    "run_id": rid,
                    "protocol": proto,
                    "view_model": view,
                    "bound": bound,
                    "note": note,
                    "created": created,
                    "rdp": rdp,
                    "gdp_mu": mus,
                }
            )
        return out

    # ---------------------------------------------------------------- budget
    def read_budget(self) -> LedgerBudget | None:
        """The stored budget, or a one-line :class:`LedgerError` for a row that cannot be one.

        SQLite stores a NaN as NULL, and a build that accepted ε = NaN wrote it so: a per-node row
        with a δ but no ε would otherwise fall back to the uniform budget, and a uniform row without
        one would enforce nothing.  The caller checks the values (:func:`check_budget`) as when set."""
        rows = self._db.execute("SELECT target, epsilon, delta, rdp_curve FROM budget").fetchall()
        if not rows:
            return None
        per, per_curve, uni, curve = {}, {}, (math.inf, DEFAULT_DELTA), None
        for target, e, d, blob in rows:
            if blob is not None and len(blob) % 8:
                raise StoredBudgetError(
                    f"stored budget RDP curve for {target!r} is not float64 values"
                )
            c = None if blob is None else np.frombuffer(blob, dtype=np.float64).copy()
            if target == _UNIFORM or e is not None or d is not None:
                if e is None or d is None:  # NaN (or nothing) where a number was stored
                    raise StoredBudgetError(
                        f"stored budget for {target!r} has no epsilon or delta (a NaN written by an "
                        "older build?): set the budget again"
                    )
            elif c is None:
                raise StoredBudgetError(f"stored budget for {target!r} is empty")
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
            self._rollback()
            raise

    def close(self) -> None:
        self._db.close()


def _compact(rdp: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """What a new block stores: ``(curves, None)`` — the row as it is — or, when its curves repeat
    enough to be worth it, ``(distinct curves, uint32 index per target)``."""
    rdp = np.ascontiguousarray(rdp, dtype=np.float64)
    m = rdp.shape[0]
    if m < COMPACT_MIN_ROWS or rdp.ndim != 2 or m >= 2**32:
        return rdp, None
    found = distinct_rows(rdp)
    if found is None:
        return rdp, None
    first, inv = found
    if first.size * rdp.itemsize * rdp.shape[1] + 4 * m > _COMPACT_MAX_SHARE * rdp.nbytes:
        return rdp, None
    return rdp[first], inv.astype(np.uint32)


def _block_curves(
    blob: bytes, index: bytes | None, m: int, k: int, *, seal: bool = True
) -> np.ndarray:
    """A block's (m × k) curves from its stored bytes — sealed (read-only over ``bytes``), so a
    reopened ledger's sums may share them as they share the first charge's rows live (``seal=False``:
    a compact block's rows as a plain array, for a comparison)."""
    if len(blob) % 8:
        raise LedgerError("stored RDP curve is not whole float64 values")
    rdp = np.frombuffer(blob, dtype=np.float64)
    if index is None:
        if rdp.size != m * k:
            raise LedgerError("stored RDP curve does not match the ledger's orders")
        return rdp.reshape(m, k)
    if len(index) % 4:  # numpy would raise its own ValueError: the ledger's one-line error instead
        raise LedgerError("stored compact block index is not whole uint32 values")
    rows = np.frombuffer(index, dtype=np.uint32)
    if rows.size != m or rdp.size % k or (m and int(rows.max()) >= rdp.size // k):
        raise LedgerError("stored compact block does not match its targets or the ledger's orders")
    full = rdp.reshape(-1, k)[rows]
    return sealed(full) if seal else full


def _costs_of_rows(rows: list, k: int) -> Costs:
    """One entry's costs from its per-target rows (the format before blocks)."""
    keys = [t for t, _, _ in rows]
    rdp = np.empty((len(rows), k))
    mu = np.zeros(len(rows))
    has = np.zeros(len(rows), dtype=bool)
    for i, (_, blob, m) in enumerate(rows):
        if len(blob) != 8 * k:
            raise LedgerError("stored RDP curve does not match the ledger's orders")
        v = np.frombuffer(blob, dtype=np.float64)
        if v.size != k:
            raise LedgerError("stored RDP curve does not match the ledger's orders")
        rdp[i] = v
        if m is not None:
            mu[i], has[i] = m, True
    return Costs(keys, rdp, mu, has)
