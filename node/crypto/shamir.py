"""Shamir secret sharing of 32-byte secrets over the prime field GF(2^521 − 1).

No well-kept prime-field Shamir library is on PyPI (the maintained ones work byte-wise over
GF(256)), so this is a small implementation: a random polynomial of degree ``t − 1`` with the
secret as constant term, coefficients from the OS CSPRNG, Lagrange interpolation at 0.  Any ``t``
shares determine the secret; ``t − 1`` shares are independent of it.  2^521 − 1 is a Mersenne prime
larger than any 32-byte secret, so secrets embed without reduction.
"""
from __future__ import annotations

import secrets
import struct
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from node.crypto.errors import InconsistentShares

PRIME = (1 << 521) - 1
SECRET_LEN = 32
_Y_LEN = 66  # ceil(521 / 8)
SHARE_LEN = 4 + _Y_LEN
_X = struct.Struct(">I")


@dataclass(frozen=True)
class Share:
    x: int
    y: int

    def encode(self) -> bytes:
        return _X.pack(self.x) + self.y.to_bytes(_Y_LEN, "big")

    @classmethod
    def decode(cls, data: bytes) -> "Share":
        if len(data) != SHARE_LEN:
            raise InconsistentShares(f"share of {len(data)} bytes, expected {SHARE_LEN}")
        (x,) = _X.unpack_from(data)
        y = int.from_bytes(data[4:], "big")
        if not 0 < x < PRIME or y >= PRIME:
            raise InconsistentShares("share outside the field")
        return cls(x, y)


def split(secret: bytes, xs: Sequence[int], threshold: int) -> list[Share]:
    """Shares of ``secret`` at the distinct non-zero points ``xs``; any ``threshold`` of them recover it."""
    if len(secret) != SECRET_LEN:
        raise ValueError(f"secrets are {SECRET_LEN} bytes")
    if not 1 <= threshold <= len(xs):
        raise ValueError(f"threshold {threshold} outside 1..{len(xs)}")
    if len(set(xs)) != len(xs) or any(not 0 < x < PRIME for x in xs):
        raise ValueError("share points must be distinct and non-zero")
    coeffs = [int.from_bytes(secret, "big")] + [secrets.randbelow(PRIME) for _ in range(threshold - 1)]
    out = []
    for x in xs:
        y = 0
        for c in reversed(coeffs):  # Horner
            y = (y * x + c) % PRIME
        out.append(Share(int(x), y))
    return out


@lru_cache(maxsize=4096)
def _weights(xs: tuple[int, ...], at: int) -> tuple[int, ...]:
    """Lagrange basis values ``λ_i(at)`` for the points ``xs``.  They depend on the points only, and a
    secure-summation leader interpolates every secret of a round from the same holders' points, so
    caching them turns each further interpolation into ``len(xs)`` multiplications (no inversions)."""
    out = []
    for i, xi in enumerate(xs):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if i != j:
                num = num * (at - xj) % PRIME
                den = den * (xi - xj) % PRIME
        out.append(num * pow(den, -1, PRIME) % PRIME)
    return tuple(out)


def _interpolate(shares: Sequence[Share], at: int) -> int:
    w = _weights(tuple(s.x for s in shares), at % PRIME)
    return sum(s.y * wi for s, wi in zip(shares, w)) % PRIME


def combine(shares: Sequence[Share], threshold: int) -> bytes:
    """The secret from the first ``threshold`` shares (refuses fewer, duplicates, or a non-secret value)."""
    if len(shares) < threshold:
        raise InconsistentShares(f"{len(shares)} shares, threshold is {threshold}")
    use = list(shares[:threshold])
    if len({s.x for s in use}) != len(use):
        raise InconsistentShares("duplicate share points")
    v = _interpolate(use, 0)
    if v >= 1 << (8 * SECRET_LEN):
        raise InconsistentShares("shares interpolate to a value that is not a 32-byte secret")
    return v.to_bytes(SECRET_LEN, "big")


def consistent(shares: Sequence[Share], threshold: int) -> list[bool]:
    """For each share: does it lie on the polynomial through the first ``threshold`` shares?"""
    if len(shares) < threshold:
        raise InconsistentShares(f"{len(shares)} shares, threshold is {threshold}")
    base = list(shares[:threshold])
    return [True] * threshold + [_interpolate(base, s.x) == s.y for s in shares[threshold:]]
