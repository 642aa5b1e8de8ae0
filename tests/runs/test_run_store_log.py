"""The run store's checkpoint log (issue 12): a checkpoint that keeps the run's state is one appended
record, not a SQLite transaction.  It must load back exactly what the SQLite-only store loads, after a
clean close, a killed process, a torn or holed log (a power loss), a truncation that never reached the
disk, and a full disk."""

from __future__ import annotations

import os
import pathlib
import resource
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from hushnet.runs.checkpoint_log import HEAD
from hushnet.runs.run_store import LOG_ENV, RunStore, log_limit


def _abandon(store: RunStore) -> None:
    """Leave the store as a killed process leaves it: files closed, nothing folded or flushed."""
    store._close_log()  # noqa: SLF001
    store._db.close()  # noqa: SLF001


def _machine(step: int, token: bytes, extra: np.ndarray | None = None) -> dict:
    return {"step": step, "pending": (1, token, step, 0), "extra": extra}


def _same(a: list[dict], b: list[dict]) -> None:
    """The same runs with the same states and checkpoints (in any order: ``runs`` orders by when a run's
    state was last written, and a reopened store writes it again at its first checkpoint)."""
    a, b = sorted(a, key=lambda r: r["run_id"]), sorted(b, key=lambda r: r["run_id"])
    assert [r["run_id"] for r in a] == [r["run_id"] for r in b]
    for x, y in zip(a, b):
        for k in ("state", "reason", "driver"):
            assert x[k] == y[k], k
        mx, my = x["machine"], y["machine"]
        assert (mx is None) == (my is None)
        if mx is not None:
            assert mx["step"] == my["step"] and mx["pending"] == my["pending"]
            assert (mx["extra"] is None) == (my["extra"] is None)
            if mx["extra"] is not None:
                assert mx["extra"].tobytes() == my["extra"].tobytes()


def _walk(store: RunStore, steps: range, size: int = 10_000) -> bytes:
    """Checkpoints of a walk-like run ``r``: a new token each step; the last token's bytes."""
    rng = np.random.default_rng(steps.start)
    tok = b""
    for step in steps:
        tok = rng.random(size).tobytes()
        store.checkpoint("r", "running", "", {"step": step}, _machine(step, tok))
    return tok


def _log(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "runs.ckpt"


def test_hops_go_to_the_log_and_load_back(tmp_path):
    st = RunStore(tmp_path / "runs.sqlite")
    st.accept("r", b"signed", 0, {})
    tok = _walk(st, range(10))
    # the first checkpoint (state accepted → running) was a transaction, the other nine are records
    assert _log(tmp_path).stat().st_size > 9 * len(tok)
    (row,) = st.runs()  # read while the newest checkpoint is only in the log
    assert row["state"] == "running" and row["driver"] == {"step": 9}
    assert row["machine"]["pending"][1] == tok
    st.close()
    assert not _log(tmp_path).exists()  # folded into SQLite at close
    (again,) = RunStore(tmp_path / "runs.sqlite", log_bytes=0).runs()
    _same([row], [again])


def test_a_killed_process_loses_no_checkpoint(tmp_path):
    """A real process appends checkpoints and is killed with SIGKILL: the reopened store has the last."""
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        import numpy as np
        from hushnet.runs.run_store import RunStore
        st = RunStore({str(tmp_path / "runs.sqlite")!r})
        st.accept("r", b"signed", 0, {{}})
        for step in range(50):
            tok = np.full(10_000, float(step)).tobytes()
            st.checkpoint("r", "running", "", {{"step": step}}, {{"pending": tok}})
        print("written", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL and "written" in p.stdout, p.stderr
    assert _log(tmp_path).stat().st_size > 0
    st = RunStore(tmp_path / "runs.sqlite")
    (row,) = st.runs()
    assert row["driver"] == {"step": 49}
    assert row["machine"]["pending"] == np.full(10_000, 49.0).tobytes()
    assert _log(tmp_path).stat().st_size == 0  # folded into SQLite when opened
    st.close()


def _records(log: pathlib.Path) -> list[tuple[int, int]]:
    """(offset, length) of each record in a log file."""
    data, out, pos = log.read_bytes(), [], 0
    while pos < len(data):
        *_, body = HEAD.unpack_from(data, pos)
        out.append((pos, HEAD.size + body))
        pos += HEAD.size + body
    return out


@pytest.mark.parametrize("damage", ["torn tail", "hole", "bad byte"])
def test_a_damaged_log_loads_its_valid_prefix(tmp_path, damage):
    """After a power loss the OS may have written any of the log's pages: the store loads the newest
    checkpoint whose record and every record before it are whole, never a damaged or later one."""
    st = RunStore(tmp_path / "runs.sqlite")
    st.accept("r", b"signed", 0, {})
    _walk(st, range(6))  # step 0 in SQLite, steps 1..5 in the log
    _abandon(st)
    log = _log(tmp_path)
    recs = _records(log)
    assert len(recs) == 5
    data = bytearray(log.read_bytes())
    if damage == "torn tail":  # the last record only partly written
        del data[recs[-1][0] + recs[-1][1] // 2 :]
        want = 4
    elif damage == "hole":  # the third record's page never written: zeros
        off, n = recs[2]
        data[off + 4096 : off + 8192] = bytes(4096)
        want = 2
    else:  # one flipped bit in the second record's token
        off, n = recs[1]
        data[off + n - 100] ^= 1
        want = 1
    log.write_bytes(bytes(data))
    st = RunStore(tmp_path / "runs.sqlite")
    (row,) = st.runs()
    assert row["driver"] == {"step": want}
    # what was folded is what a store without the log would have loaded after that step
    ref = RunStore(tmp_path / "ref.sqlite", log_bytes=0)
    ref.accept("r", b"signed", 0, {})
    _walk(ref, range(want + 1))
    _same(st.runs(), ref.runs())
    # and the store goes on from there
    _walk(st, range(want + 1, want + 4))
    _walk(ref, range(want + 1, want + 4))
    _same(st.runs(), ref.runs())
    st.close()
    ref.close()
    _same(RunStore(tmp_path / "runs.sqlite").runs(), RunStore(tmp_path / "ref.sqlite").runs())


def test_records_left_by_a_lost_truncation_are_ignored(tmp_path):
    """A fold empties the log after its synced commit; if the emptying never reached the disk, the old
    records are still there — of the previous epoch, so they are not loaded over the newer state."""
    st = RunStore(tmp_path / "runs.sqlite")
    st.accept("r", b"signed", 0, {})
    _walk(st, range(5))
    old = _log(tmp_path).read_bytes()
    st.set_state("r", "finished", "done")  # written to SQLite with the newest checkpoint (step 4)
    st.close()
    _log(tmp_path).write_bytes(old)  # as if the fold's truncation had been lost
    st = RunStore(tmp_path / "runs.sqlite")
    (row,) = st.runs()
    assert (row["state"], row["reason"], row["driver"]) == ("finished", "done", {"step": 4})
    st.close()


def test_a_state_change_is_never_undone_by_an_older_logged_checkpoint(tmp_path):
    st = RunStore(tmp_path / "runs.sqlite")
    st.accept("r", b"signed", 0, {})
    tok = _walk(st, range(4))
    st.set_state("r", "closed", "operator")
    _abandon(st)  # killed right after the state change
    st = RunStore(tmp_path / "runs.sqlite")
    (row,) = st.runs()
    assert (row["state"], row["reason"]) == ("closed", "operator")
    assert row["driver"] == {"step": 3} and row["machine"]["pending"][1] == tok
    st.close()


def test_the_log_is_folded_when_full_and_stays_bounded(tmp_path):
    """A log of 400 kB with 80 kB tokens: folded every few hops; the file never grows past its limit or
    four records, and every reopening (killed or closed) loads the newest checkpoint."""
    limit = 400_000
    st = RunStore(tmp_path / "runs.sqlite", log_bytes=limit)
    st.accept("r", b"signed", 0, {})
    sizes = []
    for i in range(40):
        tok = _walk(st, range(i, i + 1))
        sizes.append(_log(tmp_path).stat().st_size if i else 0)  # the first: a transaction
    assert max(sizes) <= limit and min(sizes[2:]) < 100_000  # it was emptied along the way
    _abandon(st)
    st = RunStore(tmp_path / "runs.sqlite", log_bytes=limit)
    (row,) = st.runs()
    assert row["driver"] == {"step": 39} and row["machine"]["pending"][1] == tok
    # one checkpoint larger than the limit: the log holds up to four of them before it is folded
    big = RunStore(tmp_path / "big.sqlite", log_bytes=1000)
    big.accept("r", b"signed", 0, {})
    for i in range(12):
        _walk(big, range(i, i + 1), size=20_000)
        log = tmp_path / "big.ckpt"
        assert (log.stat().st_size if log.exists() else 0) <= 4 * (20_000 * 8 + 4096)
    st.close()
    big.close()


class _FullDisk:
    """No file may grow past ``limit`` bytes while inside (RLIMIT_FSIZE: a write past it fails)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def __enter__(self) -> None:
        self.old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        self.soft, self.hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.limit, self.hard))

    def __exit__(self, *exc) -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.soft, self.hard))
        signal.signal(signal.SIGXFSZ, self.old)


def test_a_full_disk_loses_nothing_and_the_log_goes_on(tmp_path):
    """A record that does not fit (the file-size limit stands in for a full disk) fails with the OS's
    error and is cut off again: the log still ends with a whole record, and the next checkpoint, once
    there is room, is loaded after a kill."""
    st = RunStore(tmp_path / "runs.sqlite")
    st.accept("r", b"signed", 0, {})
    _walk(st, range(3))
    size = _log(tmp_path).stat().st_size
    with _FullDisk(size + 1000), pytest.raises(OSError):
        _walk(st, range(3, 4))
    assert _log(tmp_path).stat().st_size == size
    tok = _walk(st, range(4, 6))
    _abandon(st)
    st = RunStore(tmp_path / "runs.sqlite")
    (row,) = st.runs()
    assert row["driver"] == {"step": 5} and row["machine"]["pending"][1] == tok
    st.close()


def test_a_log_that_cannot_be_folded_on_opening_is_read_from(tmp_path, caplog):
    """Opened on a full disk (no SQLite write fits), the store still loads the logged checkpoints, says so
    once, keeps the log, and folds it at the next opening with room."""
    st = RunStore(tmp_path / "runs.sqlite")
    st.accept("r", b"signed", 0, {})
    tok = _walk(st, range(4))
    _abandon(st)
    with _FullDisk(65536):  # SQLite opens; a fold (80 kB) does not fit
        st = RunStore(tmp_path / "runs.sqlite")
        (row,) = st.runs()
    assert row["driver"] == {"step": 3} and row["machine"]["pending"][1] == tok
    (warning,) = [r for r in caplog.records if "cannot fold the checkpoint log" in r.getMessage()]
    assert "\n" not in warning.getMessage()
    _abandon(st)
    assert _log(tmp_path).stat().st_size > 0  # kept
    st = RunStore(tmp_path / "runs.sqlite")
    assert _log(tmp_path).stat().st_size == 0  # folded now
    (row,) = st.runs()
    assert row["driver"] == {"step": 3} and row["machine"]["pending"][1] == tok
    st.close()


@pytest.mark.parametrize("then", ["close", "kill"])
def test_a_state_change_that_fails_changes_nothing(tmp_path, then):
    """A ``set_state`` whose transaction fails (a full disk) leaves the run as it was: in the live store,
    after a close (whose fold once wrote the failed state) and after a kill."""
    path = tmp_path / "runs.sqlite"
    st = RunStore(path)
    st.accept("r", b"signed", 0, {})
    _walk(st, range(3), size=1000)
    with _FullDisk(os.path.getsize(str(path) + "-wal")), pytest.raises(Exception, match="disk"):
        st.set_state("r", "closed", "operator")
    (live,) = st.runs()
    assert live["state"] == "running"
    st.close() if then == "close" else _abandon(st)
    (row,) = RunStore(path).runs()
    assert (row["state"], row["driver"]) == ("running", {"step": 2})


def test_a_record_with_more_buffers_than_one_writev_takes(tmp_path):
    """600 new 4 kB buffers in one checkpoint: 1 208 pieces, more than Linux's IOV_MAX of 1 024."""
    rng = np.random.default_rng(0)
    rows = [[rng.random(512) for _ in range(600)] for _ in range(2)]
    loads = []
    for name, log_bytes in (("log", None), ("ref", 0)):
        st = RunStore(tmp_path / f"{name}.sqlite", log_bytes=log_bytes)
        st.accept("r", b"signed", 0, {})
        for step in range(2):
            st.checkpoint("r", "running", "", {"step": step}, {"rows": rows[step]})
        _abandon(st)
        (row,) = RunStore(tmp_path / f"{name}.sqlite").runs()
        loads.append(row)
    for row in loads:
        assert row["driver"] == {"step": 1}
        assert all(a.tobytes() == b.tobytes() for a, b in zip(row["machine"]["rows"], rows[1]))


@pytest.mark.parametrize("log_bytes", [None, 0], ids=["checkpoint-log", "sqlite"])
@pytest.mark.parametrize("then", ["close", "kill"])
def test_a_run_accepted_after_a_checkpoint_gets_the_next_checkpoints_state(
    tmp_path, log_bytes, then
):
    """``accept`` writes the row's state itself, so the store no longer knows the row as the earlier
    checkpoint left it: the next checkpoint's state is written, and every load says it."""
    st = RunStore(tmp_path / "runs.sqlite", log_bytes=log_bytes)
    st.checkpoint("r", "running", "", {"step": 0}, None)
    st.accept("r", b"signed", 0, {})
    st.checkpoint("r", "running", "", {"step": 1}, None)
    (live,) = st.runs()
    st.close() if then == "close" else _abandon(st)
    (again,) = RunStore(tmp_path / "runs.sqlite").runs()
    assert live["state"] == again["state"] == "running"
    assert again["driver"] == {"step": 1}


def test_a_log_is_read_back_in_pieces(tmp_path, monkeypatch):
    """Opening reads the log in pieces (one read returns at most ~2 GiB on Linux); tested with 1 kB."""
    from hushnet.runs import checkpoint_log

    st = RunStore(tmp_path / "runs.sqlite")
    st.accept("r", b"signed", 0, {})
    tok = _walk(st, range(6), size=1000)
    _abandon(st)
    monkeypatch.setattr(checkpoint_log, "READ_PIECE", 1000)
    (row,) = RunStore(tmp_path / "runs.sqlite").runs()
    assert row["driver"] == {"step": 5} and row["machine"]["pending"][1] == tok


def test_the_store_matches_the_sqlite_store_under_random_operations(tmp_path):
    """Lockstep: the same random checkpoints (own bytes, shared and new arrays, several runs), state
    changes, kills and closes, on a store with a tiny log (folded often) and one without a log: every
    load agrees."""
    rng = np.random.default_rng(12)
    a_path, b_path = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    a, b = RunStore(a_path, log_bytes=150_000), RunStore(b_path, log_bytes=0)
    runs = ["r0", "r1", "r2"]
    for s in (a, b):
        for r in runs:
            s.accept(r, b"signed", 0, {})
    toks = {r: rng.random(2000).tobytes() for r in runs}
    shared = rng.random(700)
    states = {r: ("running", "") for r in runs}
    for i in range(400):
        op = rng.random()
        r = runs[int(rng.integers(len(runs)))]
        if op < 0.75:
            if rng.random() < 0.7:
                toks[r] = rng.random(int(rng.integers(100, 4000))).tobytes()
            if rng.random() < 0.2:
                shared = rng.random(700)
            extra = shared if rng.random() < 0.5 else None
            if rng.random() < 0.05:
                states[r] = ("running", f"phase {i}")
            m = _machine(i, toks[r], extra)
            for s in (a, b):
                s.checkpoint(r, *states[r], {"i": i}, m)
        elif op < 0.82:
            states[r] = (str(rng.choice(["paused", "running", "finished"])), f"because {i}")
            for s in (a, b):
                s.set_state(r, *states[r])
        elif op < 0.9:
            _abandon(a)
            a = RunStore(a_path, log_bytes=150_000)
        elif op < 0.95:
            a.close()
            a = RunStore(a_path, log_bytes=150_000)
        else:
            _same(a.runs(), b.runs())
    _same(a.runs(), b.runs())
    a.close()
    b.close()
    _same(RunStore(a_path).runs(), RunStore(b_path).runs())


@pytest.mark.parametrize("raw", ["nan", "-1", "lots", "1e300"])
def test_an_absurd_log_size_is_refused_in_one_line(monkeypatch, raw):
    monkeypatch.setenv(LOG_ENV, raw)
    with pytest.raises(ValueError, match=LOG_ENV) as e:
        log_limit()
    assert "\n" not in str(e.value)


def test_the_log_size_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(LOG_ENV, "0")
    st = RunStore(tmp_path / "runs.sqlite")
    st.accept("r", b"signed", 0, {})
    _walk(st, range(5))
    assert not _log(tmp_path).exists()  # every checkpoint a transaction
    st.close()
    monkeypatch.setenv(LOG_ENV, "0.5")
    assert log_limit() == 2**19
    monkeypatch.delenv(LOG_ENV)
    assert log_limit() == 8 * 2**20
