"""Walk checkpoints through the run store (issue 14, durable hop rate): a hop writes its token once.

A durable hop's checkpoint used to hold the model three times (the held token, the pending handoff's
bytes, the resume copy), the pre-drawn noise buffer even when it held nothing, and every replay
digest of the run, all rewritten at every hop.  Now the held token is the pending payload, the copy
is the previous handoff's payload (already in the store, referred to again), the noise buffer is
kept only while it holds a draw, and replay digests are sealed chunks written once.  These tests
check that the slimmer checkpoint still continues the walk exactly: every node is rebuilt from the
store after every checkpoint it writes (as if killed and restarted there), and the run ends with
the same model, bit for bit, and the same ledger entries as the uninterrupted run.
"""

from __future__ import annotations

import sqlite3
from collections import deque

import numpy as np
import pytest

from hushnet.engine.actions import Finish, LedgerEntry, Send, SetTimer
from hushnet.engine.events import MessageArrived, RunStarted, TimerFired
from hushnet.families.walk.walker import _SEEN_CHUNK
from hushnet.families.walk.wire import KIND_TOKEN
from hushnet.protocols.registry import make_machine, transition_matrix
from hushnet.runs.run_store import BLOB_MIN, RunStore, pack, unpack
from hushnet.runs.service import network_walk_options
from hushnet.runs.spec import Budget, RunSpec
from hushnet.runs.synthetic import ZeroGradientTask

N, GRAPH, SIZE, STEPS = 4, "hypercube:2", 600, 2000
PREFETCH = "prefetch-noise"


def spec() -> RunSpec:
    return RunSpec(
        protocol="rw-dpsgd",
        task="hushnet.runs.synthetic:ZeroGradientTask",
        graph=GRAPH,
        steps=STEPS,
        seed=11,
        budget=Budget(1e9, 1e-5),
        sigma=1.0,
        step_size=0.01,
        task_params={"size": SIZE},
        on_peer_down="pause",
    ).with_run_id()


def machine(s: RunSpec, v: int):
    """Node ``v``'s machine as a networked node builds it (pre-drawn noise on)."""
    return make_machine(
        s.protocol,
        v,
        N,
        ZeroGradientTask(size=SIZE),
        run_seed=s.seed,
        run_id=s.run_id,
        params=s.machine_params(),
        W=transition_matrix(s.graph, s.weights),
        view_model=s.view_model,
        options=network_walk_options(s, progress_every=0),
    )


def walk(tmp_path, restart: bool) -> tuple[np.ndarray, list[int], list[RunStore], RunSpec]:
    """The whole walk in process.  With ``restart``, a node that checkpointed (a batch that sends or
    finishes, as the driver does) is replaced by a fresh machine restored from its store."""
    s = spec()
    ms = [machine(s, v) for v in range(N)]
    stores = [RunStore(tmp_path / f"n{v}-{restart}.sqlite") for v in range(N)]
    for v, st in enumerate(stores):
        st.accept(s.run_id, b"signed", v, {})
    charges = [0] * N
    final: list[np.ndarray] = []
    queue: deque[tuple[int, Send]] = deque()

    def run(v: int, acts: list) -> None:
        charges[v] += sum(isinstance(a, LedgerEntry) for a in acts)
        for a in acts:
            if isinstance(a, Finish):
                final.append(np.asarray(a.model))
        sends = [a for a in acts if isinstance(a, Send)]
        if sends or any(isinstance(a, Finish) for a in acts):
            stores[v].checkpoint(s.run_id, "running", "", {"v": v}, ms[v].checkpoint())
            if restart:
                fresh = machine(s, v)
                (row,) = stores[v].runs()
                again = fresh.restore(row["machine"])
                pending = ms[v]._pending
                if pending is None or ms[v].finished:
                    assert again == []
                else:  # a restarted holder re-sends exactly the unacknowledged token
                    assert again[0] == Send(pending[0], pending[1])
                ms[v] = fresh
        queue.extend((v, a) for a in sends)
        if any(isinstance(a, SetTimer) and a.name == PREFETCH for a in acts):
            run(v, ms[v].handle(TimerFired(PREFETCH)))

    run(0, ms[0].handle(RunStarted()))
    for v in range(1, N):
        run(v, ms[v].handle(RunStarted()))
    while queue:
        src, a = queue.popleft()
        run(a.dst, ms[a.dst].handle(MessageArrived(src, a.payload)))
    assert len(final) == 1
    return final[0], charges, stores, s


def test_restart_after_every_checkpoint_ends_bit_identical(tmp_path):
    ref, ref_charges, _, _ = walk(tmp_path, restart=False)
    got, got_charges, stores, s = walk(tmp_path, restart=True)
    assert np.array_equal(ref.view(np.uint64), got.view(np.uint64))
    assert got_charges == ref_charges and sum(got_charges) == STEPS
    # the walk was long enough that every node sealed replay-digest chunks
    for st in stores:
        (row,) = st.runs()
        assert len(row["machine"]["seen_log"][0]) >= 1
    assert _SEEN_CHUNK * 24 >= BLOB_MIN  # so a sealed chunk is a blob, written once


@pytest.mark.parametrize("log_bytes", [0, None], ids=["sqlite", "checkpoint-log"])
def test_a_hop_writes_its_token_once(tmp_path, log_bytes):
    """Each token is written once: the first checkpoint (a SQLite transaction either way), then a hop's
    checkpoint as a SQLite transaction (``log_bytes=0``) or as a record of the checkpoint log."""
    s = spec()
    ms = [machine(s, v) for v in range(N)]
    store = RunStore(tmp_path / "one.sqlite", log_bytes=log_bytes)
    log = tmp_path / "one.ckpt"
    store.accept(s.run_id, b"signed", 0, {})
    acts = ms[0].handle(RunStarted())
    tok = next(a for a in acts if isinstance(a, Send) and a.payload[0] == KIND_TOKEN)
    store.checkpoint(s.run_id, "running", "", {}, ms[0].checkpoint())
    db = sqlite3.connect(tmp_path / "one.sqlite")
    # one blob: the pending token (the held token is the same bytes, no noise is pre-drawn yet)
    assert db.execute("SELECT COUNT(*), SUM(LENGTH(data)) FROM blobs").fetchone() == (
        1,
        len(tok.payload),
    )
    # the receiver acknowledges; the node draws its next noise meanwhile and gets the token back
    ms[0].handle(TimerFired(PREFETCH))
    nxt = ms[tok.dst].handle(MessageArrived(0, tok.payload))
    ms[0].handle(MessageArrived(tok.dst, next(a for a in nxt if a.dst == 0).payload))
    back = [a for a in nxt if isinstance(a, Send) and a.payload[0] == KIND_TOKEN]
    while back[0].dst != 0:  # walk on until the token comes back to node 0
        b = back[0]
        out = ms[b.dst].handle(MessageArrived(_src(ms, b), b.payload))
        back = [a for a in out if isinstance(a, Send) and a.payload[0] == KIND_TOKEN]
    acts = ms[0].handle(MessageArrived(_src(ms, back[0]), back[0].payload))
    out = [a for a in acts if isinstance(a, Send) and a.payload[0] == KIND_TOKEN]
    ck = ms[0].checkpoint()
    assert ck["held"] == "pending" and ck["copy"] is None and ck["copy_payload"][1] is tok.payload
    assert (
        "eta" not in ck["extra"]
    )  # the draw was used by this visit; the next one is not drawn yet
    store.checkpoint(s.run_id, "running", "", {}, ck)
    rows = sorted(r[0] for r in db.execute("SELECT LENGTH(data) FROM blobs").fetchall())
    if log_bytes == 0:
        # the copy (the first handoff) is still there, once, and the new pending token: nothing else big
        assert rows == sorted([len(tok.payload), len(out[0].payload)])
        (machine_row,) = db.execute("SELECT LENGTH(machine) FROM checkpoints").fetchone()
        assert machine_row < BLOB_MIN
    else:  # SQLite untouched; the log holds one record with the new token and less than a blob else
        assert rows == [len(tok.payload)]
        assert len(out[0].payload) < log.stat().st_size < len(out[0].payload) + BLOB_MIN
    # a third checkpoint drops the blob nobody refers to any more
    before = log.stat().st_size if log.exists() else 0
    ms[0]._copy_payload = None
    ms[0]._copy = None
    store.checkpoint(s.run_id, "running", "", {}, ms[0].checkpoint())
    if log_bytes != 0:  # a record with no blob; the fold at close deletes the copy from SQLite
        assert log.stat().st_size - before < BLOB_MIN
        store.close()
        assert not log.exists()
    assert db.execute("SELECT COUNT(*), SUM(LENGTH(data)) FROM blobs").fetchone() == (
        1,
        len(out[0].payload),
    )
    (row,) = RunStore(tmp_path / "one.sqlite").runs()
    assert row["machine"]["pending"][1] == out[0].payload and row["machine"]["copy_payload"] is None
    db.close()


def _src(ms, send: Send) -> int:
    """Who sent a token (the one machine whose pending handoff it is)."""
    (v,) = [v for v, m in enumerate(ms) if m._pending is not None and m._pending[1] is send.payload]
    return v


def test_checkpoint_of_the_earlier_format_still_restores(tmp_path):
    """A node upgraded mid-run reads the checkpoint its previous version wrote (token copies inline,
    every digest in one dict, the noise buffer always)."""
    s = spec()
    a = machine(s, 0)
    acts = a.handle(RunStarted())
    tok = next(x for x in acts if isinstance(x, Send))
    a.handle(TimerFired(PREFETCH))
    new = a.checkpoint()
    old = {k: v for k, v in new.items() if k not in ("seen_log", "copy_payload")}
    old["seen"] = {}
    old["held"] = a._held
    old["copy"] = None
    old["extra"] = {"eta": a._eta.copy(), "eta_ready": a._eta_ready}
    b = machine(s, 0)
    again = b.restore(unpack(pack(old)))
    assert again[0] == Send(tok.dst, tok.payload)
    assert b._eta_ready and np.array_equal(b._eta, a._eta)
    assert b._held[0] == a._held[0] and np.array_equal(b._held[1], a._held[1])


def test_missing_blob_is_refused(tmp_path):
    big = np.arange(BLOB_MIN, dtype=np.float64)
    kept: dict[bytes, bytes] = {}

    def sink(buf: bytes, own: bool) -> bytes:
        kept[b"k"] = buf
        return b"k"

    blob = pack({"x": big}, sink)
    assert len(blob) < BLOB_MIN
    assert np.array_equal(unpack(blob, kept)["x"], big)
    with pytest.raises(ValueError, match="missing blob"):
        unpack(blob, {})


def test_new_store_files_take_large_pages_and_old_files_keep_theirs(tmp_path, monkeypatch):
    """A new store is created with :data:`PAGE_SIZE` pages (a token is fewer WAL frames to write and
    free per hop); a store file written with SQLite's 4 kB default keeps its pages and its runs when
    a newer node opens it again, and goes on checkpointing (nothing to migrate)."""
    from hushnet.runs import run_store

    token = np.arange(4 * BLOB_MIN, dtype=np.float64).tobytes()
    monkeypatch.setattr(run_store, "PAGE_SIZE", 4096)
    old = RunStore(tmp_path / "old.sqlite")
    old.accept("r", b"signed", 0, {})
    old.checkpoint("r", "running", "", {"n": 1}, {"pending": (1, token, 7, 0)})
    old._db.close()
    monkeypatch.undo()
    assert run_store.PAGE_SIZE == 16384
    new = RunStore(tmp_path / "new.sqlite")
    again = RunStore(tmp_path / "old.sqlite")
    assert new._db.execute("PRAGMA page_size").fetchone() == (run_store.PAGE_SIZE,)
    assert again._db.execute("PRAGMA page_size").fetchone() == (4096,)
    (row,) = again.runs()
    assert row["driver"] == {"n": 1} and row["machine"]["pending"] == (1, token, 7, 0)
    again.checkpoint("r", "running", "", {"n": 2}, {"pending": (1, token[::-1], 8, 0)})
    (row,) = again.runs()
    assert row["driver"] == {"n": 2} and row["machine"]["pending"][1] == token[::-1]
