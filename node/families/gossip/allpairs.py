"""Muffliato-GD's certified sensitivities on the PUBLIC schedule, computed once per process.

Why: before accepting a run every node projects its certified row ``Δ²(vertex → v)`` for all v, and its
ledger cost needs the same row again.  Row by row that is one joint-view basis per observer
(:func:`hushnet.families.gossip.realised._gd_view_basis`) — n bases per node, about n^2.7 — computed
twice per node and once more by every node a process hosts (issue 12: 18 s per row at n = 256).  But
an observer's basis serves every source (``Δ²(u → v)`` only reads the source's coordinates of observer
v's basis), and the public schedule is the same for every node of the run.  So:

* :class:`PublicGD` holds, per observer, the R×R Gram blocks ``M(u, v) = Q_v[cols_u] Q_v[cols_u]ᵀ``
  of every source u (R = gradient steps) — what [K] Thm 12's box bound reads — computed once, and
  evaluates the box bound lazily per pair (the bound may run an SDP ascent of a few ms: n² of them
  would cost more than the bases), memoised, so the K nodes a process hosts and each node's
  decision/cost pair share ONE computation.  Memory: ``R²·n²`` floats for the blocks (with the
  accountant's cap R·n ≤ 4096, at most 128 MB) plus an n×n memo, hence a small LRU
  (:data:`CACHE_MAX_ENTRIES`, :data:`CACHE_MAX_BYTES`).
* **Symmetry** (only when verified exactly): if every round matrix ``W_t`` and every round's message
  set is invariant under a group of permutations acting transitively on the nodes — XOR translations
  on a hypercube, cyclic shifts on a ring, both on a complete graph — then the whole run commutes with
  each permutation π, observer π(v)'s view space is observer v's permuted, and the exact
  ``Δ²(π(u) → π(v)) = Δ²(u → v)`` for all u, v.  One observer's blocks then give all pairs (n box
  bounds instead of n² and one basis instead of n).  The generators are checked by exact entrywise
  equality ``W_t[g][:, g] == W_t`` (and the sent pairs) on every distinct round matrix; a group is
  closed under composition, so every translation is then an automorphism.  Any failure (a dropped
  edge, irregular weights, a realised schedule after crashes, fresh ER graphs per step) falls back to
  one basis per observer, the exact path.
* **Soundness of the filled values**: in exact arithmetic the permuted pair's Gram block equals the
  pair's own, so its box bound is the pair's; the two *computed* blocks differ only by rounding (measured
  ≤ 4e-15 relative on hypercube:4/5, rings and complete graphs), and the box bound's certificates (spectral,
  ``1ᵀ|M|1``, the SDP dual with its eigenvalue margin) are as valid for one as for the other — the same
  guarantee as the direct computation, whose own basis carries the same rounding.  So that a filled value
  is also never below what the direct computation returns, filled values are raised by
  :data:`SYMMETRY_RTOL` (relative), far above that rounding (tests: filled ≥ direct, equal to 1e-9).

The realised schedule of a settlement is not public and not symmetric after crashes: it keeps the
per-row exact path (:func:`hushnet.families.gossip.realised.gd_sensitivity`).
"""

from __future__ import annotations

import collections
import hashlib
import threading
from typing import Sequence

import numpy as np
import scipy.sparse as sp

from hushnet.families.gossip.realised import RealisedSchedule, _gd_view_basis
from hushnet.privacy.ledger_math import sealed
from hushnet.privacy.linear_gaussian import box_quadratic_max

__all__ = [
    "PublicGD",
    "public_gd",
    "translations",
    "verified_translations",
    "schedule_key",
    "schedule_digest",
    "matrix_digest",
    "SYMMETRY_RTOL",
    "CACHE_MAX_ENTRIES",
    "CACHE_MAX_BYTES",
]

#: relative margin added to every value filled by symmetry: far above the rounding difference between a
#: pair's computed value and its permuted pair's (≤ 4e-15 measured), far below any test tolerance (1e-9)
SYMMETRY_RTOL = 1e-10
#: the LRU of public computations kept per process (a run's nodes all ask for the same entry)
CACHE_MAX_ENTRIES = 4
#: … and their total size: the newest entry is always kept, older ones go first past this
CACHE_MAX_BYTES = 256 * 2**20


_TRANSLATIONS: collections.OrderedDict[str, tuple[str, np.ndarray] | None] = (
    collections.OrderedDict()
)
_TRANSLATIONS_LOCK = threading.Lock()


def verified_translations(sched: RealisedSchedule) -> tuple[str, np.ndarray] | None:
    """:func:`translations`, remembered per schedule (its digest) for the nodes of a process: the check
    is cheap but not free (0.4 s at n = 2048), and every hosted node's projection asks it."""
    key = schedule_digest(sched)
    with _TRANSLATIONS_LOCK:
        if key in _TRANSLATIONS:
            _TRANSLATIONS.move_to_end(key)
            return _TRANSLATIONS[key]
    out = translations(sched)
    if out is not None:
        out = (out[0], sealed(out[1]))  # shared by every node of the process
    with _TRANSLATIONS_LOCK:
        _TRANSLATIONS[key] = out
        while len(_TRANSLATIONS) > CACHE_MAX_ENTRIES:
            _TRANSLATIONS.popitem(last=False)
    return out


def translations(sched: RealisedSchedule) -> tuple[str, np.ndarray] | None:
    """``(kind, perm)`` with ``perm[v]`` a permutation π_v (``perm[v][x] = π_v(x)``) mapping v to 0, each an
    automorphism of the whole public schedule, or None when no candidate group verifies exactly.

    Candidates: XOR translations ``x ↦ x ⊕ v`` (n a power of two; generators ``x ⊕ 2^b``) and cyclic
    shifts ``x ↦ x − v mod n`` (generator ``x + 1``).  A generator g is accepted only if, for every
    distinct round matrix, ``W_t[g][:, g]`` equals ``W_t`` entry for entry (same sparsity, same floats)
    and it maps the round's sent pairs onto themselves; and only if every node was up and recorded every
    round (a public schedule)."""
    n = sched.n
    if n < 2 or not (np.all(sched.up) and np.all(sched.recorded)):
        return None
    x = np.arange(n)
    cands: list[tuple[str, list[np.ndarray], np.ndarray]] = []
    if n & (n - 1) == 0:
        gens = [x ^ (1 << b) for b in range(n.bit_length() - 1)]
        cands.append(("xor", gens, x[:, None] ^ x[None, :]))  # π_v(x) = x ⊕ v
    cands.append(("shift", [(x + 1) % n], (x[None, :] - x[:, None]) % n))  # π_v(x) = x − v
    for kind, gens, perm in cands:
        if all(_is_automorphism(sched, g) for g in gens):
            return kind, perm
    return None


def _is_automorphism(sched: RealisedSchedule, g: np.ndarray) -> bool:
    n = sched.n
    seen_W: set[int] = set()
    seen_sent: set[int] = set()
    for t, Wt in enumerate(sched.W):
        if id(Wt) not in seen_W:
            seen_W.add(id(Wt))
            A = sp.csr_matrix(Wt)
            B = A[g][:, g]
            if (B != A).nnz:  # exact entrywise comparison
                return False
        if id(sched.sent[t]) in seen_sent:  # a public schedule shares one list across rounds
            continue
        seen_sent.add(id(sched.sent[t]))
        P = np.asarray(sched.sent[t], dtype=np.int64).reshape(-1, 2)
        codes = np.sort(P[:, 0] * n + P[:, 1])
        if codes.size and np.any(codes[1:] == codes[:-1]):  # a pair sent twice in a round
            return False
        if not np.array_equal(
            np.sort(g[P[:, 0]] * n + g[P[:, 1]]), codes
        ):  # g maps the set onto itself
            return False
    return True


class PublicGD:
    """The certified Muffliato-GD ``Δ²(u → v)`` of one public schedule, for any row, computed once.

    ``blocks[o]`` (n×R×R) holds observer ``o``'s Gram blocks of every source (o = 0 only, when the schedule
    has verified translations ``perm``); ``row(u)`` reads ``Δ²(u → v)`` for every v (box bound per pair,
    memoised in ``memo``).  Thread-safe: the hosted nodes decide in executor threads."""

    def __init__(
        self,
        sched: RealisedSchedule,
        phases: Sequence[Sequence[int]],
        gammas: Sequence[np.ndarray] | None,
        view: str,
        *,
        symmetry: bool = True,
    ) -> None:
        self.n = sched.n
        self.R = len(phases)
        sym = verified_translations(sched) if symmetry else None
        self.kind = sym[0] if sym else None
        self.perm = sym[1] if sym else None
        observers = [0] if sym else range(self.n)
        self.blocks = {
            o: self._gram_blocks(_gd_view_basis(sched, o, phases, gammas, view), o)
            for o in observers
        }
        self.memo = np.full((self.n, self.n) if sym is None else (self.n, 1), np.nan)
        self._lock = threading.Lock()

    @property
    def symmetric(self) -> bool:
        return self.perm is not None

    @property
    def nbytes(self) -> int:
        return int(sum(b.nbytes for b in self.blocks.values()) + self.memo.nbytes)

    def _gram_blocks(self, Q: np.ndarray, observer: int) -> np.ndarray:
        """(n, R, R): ``Q[cols_u] Q[cols_u]ᵀ`` for every source u (zero for the observer itself)."""
        n, R = self.n, self.R
        out = np.empty((n, R, R))
        for u in range(n):  # the product gd_sensitivity forms (values agree to rounding, ~1e-16)
            q = Q[[r * n + u for r in range(R)]]
            out[u] = q @ q.T
        out[observer] = 0.0
        return out

    def _value(self, observer: int, source: int) -> float:
        col = 0 if self.perm is not None else observer
        v = self.memo[source, col]
        if np.isnan(v):
            v = self.memo[source, col] = (
                0.0
                if source == observer
                else float(box_quadratic_max(self.blocks[observer][source], exact_limit=0)["value"])
            )
        return float(v)

    def row(self, u: int) -> np.ndarray:
        """(n,) certified ``Δ²(u → v)/Δ²`` for every observer v (0 toward u itself)."""
        with self._lock:
            if self.perm is None:
                out = np.array([self._value(v, u) for v in range(self.n)])
            else:  # Δ²(u → v) = Δ²(π_v(u) → 0), π_v an exact automorphism with π_v(v) = 0
                col = np.array([self._value(0, s) for s in range(self.n)])  # memoised after once
                out = col[self.perm[:, u]] * (1.0 + SYMMETRY_RTOL)
        out[u] = 0.0
        return out


def matrix_digest(W) -> str:
    """SHA-256 of a sparse matrix's shape and exact entries (canonical CSR: summed duplicates, sorted)."""
    C = sp.csr_matrix(W, dtype=float, copy=True)
    C.sum_duplicates()
    C.sort_indices()
    d = hashlib.sha256(repr(C.shape).encode())
    for a in (C.indptr, C.indices, C.data):
        d.update(np.ascontiguousarray(a).tobytes())
    return d.hexdigest()


def schedule_key(
    sched: RealisedSchedule,
    phases: Sequence[Sequence[int]],
    gammas: Sequence[np.ndarray] | None,
    view: str,
) -> str:
    """SHA-256 of every input the computation reads: n, the view, the phases, the γ per round and phase,
    every round's matrix (its exact entries) and message pairs, who was up — so two runs share an entry
    only when the accountant would compute the same thing."""
    h = hashlib.sha256()
    h.update(repr((sched.n, sched.rounds, view, [list(map(int, p)) for p in phases])).encode())
    if gammas is not None:
        for g in gammas:
            h.update(np.ascontiguousarray(np.asarray(g, dtype=float)).tobytes())
    h.update(schedule_digest(sched).encode())
    return h.hexdigest()


def schedule_digest(sched: RealisedSchedule) -> str:
    """SHA-256 of the schedule alone: n, every round's matrix and message pairs, who was up and recorded."""
    h = hashlib.sha256(repr((sched.n, sched.rounds)).encode())
    h.update(np.ascontiguousarray(sched.up).tobytes())
    h.update(np.ascontiguousarray(sched.recorded).tobytes())
    done: dict[int, str] = {}
    sent_done: dict[int, str] = {}
    for t, Wt in enumerate(sched.W):
        if id(Wt) not in done:
            done[id(Wt)] = matrix_digest(Wt)
        h.update(done[id(Wt)].encode())
        if id(sched.sent[t]) not in sent_done:  # a public schedule shares one list across rounds
            pairs = np.asarray(sched.sent[t], dtype=np.int64).reshape(-1, 2)
            pairs = pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]
            sent_done[id(sched.sent[t])] = hashlib.sha256(pairs.tobytes()).hexdigest()
        h.update(sent_done[id(sched.sent[t])].encode())
    return h.hexdigest()


_CACHE: collections.OrderedDict[str, PublicGD] = collections.OrderedDict()
_CACHE_LOCK = threading.Lock()
_BUILDING: dict[str, threading.Lock] = {}


def public_gd(
    sched: RealisedSchedule,
    phases: Sequence[Sequence[int]],
    gammas: Sequence[np.ndarray] | None,
    view: str,
) -> PublicGD:
    """The process-wide :class:`PublicGD` of this public schedule (built once; concurrent callers wait for
    the one build instead of repeating it)."""
    key = schedule_key(sched, phases, gammas, view)
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            return hit
        building = _BUILDING.setdefault(key, threading.Lock())
    with building:
        with _CACHE_LOCK:
            hit = _CACHE.get(key)
            if hit is not None:
                _CACHE.move_to_end(key)
                return hit
        entry = PublicGD(sched, phases, gammas, view)
        with _CACHE_LOCK:
            _CACHE[key] = entry
            _BUILDING.pop(key, None)
            while len(_CACHE) > 1 and (
                len(_CACHE) > CACHE_MAX_ENTRIES
                or sum(e.nbytes for e in _CACHE.values()) > CACHE_MAX_BYTES
            ):
                _CACHE.popitem(last=False)
        return entry


def clear_cache() -> None:
    """Forget every public computation (tests; a long-lived process never needs it)."""
    with _CACHE_LOCK:
        _CACHE.clear()
    with _TRANSLATIONS_LOCK:
        _TRANSLATIONS.clear()
