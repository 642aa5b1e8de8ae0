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

    def seen(self, epoch: int, tag: bytes) -> bytes | None:
        """The digest recorded with ``tag`` (None if new); :class:`UnknownEpoch` for an epoch not held."""
        if epoch not in self._seen:
            raise UnknownEpoch(f"no replay cache (and no key) for epoch {epoch}; held: {self.epochs}")
        return self._seen[epoch].get(tag)

    def add(self, epoch: int, tag: bytes, digest: bytes = b"") -> None:
        if epoch not in self._seen:
            raise UnknownEpoch(f"no replay cache for epoch {epoch}")
        self._seen[epoch][tag] = digest

    def check_and_add(self, epoch: int, tag: bytes, digest: bytes = b"") -> None:
        if self.seen(epoch, tag) is not None:
            raise ReplayedMessage(f"packet tag already processed in key epoch {epoch}")
        self.add(epoch, tag, digest)

    def __len__(self) -> int:
        return sum(len(s) for s in self._seen.values())
