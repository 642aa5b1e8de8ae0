"""Pairwise masks for secure summation: fixed-point encoding mod 2^k and a ChaCha20 mask PRG.

Members agree pairwise on a seed ``s_uv`` (X25519 + HKDF), expand it with ChaCha20 into ``d``
integers mod ``2^k``, and add ``+PRG(s_uv)`` if ``u < v`` else ``−PRG(s_uv)`` to their encoded
input: the masks cancel in the sum, and each single masked input is uniform mod ``2^k``.

Fixed-point encoding error (documented bound, tested): each real entry is stored as
``round(x·2^f)``, so one member's encoding is off by at most ``2^-(f+1)`` per entry and the decoded
sum of ``n`` members by at most ``n·2^-(f+1)`` per entry (plus float64 rounding of the decoded
value, relative ``2^-53``).  The sum is exact mod ``2^k``; it decodes correctly iff every partial
sum stays in ``(−2^(k−1), 2^(k−1))/2^f``, i.e. if every member's entries satisfy
``|x| ≤ max_abs(n) = 2^(k−1−f)/n`` (refused otherwise).  Defaults ``k = 64``, ``f = 24``:
16 members → error ≤ 4.8e-7 per entry, range ±3.4e10.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from node.crypto.keys import KeyPair

_U64 = np.dtype("<u8")


@dataclass(frozen=True)
class FixedPoint:
    """Signed fixed point with ``frac_bits`` fractional bits, arithmetic mod ``2^bits`` (``bits ≤ 64``)."""

    frac_bits: int = 24
    bits: int = 64

    def __post_init__(self) -> None:
        if not 8 <= self.bits <= 64:
            raise ValueError("bits must be in 8..64")
        if not 0 <= self.frac_bits < self.bits - 1:
            raise ValueError("frac_bits must be in 0..bits-2")

    @property
    def modulus_mask(self) -> np.uint64:
        return np.uint64((1 << self.bits) - 1) if self.bits < 64 else np.uint64(0xFFFFFFFFFFFFFFFF)

    def max_abs(self, n_terms: int) -> float:
        """Largest |entry| for which a sum of ``n_terms`` encoded vectors decodes without wrap-around."""
        return float(2.0 ** (self.bits - 1 - self.frac_bits) / max(1, n_terms)) * (1 - 2.0**-40)

    def error_bound(self, n_terms: int) -> float:
        """Per-entry bound on |decoded sum − true sum| from rounding (float64 rounding of the result aside)."""
        return n_terms * 2.0 ** -(self.frac_bits + 1)

    def encode(self, x: np.ndarray, n_terms: int = 1) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if not np.all(np.isfinite(x)):
            raise ValueError("cannot encode NaN or infinity")
        lim = self.max_abs(n_terms)
        if x.size and float(np.max(np.abs(x))) > lim:
            raise ValueError(f"entries exceed the fixed-point range ±{lim:.3g} for a sum of {n_terms} terms")
        v = np.rint(x * 2.0**self.frac_bits).astype(np.int64).view(np.uint64)
        return v & self.modulus_mask if self.bits < 64 else v

    def decode(self, v: np.ndarray) -> np.ndarray:
        v = np.asarray(v, dtype=np.uint64)
        if self.bits < 64:
            v = v & self.modulus_mask
            half = np.uint64(1 << (self.bits - 1))
            signed = v.astype(np.int64) - np.where(v >= half, np.int64(1 << self.bits), np.int64(0))
        else:
            signed = v.view(np.int64)
        return signed.astype(np.float64) / 2.0**self.frac_bits

    def reduce(self, v: np.ndarray) -> np.ndarray:
        return v & self.modulus_mask if self.bits < 64 else v


def mask_stream(seed: bytes, n: int, label: bytes = b"") -> np.ndarray:
    """``n`` uniform 64-bit integers from ChaCha20 keyed by the 32-byte ``seed`` (nonce from ``label``)."""
    if len(seed) != 32:
        raise ValueError("mask seeds are 32 bytes")
    nonce = hashlib.sha256(b"hushnet-mask|" + label).digest()[:16]
    ks = Cipher(algorithms.ChaCha20(seed, nonce), mode=None).encryptor().update(bytes(8 * n))
    return np.frombuffer(ks, dtype=_U64)


def pairwise_seed(mine: KeyPair, peer_public: bytes, u: int, v: int, context: bytes) -> bytes:
    """The seed ``s_uv = s_vu`` both members derive from their X25519 agreement (bound to the round)."""
    lo, hi = (u, v) if u < v else (v, u)
    info = b"hushnet-secagg-pair|" + context + lo.to_bytes(4, "big") + hi.to_bytes(4, "big")
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(mine.exchange(peer_public))
