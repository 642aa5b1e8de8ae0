"""Per-epoch onion keys of a node: generated in its state directory, rotated, deleted after a grace.

Why: one long-lived onion key makes every recorded packet openable forever by whoever later gets the
key, and makes the replay cache grow forever.  With epochs, a layer sealed in epoch ``e`` can only be
opened while the node still holds ``e``'s private key, which it deletes once the epoch's grace has
passed (forward secrecy for the onion layers), and the replay tags of ``e`` are pruned with it (the
packets they protect can no longer be opened at all, so forgetting them re-admits nothing).

Epochs are **time based and network wide**: ``epoch(t) = ⌊t / period⌋`` with the period published by
the bootstrap (``Directory.onion_epoch_seconds``), so all nodes number epochs alike without
coordinating.  A node holds keys for the current epoch and the *next* one (pre-published so that a run
accepted right after a boundary finds every member's key in the directory), and keeps the previous
epoch's key for ``grace`` seconds after its end (packets in flight, runs accepted in it; clock skew
between hosts must stay below the grace).  The key of epoch ``e`` is thus deleted at
``(e + 1)·period + grace``.  Keys live as ``onion-keys/epoch-<e>.key`` (0600).
"""

from __future__ import annotations

import hashlib
import math
import pathlib
import sqlite3
import threading
import time
from typing import Callable

from hushnet.crypto.errors import UnknownEpoch
from hushnet.crypto.keys import EpochKeys, KeyPair
from hushnet.crypto.onion import OnionKeyring
from hushnet.crypto.replay import PersistentReplayCache


def keys_digest(keys: list[tuple[int, bytes]]) -> str:
    """Hex SHA-256 of ``(epoch, public key)`` pairs in epoch order: what a publication's signature binds."""
    h = hashlib.sha256(b"hushnet-onion-keys-v1")
    for e, pk in sorted((int(e), bytes(pk)) for e, pk in keys):
        h.update(e.to_bytes(8, "big") + pk)
    return h.hexdigest()


def epoch_at(t: float, period: float) -> int:
    """The network's onion-key epoch at unix time ``t``."""
    return int(math.floor(t / period))


class RetiringEpochKeys(EpochKeys):
    """:class:`EpochKeys` that says *why* an epoch is missing: deleted after its grace, or never held."""

    def __init__(self) -> None:
        super().__init__({})
        self.deleted_through = -1  # every epoch ≤ this one had its key deleted (forward secrecy)

    def get(self, epoch: int) -> KeyPair:
        try:
            return self.pairs[epoch]
        except KeyError:
            if epoch <= self.deleted_through:
                raise UnknownEpoch(
                    f"onion key of epoch {epoch} was deleted after its grace period (forward secrecy): "
                    f"the packet is too old; held epochs {sorted(self.pairs)}"
                ) from None
            raise UnknownEpoch(
                f"no onion key for epoch {epoch} (held: {sorted(self.pairs)})"
            ) from None


class OnionKeyStore:
    """A node's onion keys by epoch, its onion replay cache, and the rotation schedule.

    ``keyring`` is shared by all of the node's onion runs and changes in place on rotation, so a
    relay opens any epoch it still holds whatever run the packet belongs to."""

    def __init__(
        self,
        state_dir: pathlib.Path,
        period: float,
        grace: float | None = None,
        *,
        replay_path: pathlib.Path | None = None,
    ) -> None:
        if not (period > 0 and math.isfinite(period)):
            raise ValueError(
                f"onion-key period must be a positive number of seconds, got {period!r}"
            )
        grace = period if grace is None else float(grace)
        if not 0 <= grace <= period:
            raise ValueError(f"onion-key grace must be in [0, period={period:g}] s, got {grace!r}")
        self.period, self.grace = float(period), grace
        self.dir = pathlib.Path(state_dir) / "onion-keys"
        self.dir.mkdir(mode=0o700, exist_ok=True)
        self.keys = RetiringEpochKeys()
        self.replay = LazyReplayCache(
            replay_path or pathlib.Path(state_dir) / "replay-onion-epochs.sqlite", self._sync_replay
        )
        self.keyring = OnionKeyring(self.keys, self.replay)  # type: ignore[arg-type]
        for f in sorted(self.dir.glob("epoch-*.key")):
            e = int(f.stem.split("-", 1)[1])
            self.keys.pairs[e] = KeyPair.from_private_bytes(f.read_bytes())
        if self.replay.path.exists():
            # tags a previous run of this node recorded: opened now, so that tags of epochs whose key was
            # deleted while the node was down are pruned at once (at the first maintain), as before
            self.replay.cache()

    def current_epoch(self, now: float | None = None) -> int:
        return epoch_at(time.time() if now is None else now, self.period)

    def expires(self, epoch: int) -> float:
        """Unix time at which epoch ``epoch``'s private key is deleted."""
        return (epoch + 1) * self.period + self.grace

    def maintain(self, now: float | None = None) -> list[tuple[int, bytes]]:
        """Rotate: make the current and next epochs' keys, delete keys past their grace (and their replay
        tags).  Returns the public keys held for epochs ≥ current (what the directory must show)."""
        from hushnet.net import pki

        now = time.time() if now is None else now
        cur = self.current_epoch(now)
        for e in (cur, cur + 1):
            if e not in self.keys.pairs:
                kp = KeyPair.generate()
                pki.write_secret(self.dir / f"epoch-{e}.key", kp.private_bytes())
                self.keys.pairs[e] = kp
        for e in sorted(self.keys.pairs):
            if now >= self.expires(e):
                (self.dir / f"epoch-{e}.key").unlink(
                    missing_ok=True
                )  # the key file first: then nothing opens e
                del self.keys.pairs[e]
                self.keys.deleted_through = max(self.keys.deleted_through, e)
        if self.replay.opened:  # else it opens in step with the keys held then (_sync_replay)
            self._sync_replay(self.replay.cache())
        return self.published(now)

    def _sync_replay(self, replay: PersistentReplayCache) -> None:
        """Hold a replay tag set for every epoch whose key is held, and none for the others."""
        for e in list(replay.epochs):  # tags of an epoch whose key is gone protect nothing any more
            if e not in self.keys.pairs:
                replay.close_epoch(e)
                self.keys.deleted_through = max(self.keys.deleted_through, e)
        for e in list(self.keys.pairs):
            if e not in replay.epochs:
                replay.open_epoch(e)

    def published(self, now: float | None = None) -> list[tuple[int, bytes]]:
        cur = self.current_epoch(now)
        return [(e, kp.public) for e, kp in sorted(self.keys.pairs.items()) if e >= cur - 1]

    def pair(self, epoch: int) -> KeyPair:
        return self.keys.get(epoch)

    def close(self) -> None:
        self.replay.close()


class LazyReplayCache:
    """The node's onion replay cache (a :class:`PersistentReplayCache`), created by the first packet that
    needs it.

    Why: a node's start made the SQLite file (WAL mode, two epochs' rows) although no onion packet had
    arrived — ~2 ms of CPU a node in a host's worker threads, ~4 CPU-seconds of a 2048-node start-up
    (issue 12) — and a network that runs no onion protocol never needs it.  Nothing is lost by waiting:
    before the file exists no tag has been recorded, so there is nothing to refuse or to prune.  When it
    opens, ``sync`` gives it one tag set per epoch whose key is held at that moment (the keys rotate
    without it meanwhile).  An existing file (a restart) is opened at once by :class:`OnionKeyStore`.
    """

    def __init__(self, path: pathlib.Path, sync: Callable[[PersistentReplayCache], None]) -> None:
        self.path = pathlib.Path(path)
        self._sync = sync
        self._cache: PersistentReplayCache | None = None
        self._closed = False
        self._lock = threading.Lock()  # packets may be peeled in worker threads

    @property
    def opened(self) -> bool:
        return self._cache is not None

    def cache(self) -> PersistentReplayCache:
        """The SQLite cache, opened (and brought in line with the keys held) on first use."""
        cache = self._cache
        if cache is None:
            with self._lock:
                if self._closed:
                    raise sqlite3.ProgrammingError(f"onion replay cache {self.path} is closed")
                if self._cache is None:
                    new = PersistentReplayCache(self.path, keep=1 << 20)
                    try:
                        self._sync(new)
                    except BaseException:
                        new.close()
                        raise
                    self._cache = new
                cache = self._cache
        return cache

    # the ReplayCache interface, each on the opened cache
    @property
    def epochs(self) -> list[int]:
        return self.cache().epochs

    def open_epoch(self, epoch: int, keep: int | None = None) -> None:
        self.cache().open_epoch(epoch, keep)

    def close_epoch(self, epoch: int) -> None:
        self.cache().close_epoch(epoch)

    def seen(self, epoch: int, tag: bytes) -> bytes | None:
        return self.cache().seen(epoch, tag)

    def add(self, epoch: int, tag: bytes, digest: bytes = b"") -> None:
        self.cache().add(epoch, tag, digest)

    def add_if_new(self, epoch: int, tag: bytes, digest: bytes = b"") -> bytes | None:
        return self.cache().add_if_new(epoch, tag, digest)

    def check_and_add(self, epoch: int, tag: bytes, digest: bytes = b"") -> None:
        self.cache().check_and_add(epoch, tag, digest)

    def __len__(self) -> int:
        return len(self.cache())

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._cache is not None:
                self._cache.close()
                self._cache = None
