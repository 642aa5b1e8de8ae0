"""Shamir secret sharing of 32-byte secrets over the prime field GF(2^256 + 297).

No well-kept prime-field Shamir library is on PyPI (the maintained ones work byte-wise over
GF(256)), so this is a small implementation: a random polynomial of degree ``t − 1`` with the
secret as constant term, coefficients from the OS CSPRNG, Lagrange interpolation at 0.  Any ``t``
shares determine the secret; ``t − 1`` shares are independent of it.

The field is the smallest prime above 2^256 (``2^256 + 297``; its primality is checked in the
tests), so every 32-byte secret embeds without reduction and a share's value takes 33 bytes.  It
replaced GF(2^521 − 1): half the width makes every product and share half the size.  Dealing is
batched (:func:`split_many`): a secure-summation member shares 1 + deg secrets at the same points,
so the powers ``x^j`` of each point are computed once and every share is one dot product
``Σ_j c_j·x^j`` with a single reduction — the points are small (member index + 1), so the powers
stay small integers and the products are cheap.  Coefficients are ``320``-bit CSPRNG integers
reduced mod the prime: statistical distance from uniform below ``2^-63``, the usual
"64 extra bits" rule (FIPS 186-5 B.2.1).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from functools import lru_cache
from operator import mul
from typing import Sequence

import numpy as np

from hushnet.crypto.errors import InconsistentShares

PRIME = (1 << 256) + 297
SECRET_LEN = 32
_Y_LEN = 33  # ceil(257 / 8)
SHARE_LEN = 4 + _Y_LEN
_X = struct.Struct(">I")
_COEFF_LEN = 40  # 320 random bits per coefficient, reduced mod PRIME (bias < 2^-63)


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


def check_encoded(data: bytes, x: int) -> bytes:
    """``data`` if it is a well-formed encoded share at the point ``x`` (length, point, value in the field),
    checked without building a :class:`Share`: a secure-summation holder only forwards the shares dealt
    to it (encoded) to the leader, who decodes those it uses, so a member checks hundreds a round."""
    if len(data) != SHARE_LEN or data[:4] != _X.pack(x):
        raise InconsistentShares(
            f"share of {len(data)} bytes or for another point, expected {SHARE_LEN} at x = {x}"
        )
    if (
        data[4] and int.from_bytes(data[4:], "big") >= PRIME
    ):  # a zero top byte is below 2^256 < PRIME
        raise InconsistentShares("share outside the field")
    return data


def split(secret: bytes, xs: Sequence[int], threshold: int) -> list[Share]:
    """Shares of ``secret`` at the distinct non-zero points ``xs``; any ``threshold`` of them recover it."""
    return split_many([secret], xs, threshold)[0]


def split_many(secrets: Sequence[bytes], xs: Sequence[int], threshold: int) -> list[list[Share]]:
    """Shares of each secret (independent polynomials) at the same points ``xs``: ``out[k][i]`` is
    secret k's share at ``xs[i]``.  One CSPRNG read for all coefficients, the powers of each point
    computed once for all secrets."""
    xs, cols = _deal(secrets, xs, threshold)
    return [[Share(x, col[k]) for x, col in zip(xs, cols)] for k in range(len(secrets))]


def split_many_encoded(
    secrets: Sequence[bytes], xs: Sequence[int], threshold: int
) -> list[list[bytes]]:
    """:func:`split_many` with every share already in its wire form (``Share.encode()``: the 4-byte point
    and the 33-byte value): a secure-summation member deals (1 + degree)·n shares a round and only
    ever sends them, so building and encoding a :class:`Share` object per share was pure overhead."""
    xs, cols = _deal(secrets, xs, threshold)
    heads = [_X.pack(x) for x in xs]
    return [
        [h + col[k].to_bytes(_Y_LEN, "big") for h, col in zip(heads, cols)]
        for k in range(len(secrets))
    ]


def _deal(
    secrets: Sequence[bytes], xs: Sequence[int], threshold: int
) -> tuple[list[int], list[list[int]]]:
    """The points and, per point, the value of every secret's random polynomial there (the dealing of
    :func:`split_many`)."""
    if any(len(s) != SECRET_LEN for s in secrets):
        raise ValueError(f"secrets are {SECRET_LEN} bytes")
    if not 1 <= threshold <= len(xs):
        raise ValueError(f"threshold {threshold} outside 1..{len(xs)}")
    xs = [int(x) for x in xs]
    if len(set(xs)) != len(xs) or any(not 0 < x < PRIME for x in xs):
        raise ValueError("share points must be distinct and non-zero")
    S, t = len(secrets), threshold
    if S == 0:
        return xs, []
    powers = [_powers(x, t) for x in xs]
    # All S polynomials are evaluated at once: coefficient j of every secret is packed into one integer
    # C_j = Σ_k c_kj·2^(k·W), so a point costs t products of one long integer by x^j instead of S·t
    # products (each a Python call), and the shares are cut out of the result.  The slots never carry
    # into each other: a slot holds Σ_j c_kj·x^j < t·2^320·max(x^j) < 2^W.  The random coefficients go
    # in unreduced (320 CSPRNG bits each): the shares are taken mod PRIME, which is the evaluation of
    # the reduced polynomial, so their law is exactly that of reducing each coefficient first.
    wb = (
        8 * _COEFF_LEN + max(max(pw) for pw in powers).bit_length() + t.bit_length() + 8
    ) // 8  # slot bytes
    slots = np.zeros((t, S, wb), dtype=np.uint8)  # little-endian slots, coefficient-major
    slots[0, :, :SECRET_LEN] = np.frombuffer(b"".join(secrets), dtype=np.uint8).reshape(
        S, SECRET_LEN
    )[:, ::-1]
    slots[1:, :, :_COEFF_LEN] = np.frombuffer(
        os.urandom(_COEFF_LEN * (t - 1) * S), dtype=np.uint8
    ).reshape(t - 1, S, _COEFF_LEN)
    packed = [int.from_bytes(slots[j].tobytes(), "little") for j in range(t)]
    cols = []
    for pw in powers:
        y = sum(map(mul, packed, pw)).to_bytes(S * wb, "little")
        cols.append([int.from_bytes(y[k * wb : (k + 1) * wb], "little") % PRIME for k in range(S)])
    return xs, cols


@lru_cache(maxsize=1024)
def _powers(x: int, n: int) -> tuple[int, ...]:
    """``(x^0, …, x^(n−1)) mod PRIME``: shared by every secret dealt at the point x."""
    out, p = [], 1
    for _ in range(n):
        out.append(p)
        p = p * x % PRIME
    return tuple(out)


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
