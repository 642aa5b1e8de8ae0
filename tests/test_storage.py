"""A node's SQLite stores keep a bounded page cache (hushnet.storage; issue 12: host memory at n = 2048).

SQLite's default cache is 2 000 KiB per connection, kept for the connection's life; a node holds five
store connections, so at n = 1024 the caches of a Muffliato-GD run's ledger and run store were several
MB of each hosted node's resident memory.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sqlite3

import numpy as np
import pytest

from hushnet.crypto.replay import PersistentReplayCache
from hushnet.families.gossip.store import ScheduleStore
from hushnet.net.store import NodeStore
from hushnet.privacy.ledger_store import LedgerStore
from hushnet.runs.run_store import RunStore
from hushnet.storage import CACHE_KIB, open_store


def _sqlite_memory_used():
    """``sqlite3_memory_used`` of the SQLite library this Python uses, or None if it cannot be read."""
    name = ctypes.util.find_library("sqlite3")
    if name is None:
        return None
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        return None
    lib.sqlite3_memory_used.restype = ctypes.c_int64
    lib.sqlite3_libversion.restype = ctypes.c_char_p
    if lib.sqlite3_libversion().decode() != sqlite3.sqlite_version:
        return None  # another copy than the one the sqlite3 module is linked with
    before = lib.sqlite3_memory_used()
    probe = sqlite3.connect(":memory:")
    probe.execute("CREATE TABLE t (x)")
    used = lib.sqlite3_memory_used() > before
    probe.close()
    return lib.sqlite3_memory_used if used else None


@pytest.fixture
def used():
    """SQLite's own heap counter.  Skipped only on a Python whose ``sqlite3`` module is linked statically
    (no shared library of the same version to ask); this machine's CI runs these tests."""
    fn = _sqlite_memory_used()
    if fn is None:
        pytest.skip("cannot read sqlite3_memory_used of the sqlite3 module's library")
    return fn


def test_every_node_store_opens_with_the_bounded_cache(tmp_path):
    stores = [
        NodeStore(tmp_path / "node.sqlite"),
        PersistentReplayCache(tmp_path / "replay.sqlite"),
        LedgerStore(tmp_path / "ledger.sqlite"),
        RunStore(tmp_path / "runs.sqlite"),
        ScheduleStore(tmp_path / "gossip.sqlite"),
    ]
    try:
        for st in stores:
            db = st._db  # noqa: SLF001 - the connection is what is checked
            assert db.execute("PRAGMA cache_size").fetchone()[0] == -CACHE_KIB, type(st).__name__
            assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal", type(st).__name__
    finally:
        for st in stores:
            st.close()


def test_open_store_keeps_page_size_and_sync(tmp_path):
    db = open_store(tmp_path / "x.sqlite", synchronous="full", page_size=16384)
    try:
        assert db.execute("PRAGMA page_size").fetchone()[0] == 16384
        assert db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert db.in_transaction is False and db.isolation_level is None
    finally:
        db.close()


def test_run_store_memory_stays_bounded_as_the_file_grows(tmp_path, used):
    """Writing 8 MB of checkpoint buffers leaves SQLite holding well under its default 2 MB cache
    (0.5 MB here; with SQLite's default cache 2.1 MB)."""
    st = RunStore(tmp_path / "runs.sqlite")
    try:
        base = used()
        rng = np.random.default_rng(0)
        for k in range(16):  # 16 runs × 512 kB buffers: the file outgrows any 2 MB cache
            rid = f"run-{k}"
            st.accept(rid, b"signed", 0, {})
            st.checkpoint(rid, "running", "", {"x": rng.random(65536)}, None)
        assert len(st.runs()) == 16  # read back: every page passes through the cache
        held = used() - base
    finally:
        st.close()
    # the cache (256 KiB), the last statement's bound buffer (512 kB) and the schema: well under 1.5 MB
    assert held < 1.5 * 2**20, f"SQLite holds {held / 2**20:.2f} MB after writing 8 MB"


def test_ledger_keeps_no_copy_of_the_last_block_it_wrote(tmp_path, used):
    """A ledger block larger than BIND_MAX (n = 2048: 2.6 MB) is written in place, so no copy of it stays
    with the prepared INSERT for the node's life (+0.18 MB of SQLite heap; before: +2.17 MB); it
    reads back bit for bit."""
    from hushnet.privacy.ledger import Ledger
    from hushnet.privacy.ledger_math import PrivacyEntry

    led = Ledger(tmp_path / "ledger.sqlite", node_id="n0")
    targets = [f"n{i}" for i in range(1, 1648)]  # 1647 × 159 orders × 8 B: 2.1 MB
    rows = np.random.default_rng(1).random((len(targets), led.orders.size)) * 1e-3
    small = PrivacyEntry.from_row("r0", "p", "sender-known", "certified", targets[:3], rows[:3])
    led.charge(small, report=False)  # the statements are prepared, the file exists
    base = used()
    led.charge(
        PrivacyEntry.from_row("r1", "p", "sender-known", "certified", targets, rows), report=False
    )
    held = used() - base
    led.close()
    assert held < 0.75 * 2**20, f"SQLite holds {held / 2**20:.2f} MB after a 2.1 MB block"
    again = Ledger(tmp_path / "ledger.sqlite")
    got = again.entries("r1")
    again.close()
    assert np.stack([got[0]["rdp"][t] for t in targets]).tobytes() == rows.tobytes()


def test_run_store_keeps_no_copy_of_the_last_buffer_it_wrote(tmp_path, used):
    """A checkpoint buffer over BIND_MAX (a gossip run's row: 1.3 MB a node at n = 1024) is not kept by
    the prepared INSERT after the checkpoint (before: +2.0 MB of SQLite heap for a 2 MB buffer)."""
    st = RunStore(tmp_path / "runs.sqlite")
    try:
        st.accept("r", b"signed", 0, {})
        st.checkpoint("r", "running", "", {"x": np.zeros(8)}, None)  # statements prepared
        base = used()
        row = np.random.default_rng(2).random(262144)  # 2 MB
        st.checkpoint("r", "running", "", {"x": row}, None)
        held = used() - base
        got = st.runs()[0]["driver"]["x"]
    finally:
        st.close()
    assert held < 0.75 * 2**20, f"SQLite holds {held / 2**20:.2f} MB after a 2 MB checkpoint buffer"
    assert got.tobytes() == row.tobytes()


def test_a_sealed_row_is_copied_and_hashed_once_across_checkpoints(tmp_path, monkeypatch):
    """A gossip run's charged row is sealed (bytes-backed, read-only) and checkpointed after every step:
    the store takes its own bytes and recognises them by identity, so the row (1.3 MB a node at
    n = 1024, ~26 checkpoints a run) is written once per run and never hashed (a random key names it)."""
    import hashlib

    from hushnet.privacy.ledger_math import sealed
    from hushnet.runs import run_store

    hashed: list[int] = []
    real = hashlib.sha256

    def sha256(data=b""):
        hashed.append(len(data))
        return real(data)

    monkeypatch.setattr(run_store.hashlib, "sha256", sha256)
    row = sealed(np.random.default_rng(3).random((1023, 159)))
    st = RunStore(tmp_path / "runs.sqlite")
    try:
        st.accept("r", b"signed", 0, {})
        for step in range(5):
            st.checkpoint("r", "running", "", {"run_rdp": row, "step": step}, None)
        blobs = st._db.execute("SELECT COUNT(*), SUM(LENGTH(data)) FROM blobs").fetchone()
        got = st.runs()[0]["driver"]["run_rdp"]
    finally:
        st.close()
    # the caller's own bytes are named by a random key and known by identity: never hashed, written once
    assert hashed.count(row.nbytes) == 0
    assert blobs == (1, row.nbytes)
    assert got.tobytes() == row.tobytes()
