"""X25519 key pairs and the public-key directory a node reads from the bootstrap membership.

A node has separate long-term X25519 keys per purpose (onion relaying, destination sealing,
secure-summation share transport): key separation lets them rotate independently.  The directory
maps node id -> 32-byte public key for one key epoch.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from hushnet.crypto.errors import CryptoError, UnknownEpoch

KEY_LEN = 32


def public_bytes(pub: X25519PublicKey) -> bytes:
    return pub.public_bytes(Encoding.Raw, PublicFormat.Raw)


def exchange(private: X25519PrivateKey, peer_public: bytes) -> bytes:
    """X25519(private, peer); a low-order peer key (all-zero shared secret) is refused."""
    if len(peer_public) != KEY_LEN:
        raise CryptoError(f"X25519 public key must be {KEY_LEN} bytes, got {len(peer_public)}")
    try:
        return private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError as exc:  # cryptography refuses the all-zero result of a low-order point
        raise CryptoError(f"X25519 exchange refused: {exc}") from exc


_STATIC_CACHE_MAX = (
    1 << 16
)  # peers whose static secret a key pair remembers (a directory's size, with room)


@dataclass(frozen=True, eq=False)
class KeyPair:
    """An X25519 key pair; ``public`` is the raw 32-byte encoding published in the directory."""

    private: X25519PrivateKey
    public: bytes
    # static-static secrets by peer public key (see static_secret); never compared nor printed
    _static: dict[bytes, bytes] = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def generate(cls) -> "KeyPair":
        sk = X25519PrivateKey.generate()
        return cls(sk, public_bytes(sk.public_key()))

    @classmethod
    def from_private_bytes(cls, raw: bytes) -> "KeyPair":
        sk = X25519PrivateKey.from_private_bytes(raw)
        return cls(sk, public_bytes(sk.public_key()))

    def private_bytes(self) -> bytes:
        return self.private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())

    def exchange(self, peer_public: bytes) -> bytes:
        return exchange(self.private, peer_public)

    def static_secret(self, peer_public: bytes) -> bytes:
        """``X25519(own long-term key, peer's long-term key)``, computed once per peer and then cached.

        The static-static secret never changes while both keys live, so recomputing it every round (a
        secure-summation member needs it for each pairwise seed and each share envelope) is wasted
        work; callers make per-use keys from it with HKDF bound to their context.  Caching it in the
        key object adds no exposure: whoever can read the cache can read the private key beside it,
        and it goes with the object when the key is rotated.  Refusals (bad length, low-order peer
        key) are raised every time, never cached."""
        s = self._static.get(peer_public)
        if s is None:
            s = exchange(self.private, peer_public)
            if len(self._static) >= _STATIC_CACHE_MAX:
                self._static.clear()
            self._static[bytes(peer_public)] = s
        return s


@dataclass(frozen=True)
class KeyDirectory:
    """Public keys of one purpose for one epoch: ``keys[node] = 32-byte X25519 public key``."""

    epoch: int
    keys: dict[int, bytes] = field(default_factory=dict)

    def public(self, node: int) -> bytes:
        try:
            return self.keys[int(node)]
        except KeyError:
            raise CryptoError(
                f"node {node} has no key in the directory of epoch {self.epoch}"
            ) from None

    def digest(self) -> bytes:
        """SHA-256 over the canonical encoding (epoch, then sorted (node, key)); neighbours compare it."""
        h = hashlib.sha256(b"hushnet-keydir-v1" + self.epoch.to_bytes(8, "big"))
        for node in sorted(self.keys):
            h.update(node.to_bytes(4, "big") + self.keys[node])
        return h.digest()


@dataclass
class EpochKeys:
    """A node's private keys by epoch (current and the previous one, kept for packets in flight)."""

    pairs: dict[int, KeyPair] = field(default_factory=dict)

    def get(self, epoch: int) -> KeyPair:
        try:
            return self.pairs[epoch]
        except KeyError:
            raise UnknownEpoch(f"no key for epoch {epoch} (held: {sorted(self.pairs)})") from None


def simulation_keypairs(seed: int, n: int, purpose: str) -> list[KeyPair]:
    """Reproducible key pairs for the in-process simulator ONLY.

    The keys are a function of a seed, so anyone who knows it can decrypt everything: a deployed
    node generates its keys with :meth:`KeyPair.generate` and publishes only the public halves.
    """
    out = []
    for v in range(n):
        raw = hashlib.sha256(f"hushnet-sim-key|{purpose}|{seed}|{v}".encode()).digest()
        out.append(KeyPair.from_private_bytes(raw))
    return out


def simulation_directory(pairs: list[KeyPair], epoch: int = 0) -> KeyDirectory:
    return KeyDirectory(epoch, {v: kp.public for v, kp in enumerate(pairs)})


def machine_keypair(
    params: dict, purpose: str, seed: int, n: int, node: int
) -> tuple[KeyPair, KeyDirectory]:
    """The key pair and directory a machine uses for ``purpose`` (``"onion"``, ``"dest"``, ``"share"``).

    A deployed node passes its own key and the directory in ``params`` (``<purpose>_key``,
    ``<purpose>_directory``; both are popped).  Without them the keys are the *simulation* keys of
    the run seed — reproducible, and therefore only for the in-process simulator.
    """
    k, d = params.pop(f"{purpose}_key", None), params.pop(f"{purpose}_directory", None)
    if k is None or d is None:
        pairs = simulation_keypairs(seed, n, purpose)
        epoch = int(params.get("epoch", params.get("onion_epoch", 0)))
        return pairs[node], simulation_directory(pairs, epoch)
    return k, d
