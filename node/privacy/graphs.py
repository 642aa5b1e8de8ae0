"""Communication graphs, their gossip/transition weights and spectral quantities.

Every part of hushnet that needs a graph goes through this module: the bootstrap assigns
neighbours from a spec string, the privacy accountant computes pairwise losses on the same
graph, and the simulator walks it.  Sharing one parser and one weighting rule is what makes
"every node computes the same W" true, which is what the privacy analyses assume.

Spec syntax (shared by the network and the privacy tools)::

    complete:N  ring:N  hypercube:D  grid:RxC  er:N:P:SEED  regular:N:K:SEED
    geometric:N:R:SEED  sbm:S1,S2,...:PIN:POUT:SEED  edgelist:PATH

``hypercube:D`` numbers node i by the binary digits of i (nodes 0 and 2^D-1 are antipodes);
``grid:RxC`` numbers node (r, c) as r*C + c.  ``edgelist:PATH`` reads whitespace- or
comma-separated pairs, skips lines that are not two integers, and relabels the ids
0..n-1 in increasing order.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp
from scipy.sparse import csgraph

if (
    TYPE_CHECKING
):  # networkx is imported where a random graph is generated: a node process rarely needs it
    import networkx as nx

__all__ = [
    "Graph",
    "GraphSpecError",
    "parse_graph",
    "graph_from_edges",
    "metropolis_hastings",
    "spectral_gap",
    "chebyshev_gamma",
    "mixing_time",
    "is_periodic",
]


class GraphSpecError(ValueError):
    """A graph spec string that cannot be parsed or built."""


@dataclass(frozen=True, eq=False)
class Graph:
    """An undirected simple graph on nodes 0..n-1, stored as a symmetric sparse 0/1 matrix."""

    adjacency: sp.csr_matrix
    spec: str = ""
    positions: np.ndarray | None = field(default=None, repr=False)

    @property
    def n(self) -> int:
        return int(self.adjacency.shape[0])

    @cached_property
    def degrees(self) -> np.ndarray:
        return np.asarray(self.adjacency.sum(axis=1)).ravel().astype(np.int64)

    @property
    def num_edges(self) -> int:
        return int(self.adjacency.nnz // 2)

    def neighbors(self, i: int) -> np.ndarray:
        a = self.adjacency
        return a.indices[a.indptr[i] : a.indptr[i + 1]].copy()

    def edges(self) -> np.ndarray:
        """All edges as an (m, 2) int array with u < v, sorted."""
        upper = sp.triu(self.adjacency, k=1).tocoo()
        e = np.stack([upper.row, upper.col], axis=1).astype(np.int64)
        order = np.lexsort((e[:, 1], e[:, 0]))
        return e[order]

    def to_networkx(self) -> "nx.Graph":
        import networkx as nx

        g = nx.Graph()
        g.add_nodes_from(range(self.n))
        g.add_edges_from(map(tuple, self.edges().tolist()))
        return g

    def is_connected(self) -> bool:
        ncomp, _ = csgraph.connected_components(self.adjacency, directed=False)
        return ncomp == 1

    def largest_component(self) -> "Graph":
        """The induced subgraph on the largest connected component, relabelled 0..k-1."""
        _, labels = csgraph.connected_components(self.adjacency, directed=False)
        keep = np.flatnonzero(labels == np.bincount(labels).argmax())
        sub = self.adjacency[keep][:, keep].tocsr()
        pos = None if self.positions is None else self.positions[keep]
        return Graph(sub, spec=f"{self.spec}|lcc", positions=pos)

    def shortest_path_lengths(self, source: int) -> np.ndarray:
        """Hop distances from ``source`` (``-1`` where unreachable)."""
        d = csgraph.shortest_path(self.adjacency, directed=False, unweighted=True, indices=source)
        out = np.where(np.isinf(d), -1, d)
        return out.astype(np.int64)

    def all_shortest_path_lengths(self) -> np.ndarray:
        """n×n hop distances (``-1`` where unreachable); O(n·m), fine for n of a few thousands."""
        d = csgraph.shortest_path(self.adjacency, directed=False, unweighted=True)
        return np.where(np.isinf(d), -1, d).astype(np.int64)


def graph_from_edges(
    n: int, edges: np.ndarray | list, spec: str = "", positions: np.ndarray | None = None
) -> Graph:
    """Build a :class:`Graph` from an edge list on nodes 0..n-1 (self-loops and duplicates dropped)."""
    e = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    if e.size and (e.min() < 0 or e.max() >= n):
        raise GraphSpecError(f"edge endpoint outside 0..{n - 1}")
    e = e[e[:, 0] != e[:, 1]]
    rows = np.concatenate([e[:, 0], e[:, 1]])
    cols = np.concatenate([e[:, 1], e[:, 0]])
    a = sp.coo_matrix((np.ones(rows.size), (rows, cols)), shape=(n, n)).tocsr()
    a.data[:] = 1.0  # duplicates summed above; back to 0/1
    a.sort_indices()
    return Graph(a, spec=spec, positions=positions)


def _nx():
    """networkx, imported on first use (random graph families only)."""
    import networkx

    return networkx


def _from_networkx(g: "nx.Graph", spec: str, positions: np.ndarray | None = None) -> Graph:
    mapping = {v: i for i, v in enumerate(sorted(g.nodes()))}
    edges = [(mapping[u], mapping[v]) for u, v in g.edges()]
    return graph_from_edges(len(mapping), edges, spec=spec, positions=positions)


def _int(text: str, what: str, spec: str, minimum: int = 1) -> int:
    try:
        value = int(text)
    except ValueError:
        raise GraphSpecError(f"{spec!r}: {what} must be an integer, got {text!r}") from None
    if value < minimum:
        raise GraphSpecError(f"{spec!r}: {what} must be >= {minimum}, got {value}")
    return value


def _float(text: str, what: str, spec: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise GraphSpecError(f"{spec!r}: {what} must be a number, got {text!r}") from None


def _hypercube(d: int, spec: str) -> Graph:
    n = 1 << d
    nodes = np.arange(n)
    edges = [np.stack([nodes, nodes ^ (1 << b)], axis=1) for b in range(d)]
    e = np.concatenate(edges) if edges else np.zeros((0, 2), dtype=np.int64)
    return graph_from_edges(n, e[e[:, 0] < e[:, 1]], spec=spec)


def _grid(r: int, c: int, spec: str) -> Graph:
    idx = np.arange(r * c).reshape(r, c)
    horiz = np.stack([idx[:, :-1].ravel(), idx[:, 1:].ravel()], axis=1)
    vert = np.stack([idx[:-1, :].ravel(), idx[1:, :].ravel()], axis=1)
    return graph_from_edges(r * c, np.concatenate([horiz, vert]), spec=spec)


def read_edgelist(path: str | Path) -> tuple[int, np.ndarray]:
    """Read pairs of integers; relabel ids 0..n-1 in increasing order; skip other lines."""
    pairs: list[tuple[int, int]] = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            parts = [p for p in re.split(r"[,\s]+", line.strip()) if p]
            if len(parts) != 2:
                continue
            try:
                pairs.append((int(parts[0]), int(parts[1])))
            except ValueError:
                continue
    if not pairs:
        raise GraphSpecError(f"edgelist {path}: no edges found")
    arr = np.asarray(pairs, dtype=np.int64)
    ids, inverse = np.unique(arr, return_inverse=True)
    return int(ids.size), inverse.reshape(-1, 2)


def parse_graph(spec: str) -> Graph:
    """Build the graph named by ``spec`` (see the module docstring). Seeded families are reproducible."""
    if not isinstance(spec, str) or ":" not in spec:
        raise GraphSpecError(
            f"bad graph spec {spec!r}: expected FAMILY:PARAMS, e.g. ring:8, hypercube:3, grid:4x4, er:50:0.1:1"
        )
    family, _, rest = spec.partition(":")
    family = family.strip().lower()
    args = rest.split(":")
    if family == "edgelist":
        n, e = read_edgelist(rest)
        return graph_from_edges(n, e, spec=spec)
    if family == "complete":
        n = _int(args[0], "N", spec)
        iu = np.triu_indices(n, k=1)
        return graph_from_edges(n, np.stack(iu, axis=1), spec=spec)
    if family == "ring":
        n = _int(args[0], "N", spec, minimum=3)
        i = np.arange(n)
        return graph_from_edges(n, np.stack([i, (i + 1) % n], axis=1), spec=spec)
    if family == "hypercube":
        d = _int(args[0], "D", spec, minimum=0)
        if d > 20:
            raise GraphSpecError(f"{spec!r}: hypercube dimension {d} too large (max 20)")
        return _hypercube(d, spec)
    if family == "grid":
        m = re.fullmatch(r"(\d+)x(\d+)", args[0].strip().lower())
        if not m:
            raise GraphSpecError(f"{spec!r}: grid spec is grid:RxC, e.g. grid:4x5")
        r, c = int(m.group(1)), int(m.group(2))
        if r < 1 or c < 1:
            raise GraphSpecError(f"{spec!r}: grid sides must be >= 1")
        return _grid(r, c, spec)
    if family == "er":
        _need(args, 3, spec, "er:N:P:SEED")
        n, p, seed = (
            _int(args[0], "N", spec),
            _float(args[1], "P", spec),
            _int(args[2], "SEED", spec, 0),
        )
        if not 0.0 <= p <= 1.0:
            raise GraphSpecError(f"{spec!r}: P must be in [0, 1]")
        return _from_networkx(_nx().gnp_random_graph(n, p, seed=seed), spec)
    if family == "regular":
        _need(args, 3, spec, "regular:N:K:SEED")
        n, k, seed = (
            _int(args[0], "N", spec),
            _int(args[1], "K", spec, 0),
            _int(args[2], "SEED", spec, 0),
        )
        if k >= n or (n * k) % 2:
            raise GraphSpecError(f"{spec!r}: need K < N and N*K even")
        return _from_networkx(_nx().random_regular_graph(k, n, seed=seed), spec)
    if family == "geometric":
        _need(args, 3, spec, "geometric:N:R:SEED")
        n, r, seed = (
            _int(args[0], "N", spec),
            _float(args[1], "R", spec),
            _int(args[2], "SEED", spec, 0),
        )
        g = _nx().random_geometric_graph(n, r, seed=seed)
        pos = np.array([g.nodes[i]["pos"] for i in range(n)])
        return _from_networkx(g, spec, positions=pos)
    if family == "sbm":
        _need(args, 4, spec, "sbm:S1,S2,...:PIN:POUT:SEED")
        sizes = [_int(s, "block size", spec) for s in args[0].split(",")]
        pin, pout, seed = (
            _float(args[1], "PIN", spec),
            _float(args[2], "POUT", spec),
            _int(args[3], "SEED", spec, 0),
        )
        probs = [[pin if i == j else pout for j in range(len(sizes))] for i in range(len(sizes))]
        return _from_networkx(_nx().stochastic_block_model(sizes, probs, seed=seed), spec)
    raise GraphSpecError(
        f"unknown graph family {family!r} in {spec!r}; known: complete, ring, hypercube, grid, er, regular, "
        "geometric, sbm, edgelist"
    )


def _need(args: list[str], k: int, spec: str, usage: str) -> None:
    if len(args) != k:
        raise GraphSpecError(f"{spec!r}: expected {usage}")


def metropolis_hastings(graph: Graph, variant: str = "hamilton") -> sp.csr_matrix:
    """Symmetric doubly-stochastic gossip / transition matrix W of the graph.

    ``hamilton`` (default): ``W_uv = 1/(1 + max(d_u, d_v))`` on edges — what the papers' code and
    every figure use (self-loops everywhere, hence aperiodic).  ``paper``: the printed rule
    ``1/max(d_u, d_v)``, which is periodic on regular bipartite graphs such as the hypercube
    (a warning says so).  The self-loop takes the rest of each row in both cases.
    """
    if variant not in ("hamilton", "paper"):
        raise ValueError(f"unknown weight variant {variant!r}; use 'hamilton' or 'paper'")
    a = graph.adjacency.tocoo()
    d = graph.degrees.astype(float)
    m = np.maximum(d[a.row], d[a.col])
    w = 1.0 / (m + 1.0) if variant == "hamilton" else 1.0 / m
    off = sp.coo_matrix((w, (a.row, a.col)), shape=a.shape).tocsr()
    diag = 1.0 - np.asarray(off.sum(axis=1)).ravel()
    diag[np.abs(diag) < 1e-15] = 0.0
    W = (off + sp.diags(diag)).tocsr()
    W.sort_indices()
    if variant == "paper" and graph.n > 1 and is_periodic(W):
        warnings.warn(
            f"the printed weight rule on {graph.spec or 'this graph'} is periodic (eigenvalue -1): "
            "random walks and gossip do not converge; use the default 'hamilton' weights",
            RuntimeWarning,
            stacklevel=2,
        )
    return W


def _dense(W) -> np.ndarray:
    return W.toarray() if sp.issparse(W) else np.asarray(W, dtype=float)


def eigenvalues(W) -> np.ndarray:
    """Eigenvalues of a symmetric W, ascending."""
    return np.linalg.eigvalsh(_dense(W))


def spectral_gap(W, kind: str = "absolute") -> float:
    """Spectral gap of a symmetric stochastic W.

    ``absolute``: ``1 - max(|λ₂|, |λ_n|)`` — the gap the theorems use ([M] Def. 2, [K] γ_abs).
    ``code``: ``1 - λ₂`` (the reference code's ``vplambda``, which ignores negative eigenvalues) —
    use it only to reproduce the papers' experiment parameters.
    """
    lam = eigenvalues(W)
    if lam.size < 2:
        return 1.0
    if kind == "code":
        return float(1.0 - lam[-2])
    if kind == "absolute":
        return float(1.0 - max(abs(lam[-2]), abs(lam[0])))
    raise ValueError(f"unknown gap kind {kind!r}; use 'absolute' or 'code'")


def chebyshev_gamma(W=None, *, gap: float | None = None, kind: str = "code") -> float:
    """Muffliato's Chebyshev coefficient ``γ = 2(1 − sqrt(λ(1 − λ/4)))/(1 − λ/2)²`` from the gap λ."""
    lam = spectral_gap(W, kind=kind) if gap is None else float(gap)
    return 2.0 * (1.0 - math.sqrt(lam * (1.0 - lam / 4.0))) / (1.0 - lam / 2.0) ** 2


def is_periodic(W) -> bool:
    """True when W has an eigenvalue -1 (a bipartite component with no self-loops)."""
    return bool(eigenvalues(W)[0] <= -1.0 + 1e-10)


def mixing_time(W, eps: float = 0.25, max_steps: int = 100_000) -> int:
    """``τ_mix(ε) = min{t : max_v ‖W^t[v,:] − 1/n‖_TV ≤ ε}`` computed by repeated multiplication."""
    n = W.shape[0]
    Wm = W.tocsr() if sp.issparse(W) else np.asarray(W, dtype=float)
    P = np.eye(n)
    for t in range(1, max_steps + 1):
        P = np.asarray(Wm @ P) if sp.issparse(Wm) else P @ Wm
        if 0.5 * np.abs(P - 1.0 / n).sum(axis=1).max() <= eps:
            return t
    raise RuntimeError(
        f"W did not mix to {eps} within {max_steps} steps (disconnected or periodic?)"
    )
