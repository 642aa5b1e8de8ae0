"""A run store on a full disk (issue 12): a 2048-node walk stopped with "cannot write the run's checkpoint
(cannot rollback - no transaction is active)" — SQLite had rolled the transaction back itself on
SQLITE_FULL and the store's own ROLLBACK raised over the error that said what went wrong.  The error is
SQLite's "full" now, and the store writes again once there is room."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from hushnet.runs.run_store import RunStore


def test_a_full_disk_says_so_and_the_store_recovers(tmp_path):
    store = RunStore(tmp_path / "runs.sqlite")
    store.accept("r1", b"signed", 3, {})
    db = store._db  # noqa: SLF001 - the file's size limit stands in for the disk
    db.execute(f"PRAGMA max_page_count = {db.execute('PRAGMA page_count').fetchone()[0]}")
    big = {"x": np.arange(200_000, dtype=np.float64)}
    with pytest.raises(sqlite3.OperationalError, match="full"):
        store.checkpoint("r1", "running", "", {"step": 1}, big)
    db.execute("PRAGMA max_page_count = 1073741823")
    store.checkpoint("r1", "running", "", {"step": 2}, big)
    (run,) = store.runs()
    assert run["driver"] == {"step": 2} and np.array_equal(run["machine"]["x"], big["x"])
    store.close()
