"""A matrix's distinct rows, found by their bits, so that a row-wise computation runs once per distinct row.

Why (issue 12): a node's per-target RDP curves repeat.  A walk node's run row at n = 2048 has ~400 distinct
curves among 2 047 targets (targets at equal distance on the hypercube get the same curve), and so do its
lifetime ledger totals after the run; converting every curve to (ε, δ) was most of a report's CPU.  A
conversion depends on a curve's own values only, so converting each distinct curve once and gathering the
results gives the same numbers bit for bit — provided "the same" means every bit is, which this module
checks rather than trusts a hash for.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hushnet.privacy.conversions import rdp_epsilon

__all__ = ["Converted", "convert_distinct", "distinct_rows"]

#: odd 64-bit multipliers by row length: a row's hash is the wrapping sum of its bits times these
_WEIGHTS: dict[int, np.ndarray] = {}
#: columns hashed in the first attempt (spread over the row); a collision falls back to every column
_SAMPLE = 8


def _weights(k: int) -> np.ndarray:
    w = _WEIGHTS.get(k)
    if w is None:
        rng = np.random.default_rng(0x5EED)
        w = rng.integers(0, 2**63, k, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        _WEIGHTS[k] = w
    return w


def _bits(a: np.ndarray) -> np.ndarray:
    """The rows of a float64 (or 64-bit) matrix as uint64 words (a view when already contiguous)."""
    a = np.ascontiguousarray(a)
    if a.dtype.itemsize != 8:
        raise ValueError("distinct_rows needs 64-bit elements")
    return a.view(np.uint64).reshape(a.shape[0], a.size // max(a.shape[0], 1))


def _group(h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    _, first, inv = np.unique(h, return_index=True, return_inverse=True)
    return first, inv.reshape(-1)


#: rows compared per block (a block and its representatives stay in the cache)
_BLOCK = 256


def _rows_equal(bits: np.ndarray, rep: np.ndarray) -> bool:
    """Whether every row of ``bits`` equals row ``rep[i]`` of it, bit for bit (by blocks: no n × k copy)."""
    for i in range(0, bits.shape[0], _BLOCK):
        if not np.array_equal(bits[i : i + _BLOCK], bits[rep[i : i + _BLOCK]]):
            return False
    return True


def distinct_rows(a: np.ndarray, *extra: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``(first, inverse)`` such that ``a[first][inverse]`` is ``a`` bit for bit, and each ``extra`` (one
    64-bit value per row: a row's δ, its μ², …) likewise; rows count as equal only when all of their
    bits and all their extras' bits are.  ``None`` when two different rows share a hash (then the caller
    computes every row: a hash collision may only cost time, never change a number).

    A hash of a few columns groups the rows first (cheap: most of the cost is then the bitwise check);
    if that groups different rows together, every column is hashed before giving up."""
    bits = _bits(a)
    cols = [_bits(np.asarray(e).reshape(-1, 1)) for e in extra]
    m, k = bits.shape
    if m == 0:
        return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.intp)
    step = max(1, k // _SAMPLE)
    for sample in (slice(None, None, step), slice(None)):
        part = bits[:, sample]
        with np.errstate(over="ignore"):
            h = (part * _weights(k)[sample]).sum(axis=1, dtype=np.uint64)
            for j, c in enumerate(cols):
                h = h * np.uint64(0x9E3779B97F4A7C15) + c[:, 0] * np.uint64(2 * j + 3)
        first, inv = _group(h)
        if first.size == m or (
            _rows_equal(bits, first[inv]) and all(np.array_equal(c[first][inv], c) for c in cols)
        ):
            return first, inv
        if step == 1:
            break
    return None


@dataclass(frozen=True)
class Converted:
    """``rdp_epsilon(orders, rows, delta)`` of a matrix's rows, kept as its distinct rows' results.

    A report converts its run row, then its lifetime totals — after a node's first run the same curves
    in the same order (issue 12): :meth:`for_rows` gives the second conversion from the first when the
    matrices are equal bit for bit, the orders and δ too."""

    orders: np.ndarray
    rows: np.ndarray
    delta: float
    #: each distinct row's first occurrence and row → its distinct row (``None``: every row on its own)
    first: np.ndarray | None
    inv: np.ndarray | None
    eps: np.ndarray
    alpha: np.ndarray

    def epsilon(self) -> np.ndarray:
        """ε of every row."""
        return self.eps if self.inv is None else self.eps[self.inv]

    def spends(self) -> np.ndarray:
        """Whether each row has a positive entry (``np.any(rows > 0, axis=-1)``, from the distinct rows)."""
        if self.inv is None:
            return np.any(self.rows > 0, axis=-1)
        return np.any(self.rows[self.first] > 0, axis=-1)[self.inv]

    def for_rows(self, orders: np.ndarray, rows: np.ndarray, delta: float):
        """``(ε, best order)`` of every row of ``rows`` at ``delta`` if that is this conversion (the same
        orders, δ and rows bit for bit), else ``None``."""
        if (
            float(delta) != self.delta
            or rows.shape != self.rows.shape
            or orders.shape != self.orders.shape
            or _bits(orders.reshape(1, -1)).tobytes() != _bits(self.orders.reshape(1, -1)).tobytes()
            or not (rows is self.rows or np.array_equal(_bits(rows), _bits(self.rows)))
        ):
            return None
        if self.inv is None:
            return self.eps, self.alpha
        return self.eps[self.inv], self.alpha[self.inv]


#: below this many rows a conversion is cheaper than finding the distinct ones
DEDUP_MIN_ROWS = 64


def convert_distinct(orders: np.ndarray, rows: np.ndarray, delta: float) -> Converted:
    """``rdp_epsilon(orders, rows, delta)``, converting each distinct row once (rows equal bit for bit,
    :func:`distinct_rows`; on a hash collision, or under :data:`DEDUP_MIN_ROWS` rows, every row).  The
    same numbers bit for bit: a row's conversion depends on its own values only."""
    o = np.asarray(orders, dtype=np.float64)
    r = np.ascontiguousarray(rows, dtype=np.float64)
    found = distinct_rows(r) if r.ndim == 2 and r.shape[0] >= DEDUP_MIN_ROWS else None
    if found is None:
        eps, alpha = rdp_epsilon(o, r, float(delta))
        return Converted(o, r, float(delta), None, None, eps, alpha)
    first, inv = found
    eps, alpha = rdp_epsilon(o, r[first], float(delta))
    return Converted(o, r, float(delta), first, inv, eps, alpha)
