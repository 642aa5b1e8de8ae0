"""The run store's checkpoint log: a hop's checkpoint as one appended record instead of a SQLite
transaction (issue 12).

Why: a walk writes a checkpoint at every hop, before the token leaves (the crash rule of
:mod:`hushnet.runs.run_store`).  As a SQLite transaction that checkpoint wrote the new token's overflow
pages into the WAL, freed the old token's pages and rewrote the checkpoint row: 0.45 ms of a 2 ms hop at
10⁴ floats, 0.25 ms in a 410-node host, and the single largest piece of the hop after the transport.
Appended to a file it is one ``writev`` of the same bytes.

The log is durable the way the store's ``synchronous=NORMAL`` commits are: a record is in the page
cache when :func:`append` returns, so it survives the process being killed; a power loss may lose the
last records (``HUSHNET_RUNS_SYNC=full`` syncs each one).  What a power loss cannot do is make the store
load something inconsistent:

* every record carries a CRC-32 of all of its bytes and the store's **epoch**; :func:`read` takes the
  longest prefix of valid records of the current epoch and stops at the first torn, missing or stale
  one (the OS may have written the file's later pages and not its earlier ones);
* a record names every blob its checkpoint refers to; one whose blobs are neither in the log's prefix
  nor in the SQLite base ends the prefix too;
* the store folds the log into SQLite (**compaction**) in a transaction committed with a sync, and bumps
  the epoch in that same transaction, before it truncates the log: records left behind by a truncation
  that never reached the disk have the old epoch and are ignored.

Record layout (little endian): ``HNJ1``, CRC-32 of the rest, epoch (u64), sequence number (u64), body
length (u64); body: lengths of run id, state, reason (u32 each), of the driver and machine parts (u64;
2⁶⁴ − 1: no machine), number of referred and of new blobs (u32 each); then run id, state, reason,
driver, machine, the referred keys (16 bytes each) and every new blob as key, length (u64) and bytes.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass, field
from typing import Sequence

MAGIC = b"HNJ1"
#: magic, CRC-32 of everything after it, epoch, sequence number, body length
HEAD = struct.Struct("<4sIQQQ")
_BODY = struct.Struct("<IIIQQII")
_BLOB = struct.Struct("<16sQ")
#: the length of a blob key (see :meth:`hushnet.runs.run_store.RunStore.checkpoint`)
KEY_LEN = 16
_NO_MACHINE = 2**64 - 1
#: the most :func:`read_file` asks one ``read`` for (Linux returns at most 2 GiB − 4 kB)
READ_PIECE = 1 << 30
#: buffers one ``writev`` may take (Linux: 1024)
_IOV_MAX = max(16, os.sysconf("SC_IOV_MAX")) if hasattr(os, "sysconf") else 1024


@dataclass
class PackedCheckpoint:
    """One run's checkpoint as the store writes it (packed driver and machine, the keys of the blobs it
    refers to); for the newest logged one of a run, what the store folds into SQLite.

    ``locs`` maps the key of each blob this checkpoint refers to that is in the log (not in SQLite) to
    its ``(offset, length)`` in the log file."""

    seq: int
    state: str
    reason: str
    driver: bytes
    machine: bytes | None
    keys: frozenset[bytes]
    locs: dict[bytes, tuple[int, int]] = field(default_factory=dict)


def record(
    epoch: int,
    seq: int,
    run_id: str,
    state: str,
    reason: str,
    driver: bytes,
    machine: bytes | None,
    keys: Sequence[bytes],
    new: Sequence[tuple[bytes, bytes]],
) -> tuple[list[bytes | memoryview], dict[bytes, tuple[int, int]]]:
    """One record as the buffers to write (no copy of the blobs) and where each new blob starts in it
    (``key → (offset from the record's start, length)``)."""
    rid, st, why = run_id.encode(), state.encode(), reason.encode()
    for k in keys:
        if len(k) != KEY_LEN:
            raise ValueError(f"a blob key is {KEY_LEN} bytes, got {len(k)}")
    mlen = _NO_MACHINE if machine is None else len(machine)
    body_head = _BODY.pack(len(rid), len(st), len(why), len(driver), mlen, len(keys), len(new))
    parts: list[bytes | memoryview] = [body_head, rid, st, why, driver]
    if machine is not None:
        parts.append(machine)
    parts.append(b"".join(keys))
    off = HEAD.size + sum(len(p) for p in parts)
    where: dict[bytes, tuple[int, int]] = {}
    for key, data in new:
        view = memoryview(data).cast("B")
        parts += [_BLOB.pack(key, view.nbytes), view]
        where[key] = (off + _BLOB.size, view.nbytes)
        off += _BLOB.size + view.nbytes
    body_len = off - HEAD.size
    tail = struct.pack("<QQQ", epoch, seq, body_len)
    crc = zlib.crc32(tail)
    for p in parts:
        crc = zlib.crc32(p, crc)
    return [MAGIC, struct.pack("<I", crc), tail, *parts], where


def append(fd: int, at: int, parts: list[bytes | memoryview], sync: bool) -> int:
    """Write one record's ``parts`` at the log's end ``at`` (the file is opened ``O_APPEND``); its size.

    Written with ``writev`` in batches of at most ``IOV_MAX`` buffers (a record with many new blobs has
    more), short writes continued where they stopped.  A write that fails (a full disk) is cut off
    again, so the log still ends with a whole record and the next append is not hidden behind a torn
    one; if even that fails, its error is raised (the caller then folds the log before appending)."""
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    size = sum(v.nbytes for v in views)
    try:
        i = 0
        while i < len(views):
            n = os.writev(fd, views[i : i + _IOV_MAX])
            if n <= 0:
                raise OSError(f"the checkpoint log took no more of a record's {size} bytes")
            while n and i < len(views):  # skip what was written; a buffer written in part goes on
                if n >= views[i].nbytes:
                    n -= views[i].nbytes
                    i += 1
                else:
                    views[i], n = views[i][n:], 0
        if sync:
            os.fdatasync(fd)
    except BaseException:
        os.ftruncate(fd, at)
        raise
    return size


def read_file(fd: int, size: int) -> memoryview:
    """The first ``size`` bytes of the log (read in pieces: one ``read`` returns at most ~2 GiB)."""
    buf = bytearray(size)
    view, off = memoryview(buf), 0
    while off < size:
        n = os.preadv(fd, [view[off : off + min(size - off, READ_PIECE)]], off)
        if n <= 0:
            break
        off += n
    return view[:off]


def read(
    data: bytes | memoryview,
    epoch: int,
    base_keys: dict[str, set[bytes]],
    base_seq: dict[str, int],
) -> tuple[dict[str, PackedCheckpoint], int, int]:
    """The newest checkpoint of each run in the log's valid prefix that is newer than the run's
    checkpoint in SQLite (``run_id → entry``), the prefix's length, and the highest sequence number in it.

    The prefix ends at the first record that is torn (short, bad magic, bad CRC), of another epoch, or
    refers to a blob that is neither in the prefix before it nor in ``base_keys`` (the run's blobs in
    SQLite).  A record no newer than ``base_seq`` (the sequence number of the run's checkpoint in SQLite,
    which a state change wrote after it) is passed over: what it refers to may be gone from SQLite."""
    mv = memoryview(data).cast("B")
    out: dict[str, PackedCheckpoint] = {}
    locs: dict[str, dict[bytes, tuple[int, int]]] = {}
    pos, top = 0, 0
    while pos + HEAD.size <= len(mv):
        magic, crc, ep, seq, body_len = HEAD.unpack_from(mv, pos)
        end = pos + HEAD.size + body_len
        if magic != MAGIC or ep != epoch or end > len(mv) or body_len < _BODY.size:
            break
        if zlib.crc32(mv[pos + 8 : end]) != crc:
            break
        try:
            entry, run_id, new = _parse(mv, pos + HEAD.size, end, seq)
        except (ValueError, UnicodeDecodeError, struct.error):
            break
        have = locs.setdefault(run_id, {})
        have.update(new)
        top = max(top, seq)
        if seq <= base_seq.get(run_id, -1):
            pos = end
            continue
        if any(k not in have and k not in base_keys.get(run_id, ()) for k in entry.keys):
            break
        entry.locs = {k: have[k] for k in entry.keys if k in have}
        locs[run_id] = dict(entry.locs)
        out[run_id] = entry
        pos = end
    return out, pos, top


def _parse(
    mv: memoryview, start: int, end: int, seq: int
) -> tuple[PackedCheckpoint, str, dict[bytes, tuple[int, int]]]:
    """One record's body (``mv[start:end]``): its entry, run id and the file offsets of its new blobs."""
    lr, ls, lw, ld, lm, nk, nb = _BODY.unpack_from(mv, start)
    p = start + _BODY.size

    def take(n: int) -> memoryview:
        nonlocal p
        if p + n > end:
            raise ValueError("record shorter than its lengths")
        v = mv[p : p + n]
        p += n
        return v

    run_id = bytes(take(lr)).decode()
    state = bytes(take(ls)).decode()
    reason = bytes(take(lw)).decode()
    driver = bytes(take(ld))
    machine = None if lm == _NO_MACHINE else bytes(take(lm))
    raw = bytes(take(nk * KEY_LEN))
    keys = frozenset(raw[i : i + KEY_LEN] for i in range(0, len(raw), KEY_LEN))
    new: dict[bytes, tuple[int, int]] = {}
    for _ in range(nb):
        key, n = _BLOB.unpack(take(_BLOB.size))
        new[key] = (p, n)
        take(n)
    if p != end:
        raise ValueError("record longer than its lengths")
    return PackedCheckpoint(seq, state, reason, driver, machine, keys), run_id, new


__all__ = ["HEAD", "KEY_LEN", "MAGIC", "PackedCheckpoint", "append", "read", "read_file", "record"]
