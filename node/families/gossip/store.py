"""Durable gossip schedule records: a node's realised rows of ``W_t`` survive a crash of its process.

Every gossip round closes with a ``schedule`` record (the node's row of ``W_t`` and the neighbours it
sent its value to); the settlement replays those records to account what really happened.  In memory
only, a node killed mid-run (or before settlement) would lose them and nobody could replay its part of
the run.  This store keeps them in the node's state directory, in SQLite like the privacy ledger
(:mod:`hushnet.privacy.ledger`), written *as they are produced*:

* at acceptance the run is registered with its public spec, the node's vertex and the vertex → node
  id map, so a restarted node can answer ``run.schedule`` and settle a run it no longer holds;
* every record is committed by the node driver's journal hook *before* the actions after it run — in
  particular before the next round's value is sent.  Committed as the node's run store and privacy
  ledger commit (WAL, ``synchronous=NORMAL``: a committed record survives any crash of the process;
  ``HUSHNET_RUNS_SYNC=full`` fsyncs each one so it also survives a power loss).  It was ``FULL``
  alone of the node's stores: at n = 1024 (3 hosts of 342 nodes) each round's 1 024 fsyncs ran on the
  hosts' event loops, which spent much of the rounds waiting on the disk (main threads in D state,
  ~43 s a round at load 14) — for a guarantee the ledger beside it does not give either.

That ordering is the invariant the conservative settlement rests on
(:func:`hushnet.families.gossip.realised.complete_crashed`): the durable records of a node are a
*prefix* of its rounds, and a node can have sent a value only in the rounds it recorded plus, at
most, the one round in progress when it died (the value of round t leaves before round t's record,
the value of round t+1 only after it).  If the write fails the driver stops the run: no value leaves
whose derivation is not on disk.
"""

from __future__ import annotations

import json
import pathlib
import sqlite3
import threading
import time
from typing import Any, Callable

from hushnet.engine.actions import LedgerEntry as EngineEntry
from hushnet.runs.run_store import sync_mode
from hushnet.runs.spec import RunSpec, spec_from_dict
from hushnet.storage import open_store

#: the store's file in a node's state directory (next to ``privacy_ledger.sqlite``)
STORE_FILE = "gossip_schedule.sqlite"


class ScheduleStore:
    """The gossip schedule records of one node (all its runs), in one SQLite file."""

    def __init__(self, path: str | pathlib.Path) -> None:
        self.path = str(path)
        self._lock = threading.RLock()
        # the next round's value leaves only after this record is committed (see the module's docstring)
        self._db = open_store(self.path, synchronous=sync_mode())
        self._db.executescript(
            """
            CREATE TABLE IF NOT EXISTS runs (
                run_id TEXT PRIMARY KEY, vertex INTEGER NOT NULL, ids TEXT NOT NULL, spec TEXT NOT NULL,
                created REAL NOT NULL);
            CREATE TABLE IF NOT EXISTS records (
                run_id TEXT NOT NULL REFERENCES runs(run_id), round INTEGER NOT NULL, record TEXT NOT NULL,
                PRIMARY KEY (run_id, round));
            """
        )

    def open_run(self, spec: RunSpec, vertex: int, ids: list[str]) -> None:
        """Register a run at acceptance (idempotent: a resubmitted spec keeps its records)."""
        with self._lock:
            self._db.execute(
                "INSERT OR IGNORE INTO runs(run_id, vertex, ids, spec, created) VALUES (?,?,?,?,?)",
                (
                    spec.run_id,
                    int(vertex),
                    json.dumps(list(ids)),
                    json.dumps(spec.to_dict()),
                    time.time(),
                ),
            )

    def append(self, run_id: str, record: dict[str, Any]) -> None:
        """Commit one round's record; a second, different record of the same round is an error (never
        overwritten); the same record again is a no-op (a restored node re-journals its checkpoint's rounds)."""
        text = json.dumps(record, sort_keys=True)
        with self._lock:
            try:
                self._db.execute(
                    "INSERT INTO records(run_id, round, record) VALUES (?,?,?)",
                    (run_id, int(record["round"]), text),
                )
            except sqlite3.IntegrityError:
                row = self._db.execute(
                    "SELECT record FROM records WHERE run_id = ? AND round = ?",
                    (run_id, int(record["round"])),
                ).fetchone()
                if row is not None and row[0] == text:
                    return
                raise ValueError(
                    f"round {record['round']} of run {run_id} is already recorded"
                ) from None

    def records(self, run_id: str) -> list[dict[str, Any]]:
        """The run's records, by round."""
        with self._lock:
            rows = self._db.execute(
                "SELECT record FROM records WHERE run_id = ? ORDER BY round", (run_id,)
            ).fetchall()
        return [json.loads(r) for (r,) in rows]

    def run(self, run_id: str) -> tuple[RunSpec, int, list[str]] | None:
        """``(spec, vertex, ids)`` of a registered run, or None."""
        with self._lock:
            row = self._db.execute(
                "SELECT spec, vertex, ids FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
        if row is None:
            return None
        return spec_from_dict(json.loads(row[0])), int(row[1]), list(json.loads(row[2]))

    def journal(self, run_id: str) -> Callable[[EngineEntry], None]:
        """The node driver's journal hook: persists ``schedule`` entries, ignores the others (the privacy
        ledger already persists data entries)."""
        from hushnet.families.gossip.node import schedule_records

        def write(ev: EngineEntry) -> None:
            for rec in schedule_records([ev]):
                self.append(run_id, rec)

        return write

    def close(self) -> None:
        with self._lock:
            self._db.close()


_STORES: dict[str, ScheduleStore] = {}
_STORES_LOCK = threading.Lock()


def store_for(state_dir: str | pathlib.Path) -> ScheduleStore:
    """The (process-wide, one per state directory) store of a node."""
    key = str(pathlib.Path(state_dir).resolve() / STORE_FILE)
    with _STORES_LOCK:
        st = _STORES.get(key)
        if st is None:
            st = _STORES[key] = ScheduleStore(key)
        return st


__all__ = ["STORE_FILE", "ScheduleStore", "store_for"]
