"""Exact privacy of linear-Gaussian views ``O = A z + B ζ`` (docs/design/spec/gossip.md §3).

Every gossip protocol hushnet runs (Muffliato averaging, Muffliato-GD rounds, Koskela–Kulkarni
streaming gossip) hands an observer a view that is linear in the private contributions ``z`` plus
Gaussian noise ``ζ ~ N(0, σ² I)`` that the observer does not know.  For two neighbouring inputs
the view is a pair of Gaussians with the same covariance ``σ² B Bᵀ``, so the privacy loss is
*exactly* that of a one-dimensional Gaussian mechanism with squared sensitivity

    Δ² = max_{δz ∈ C_j} (A δz)ᵀ (B Bᵀ)⁺ (A δz)            ([K] Lemma 6, Theorem 12)

and Δ = ∞ when ``A δz`` leaves ``range(B)`` (the observer then separates the two inputs with
certainty).  This is why hushnet calls these numbers *certified*: no composition theorem or
marginal-by-marginal bound is involved, unlike [M] Theorem 1 (see §1.3.9 of the spec).

The module holds the generic machinery; ``muffliato.py`` and ``koskela.py`` build ``A`` and ``B``.
All-pairs results are :class:`hushnet.privacy.matrix.PrivacyMatrix`, the type every accountant returns.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hushnet.privacy import conversions

__all__ = [
    "LinearGaussianView",
    "RANK_RTOL",
    "RANGE_RTOL",
    "orthonormal_range",
    "projection_weights",
    "box_quadratic_max",
    "sdp_box_bound",
    "gaussian_loss",
    "rdp_of",
    "mu_of",
    "epsilon_of",
]

#: relative threshold on singular values below which a direction counts as numerically absent.
#: Muffliato/Koskela Gram matrices show a gap of ~8 orders of magnitude around it (docs/design/spec/gossip.md §1.3.9).
RANK_RTOL = 1e-9
#: relative residual above which a mean shift is declared outside ``range(B)`` (⇒ Δ = ∞).
RANGE_RTOL = 1e-7
#: :class:`LinearGaussianView`'s own cuts, at a small multiple of rounding rather than at "numerically
#: small": a noise direction of relative size 1e-10 is *present* (dropping it certified B = diag(1, 1e-10),
#: A = (1, 1e-8)ᵀ at Δ² = 1 instead of 1 + 1e4), and a mean shift 1e-8 outside range(B) is seen without
#: noise (Δ = ∞, not the in-range part).  Keeping a doubtful direction errs on the safe side.
VIEW_RANK_RTOL = 1e-13
VIEW_RANGE_RTOL = 1e-11


# --------------------------------------------------------------------------------------------
# result type
# --------------------------------------------------------------------------------------------
# --------------------------------------------------------------------------------------------
# conversions of a squared sensitivity (in units of the noise: Δ²/σ² once divided by σ²)
# --------------------------------------------------------------------------------------------
def rdp_of(alpha: float | np.ndarray, sens_sq, sigma: float) -> np.ndarray | float:
    """Rényi DP ``α Δ² / (2σ²)`` of a Gaussian view (∞ stays ∞)."""
    with np.errstate(invalid="ignore"):
        return conversions.gaussian_rdp(alpha, np.asarray(sens_sq, dtype=float) / sigma**2)


def mu_of(sens_sq, sigma: float) -> np.ndarray | float:
    """μ-GDP parameter ``Δ/σ`` ([K] Lemma 4)."""
    return np.sqrt(np.asarray(sens_sq, dtype=float)) / sigma


def epsilon_of(sens_sq: float, sigma: float, delta: float) -> float:
    """Tight (ε, δ) of the Gaussian mechanism with sensitivity Δ and noise σ (via μ-GDP)."""
    return conversions.gdp_epsilon(float(mu_of(sens_sq, sigma)), delta)


def gaussian_loss(
    sens_sq: float, alpha: float, sigma: float, delta: float | None = None, **labels: Any
) -> dict:
    """One pair's loss report: RDP at ``alpha``, μ-GDP and, with ``delta``, tight ε; labelled."""
    s = float(sens_sq)
    out: dict[str, Any] = {
        "rdp": float(rdp_of(alpha, s, sigma)),
        "alpha": float(alpha),
        "sigma": float(sigma),
        "sensitivity_sq": s,
        "mu_gdp": float(mu_of(s, sigma)),
    }
    if delta is not None:
        out["delta"] = float(delta)
        out["epsilon"] = epsilon_of(s, sigma, delta)
        out["epsilon_conversion"] = "tight Gaussian (mu-GDP)"
    out.update(labels)
    return out


# --------------------------------------------------------------------------------------------
# linear algebra
# --------------------------------------------------------------------------------------------
def orthonormal_range(B: np.ndarray, rtol: float = RANK_RTOL) -> tuple[np.ndarray, np.ndarray]:
    """``(U_r, s_r)``: an orthonormal basis of ``range(B)`` and the matching singular values."""
    B = np.asarray(B, dtype=float)
    if B.size == 0:
        return np.zeros((B.shape[0], 0)), np.zeros(0)
    U, s, _ = np.linalg.svd(B, full_matrices=False)
    keep = s > rtol * (s[0] if s.size else 0.0)
    return U[:, keep], s[keep]


def projection_weights(M: np.ndarray, rtol: float = RANK_RTOL) -> np.ndarray:
    """``‖Π e_u‖²`` for every u, Π the orthogonal projector onto the column space of ``M`` (n×r).

    For a view ``O = Mᵀ(z + ζ)`` (same matrix for signal and noise: Muffliato averaging, spec
    §1.3.9) this is the squared sensitivity of every coordinate u at once ([K] Lemma 6).  It is a
    projection, so it lies in [0, 1] and *grows* with the subspace: counting a doubtful direction
    errs on the safe (larger) side.

    Computed through r×r Gram matrices (BLAS-3; fast for r ≪ n) in two passes so the squared
    condition number of the Gram matrix does not decide the rank: pass one takes the clearly
    present directions (eigenvalue > 1e-12 of the top) and re-orthonormalises them; pass two
    looks for what is left in the residual ``M − QQᵀM`` and keeps directions whose singular value
    exceeds ``rtol·‖M‖₂`` (the same rule as an SVD with relative tolerance ``rtol``).
    """
    M = np.asarray(M, dtype=float)
    n, r = M.shape
    if r == 0:
        return np.zeros(n)
    if r > n:
        return _projection_weights_wide(M, rtol)
    lam, U = np.linalg.eigh(M.T @ M)
    top = float(lam[-1])
    if top <= 0.0:
        return np.zeros(n)
    keep = lam > 1e-12 * top
    Q = (M @ U[:, keep]) / np.sqrt(lam[keep])
    Q = _reorthonormalise(Q)
    resid = M - Q @ (Q.T @ M)
    lam_r, U_r = np.linalg.eigh(resid.T @ resid)
    extra = lam_r > (rtol**2) * top
    if extra.any():
        Q2 = (resid @ U_r[:, extra]) / np.sqrt(lam_r[extra])
        Q2 -= Q @ (Q.T @ Q2)
        Q2 = _reorthonormalise(Q2)
        Q = np.concatenate([Q, Q2], axis=1)
    return np.einsum("ij,ij->i", Q, Q)


def _projection_weights_wide(M: np.ndarray, rtol: float) -> np.ndarray:
    """Same as :func:`projection_weights` when there are more rows in the view than sources:
    work with the n×n Gram ``M Mᵀ`` (its eigenvectors are orthonormal already), then the same
    residual pass for directions the squared spectrum could not resolve."""
    lam, U = np.linalg.eigh(M @ M.T)
    top = float(lam[-1])
    if top <= 0.0:
        return np.zeros(M.shape[0])
    Q = U[:, lam > 1e-12 * top]
    resid = M - Q @ (Q.T @ M)
    lam_r, U_r = np.linalg.eigh(resid @ resid.T)
    extra = lam_r > (rtol**2) * top
    if extra.any():
        Q2 = U_r[:, extra]
        Q2 -= Q @ (Q.T @ Q2)
        Q = np.concatenate([Q, _reorthonormalise(Q2)], axis=1)
    return np.einsum("ij,ij->i", Q, Q)


def _reorthonormalise(Q: np.ndarray) -> np.ndarray:
    """One Gram pass on nearly orthonormal columns (Cholesky-QR2's second step); drops collapses."""
    if Q.shape[1] == 0:
        return Q
    lam, U = np.linalg.eigh(Q.T @ Q)
    good = lam > 0.25
    return (Q @ U[:, good]) / np.sqrt(lam[good])


def box_quadratic_max(M: np.ndarray, exact_limit: int = 20, tol: float = 1e-12) -> dict[str, Any]:
    """Certified ``max cᵀMc`` over per-round contributions of norm ≤ 1, scalar *or vector* ([K] §2.3).

    Why vectors matter: a model's contribution in round t is a vector ``x_t ∈ R^d`` with
    ``‖x_t‖ ≤ 1`` and the noise is i.i.d. per coordinate, so the view splits into d independent
    scalar views and ``Δ² = Σ_{s,t} M_st ⟨x_s, x_t⟩ = tr(M X)`` with ``X`` the Gram matrix of the
    contributions: ``X ⪰ 0``, ``diag X ≤ 1``.  The maximum over that set is the SDP relaxation of
    the Boolean program, which can exceed the vertex maximum over ``c ∈ {±1}^T`` (ring 8, T = 4:
    vertex 3.75993, unit vectors in the plane 3.76028).  So the *certified* ``value`` is always an
    upper bound of the vector maximum, whatever the model's dimension:

    * ``spectral`` (``T λmax``) and ``abs`` (``1ᵀ|M|1``) are valid for vectors (``tr(MX) ≤
      λmax tr X`` and ``|X_ij| ≤ 1``); both are dual-feasible points of the SDP below;
    * ``sdp``: a dual certificate ``Σ y_i`` with ``Diag(y) ⪰ M`` (so ``tr(MX) ≤ tr(Diag(y) X) ≤
      Σ y_i``), ``y`` read off a Burer–Monteiro ascent and made feasible by an exact eigenvalue
      shift — valid even if the ascent has not converged;
    * ``vector_lower``: that ascent's value, attained by unit vectors (of dimension ``rank``).

    ``value = min(spectral, abs, sdp)``.  It is *exact* (``exact`` set, for scalar and vector
    contributions alike) only where a certificate proves scalar and vector maxima agree:
    M entrywise non-negative (then ``tr(MX) ≤ Σ M_ij = 1ᵀM1``, attained by c = 1), or the vertex
    maximum (``scalar``: enumerated when ``T ≤ exact_limit``) meets ``value`` (always for T ≤ 2).
    Otherwise ``exact`` is None and ``method`` names the upper bound that won; ``scalar`` (the
    maximum for scalar models only) and ``lower`` (c = 1) are reported, never used as a guarantee.
    """
    M = np.asarray(M, dtype=float)
    M = 0.5 * (M + M.T)
    T = M.shape[0]
    keys = ("lower", "spectral", "abs", "sdp", "vector_lower", "scalar", "exact", "value")
    if T == 0:
        return {**{k: 0.0 for k in keys}, "method": "exact", "rank": 0}
    if not np.all(np.isfinite(M)):
        return {**{k: math.inf for k in keys}, "method": "infinite", "rank": 0}
    ones = np.ones(T)
    lower = float(ones @ M @ ones)
    spectral = float(T * max(np.linalg.eigvalsh(M)[-1], 0.0))
    absb = float(np.abs(M).sum())
    scale = max(np.abs(M).max(), 1e-300)
    out: dict[str, Any] = {
        "lower": lower,
        "spectral": spectral,
        "abs": absb,
        "sdp": None,
        "vector_lower": None,
        "scalar": None,
        "exact": None,
        "rank": None,
    }
    if np.all(M >= -tol * scale):
        out.update(
            scalar=lower,
            exact=lower,
            value=max(lower, 0.0),
            vector_lower=lower,
            rank=1,
            method="exact (non-negative M: c = 1 is optimal for scalar and vector contributions)",
        )
        return out
    if T <= exact_limit:
        out["scalar"] = _enumerate_vertices(M)
    # the ascent costs O(T²k) a step: long horizons get fewer steps (the certificate stays valid, only looser)
    sdp, vec_lower, rank = sdp_box_bound(M, max_iter=2000 if T <= 64 else 300)
    out.update(sdp=sdp, vector_lower=vec_lower, rank=rank)
    bounds = {
        "spectral": spectral,
        "abs": absb,
        "sdp (vector contributions, dual certificate)": sdp,
    }
    method = min(bounds, key=bounds.get)
    value = max(float(bounds[method]), 0.0)
    scalar = out["scalar"]
    if scalar is not None and scalar >= value - 1e-12 * max(abs(value), 1e-300):
        out.update(
            exact=value,
            method="exact (vertex maximum meets an upper bound valid for vector contributions)",
        )
    elif vec_lower >= value - 1e-7 * max(abs(value), 1e-300):
        method += f"; tight for vector contributions of dimension >= {rank}"
        out["method"] = method
    else:
        out["method"] = method
    out["value"] = value
    return out


def sdp_box_bound(
    M: np.ndarray,
    max_iter: int = 2000,
    gap_rtol: float = 1e-9,
    check_every: int = 20,
    seed: int = 0,
) -> tuple[float, float, int]:
    """``(upper, lower, rank)`` for ``max {tr(MX) : X ⪰ 0, diag X ≤ 1}`` (M PSD, T×T).

    ``lower``: Burer–Monteiro ascent ``V ← rownormalise((M − λmin I) V)`` with ``k ≈ √(2T)``
    columns (rank-k optima of this SDP are global for such k, generically); each step cannot
    decrease ``tr(VᵀMV)`` (on unit rows the shift changes it by a constant, the shifted objective is
    convex in V and the step maximises its linearisation), and ``VVᵀ`` is a feasible X, so ``lower``
    is attained by unit vectors in ``R^k``.  ``upper``: the dual ``min Σy s.t. Diag(y) ⪰ M``.  At the
    optimum ``y_i = (MX)_ii``; any y becomes feasible after ``y ← y − λmin(Diag(y) − M)``, so
    ``upper = Σy − T·λmin`` is a valid bound whether or not the ascent converged (plus a margin for
    the eigenvalue solver's backward error).  The ascent stops once the two meet (``gap_rtol``).
    """
    M = 0.5 * (np.asarray(M, dtype=float) + np.asarray(M, dtype=float).T)
    T = M.shape[0]
    k = min(T, int(math.ceil(math.sqrt(2.0 * T))) + 1)
    V = np.random.default_rng(seed).standard_normal((T, k))
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    # shifting by λmin(M) ≥ 0 keeps the iterated form PSD (every step still ascends) and speeds the
    # ascent up when M is close to a multiple of I (streaming gossip's M often is)
    Ms = M - float(np.linalg.eigvalsh(M)[0]) * np.eye(T)
    eps = np.finfo(float).eps
    upper, lower = math.inf, 0.0
    for it in range(1, max_iter + 1):
        G = Ms @ V
        V = G / np.maximum(np.linalg.norm(G, axis=1, keepdims=True), 1e-300)
        if it % check_every and it != max_iter:
            continue
        MV = M @ V
        y = np.einsum("ij,ij->i", V, MV)  # (M X)_ii: the dual point complementary to X = VVᵀ
        lower = max(lower, float(y.sum()))
        D = np.diag(y) - M
        lam = float(np.linalg.eigvalsh(D)[0])
        upper = min(upper, float(y.sum() - T * (lam - 8.0 * T * eps * float(np.linalg.norm(D)))))
        if upper - lower <= gap_rtol * abs(upper):
            break
    return upper, lower, int(np.linalg.matrix_rank(V, tol=1e-8))


def _enumerate_vertices(M: np.ndarray, chunk: int = 1 << 16) -> float:
    """Brute force over the 2^(T-1) sign vectors with c_0 = +1 (c and −c give the same value)."""
    T = M.shape[0]
    best = -math.inf
    rest = T - 1
    total = 1 << rest
    for start in range(0, total, chunk):
        idx = np.arange(start, min(start + chunk, total), dtype=np.int64)
        bits = ((idx[:, None] >> np.arange(rest, dtype=np.int64)) & 1).astype(float)
        C = np.concatenate([np.ones((idx.size, 1)), 1.0 - 2.0 * bits], axis=1)
        vals = np.einsum("ij,jk,ik->i", C, M, C)
        best = max(best, float(vals.max()))
    return best


# --------------------------------------------------------------------------------------------
# the generic view
# --------------------------------------------------------------------------------------------
@dataclass
class LinearGaussianView:
    """A view ``O = A z + B ζ`` with ``ζ ~ N(0, σ² I)`` unknown to the observer.

    ``A`` is k×p (k observed numbers, p contributions), ``B`` is k×q (q unknown noise draws).
    Noise the observer knows (its own, SecLDP) must already be removed from ``B``: known noise
    is a known offset and protects nobody.
    """

    A: np.ndarray
    B: np.ndarray
    rtol: float = VIEW_RANK_RTOL
    _basis: tuple[np.ndarray, np.ndarray] | None = field(default=None, init=False, repr=False)

    def _range(self) -> tuple[np.ndarray, np.ndarray]:
        if self._basis is None:
            self._basis = orthonormal_range(self.B, self.rtol)
        return self._basis

    def whiten(self, shifts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(Σ_r⁻¹ U_rᵀ A δz, out_of_range)`` for the columns δz of ``shifts`` (p×m)."""
        U, s = self._range()
        a = np.asarray(self.A, dtype=float) @ np.asarray(shifts, dtype=float)
        if a.ndim == 1:
            a = a[:, None]
        coef = U.T @ a
        resid = np.linalg.norm(a - U @ coef, axis=0)
        norm = np.linalg.norm(a, axis=0)
        out = resid > VIEW_RANGE_RTOL * np.maximum(norm, 1e-300)
        out &= norm > 0
        return coef / s[:, None], out

    def sensitivity_sq(self, shifts: np.ndarray) -> np.ndarray:
        """``(Aδz)ᵀ(BBᵀ)⁺(Aδz)`` per column of ``shifts``; ``inf`` where ``Aδz ∉ range(B)``."""
        z, out = self.whiten(shifts)
        val = np.einsum("ij,ij->j", z, z)
        val[out] = np.inf
        return val

    def coordinate_sensitivity_sq(self, j: int, scale: float = 1.0) -> float:
        """Δ² for a change of contribution j by ``scale`` (a single Gaussian-mechanism release)."""
        e = np.zeros(self.A.shape[1])
        e[j] = scale
        return float(self.sensitivity_sq(e[:, None])[0])

    def block_matrix(self, columns: list[int] | np.ndarray) -> np.ndarray:
        """``M = Gᵀ(BBᵀ)⁺G`` for ``G = A[:, columns]`` (T×T), ``inf`` everywhere if out of range."""
        cols = np.asarray(columns, dtype=int)
        E = np.zeros((self.A.shape[1], cols.size))
        E[cols, np.arange(cols.size)] = 1.0
        z, out = self.whiten(E)
        if out.any():
            return np.full((cols.size, cols.size), np.inf)
        return z.T @ z

    def box_sensitivity_sq(
        self, columns: list[int] | np.ndarray, exact_limit: int = 20
    ) -> dict[str, Any]:
        """Δ² when contributions ``columns`` may each change by at most 1 ([K] Theorem 12)."""
        return box_quadratic_max(self.block_matrix(columns), exact_limit=exact_limit)


def brute_force_sensitivity_sq(
    A: np.ndarray, B: np.ndarray, shift: np.ndarray, rcond: float = 1e-10
) -> float:
    """Reference implementation with ``pinv`` (slow, for tests and the dense baseline)."""
    a = np.asarray(A, float) @ np.asarray(shift, float)
    K = np.asarray(B, float) @ np.asarray(B, float).T
    Kp = np.linalg.pinv(K, rcond=rcond, hermitian=True)
    proj = K @ Kp @ a
    if np.linalg.norm(a - proj) > 1e-6 * max(np.linalg.norm(a), 1e-300):
        return math.inf
    return float(a @ Kp @ a)


def sign_vectors(T: int):
    """All c ∈ {±1}^T with c_0 = +1 (tests)."""
    for rest in itertools.product((1.0, -1.0), repeat=T - 1):
        yield np.array((1.0,) + rest)
