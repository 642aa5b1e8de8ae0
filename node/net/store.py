"""The node's local SQLite store (``node.sqlite`` in its state directory).

Holds small durable facts that must survive a restart: a key/value table (incarnation counter,
last directory epoch, protocol state of later issues) and an inbox log of envelopes that
built-in diagnostics record (``net.ping``), so an operator can verify end-to-end delivery.
"""

from __future__ import annotations

import json
import pathlib
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


class NodeStore:
    def __init__(self, path: pathlib.Path) -> None:
        self.path = pathlib.Path(path)
        self._db = open_store(self.path)
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def get(self, key: str, default=None):
        row = self._db.execute("SELECT value FROM kv WHERE key=?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    def put(self, key: str, value) -> None:
        self._db.execute(
            "INSERT INTO kv(key,value) VALUES(?,?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
            (key, json.dumps(value)),
        )

    def next_incarnation(self) -> int:
        """Count process starts; sequence numbers embed it so they never repeat after a restart."""
        value = int(self.get("incarnation", 0)) + 1
        self.put("incarnation", value)
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
