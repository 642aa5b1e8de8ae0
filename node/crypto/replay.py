"""Replay caches, one set of tags per key epoch.

A relay (or a destination) refuses a packet whose tag it already saw *within the key epoch*; the
cache only has to span the epochs whose keys the node still holds, so it is bounded by key
rotation, and a packet for an epoch the node holds no key for is refused as unknown.
"""

from __future__ import annotations

from hushnet.crypto.errors import UnknownEpoch
from hushnet.engine.errors import ReplayedMessage


class ReplayCache:
    """``check_and_add(epoch, tag)``: refuse an unknown epoch or a tag seen before in that epoch."""

    def __init__(self, epochs: set[int] | None = None) -> None:
        self._seen: dict[int, dict[bytes, bytes]] = {e: {} for e in (epochs or {0})}

    @property
    def epochs(self) -> list[int]:
        return sorted(self._seen)

    def open_epoch(self, epoch: int, keep: int = 2) -> None:
        """Start ``epoch`` and forget all but the ``keep`` most recent epochs (their keys are deleted too)."""
        self._seen.setdefault(int(epoch), {})
        for e in sorted(self._seen)[:-keep]:
            del self._seen[e]

    def close_epoch(self, epoch: int) -> None:
        """Forget ``epoch`` (its key was deleted: nothing of it can be opened, so no replay can pass)."""
        self._seen.pop(int(epoch), None)

    def seen(self, epoch: int, tag: bytes) -> bytes | None:
        """The digest recorded with ``tag`` (None if new); :class:`UnknownEpoch` for an epoch not held."""
        if epoch not in self._seen:
            raise UnknownEpoch(
                f"no replay cache (and no key) for epoch {epoch}; held: {self.epochs}"
            )
        return self._seen[epoch].get(tag)

    def add(self, epoch: int, tag: bytes, digest: bytes = b"") -> None:
        if epoch not in self._seen:
            raise UnknownEpoch(f"no replay cache for epoch {epoch}")
        self._seen[epoch][tag] = digest

    def add_if_new(self, epoch: int, tag: bytes, digest: bytes = b"") -> bytes | None:
        """Record ``tag`` unless it is already there; returns the digest recorded before (None: new).
        One step on the hot path instead of :meth:`seen` then :meth:`add`."""
        prev = self.seen(epoch, tag)
        if prev is None:
            self.add(epoch, tag, digest)
        return prev

    def check_and_add(self, epoch: int, tag: bytes, digest: bytes = b"") -> None:
        if self.seen(epoch, tag) is not None:
            raise ReplayedMessage(f"packet tag already processed in key epoch {epoch}")
        self.add(epoch, tag, digest)

    def __len__(self) -> int:
        return sum(len(s) for s in self._seen.values())


class ReplayCacheFull(ReplayedMessage):
    """The epoch's tag set reached its bound: refuse rather than forget (forgetting would re-admit replays)."""

    code = "replay-cache-full"


class PersistentReplayCache(ReplayCache):
    """A node's replay cache in SQLite (its state directory): one per node, shared by all its runs,
    surviving restarts — replay protection lasts as long as the key epoch, not one run or one process.

    Bounded twice: only the ``keep`` most recent epochs are held (older ones are deleted with their
    keys when :meth:`open_epoch` rotates), and an epoch holds at most ``max_per_epoch`` tags — past that
    new packets of the epoch are refused (:class:`ReplayCacheFull`), which tells the operator to rotate
    the key; evicting old tags instead would silently re-admit their replays.  Writes go through WAL
    with ``synchronous=NORMAL``: committed at once (a process crash loses nothing), fsynced at
    checkpoints (not every packet)."""

    def __init__(
        self, path, epochs: set[int] | None = None, *, max_per_epoch: int = 1 << 22, keep: int = 2
    ) -> None:
        from hushnet.storage import open_store

        self.path, self.max_per_epoch, self.keep = path, int(max_per_epoch), int(keep)
        self._db = open_store(path)
        self._db.execute("CREATE TABLE IF NOT EXISTS epochs (epoch INTEGER PRIMARY KEY)")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS tags (epoch INTEGER NOT NULL, tag BLOB NOT NULL, digest BLOB NOT NULL, "
            "PRIMARY KEY (epoch, tag)) WITHOUT ROWID"
        )
        # tags per held epoch, kept in memory (one statement per packet on the hot path, not three)
        self._n: dict[int, int] = {
            e: int(
                self._db.execute("SELECT COUNT(*) FROM tags WHERE epoch = ?", (e,)).fetchone()[0]
            )
            for (e,) in self._db.execute("SELECT epoch FROM epochs").fetchall()
        }
        for e in sorted(epochs or set()):
            self.open_epoch(e, self.keep)

    @property
    def epochs(self) -> list[int]:
        return sorted(self._n)

    def open_epoch(self, epoch: int, keep: int | None = None) -> None:
        """Hold ``epoch`` (if not already) and delete all but the ``keep`` most recent epochs' tags.

        A secure-sum machine opens its epoch every round: when the epoch is already held and nothing is
        to be pruned the transaction would change nothing on disk, so it is skipped (``_n`` mirrors the
        ``epochs`` table: both change only together)."""
        keep = self.keep if keep is None else int(keep)
        if int(epoch) in self._n and len(self._n) <= keep:
            return
        with self._db:
            self._db.execute("BEGIN")
            self._db.execute("INSERT OR IGNORE INTO epochs (epoch) VALUES (?)", (int(epoch),))
            self._n.setdefault(int(epoch), 0)
            for e in self.epochs[:-keep]:
                self._db.execute("DELETE FROM tags WHERE epoch = ?", (e,))
                self._db.execute("DELETE FROM epochs WHERE epoch = ?", (e,))
                del self._n[e]

    def close_epoch(self, epoch: int) -> None:
        """Delete ``epoch``'s tags: called when the epoch's key is deleted (after it nothing of the epoch
        opens, so dropping its tags re-admits nothing)."""
        with self._db:
            self._db.execute("BEGIN")
            self._db.execute("DELETE FROM tags WHERE epoch = ?", (int(epoch),))
            self._db.execute("DELETE FROM epochs WHERE epoch = ?", (int(epoch),))
            self._n.pop(int(epoch), None)

    def _count(self, epoch: int) -> int:
        n = self._n.get(int(epoch))
        if n is None:
            raise UnknownEpoch(
                f"no replay cache (and no key) for epoch {epoch}; held: {self.epochs}"
            )
        return n

    def seen(self, epoch: int, tag: bytes) -> bytes | None:
        self._count(epoch)
        row = self._db.execute(
            "SELECT digest FROM tags WHERE epoch = ? AND tag = ?", (int(epoch), bytes(tag))
        ).fetchone()
        return None if row is None else bytes(row[0])

    def add(self, epoch: int, tag: bytes, digest: bytes = b"") -> None:
        if self._count(epoch) >= self.max_per_epoch:
            raise ReplayCacheFull(
                f"replay cache of key epoch {epoch} is full ({self.max_per_epoch} tags): rotate the key"
            )
        cur = self._db.execute(
            "INSERT OR IGNORE INTO tags (epoch, tag, digest) VALUES (?, ?, ?)",
            (int(epoch), bytes(tag), bytes(digest)),
        )  # autocommit: durable when it returns
        self._n[int(epoch)] += cur.rowcount

    def add_if_new(self, epoch: int, tag: bytes, digest: bytes = b"") -> bytes | None:
        """One statement per new packet (``INSERT OR IGNORE``; the digest is read back only for a replay),
        where ``seen`` + ``add`` took two: same durability, the row is committed when this returns."""
        if self._count(epoch) >= self.max_per_epoch:
            if (prev := self.seen(epoch, tag)) is not None:
                return prev
            raise ReplayCacheFull(
                f"replay cache of key epoch {epoch} is full ({self.max_per_epoch} tags): rotate the key"
            )
        cur = self._db.execute(
            "INSERT OR IGNORE INTO tags (epoch, tag, digest) VALUES (?, ?, ?)",
            (int(epoch), bytes(tag), bytes(digest)),
        )
        if cur.rowcount == 1:
            self._n[int(epoch)] += 1
            return None
        return self.seen(epoch, tag)

    def check_and_add(self, epoch: int, tag: bytes, digest: bytes = b"") -> None:
        """:meth:`ReplayCache.check_and_add` in one statement for a new tag (``INSERT OR IGNORE``, see
        :meth:`add_if_new`) instead of a ``SELECT`` and an ``INSERT``: same answer, same durability."""
        if self.add_if_new(epoch, tag, digest) is not None:
            raise ReplayedMessage(f"packet tag already processed in key epoch {epoch}")

    def __len__(self) -> int:
        return sum(self._n.values())

    def close(self) -> None:
        self._db.close()
