"""The one result type of every all-pairs accountant: a matrix of pairwise Rényi losses.

Random-walk, Muffliato and streaming-gossip accountants all return a :class:`PrivacyMatrix`, so the
CLI, the run reports and the figures read one shape, and every number travels with the labels
that say which bound produced it ("certified" — what hushnet stands behind — or "paper", a
labelled reproduction of a published formula) and under which view model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

__all__ = ["PrivacyMatrix", "adjacency_of", "json_number"]


def json_number(x: float) -> float | str:
    """A float for JSON: ``inf`` becomes the string "inf" (never silently clipped)."""
    x = float(x)
    return x if math.isfinite(x) else ("inf" if x > 0 else "-inf")


def adjacency_of(graph: Any) -> sp.csr_matrix:
    """The 0/1 adjacency of a hushnet Graph, a (sparse or dense) matrix, or a networkx graph."""
    if hasattr(graph, "adjacency") and not callable(graph.adjacency):
        return sp.csr_matrix(graph.adjacency)
    if sp.issparse(graph) or isinstance(graph, np.ndarray):
        A = sp.csr_matrix(graph, dtype=float)
        A.setdiag(0)
        A.eliminate_zeros()
        return A
    import networkx as nx

    return sp.csr_matrix(nx.to_scipy_sparse_array(graph, format="csr", dtype=float))


@dataclass(frozen=True)
class PrivacyMatrix:
    """All-pairs Rényi losses ``ε_{u→v}`` at order ``alpha`` and how they were made.

    Row ``u`` is the contributor, column ``v`` the observer, diagonal 0.  ``np.inf`` means the
    observer recovers the contributor's input with certainty.  The optional labels
    (``horizon``, ``constraint``, ``passage``, ``sigma``, ``T``, ``protocol``) are set by the
    accountants they concern and left ``None`` elsewhere.
    """

    matrix: np.ndarray
    alpha: float
    bound: str
    view: str
    notes: list[str] = field(default_factory=list)
    protocol: str = ""
    horizon: str | None = None
    constraint: str | None = None
    passage: str | None = None
    sigma: float | None = None
    T: int | None = None
    sensitivity_sq: np.ndarray | None = field(default=None, repr=False, compare=False)
    adjacency: sp.csr_matrix | None = field(default=None, repr=False, compare=False)
    #: the valid bounds whose entrywise minimum ``matrix`` is (name → n×n RDP), when there are several
    #: (random walk: "random-walk" and "local-DP"); :meth:`certified_by` names the one that won per pair
    components: dict[str, np.ndarray] | None = field(default=None, repr=False, compare=False)

    def certified_by(self, u: int, v: int) -> str:
        """The bound that produced ``matrix[u, v]`` (the smallest component; ties go to the first)."""
        if not self.components:
            return self.bound
        return min(self.components, key=lambda k: float(self.components[k][u, v]))

    @property
    def n(self) -> int:
        return int(self.matrix.shape[0])

    def off_diagonal(self) -> np.ndarray:
        return np.asarray(self.matrix, dtype=float)[~np.eye(self.n, dtype=bool)]

    def to_dp(self, delta: float, method: str = "improved") -> np.ndarray:
        """(ε, δ) per pair at the matrix's order α, diag 0.

        ``method="improved"`` (default): hushnet's one RDP → (ε, δ) rule, dp-accounting's improved
        conversion (:func:`hushnet.privacy.conversions.rdp_epsilon`); ``"classic"``: Mironov's
        ``ε + ln(1/δ)/(α−1)``, the papers' conversion, for figures that reproduce them.
        """
        from hushnet.privacy.conversions import rdp_epsilon

        out, _ = rdp_epsilon(
            [self.alpha], np.asarray(self.matrix, dtype=float)[..., None], delta, method=method
        )
        out = np.array(out, dtype=float)
        np.fill_diagonal(out, 0.0)
        return out

    def summary(self, graph: Any = None) -> dict[str, Any]:
        """min / mean / max over ordered pairs u ≠ v and the mean by shortest-path distance (JSON-ready).

        The distances come from ``graph`` when given, else from the adjacency the accountant kept.
        """
        vals = self.off_diagonal()
        out: dict[str, Any] = {"bound": self.bound, "view": self.view, "alpha": self.alpha}
        for key in ("protocol", "horizon", "constraint", "passage", "sigma", "T"):
            value = getattr(self, key)
            if value not in (None, ""):
                out[key] = value
        out.update(
            n=self.n,
            pairs=int(vals.size),
            infinite_pairs=int(np.isinf(vals).sum()),
            min=json_number(vals.min()) if vals.size else None,
            mean=json_number(vals.mean()) if vals.size else None,
            max=json_number(vals.max()) if vals.size else None,
            notes=list(self.notes),
        )
        if self.components:
            mask = ~np.eye(self.n, dtype=bool)
            stack = np.stack([np.asarray(c, dtype=float)[mask] for c in self.components.values()])
            won = np.argmin(stack, axis=0)
            out["certified_by"] = {k: int(np.sum(won == i)) for i, k in enumerate(self.components)}
        adj = adjacency_of(graph) if graph is not None else self.adjacency
        if adj is not None:
            from scipy.sparse.csgraph import shortest_path

            mask = ~np.eye(self.n, dtype=bool)
            d = shortest_path(adj, unweighted=True, directed=False)[mask]
            m = np.asarray(self.matrix, dtype=float)[mask]
            reach = np.isfinite(d)
            di = d[reach].astype(int)
            out["mean_by_distance"] = {
                str(k): json_number(m[reach][di == k].mean()) for k in np.unique(di) if k >= 1
            }
        return out
