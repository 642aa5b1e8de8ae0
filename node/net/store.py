"""The node's local SQLite store (``node.sqlite`` in its state directory), and its incarnation counter.

Holds small durable facts that must survive a restart: a key/value table (last directory epoch, protocol
state of later issues) and an inbox log of envelopes that built-in diagnostics record (``net.ping``), so
an operator can verify end-to-end delivery.

Why the SQLite file is opened on first use and the incarnation lives in a file of its own: a start
read and wrote nothing in ``node.sqlite`` but the incarnation counter, and creating the file in WAL mode
cost ~1.7 ms of CPU a node (2.9 ms under a host's load), ~3.5–6 CPU-seconds of a 2048-node start-up
(issue 12); an atomically replaced ``incarnation`` file costs ~0.1 ms.  A state directory written before
that keeps its counter in ``node.sqlite``'s ``kv`` table: it is read once from there (the larger of the
two counts), then counted on in the file.
"""

from __future__ import annotations

import json
import os
import pathlib
import sqlite3
import threading
import time

from hushnet.storage import open_store

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS inbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    received REAL NOT NULL,
    protocol TEXT NOT NULL,
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    sender TEXT NOT NULL,
    size INTEGER NOT NULL,
    sha256 TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS inbox_run ON inbox(protocol, run_id);
"""

#: the incarnation counter's file, beside ``node.sqlite``
INCARNATION_FILE = "incarnation"


class NodeStore:
    """``node.sqlite``, opened (created) by the first call that reads or writes it."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = pathlib.Path(path)
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._lock = (
            threading.Lock()
        )  # the first use may come from a worker thread and the loop at once

    @property
    def opened(self) -> bool:
        """Whether the SQLite file has been opened (tests read it)."""
        return self._conn is not None

    @property
    def _db(self) -> sqlite3.Connection:
        conn = self._conn
        if conn is None:
            with self._lock:
                if self._closed:
                    raise sqlite3.ProgrammingError(f"node store {self.path} is closed")
                if self._conn is None:
                    db = open_store(self.path)
                    try:
                        db.executescript(_SCHEMA)
                    except BaseException:
                        db.close()
                        raise
                    self._conn = db
                conn = self._conn
        return conn

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def get(self, key: str, default=None):
        row = self._db.execute("SELECT value FROM kv WHERE key=?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    def put(self, key: str, value) -> None:
        self._db.execute(
            "INSERT INTO kv(key,value) VALUES(?,?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
            (key, json.dumps(value)),
        )

    def next_incarnation(self) -> int:
        """Count process starts; sequence numbers embed it so they never repeat after a restart.

        Written like the node's other small files (a temporary file renamed over the old one): a crash
        leaves the old count or the new one, and a restart counts from the larger of the file and a
        counter an older version kept in ``node.sqlite``."""
        path = self.path.parent / INCARNATION_FILE
        try:
            value = int(path.read_text().strip() or 0)
        except FileNotFoundError:
            value = 0
        except ValueError:
            raise ValueError(f"{path} does not hold an incarnation number") from None
        if self.path.exists():  # a counter an older version kept (or a file restored from a backup)
            value = max(value, int(self.get("incarnation", 0)))
        value += 1
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w") as fh:
            fh.write(f"{value}\n")
        os.replace(tmp, path)
        return value

    def record(
        self, protocol: str, run_id: str, seq: int, sender: str, size: int, sha256: str
    ) -> None:
        self._db.execute(
            "INSERT INTO inbox(received, protocol, run_id, seq, sender, size, sha256) VALUES(?,?,?,?,?,?,?)",
            (time.time(), protocol, run_id, int(seq), sender, int(size), sha256),
        )

    def inbox(self, protocol: str | None = None, run_id: str | None = None) -> list[dict]:
        sql = "SELECT received, protocol, run_id, seq, sender, size, sha256 FROM inbox"
        cond, args = [], []
        if protocol:
            cond.append("protocol=?")
            args.append(protocol)
        if run_id:
            cond.append("run_id=?")
            args.append(run_id)
        if cond:
            sql += " WHERE " + " AND ".join(cond)
        sql += " ORDER BY id"
        keys = ("received", "protocol", "run_id", "seq", "sender", "size", "sha256")
        return [dict(zip(keys, row)) for row in self._db.execute(sql, args)]
