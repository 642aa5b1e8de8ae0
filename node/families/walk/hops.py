"""Next-hop rules: how the token holder picks the next holder from *public* information.

The privacy analyses assume the walk follows the public transition matrix exactly, so every rule
samples from the node's own generator and, when a neighbour is unreachable, never re-samples
silently: :meth:`TransitionRow.without` builds the changed row that a recorded deviation uses.
"""

from __future__ import annotations

import sys

import numpy as np


class HopRule:
    """Pick the next holder; ``senders`` are the nodes allowed to hand this node the token."""

    node: int

    def sample(self, rng: np.random.Generator) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def may_receive_from(self, src: int) -> bool:  # pragma: no cover - interface
        raise NotImplementedError

    def without(self, excluded: set[int]) -> "HopRule | None":
        """The rule with ``excluded`` nodes removed and the rest renormalised (None if nothing is left)."""
        raise NotImplementedError


class TransitionRow(HopRule):
    """Sample from row ``W[node, :]`` (self-loop included when ``W[node, node] > 0``).

    Sampling is one uniform draw and a binary search in the cumulative row — the same draw in the
    simulator and in the networked node, so the walk is reproducible from the run seed.
    """

    def __init__(self, node: int, cols: np.ndarray, probs: np.ndarray) -> None:
        self.node = int(node)
        keep = probs > 0
        self.cols = np.asarray(cols, dtype=np.int64)[keep]
        p = np.asarray(probs, dtype=np.float64)[keep]
        if self.cols.size == 0:
            raise ValueError(f"node {node}: empty transition row")
        total = p.sum()
        if not np.isclose(total, 1.0, atol=1e-9):
            raise ValueError(f"node {node}: transition row sums to {total}, not 1")
        self.probs = p / total
        self.cum = np.cumsum(self.probs)
        self.cum[-1] = 1.0
        self._senders = np.sort(
            self.cols[self.cols != self.node]
        )  # sorted: membership by binary search

    @classmethod
    def from_matrix(cls, W, node: int) -> "TransitionRow":
        # a sparse W exists only once scipy.sparse was imported: not imported here for a node process
        # whose runs have not begun (its run service imports this module at start-up)
        sp = sys.modules.get("scipy.sparse")
        if sp is not None and sp.issparse(W):
            W = W.tocsr() if not isinstance(W, sp.csr_matrix) else W
            lo, hi = W.indptr[node], W.indptr[node + 1]
            return cls(node, W.indices[lo:hi], W.data[lo:hi])
        w = np.asarray(W[node], dtype=np.float64)
        nz = np.flatnonzero(w)
        return cls(node, nz, w[nz])

    def sample(self, rng: np.random.Generator) -> int:
        return int(self.cols[int(np.searchsorted(self.cum, rng.random(), side="right"))])

    def may_receive_from(self, src: int) -> bool:
        # W is symmetric under the papers' assumptions, so in-neighbours = out-neighbours
        s = self._senders
        i = int(np.searchsorted(s, src))
        return i < s.size and int(s[i]) == src

    def without(self, excluded: set[int]) -> "TransitionRow | None":
        keep = ~np.isin(self.cols, list(excluded))
        if not keep.any():
            return None
        r = TransitionRow.__new__(TransitionRow)
        r.node = self.node
        r.cols = self.cols[keep]
        r.probs = self.probs[keep] / self.probs[keep].sum()
        r.cum = np.cumsum(r.probs)
        r.cum[-1] = 1.0
        r._senders = self._senders
        return r


class UniformHop(HopRule):
    """Complete graph with self-loops (``W = J/n``, P-AD §4): the next holder is uniform on all n nodes."""

    def __init__(self, node: int, n: int) -> None:
        self.node, self.n = int(node), int(n)
        self._excluded: frozenset[int] = frozenset()

    def sample(self, rng: np.random.Generator) -> int:
        if not self._excluded:
            return int(rng.integers(self.n))
        allowed = np.setdiff1d(np.arange(self.n), list(self._excluded))
        return int(allowed[rng.integers(allowed.size)])

    def may_receive_from(self, src: int) -> bool:
        return 0 <= src < self.n and src != self.node

    def without(self, excluded: set[int]) -> "UniformHop | None":
        if len(excluded | self._excluded) >= self.n:
            return None
        r = UniformHop(self.node, self.n)
        r._excluded = frozenset(excluded) | self._excluded
        return r


class RingSuccessor(HopRule):
    """Directed ring with a public order (P-AD §3): always the next node, only the previous one may send."""

    def __init__(self, node: int, n: int) -> None:
        self.node, self.n = int(node), int(n)

    def sample(self, rng: np.random.Generator) -> int:
        return (self.node + 1) % self.n

    def may_receive_from(self, src: int) -> bool:
        return src == (self.node - 1) % self.n

    def without(self, excluded: set[int]) -> None:
        return None  # the ring has no alternative: a dead successor pauses the run
