"""Source anonymity evaluated on the *actual* graph (spec ``anonymity.md`` §3.8, §4.7, §5.4).

The paper's closed forms are a model of a random regular graph; a deployment runs on one sampled
graph whose shells ``S_i(ℓ)`` differ from node to node and whose hitting-time laws differ from the
model (short retroceding returns, erratum E9). This module computes, exactly on the given graph:

* all-pairs BFS distances, per-node shells and the graph-mean shell sizes ``Ā(ℓ)`` (decision D3);
* the destination chain ``M_ij = p_{D_i}(j) = p(ℓ_ij)/|S_i(ℓ_ij)|`` and its stationary law ``π``;
* exact mean hitting times (fundamental matrix) and the streamed first-passage pmfs
  ``F_t[i,j] = P(T_FH(i,j) = t)`` (``F_t = P · offdiag(F_{t−1})``);
* Definition 1 at node level and at distance level, with or without return-time side information;
* the *strong* adversary that sees the exact hop count ``T`` (``I(S;T|D)``, ``H(S|D=j,T=t)``,
  posteriors given ``T ≤ k``) — outside the paper's model, reported as a diagnostic.

These are *exact* evaluations on the deployed graph (labelled "exact-graph"), never DP credit.
Dense ``N×N`` arrays are used: intended for the N ≲ a few thousand of a hushnet deployment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import shortest_path
from scipy.special import xlogy

__all__ = [
    "as_adjacency",
    "distance_matrix",
    "shell_counts",
    "graph_mean_shell_sizes",
    "destination_matrix",
    "stationary_distribution",
    "transition_matrix",
    "mean_hitting_times",
    "first_passage_stream",
    "hitting_pmf_horizon",
    "window_masses",
    "window_masses_grid",
    "NodeLevelResult",
    "definition1_entropies",
    "StrongAdversaryResult",
    "strong_adversary",
    "protocol_mean_iteration_time",
    "chain_of_custody_probability",
    "mix_then_hit_information",
    "return_time_tail",
    "max_tv_to_stationary",
]


# ---------------------------------------------------------------------------------------------
# Graph structure
# ---------------------------------------------------------------------------------------------


def as_adjacency(graph: Any) -> sp.csr_matrix:
    """Symmetric 0/1 CSR adjacency from a :class:`hushnet.privacy.graphs.Graph`, a networkx graph,
    a scipy sparse matrix or a dense array (nodes of a networkx graph in sorted order)."""
    if hasattr(graph, "adjacency") and sp.issparse(getattr(graph, "adjacency")):
        adj = graph.adjacency
    elif sp.issparse(graph):
        adj = graph
    elif isinstance(graph, np.ndarray):
        adj = sp.csr_matrix(graph)
    else:  # networkx
        import networkx as nx

        adj = nx.to_scipy_sparse_array(graph, nodelist=sorted(graph.nodes()), format="csr")
    adj = sp.csr_matrix(adj, dtype=float)
    adj.setdiag(0)
    adj.eliminate_zeros()
    adj.data[:] = 1.0
    if (adj != adj.T).nnz:
        raise ValueError("the graph must be undirected (symmetric adjacency)")
    return adj


def distance_matrix(adj: sp.csr_matrix) -> np.ndarray:
    """All-pairs hop distances (int64); raises if the graph is disconnected."""
    d = shortest_path(adj, method="D", unweighted=True, directed=False)
    if not np.all(np.isfinite(d)):
        raise ValueError("the graph is disconnected; the anonymity scheme needs a connected graph")
    return d.astype(np.int64)


def shell_counts(dist: np.ndarray) -> np.ndarray:
    """``|S_i(ℓ)|`` for every node i and ℓ = 0..diam (shape ``(N, diam+1)``)."""
    n = dist.shape[0]
    diam = int(dist.max())
    counts = np.zeros((n, diam + 1), dtype=np.int64)
    rows = np.repeat(np.arange(n), n)
    np.add.at(counts, (rows, dist.ravel()), 1)
    return counts


def graph_mean_shell_sizes(dist: np.ndarray, ell1: int, ell2: int) -> np.ndarray:
    """Graph-mean ``Ā(ℓ) = mean_i |S_i(ℓ)|`` on ℓ = ell1..ell2 (decision D3)."""
    counts = shell_counts(dist)
    if ell2 >= counts.shape[1]:
        raise ValueError(f"ell2={ell2} exceeds the graph diameter {counts.shape[1] - 1}")
    return counts[:, ell1 : ell2 + 1].mean(axis=0).astype(float)


def destination_matrix(dist: np.ndarray, p: np.ndarray, ell1: int) -> np.ndarray:
    """``M_ij = p_{D_i}(j) = p̃_i(ℓ_ij)/|S_i(ℓ_ij)|`` for ``ℓ_ij ∈ [ℓ1, ℓ2]``, else 0 (§2.1, D3).

    ``p̃_i`` is ``p`` renormalised over the distances whose shell around ``i`` is non-empty.
    Rows sum to 1; ``M_ii = 0`` and neighbours get 0 because ``ℓ1 ≥ 2``.
    """
    p = np.asarray(p, dtype=float)
    ell2 = ell1 + p.size - 1
    counts = shell_counts(dist)
    width = max(counts.shape[1], ell2 + 1)
    counts = np.pad(counts, ((0, 0), (0, width - counts.shape[1])))
    band = counts[:, ell1 : ell2 + 1].astype(float)  # (N, K)
    avail = band > 0
    pt = np.where(avail, p[None, :], 0.0)
    tot = pt.sum(axis=1, keepdims=True)
    if np.any(tot <= 0):
        raise ValueError("some node has every shell in [ell1, ell2] empty")
    per_node = np.where(avail, pt / tot / np.where(avail, band, 1.0), 0.0)  # weight per node at ℓ
    in_band = (dist >= ell1) & (dist <= ell2)
    idx = np.clip(dist - ell1, 0, p.size - 1)
    return np.where(in_band, np.take_along_axis(per_node, idx, axis=1), 0.0)


def stationary_distribution(M: np.ndarray) -> np.ndarray:
    """Stationary law ``π`` of a row-stochastic matrix (left Perron vector), via a linear solve."""
    n = M.shape[0]
    A = M.T - np.eye(n)
    A[-1, :] = 1.0
    b = np.zeros(n)
    b[-1] = 1.0
    pi = np.linalg.solve(A, b)
    pi = np.clip(pi, 0.0, None)
    return pi / pi.sum()


def transition_matrix(adj: sp.csr_matrix) -> sp.csr_matrix:
    """Simple random walk ``P = D^{−1}A`` (uniform neighbour, backtracking allowed, decision D2)."""
    deg = np.asarray(adj.sum(axis=1)).ravel()
    return sp.csr_matrix(sp.diags(1.0 / deg) @ adj)


def mean_hitting_times(adj: sp.csr_matrix) -> np.ndarray:
    """Exact ``E[T_FH(i,j)]`` (off-diagonal) and mean return times ``1/π_j`` (diagonal).

    Fundamental matrix ``Z = (I − P + 1π^T)^{−1}``: ``E_ij = (Z_jj − Z_ij)/π_j`` — exact, no
    horizon truncation, unlike summing the streamed pmfs.
    """
    P = transition_matrix(adj).toarray()
    deg = np.asarray(adj.sum(axis=1)).ravel()
    pi = deg / deg.sum()
    n = P.shape[0]
    Z = np.linalg.inv(np.eye(n) - P + np.outer(np.ones(n), pi))
    E = (np.diag(Z)[None, :] - Z) / pi[None, :]
    E[np.diag_indices(n)] = 1.0 / pi
    return E


def first_passage_stream(P: sp.csr_matrix, t_max: int) -> Iterator[tuple[int, np.ndarray]]:
    """Yield ``(t, F_t)`` for t = 1..t_max with ``F_t[i,j] = P(first hit of j from i at t)``.

    ``diag(F_t)`` is the first-return pmf of j. The yielded array is reused between steps (copy it
    if you keep it). Cost per step: one sparse×dense product.
    """
    n = P.shape[0]
    F = P.toarray()
    diag = np.diag_indices(n)
    for t in range(1, t_max + 1):
        yield t, F
        G = F.copy()
        G[diag] = 0.0
        F = np.asarray(P @ G)


def hitting_pmf_horizon(n: int, c: int, tail: float = 25.0) -> int:
    """Horizon ``tail·N/c'`` after which the geometric hitting tail is below ``e^{−tail}`` (§3.8)."""
    return int(math.ceil(tail * n * (c - 1) / (c - 2)))


def window_masses(
    adj: sp.csr_matrix,
    delta: float,
    kappa_prime: float = math.inf,
    *,
    E: np.ndarray | None = None,
) -> np.ndarray:
    """``mass_ij = Σ_{t=⌈μ_ij−δ⌉}^{⌊μ_ij+δ⌋} F_t[i,j]`` with ``μ_ij = E[T_ij | T_ij ≤ κ']``.

    The window is the destination's belief interval of Definition 1; the pmf inside it is the
    unconditional one (Lemma 3). ``κ' = ∞`` centres on the exact mean.
    """
    P = transition_matrix(adj)
    n = adj.shape[0]
    if math.isinf(kappa_prime):
        mu = mean_hitting_times(adj) if E is None else E
    else:
        k = int(math.floor(kappa_prime))
        s0 = np.zeros((n, n))
        s1 = np.zeros((n, n))
        for t, F in first_passage_stream(P, k):
            s0 += F
            s1 += t * F
        with np.errstate(invalid="ignore", divide="ignore"):
            mu = np.where(s0 > 0, s1 / np.where(s0 > 0, s0, 1.0), np.nan)
    lo = np.ceil(mu - delta)
    hi = np.floor(mu + delta)
    off = ~np.eye(n, dtype=bool)
    t_hi = int(np.nanmax(np.where(off, hi, -1)))
    mass = np.zeros((n, n))
    for t, F in first_passage_stream(P, max(t_hi, 1)):
        mask = (lo <= t) & (t <= hi)
        mass += np.where(mask, F, 0.0)
    mass[~off] = 0.0
    return np.nan_to_num(mass)


def window_masses_grid(
    adj: sp.csr_matrix,
    delta: float,
    kappas: Sequence[float],
    *,
    E: np.ndarray | None = None,
) -> np.ndarray:
    """:func:`window_masses` for many side-information values ``κ'`` at once (two streamed passes
    in total instead of two per ``κ'``); shape ``(len(kappas), N, N)``."""
    P = transition_matrix(adj)
    n = adj.shape[0]
    kappas = [float(k) for k in kappas]
    finite = sorted({int(math.floor(k)) for k in kappas if math.isfinite(k)})
    mus: dict[int, np.ndarray] = {}
    if finite:
        s0 = np.zeros((n, n))
        s1 = np.zeros((n, n))
        want = set(finite)
        for t, F in first_passage_stream(P, max(finite)):
            s0 += F
            s1 += t * F
            if t in want:
                with np.errstate(invalid="ignore", divide="ignore"):
                    mus[t] = np.where(s0 > 0, s1 / np.where(s0 > 0, s0, 1.0), np.nan)
    mu_inf = None
    if any(math.isinf(k) for k in kappas):
        mu_inf = mean_hitting_times(adj) if E is None else E
    off = ~np.eye(n, dtype=bool)
    los, his = [], []
    for k in kappas:
        mu = mu_inf if math.isinf(k) else mus[int(math.floor(k))]
        los.append(np.ceil(mu - delta))
        his.append(np.floor(mu + delta))
    t_hi = int(max(np.nanmax(np.where(off, h, -1)) for h in his))
    t_lo = [float(np.nanmin(np.where(off, lo, np.inf))) for lo in los]
    t_top = [float(np.nanmax(np.where(off, h, -1))) for h in his]
    mass = np.zeros((len(kappas), n, n))
    for t, F in first_passage_stream(P, max(t_hi, 1)):
        for g in range(len(kappas)):
            if t_lo[g] <= t <= t_top[g]:
                mass[g] += np.where((los[g] <= t) & (t <= his[g]), F, 0.0)
    mass[:, ~off] = 0.0
    return np.nan_to_num(mass)


# ---------------------------------------------------------------------------------------------
# Definition 1 on the actual graph
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeLevelResult:
    """Definition-1 entropies per destination j (nats), exact on the graph.

    ``node_level[j]``: entropy of ``w_i ∝ M_ij·mass_ij`` over candidate sources i (max
    ``log Σ_ℓ A(ℓ)``). ``distance_level[j]``: entropy of ``W_j(ℓ) ∝ mean_{i∈S_j(ℓ)} w_i`` (max
    ``log K``) — the quantity the paper plots, on the real graph.
    """

    node_level: np.ndarray
    distance_level: np.ndarray
    prior: str
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def alpha(self) -> float:
        """α-privacy of Definition 1: the minimum node-level entropy over destinations."""
        return float(self.node_level.min())

    def summary(self) -> dict[str, float]:
        return {
            "node_level_min": float(self.node_level.min()),
            "node_level_mean": float(self.node_level.mean()),
            "distance_level_min": float(self.distance_level.min()),
            "distance_level_mean": float(self.distance_level.mean()),
        }


def _column_entropy(w: np.ndarray) -> np.ndarray:
    """Entropy of each column of non-negative weights (normalised per column)."""
    tot = w.sum(axis=0)
    q = w / np.where(tot > 0, tot, 1.0)
    return -xlogy(q, q).sum(axis=0)


def definition1_entropies(
    dist: np.ndarray,
    M: np.ndarray,
    mass: np.ndarray,
    ell1: int,
    ell2: int,
    *,
    prior: np.ndarray | None = None,
) -> NodeLevelResult:
    """Node- and distance-level Definition-1 entropy for every destination j.

    ``w_i(j) = prior_i · M_ij · mass_ij`` (``prior`` = None → Definition 1 as written, no prior;
    pass ``π`` for the Bayesian reading of §3.7).
    """
    w = M * mass
    if prior is not None:
        w = w * np.asarray(prior, dtype=float)[:, None]
    node_level = _column_entropy(w)
    K = ell2 - ell1 + 1
    Wd = np.zeros((K, dist.shape[0]))
    for k, ell in enumerate(range(ell1, ell2 + 1)):
        sel = dist == ell
        cnt = sel.sum(axis=0)
        Wd[k] = np.where(cnt > 0, (w * sel).sum(axis=0) / np.where(cnt > 0, cnt, 1), 0.0)
    return NodeLevelResult(
        node_level=node_level,
        distance_level=_column_entropy(Wd),
        prior="none" if prior is None else "given",
    )


# ---------------------------------------------------------------------------------------------
# Strong adversary: the destination observes the exact hop count T
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StrongAdversaryResult:
    """Posterior entropies of a destination that sees the exact ``T`` (per destination j).

    Joint law: ``x_t[i,j] = π_i M_ij F_t[i,j]``. ``h_prior[j] = H(S|D=j)``,
    ``h_given_t[j]`` a certified lower bound on ``H(S|D=j,T)`` and ``h_given_t_upper[j]`` an upper
    bound (they meet when ``tail_mass`` is 0), ``h_at_t[t][j] = H(S|D=j,T=t)``, ``p_t[t] = P(T=t)``,
    ``h_tail[j] = H(S|D=j,T≥tail_from)`` (exact), ``h_le[k][j] = H(S|D=j,T≤k)``, ``pmf_t`` = protocol
    law of T for t = 1..t_max. Aggregates weight destinations by ``π_j = P(D=j)``.
    """

    h_prior: np.ndarray
    h_given_t: np.ndarray
    h_given_t_upper: np.ndarray
    h_at_t: dict[int, np.ndarray]
    p_t: dict[int, float]
    h_tail: np.ndarray
    tail_from: int
    h_le: dict[int, np.ndarray]
    pmf_t: np.ndarray
    pi: np.ndarray
    t_max: int
    tail_mass: float

    @property
    def mutual_information(self) -> float:
        """``I(S;T|D) = Σ_j π_j (H(S|D=j) − H(S|D=j,T))`` in nats: an upper bound (exact when
        ``tail_mass`` is 0), from the lower bound on ``H(S|D=j,T)``."""
        return float(np.dot(self.pi, self.h_prior - self.h_given_t))

    @property
    def mutual_information_lower(self) -> float:
        """A lower bound on ``I(S;T|D)`` (from ``h_given_t_upper``): how much the cut-off tail could
        change the certified value."""
        return float(np.dot(self.pi, self.h_prior - self.h_given_t_upper))

    def summary(self) -> dict[str, Any]:
        return {
            "H_S_given_D_mean": float(self.h_prior.mean()),
            "H_S_given_D_T_mean": float(self.h_given_t.mean()),
            "H_S_given_D_T_mean_upper": float(self.h_given_t_upper.mean()),
            "I_S_T_given_D": self.mutual_information,
            "I_S_T_given_D_lower": self.mutual_information_lower,
            "H_at_T": {int(t): float(v.mean()) for t, v in self.h_at_t.items()},
            "P_T": {int(t): float(v) for t, v in self.p_t.items()},
            f"H_T_ge_{self.tail_from}": float(self.h_tail.mean()),
            "H_T_le": {int(k): float(v.mean()) for k, v in self.h_le.items()},
            "t_max": self.t_max,
            "tail_mass_closed": self.tail_mass,
        }


def strong_adversary(
    adj: sp.csr_matrix,
    M: np.ndarray,
    *,
    t_max: int,
    record_t: Sequence[int] = (2, 4, 10),
    tail_from: int = 50,
    le_ks: Sequence[int] = (5, 10, 20, 50, 218),
    pi: np.ndarray | None = None,
) -> StrongAdversaryResult:
    """Stream ``F_t`` to ``t_max`` and accumulate the strong adversary's posteriors.

    The tail ``t > t_max`` (mass ``tail_mass``) is not streamed, and the certified numbers do not
    guess its shape.  Every walk hits its destination, so the tail's mass per (source, destination)
    is known exactly — ``π_i M_ij − Σ_{t≤t_max} x_t[i,j]`` — which makes ``h_tail`` exact; how that
    mass splits over the values of T is not known, so ``H(S|D=j,T)`` is bracketed: the tail adds at
    least 0 (``h_given_t``, the certified lower bound, hence an upper bound on ``I(S;T|D)``) and at
    most its ``H(S|D=j, T>t_max)`` — finer conditioning only lowers entropy — (``h_given_t_upper``).
    An earlier version closed the tail with the posterior at ``t_max`` (a quasi-stationary guess):
    on graphs that mix more slowly than the horizon assumes it over-stated the entropy (0.25 nats on
    a lollipop graph; tests/privacy/test_anon_graph.py).  Cost: ``t_max`` sparse×dense steps plus
    O(N²) each.
    """
    n = M.shape[0]
    P = transition_matrix(adj)
    pi = stationary_distribution(M) if pi is None else np.asarray(pi, dtype=float)
    prior_joint = pi[:, None] * M  # π_i M_ij
    prior_joint[np.diag_indices(n)] = 0.0  # a source is never its own destination (x_t's diagonal)
    xtot = prior_joint.sum(axis=0)  # Σ_t X_t exactly (Σ_t F_t[i,j] = 1: every walk hits j)
    h_prior = _column_entropy(prior_joint)
    seen = np.zeros((n, n))  # Σ_{t≤t_max} x_t per cell
    s_xlogx = np.zeros(n)
    s_XlogX = np.zeros(n)
    s_X = np.zeros(n)
    tail_acc = np.zeros((n, n))
    le_acc = {int(k): np.zeros((n, n)) for k in le_ks if k <= t_max}
    le_done: dict[int, np.ndarray] = {}
    h_at_t: dict[int, np.ndarray] = {}
    p_t: dict[int, float] = {}
    pmf_t = np.zeros(t_max + 1)
    last_x = None
    for t, F in first_passage_stream(P, t_max):
        x = prior_joint * F
        x[np.diag_indices(n)] = 0.0
        X = x.sum(axis=0)
        s_xlogx += xlogy(x, x).sum(axis=0)
        s_XlogX += xlogy(X, X)
        s_X += X
        seen += x
        pmf_t[t] = X.sum()
        if t in record_t:
            h_at_t[t] = _column_entropy(x)
            p_t[t] = float(X.sum())
        if t >= tail_from:
            tail_acc += x
        for k, acc in le_acc.items():
            if t <= k:
                acc += x
                if t == k:
                    le_done[k] = _column_entropy(acc)
        last_x = x
    assert last_x is not None
    rest = np.clip(prior_joint - seen, 0.0, None)  # the tail's joint mass per cell, exactly
    remaining = rest.sum(axis=0)
    safe = np.where(xtot > 0, xtot, 1.0)
    h_given_t = -(s_xlogx - s_XlogX) / safe  # tail counted as 0 nats: a lower bound
    h_given_t_upper = h_given_t + remaining * _column_entropy(rest) / safe
    if tail_from <= t_max:
        tail_acc += rest
    return StrongAdversaryResult(
        h_prior=h_prior,
        h_given_t=h_given_t,
        h_given_t_upper=h_given_t_upper,
        h_at_t=h_at_t,
        p_t=p_t,
        h_tail=_column_entropy(tail_acc),
        tail_from=tail_from,
        h_le=le_done,
        pmf_t=pmf_t,
        pi=pi,
        t_max=t_max,
        tail_mass=float(remaining.sum()),
    )


def protocol_mean_iteration_time(
    M: np.ndarray, E: np.ndarray, pi: np.ndarray | None = None
) -> float:
    """Exact mean hops per update of the running protocol: ``Σ_ij π_i M_ij E[T_ij]``.

    The sources form a Markov chain with kernel ``M`` (the walk's motion does not depend on the
    choice), so ``π`` of ``M`` is the long-run law of the source (§3.7).
    """
    pi = stationary_distribution(M) if pi is None else pi
    return float(np.sum(pi[:, None] * M * E))


def chain_of_custody_probability(M: np.ndarray, pi: np.ndarray | None = None) -> float:
    """``P(destination of iteration g = source of iteration g−1) = Σ_i π_i Σ_j M_ij M_ji``.

    The "ping-pong" event of §6.6: the node then learns the exact update of the node it had itself
    chosen as destination.
    """
    pi = stationary_distribution(M) if pi is None else pi
    return float(np.sum(pi[:, None] * M * M.T))


def mix_then_hit_information(
    adj: sp.csr_matrix, M: np.ndarray, burn_in: int, *, t_max: int, pi: np.ndarray | None = None
) -> float:
    """``I(S;T|D)`` when the walk first runs ``burn_in`` hops, then stops at the first visit of
    ``j`` at or after that step ([BEYOND] mix-then-hit, §6.6; Mode B only).

    ``P(T = B+s | i→j) = (P^B H_s)[i,j]`` with ``H_0 = I`` and ``H_s = offdiag(F_s)``. The tail past
    ``t_max`` is closed as in :func:`strong_adversary`.
    """
    n = M.shape[0]
    Pm = transition_matrix(adj)
    pi = stationary_distribution(M) if pi is None else pi
    prior_joint = pi[:, None] * M
    xtot = prior_joint.sum(axis=0)
    h_prior = _column_entropy(prior_joint)
    PB = np.eye(n)
    Pd = Pm.toarray()
    for _ in range(burn_in):
        PB = PB @ Pd
    s_xlogx = np.zeros(n)
    s_XlogX = np.zeros(n)
    s_X = np.zeros(n)
    diag = np.diag_indices(n)
    H = np.eye(n)
    last_x = None
    for s in range(0, t_max + 1):
        R = PB @ H
        x = prior_joint * R
        x[diag] = 0.0
        X = x.sum(axis=0)
        s_xlogx += xlogy(x, x).sum(axis=0)
        s_XlogX += xlogy(X, X)
        s_X += X
        last_x = x
        G = np.asarray(Pm @ H)
        G[diag] = 0.0
        H = G
    assert last_x is not None
    remaining = np.clip(xtot - s_X, 0.0, None)
    h_given_t = -(s_xlogx - s_XlogX) / xtot + remaining * _column_entropy(last_x) / xtot
    return float(np.dot(pi, h_prior - h_given_t))


def return_time_tail(
    adj: sp.csr_matrix, ts: Sequence[int], *, condition_ge: int = 1
) -> dict[int, float]:
    """Exact ``P(T_FR ≥ t | T_FR ≥ condition_ge)`` of the first return time, pooled over nodes.

    Compare with eq. (6) (erratum E9: on a real graph short retroceding returns make the
    conditioned tail lighter than the model's, so the ``1−δ'`` coverage of ``t1`` is optimistic).
    Pooled = ``Σ_j P_j(T ≥ t) / Σ_j P_j(T ≥ condition_ge)`` (for a regular graph every node is
    equally likely to be the destination under the stationary walk).
    """
    P = transition_matrix(adj)
    n = adj.shape[0]
    t_hi = max(max(ts), condition_ge)
    cdf_before = np.zeros(t_hi + 2)  # cdf_before[t] = Σ_j P_j(T_FR < t)
    acc = 0.0
    for t, F in first_passage_stream(P, t_hi):
        cdf_before[t] = acc
        acc += float(np.trace(F))
    cdf_before[t_hi + 1] = acc
    ge = lambda t: n - cdf_before[t]  # noqa: E731  Σ_j P_j(T ≥ t)
    return {int(t): float(ge(t) / ge(condition_ge)) for t in ts}


def max_tv_to_stationary(adj: sp.csr_matrix, steps: int) -> float:
    """``max_i TV(P^steps(i,·), π_rw)`` — how far a burn-in of ``steps`` hops is from mixed."""
    P = transition_matrix(adj)
    deg = np.asarray(adj.sum(axis=1)).ravel()
    pi = deg / deg.sum()
    R = np.eye(adj.shape[0])
    for _ in range(steps):
        R = np.asarray(R @ P)
    return float(0.5 * np.abs(R - pi[None, :]).sum(axis=1).max())
