"""SQLite persistence of the bootstrap: members and the chosen topology survive a restart."""

from __future__ import annotations

import pathlib
import sqlite3
import time
from dataclasses import dataclass

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS members (
    node_id      TEXT PRIMARY KEY,
    vertex       INTEGER NOT NULL UNIQUE,
    address      TEXT NOT NULL,
    cert_pem     BLOB NOT NULL,
    cert_sha256  TEXT NOT NULL,
    key_sha256   TEXT NOT NULL UNIQUE,
    x25519       BLOB NOT NULL,
    joined_unix  REAL NOT NULL,
    last_seen    REAL NOT NULL,
    left_network INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS onion_keys (
    node_id    TEXT NOT NULL,
    epoch      INTEGER NOT NULL,
    public_key BLOB NOT NULL,
    PRIMARY KEY (node_id, epoch)
);
"""


@dataclass
class MemberRow:
    node_id: str
    vertex: int
    address: str
    cert_pem: bytes
    cert_sha256: str
    key_sha256: str
    x25519: bytes
    joined_unix: float
    last_seen: float
    left_network: bool


class BootstrapStore:
    """Members, topology spec and directory epoch in ``bootstrap.sqlite``."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = pathlib.Path(path)
        self._db = sqlite3.connect(self.path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    # meta
    def get_meta(self, key: str, default: str | None = None) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else default

    def set_meta(self, key: str, value: str) -> None:
        self._db.execute(
            "INSERT INTO meta(key,value) VALUES(?,?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
            (key, value),
        )

    @property
    def epoch(self) -> int:
        return int(self.get_meta("epoch", "0"))

    def bump_epoch(self) -> int:
        epoch = self.epoch + 1
        self.set_meta("epoch", str(epoch))
        return epoch

    # members
    def _row(self, row) -> MemberRow | None:
        if row is None:
            return None
        return MemberRow(
            row[0],
            int(row[1]),
            row[2],
            bytes(row[3]),
            row[4],
            row[5],
            bytes(row[6]),
            float(row[7]),
            float(row[8]),
            bool(row[9]),
        )

    _COLS = "node_id, vertex, address, cert_pem, cert_sha256, key_sha256, x25519, joined_unix, last_seen, left_network"

    def member(self, node_id: str) -> MemberRow | None:
        return self._row(
            self._db.execute(
                f"SELECT {self._COLS} FROM members WHERE node_id=?", (node_id,)
            ).fetchone()
        )

    def member_by_key(self, key_sha256: str) -> MemberRow | None:
        return self._row(
            self._db.execute(
                f"SELECT {self._COLS} FROM members WHERE key_sha256=?", (key_sha256,)
            ).fetchone()
        )

    def members(self) -> list[MemberRow]:
        rows = self._db.execute(f"SELECT {self._COLS} FROM members ORDER BY vertex").fetchall()
        return [self._row(r) for r in rows]

    def vertex_taken(self, vertex: int) -> bool:
        return (
            self._db.execute("SELECT 1 FROM members WHERE vertex=?", (int(vertex),)).fetchone()
            is not None
        )

    def used_vertices(self) -> set[int]:
        return {int(r[0]) for r in self._db.execute("SELECT vertex FROM members")}

    def upsert(self, m: MemberRow) -> None:
        self._db.execute(
            f"INSERT INTO members({self._COLS}) VALUES(?,?,?,?,?,?,?,?,?,?) "
            "ON CONFLICT(node_id) DO UPDATE SET vertex=excluded.vertex, address=excluded.address, "
            "cert_pem=excluded.cert_pem, cert_sha256=excluded.cert_sha256, key_sha256=excluded.key_sha256, "
            "x25519=excluded.x25519, last_seen=excluded.last_seen, left_network=excluded.left_network",
            (
                m.node_id,
                m.vertex,
                m.address,
                m.cert_pem,
                m.cert_sha256,
                m.key_sha256,
                m.x25519,
                m.joined_unix,
                m.last_seen,
                int(m.left_network),
            ),
        )

    def touch(self, node_id: str, address: str | None = None, now: float | None = None) -> None:
        now = time.time() if now is None else now
        if address:
            self._db.execute(
                "UPDATE members SET last_seen=?, address=?, left_network=0 WHERE node_id=?",
                (now, address, node_id),
            )
        else:
            self._db.execute(
                "UPDATE members SET last_seen=?, left_network=0 WHERE node_id=?", (now, node_id)
            )

    def touch_many(self, node_ids: list[str], now: float | None = None) -> None:
        """Renew many leases in one transaction (one fsync-free WAL commit instead of one per node)."""
        now = time.time() if now is None else now
        with self._db:
            self._db.execute("BEGIN")
            self._db.executemany(
                "UPDATE members SET last_seen=?, left_network=0 WHERE node_id=?",
                [(now, n) for n in node_ids],
            )

    def lease_states(self, node_ids: list[str]) -> dict[str, bool]:
        """``node_id -> left_network`` for those of ``node_ids`` that are members."""
        out: dict[str, bool] = {}
        for i in range(0, len(node_ids), 500):
            chunk = node_ids[i : i + 500]
            rows = self._db.execute(
                f"SELECT node_id, left_network FROM members WHERE node_id IN "
                f"({','.join('?' * len(chunk))})",
                chunk,
            )
            out.update((r[0], bool(r[1])) for r in rows)
        return out

    def mark_left(self, node_id: str) -> None:
        self._db.execute("UPDATE members SET left_network=1 WHERE node_id=?", (node_id,))

    def mark_left_many(self, node_ids: list[str]) -> None:
        """Mark many members as left in one transaction (a host process's nodes stopping together)."""
        with self._db:
            self._db.execute("BEGIN")
            self._db.executemany(
                "UPDATE members SET left_network=1 WHERE node_id=?", [(n,) for n in node_ids]
            )

    # per-epoch onion keys (previous, current and next epoch; older ones are pruned)
    def put_onion_keys(self, node_id: str, keys: list[tuple[int, bytes]]) -> bool:
        """Record ``node_id``'s onion keys; True if anything changed (the directory epoch must move)."""
        changed = False
        for e, pk in keys:
            row = self._db.execute(
                "SELECT public_key FROM onion_keys WHERE node_id=? AND epoch=?", (node_id, int(e))
            ).fetchone()
            if row is None or bytes(row[0]) != bytes(pk):
                self._db.execute(
                    "INSERT INTO onion_keys(node_id, epoch, public_key) VALUES(?,?,?) ON CONFLICT(node_id, epoch) "
                    "DO UPDATE SET public_key=excluded.public_key",
                    (node_id, int(e), bytes(pk)),
                )
                changed = True
        return changed

    def put_onion_keys_many(self, keys: dict[str, list[tuple[int, bytes]]]) -> list[str]:
        """:meth:`put_onion_keys` for several nodes in one transaction; returns the nodes whose keys changed."""
        with self._db:
            self._db.execute("BEGIN")
            return [node_id for node_id, ks in keys.items() if self.put_onion_keys(node_id, ks)]

    def prune_onion_keys(self, min_epoch: int) -> None:
        self._db.execute("DELETE FROM onion_keys WHERE epoch < ?", (int(min_epoch),))

    def onion_keys(
        self, node_ids: list[str] | None = None, min_epoch: int | None = None
    ) -> dict[str, list[tuple[int, bytes]]]:
        """Onion keys by node (ascending epoch), of ``node_ids`` only if given, from ``min_epoch`` on.

        Why the filters: a directory change names a few members, and reading every node's keys for it
        (all of them, on each of a join storm's changes) was a quarter of the bootstrap's time at n = 2048.
        """
        out: dict[str, list[tuple[int, bytes]]] = {}
        low = -(1 << 62) if min_epoch is None else int(min_epoch)
        if node_ids is None:
            rows = self._db.execute(
                "SELECT node_id, epoch, public_key FROM onion_keys WHERE epoch >= ? ORDER BY epoch",
                (low,),
            )
        else:
            ids = list(node_ids)
            rows = []
            for i in range(0, len(ids), 500):  # SQLite's bound-parameter limit
                part = ids[i : i + 500]
                rows += self._db.execute(
                    "SELECT node_id, epoch, public_key FROM onion_keys WHERE epoch >= ? AND node_id IN "
                    f"({','.join('?' * len(part))}) ORDER BY epoch",
                    (low, *part),
                ).fetchall()
            rows.sort(key=lambda r: r[1])
        for node_id, e, pk in rows:
            out.setdefault(node_id, []).append((int(e), bytes(pk)))
        return out
