"""A checkpoint leaves the run's row alone when its state does not change (issue 12).

The ``runs`` row holds the signed spec and the acceptance record — at n = 2048 the projected row of 2 047
targets, ~60 kB of overflow pages — and every hop's checkpoint rewrote it only to restamp ``updated``.
Now the row is written when the state or reason changes, and the state on disk is always the last one
written, also after a checkpoint that failed."""

from __future__ import annotations

import os
import sqlite3

import pytest

from hushnet.runs.run_store import RunStore

ROW = {"node": "n5", "accept": True, "row": {f"n{i}": 0.0123456789 * i for i in range(2047)}}


def _row(path) -> tuple[str, str, float]:
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT state, reason, updated FROM runs WHERE run_id = 'r'").fetchone()
    finally:
        db.close()


def test_the_row_is_written_when_the_state_changes_only(tmp_path):
    path = str(tmp_path / "runs.sqlite")
    store = RunStore(path)
    store.accept("r", b"signed" * 500, 5, ROW)
    store.checkpoint("r", "running", "", {"step": 0}, {"token": os.urandom(64)})
    first = _row(path)
    assert first[:2] == ("running", "")
    wal = os.path.getsize(path + "-wal")
    for step in range(1, 40):
        store.checkpoint("r", "running", "", {"step": step}, {"token": os.urandom(64)})
    assert _row(path) == first  # not rewritten: same state, same stamp
    # 39 checkpoints of a small row: well under one 2047-target row's worth of pages each
    assert os.path.getsize(path + "-wal") - wal < 39 * 60_000
    store.checkpoint("r", "paused", "neighbour n3 unreachable", {"step": 40}, None)
    assert _row(path)[:2] == ("paused", "neighbour n3 unreachable") and _row(path)[2] >= first[2]
    store.set_state("r", "finished")
    store.checkpoint("r", "finished", "", {"step": 41}, None)
    store.close()
    (run,) = RunStore(path).runs()
    assert (run["state"], run["driver"], run["decision"]) == ("finished", {"step": 41}, ROW)


def test_a_failed_checkpoint_does_not_leave_the_row_behind(tmp_path):
    path = str(tmp_path / "runs.sqlite")
    store = RunStore(path)
    store.accept("r", b"signed", 5, ROW)
    store.checkpoint("r", "running", "", {"step": 0}, None)
    db = store._db  # noqa: SLF001 - the file's size limit stands in for a full disk
    db.execute(f"PRAGMA max_page_count = {db.execute('PRAGMA page_count').fetchone()[0]}")
    with pytest.raises(sqlite3.OperationalError, match="full"):
        store.checkpoint("r", "stopped", "disk", {"step": 1}, {"big": os.urandom(200_000)})
    assert _row(path)[:2] == ("running", "")
    db.execute("PRAGMA max_page_count = 1073741823")
    store.checkpoint("r", "stopped", "disk", {"step": 1}, None)
    assert _row(path)[:2] == ("stopped", "disk")
    store.close()
