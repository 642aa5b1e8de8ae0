"""Muffliato (Cyffers et al., NeurIPS 2022) bounds as printed: Theorem 1, Corollaries 1/2, Theorem 4.

**Not guarantees.**  [M] Theorem 1 adds up the Rényi divergences of the individual messages as if
they were independent; they share the noise η, and the observer can do far better by combining
them (docs/design/spec/gossip.md §1.3.9: the observer recovers the antipode's noisy input exactly on the
paper's own hypercube setting).  The certified accountant is :mod:`hushnet.privacy.muffliato`; it
calls these only to show a labelled reproduction (``bound="paper"``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

from hushnet.privacy.muffliato import _adjacency, _csr, _neighbours, gossip_rows

__all__ = [
    "thm1_matrix",
    "thm1_from_source",
    "thm1_schedule_matrix",
    "thm1_to_observer",
    "cor1_matrix",
    "cor2_column",
    "thm4_er_bound",
]


def thm1_matrix(W, T: int, *, convention: str = "paper") -> np.ndarray:
    """[M] eq. (6) without the α Δ²/2σ² factor: ``F[u, v] = Σ_t Σ_{w∈N(v)} P_t[w,u]²/‖P_t[w,:]‖²``.

    Row u = source, column v = observer.  ``convention="paper"`` sums t = 0..T−1 (``W_{0:0} = I``,
    the theorem); ``"code"`` sums t = 1..T as the reference code's averaging figures do.
    Unclipped; O(T·nnz(W)·n) time and O(n²) memory (docs/design/spec/gossip.md §1.3.1).
    """
    if convention not in ("paper", "code"):
        raise ValueError("convention must be 'paper' or 'code'")
    Wc = _csr(W)
    n = Wc.shape[0]
    A = _adjacency(Wc)
    P = np.eye(n) if convention == "paper" else Wc.toarray()
    F = np.zeros((n, n))
    for _t in range(T):
        F += _thm1_term(A, P)
        P = np.asarray(Wc @ P)
    return F.T.copy()


def _thm1_term(A: sp.csr_matrix, P: np.ndarray) -> np.ndarray:
    """``A C`` with ``C[w,u] = P[w,u]²/‖P[w,:]‖²`` (row = observer v, column = source u)."""
    sq = P * P
    norms = sq.sum(axis=1)
    C = sq / np.where(norms > 0, norms, 1.0)[:, None]
    return np.asarray(A @ C)


def thm1_from_source(
    W,
    source: int,
    T: int,
    *,
    convention: str = "paper",
    eig: tuple[np.ndarray, np.ndarray] | None = None,
    norms: Sequence[np.ndarray] | None = None,
    adjacency: sp.csr_matrix | None = None,
) -> np.ndarray:
    """Theorem 1 from one source to every observer (unit-free), for fixed symmetric W.

    ``f(u → v) = Σ_t Σ_{w∈N(v)} (W^t)_{w,u}² / ‖(W^t)_{w,:}‖²``.  Column u of ``W^t`` comes from
    sparse propagation; the row norms are ``(W^{2t})_{ww} = Σ_k Q_wk² λ_k^{2t}`` from one
    eigendecomposition, so nothing n×n is multiplied per step (grid 45×45 with T = 243 in ~2 s).

    What depends on W only may be given, computed once for every source (:func:`thm1_parts`: a host's
    nodes each show this row in their report, issue 12): ``norms[t]`` the row norms at each ``t`` of the
    sum (then ``eig`` is not needed) and ``adjacency``; the result is the same, bit for bit.
    """
    if convention not in ("paper", "code"):
        raise ValueError("convention must be 'paper' or 'code'")
    Wc = _csr(W)
    n = Wc.shape[0]
    if norms is None:
        lam, Q = (
            np.linalg.eigh(Wc.toarray()) if eig is None else eig
        )  # reuse across sources if given
        Q2 = Q * Q
    A = _adjacency(Wc) if adjacency is None else adjacency
    col = np.zeros(n)
    col[source] = 1.0
    ts = range(T) if convention == "paper" else range(1, T + 1)
    acc = np.zeros(n)
    t_prev = 0
    for t in ts:
        for _ in range(t - t_prev):
            col = np.asarray(Wc @ col)
        t_prev = t
        nt = Q2 @ (lam ** (2 * t)) if norms is None else norms[t]
        acc += col * col / np.where(nt > 0, nt, 1.0)
    f = np.asarray(A @ acc)
    f[source] = 0.0
    return f


def thm1_parts(
    W, T: int, eig: tuple[np.ndarray, np.ndarray], *, convention: str = "paper"
) -> tuple[list[np.ndarray], sp.csr_matrix]:
    """What :func:`thm1_from_source` computes from W alone, for sums up to ``T``: the row norms at every
    ``t`` (indexed by t) and the adjacency — the same arrays it would compute, to be passed back to it."""
    lam, Q = eig
    Q2 = Q * Q
    ts = range(T) if convention == "paper" else range(T + 1)
    return [Q2 @ (lam ** (2 * t)) for t in ts], _adjacency(_csr(W))


def thm1_schedule_matrix(
    products: Sequence[np.ndarray], adjacencies: Sequence[sp.spmatrix]
) -> np.ndarray:
    """Theorem 1 for time-varying graphs: ``products[t] = W_{0:t}``, ``adjacencies[t]`` = E_t.

    Row w / column u of ``W_{0:t}`` (docs/design/spec/gossip.md §1.3.1 FIX), summed over ``{v,w} ∈ E_t``.  Source-major.
    """
    n = products[0].shape[0]
    F = np.zeros((n, n))
    for P, A in zip(products, adjacencies):
        A = sp.csr_matrix(A, dtype=float)
        A.setdiag(0.0)
        A.eliminate_zeros()
        F += _thm1_term(A, np.asarray(P, dtype=float))
    return F.T.copy()


def cor1_matrix(W, T: int) -> np.ndarray:
    """[M] Corollary 1 (random-walk form), unit-free: ``n·max_{w∼v} W_vw^{-2} Σ_{t=1..T} (W^t)_{u,v}²``."""
    Wc = _csr(W)
    n = Wc.shape[0]
    Wd = Wc.toarray()
    maxinv = np.zeros(n)
    for v in range(n):
        nb = _neighbours(Wc, v)
        maxinv[v] = np.max(1.0 / Wd[v, nb] ** 2) if nb.size else 0.0
    P = np.eye(n)
    acc = np.zeros((n, n))
    for _t in range(T):
        P = Wd @ P
        acc += P * P
    return n * acc * maxinv[None, :]


def thm4_er_bound(
    W, source: int, T: int, alpha: float, sigma: float, q: float, delta_sens: float = 1.0
) -> np.ndarray:
    """[M] Theorem 4 per observer (paper value): LDP for neighbours of the source, else
    ``α Δ² T d_v/(σ² (n − d_v))`` capped at LDP.  Requires ``σ² ≥ Δ² α(α−1)/2`` (checked)."""
    if sigma**2 < delta_sens**2 * alpha * (alpha - 1) / 2:
        raise ValueError("Theorem 4 needs sigma^2 >= Delta^2 alpha (alpha-1)/2")
    Wc = _csr(W)
    n = Wc.shape[0]
    A = _adjacency(Wc)
    d = np.asarray(A.sum(axis=1)).ravel()
    ldp = alpha * delta_sens**2 / (2 * sigma**2)
    out = np.minimum(alpha * delta_sens**2 * T * d / (sigma**2 * (n - d)), ldp)
    nb = _neighbours(Wc, source)
    out[nb] = ldp
    out[source] = 0.0
    return out


def thm1_to_observer(
    Wc: sp.csr_matrix, observer: int, T: int, convention: str = "paper"
) -> np.ndarray:
    """Theorem 1 from every source to one observer (unit-free; only the observer's neighbours'
    rows are propagated).  ``convention="code"`` multiplies once more, as the reference code does."""
    nb = _neighbours(Wc, observer)
    if convention == "paper":
        Y = gossip_rows(Wc, nb, T)
    elif convention == "code":
        Y = gossip_rows(Wc, nb, T, extra_multiply=True)
    else:
        raise ValueError("convention must be 'paper' or 'code'")
    sq = Y * Y
    norms = sq.sum(axis=1, keepdims=True)
    F = (sq / np.where(norms > 0, norms, 1.0)).sum(axis=(0, 2))
    F[observer] = 0.0
    return F


def cor2_column(R: np.ndarray) -> np.ndarray:
    """[M] Corollary 2 (Theorem 1 per message of randomized Muffliato): the observer's received
    rows ``R`` (messages × sources) → unit-free loss from every source."""
    c = (R * R) / (R * R).sum(axis=1, keepdims=True)
    return c.sum(axis=0)
