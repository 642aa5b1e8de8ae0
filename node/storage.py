"""How a node's SQLite stores open their file: one place, with a bounded page cache.

A node keeps five SQLite files open for its whole life (``node.sqlite``, its replay cache, its privacy
ledger, its runs and its gossip schedule) and a host process keeps them for every node it hosts.
SQLite's default page cache is 2 000 KiB *per connection*, filled as the file is read and written and
never given back: at n = 1024 a node's ledger (2.6 MB) and run store each grow past it during a
Muffliato-GD run, so the caches alone were ~4 MB of each hosted node's resident memory, and five
connections × 2 MB × 2 048 nodes is 20 GB the machine does not have (issue 12).  The files' pages stay
in the operating system's page cache (shared, reclaimable, not the process's resident memory), so a
small SQLite cache costs a ``pread`` per page instead of a ``memcpy``; the stores' transactions touch a
few pages each (an index path and the rows written), which :data:`CACHE_KIB` holds.
"""

from __future__ import annotations

import pathlib
import sqlite3

#: page cache of each store connection, in KiB (SQLite's default is 2 000); a transaction larger than
#: this spills its dirty pages to the WAL before it commits (still atomic)
CACHE_KIB = 256
#: the largest buffer a store binds as a statement parameter; larger ones are written with
#: :func:`insert_large_blob`.  Why: SQLite copies a bound buffer and the statement keeps the copy until it
#: is next run — and Python's ``sqlite3`` keeps its last 128 statements prepared — so the last block a
#: node's ledger wrote (targets × 159 orders: 1.3 MB at n = 1024) stayed in memory for the node's life
BIND_MAX = 64 * 1024


def open_store(
    path: str | pathlib.Path,
    *,
    synchronous: str = "normal",
    page_size: int | None = None,
) -> sqlite3.Connection:
    """A node store's connection: autocommit (the store issues its own ``BEGIN``), usable from worker
    threads (each store serialises its calls), WAL, ``synchronous`` as given, page cache :data:`CACHE_KIB`.

    ``page_size`` applies to a new file only (set before WAL mode; an existing file keeps its own)."""
    db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    try:
        if page_size is not None:
            db.execute(f"PRAGMA page_size={int(page_size)}")
        db.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={synchronous.upper()}")
    except BaseException:
        db.close()
        raise
    return db


def insert_large_blob(
    db: sqlite3.Connection, sql: str, params: tuple, table: str, column: str, data
) -> int | None:
    """Run ``sql`` (an INSERT whose ``column`` value is ``zeroblob(?)``, bound to ``len(data)`` at the
        place the buffer would be) and write ``data`` into the new row through SQLite's incremental blob
        I/O; returns the row id (None when an ``INSERT OR IGNORE`` made no row: ``lastrowid`` would then
    name an earlier row).  No copy of ``data`` stays with the prepared statement (:data:`BIND_MAX`).

        Call it inside the caller's transaction: the row and its bytes commit (or roll back) together."""
    view = memoryview(data).cast("B")
    cur = db.execute(sql, params)
    if (
        cur.rowcount != 1
    ):  # an INSERT OR IGNORE whose row exists (the same content key): nothing to write
        return None
    with db.blobopen(table, column, cur.lastrowid) as blob:
        blob.write(view)
    return int(cur.lastrowid)


def rollback(db: sqlite3.Connection) -> None:
    """Undo the open transaction after a failed statement, if SQLite has not undone it already.

    Why: on some errors (a full disk: SQLITE_FULL) SQLite rolls the transaction back itself, and a second
    ``ROLLBACK`` then raised "cannot rollback - no transaction is active" in place of the error that said
    what went wrong (a 2048-node walk stopped with that message when the disk filled, issue 12)."""
    if db.in_transaction:
        db.execute("ROLLBACK")
