"""A node's stores keep no copy of what they wrote (issue 12: a walk at n = 2048 ran out of memory).

A host keeps a ledger and a run store open per node.  Each SQLite connection kept up to 2 MB of page
cache and, with its cached statements, the last value bound to each — after a walk's first visit, the
2.6 MB cost block (ledger) and rows blob (run store) a second time: 16.8 MB a node at n = 2048, ≈ 34 GB
for a 2 048-node walk (9.1 MB a node now: bounded cache, big values through blob I/O).  SQLite's own counter (``sqlite3_memory_used``, the library
this Python's ``sqlite3`` is linked to) says what the connections still hold after a big write.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import pathlib

import numpy as np
import pytest

from hushnet.privacy.conversions import DEFAULT_ORDERS
from hushnet.privacy.ledger import Ledger
from hushnet.privacy.ledger_math import PrivacyEntry
from hushnet.runs.run_store import RunStore

#: what a store connection may still hold after writing megabytes: its bounded page cache (256 KiB,
#: allocated in 16 kB pages for the run store) and schema; before, 4.3 MB (run store) and 4.6 MB (ledger)
HELD_MAX = 1_000_000


def _sqlite_memory_used():
    name = ctypes.util.find_library("sqlite3")
    if name is None:
        pytest.skip("no shared SQLite library to ask")
    lib = ctypes.CDLL(name)
    fn = getattr(lib, "sqlite3_memory_used", None)
    if fn is None:
        pytest.skip("SQLite library without sqlite3_memory_used")
    fn.restype = ctypes.c_int64
    return fn


def test_the_run_store_keeps_no_copy_of_a_checkpoints_blob(tmp_path: pathlib.Path) -> None:
    used = _sqlite_memory_used()
    store = RunStore(tmp_path / "runs.sqlite")
    store.accept("r1", b"signed", 0, {})
    before = used()
    rows = np.random.default_rng(0).random((2047, 159)).tobytes()  # a walk's rows at n = 2048
    store.checkpoint("r1", "running", "", {"rows": [rows]}, None)
    assert used() - before < HELD_MAX
    store.close()


def test_the_ledger_keeps_no_copy_of_a_charged_block(tmp_path: pathlib.Path) -> None:
    used = _sqlite_memory_used()
    ledger = Ledger(tmp_path / "ledger.sqlite", node_id="n0")
    orders = np.asarray(DEFAULT_ORDERS, dtype=float)
    targets = [f"n{i}" for i in range(1, 2048)]
    rdp = np.random.default_rng(1).random((len(targets), orders.size)) * 1e-3
    before = used()
    ledger.charge(
        PrivacyEntry.from_row("r1", "rw-dpsgd", "sender-known", "certified", targets, rdp)
    )
    assert used() - before < HELD_MAX
    ledger.close()
