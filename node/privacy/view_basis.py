"""Orthonormal bases of an observer's view space grown without explicit long products.

Gossip views are spans of rows of products of averaging matrices (``e_wᵀ W_{t−1}⋯W_0``).  Factorising
those rows explicitly loses directions: the products are badly conditioned, and the directions an
SVD misses exist in exact arithmetic, so the projection ``‖Π e_u‖²`` (the squared sensitivity) comes
out too small.  The helpers here grow orthonormal bases one step at a time (block Arnoldi, forwards
or backwards in time), the accountants of :mod:`hushnet.privacy.muffliato` and
:mod:`hushnet.families.gossip.realised` build on them, and tests pin the dimensions to exact
arithmetic modulo a prime.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "NEW_DIRECTION_RTOL",
    "IMAGE_ATOL",
    "svd_basis",
    "extend_basis",
    "pairwise_view_basis",
]

#: a view direction whose residual, after orthogonalisation against the basis grown so far, is shorter
#: than this is counted as already present — the rule of the public-W block Arnoldi
#: (:func:`hushnet.privacy.muffliato.krylov_weights`, selectors have unit norm, ‖C_k‖ ≤ 3)
NEW_DIRECTION_RTOL = 1e-9
#: singular values of ``C_kᵀ Q`` (Q orthonormal) at or below this are directions the step annihilates
#: (a singular W_t, e.g. J/n); genuine ones are ≥ σ_min(C_k), far above it
IMAGE_ATOL = 1e-13


def svd_basis(X: np.ndarray, tol: float) -> np.ndarray:
    """Orthonormal basis of the column space of X, dropping singular values ≤ ``tol`` (absolute)."""
    if X.shape[1] == 0:
        return X
    try:
        U, sv, _ = np.linalg.svd(X, full_matrices=False)
    except np.linalg.LinAlgError:
        import scipy.linalg as sla

        U, sv, _ = sla.svd(X, full_matrices=False, lapack_driver="gesvd")
    return U[:, sv > tol]


def extend_basis(Q: np.ndarray, E: np.ndarray) -> np.ndarray:
    """``Q`` plus the directions of ``E`` it lacks (residual > :data:`NEW_DIRECTION_RTOL`), orthonormal."""
    X = E.astype(float, copy=True)
    if Q.shape[1]:
        for _ in range(2):  # "twice is enough"
            X -= Q @ (Q.T @ X)
    new = svd_basis(X, NEW_DIRECTION_RTOL)
    if not new.shape[1]:
        return Q
    if Q.shape[1]:
        new -= Q @ (Q.T @ new)
        new = svd_basis(new, 0.5)
    return np.concatenate([Q, new], axis=1)


def pairwise_view_basis(steps: list, n: int, v: int, refresh: int = 64) -> np.ndarray:
    """Orthonormal basis of observer v's view space for the activations ``steps`` (backwards in time).

    When both ends average, ``A_tᵀ`` replaces rows a and b of the basis by their mean: the Gram matrix
    becomes ``I − ½ddᵀ`` (``d = Q[a] − Q[b]``), so one direction shrinks to ``ρ = ‖(I − QQᵀ)(e_a − e_b)‖/√2``
    — the distance of ``e_a − e_b`` (the direction ``A_tᵀ`` annihilates) from the basis' span, computed
    directly, not as ``√(1 − ½‖d‖²)`` (which would turn rounding into 1e-8).  It is rescaled by ``1/ρ``, or
    dropped when ``ρ`` is below :data:`NEW_DIRECTION_RTOL`.  One-sided steps (a dropout) and every
    ``refresh`` steps: a full re-orthonormalisation."""
    Q = np.zeros((n, 0))
    since = 0
    for _t, a, b, ua, ub, sa, sb in reversed(steps):
        if Q.shape[1] and (ua or ub):
            qa, qb = Q[a].copy(), Q[b].copy()
            if ua and ub:
                d = qa - qb
                nd = float(np.linalg.norm(d))
                Q[a] = Q[b] = 0.5 * (qa + qb)
                if nd > 1e-15:
                    z = np.zeros(n)
                    z[a], z[b] = 1.0, -1.0
                    r = z - _old_basis_times(Q, qa, qb, a, b, d)
                    rho = float(np.linalg.norm(r)) / math.sqrt(2.0)
                    dh = d / nd
                    Yd = Q @ dh
                    if rho <= NEW_DIRECTION_RTOL:
                        w = dh.copy()
                        w[0] += 1.0 if dh[0] >= 0 else -1.0
                        w /= np.linalg.norm(w)
                        H = np.eye(dh.size) - 2.0 * np.outer(w, w)  # H dh = ∓e_1
                        Q = (Q - np.outer(Yd, dh)) @ H[:, 1:]
                    else:
                        Q = Q + (1.0 / rho - 1.0) * np.outer(Yd, dh)
            else:
                end, other = (a, b) if ua else (b, a)
                Q[end] = 0.5 * qa if end == a else 0.5 * qb
                Q[other] = (qb if other == b else qa) + 0.5 * (qa if end == a else qb)
                Q = svd_basis(Q, IMAGE_ATOL)
                since = 0
        cols = []
        if v == a and sb:
            cols.append(b)
        if v == b and sa:
            cols.append(a)
        if cols:
            E = np.zeros((n, len(cols)))
            E[cols, np.arange(len(cols))] = 1.0
            Q = extend_basis(Q, E)
        since += 1
        if since >= refresh and Q.shape[1]:
            Q = svd_basis(Q, IMAGE_ATOL)
            since = 0
    return Q


def _old_basis_times(
    Q: np.ndarray, qa: np.ndarray, qb: np.ndarray, a: int, b: int, d: np.ndarray
) -> np.ndarray:
    """``Q_old Q_oldᵀ (e_a − e_b)`` where ``Q_old`` is ``Q`` with rows a, b restored to ``qa``, ``qb``."""
    out = Q @ d
    out[a] = qa @ d
    out[b] = qb @ d
    return out
