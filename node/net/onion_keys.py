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
import time

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
        replay = PersistentReplayCache(
            replay_path or pathlib.Path(state_dir) / "replay-onion-epochs.sqlite", keep=1 << 20
        )
        self.keyring = OnionKeyring(self.keys, replay)
        for f in sorted(self.dir.glob("epoch-*.key")):
            e = int(f.stem.split("-", 1)[1])
            self.keys.pairs[e] = KeyPair.from_private_bytes(f.read_bytes())

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
        replay = self.keyring.replay
        for e in replay.epochs:  # tags of an epoch whose key is gone protect nothing any more
            if e not in self.keys.pairs:
                replay.close_epoch(e)
                self.keys.deleted_through = max(self.keys.deleted_through, e)
        for e in self.keys.pairs:
            if e not in replay.epochs:
                replay.open_epoch(e)
        return self.published(now)

    def published(self, now: float | None = None) -> list[tuple[int, bytes]]:
        cur = self.current_epoch(now)
        return [(e, kp.public) for e, kp in sorted(self.keys.pairs.items()) if e >= cur - 1]

    def pair(self, epoch: int) -> KeyPair:
        return self.keys.get(epoch)

    def close(self) -> None:
        self.keyring.replay.close()
