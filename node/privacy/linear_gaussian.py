"""Exact privacy of linear-Gaussian views ``O = A z + B ζ`` (spec gossip.md §3).

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
from hushnet.privacy.matrix import json_number

__all__ = [
    "LinearGaussianView",
    "RANK_RTOL",
    "RANGE_RTOL",
    "orthonormal_range",
    "projection_weights",
    "box_quadratic_max",
    "gaussian_loss",
    "rdp_of",
    "mu_of",
    "epsilon_of",
]

#: relative threshold on singular values below which a direction counts as numerically absent.
#: Muffliato/Koskela Gram matrices show a gap of ~8 orders of magnitude around it (spec §1.3.9).
RANK_RTOL = 1e-9
#: relative residual above which a mean shift is declared outside ``range(B)`` (⇒ Δ = ∞).
RANGE_RTOL = 1e-7


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


def gaussian_loss(sens_sq: float, alpha: float, sigma: float, delta: float | None = None, **labels: Any) -> dict:
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
    """``max_{c ∈ [-1,1]^T} cᵀ M c`` for a PSD T×T matrix, with the bounds of [K] §2.3.

    Returns ``lower`` (c = 1), ``spectral`` (T λmax), ``abs`` (1ᵀ|M|1), ``exact`` (vertex
    enumeration when ``T ≤ exact_limit``, or directly ``1ᵀM1`` when M is entrywise
    non-negative, since then ``cᵀMc ≤ Σ|M_ij| = 1ᵀM1``; otherwise None) and ``value``: the exact
    value when known, else ``min(spectral, abs)`` — both valid upper bounds.  ``method`` says
    which one ``value`` is.
    """
    M = np.asarray(M, dtype=float)
    M = 0.5 * (M + M.T)
    T = M.shape[0]
    if T == 0:
        return {"lower": 0.0, "spectral": 0.0, "abs": 0.0, "exact": 0.0, "value": 0.0, "method": "exact"}
    if not np.all(np.isfinite(M)):
        return {"lower": math.inf, "spectral": math.inf, "abs": math.inf, "exact": math.inf,
                "value": math.inf, "method": "infinite"}
    ones = np.ones(T)
    lower = float(ones @ M @ ones)
    spectral = float(T * max(np.linalg.eigvalsh(M)[-1], 0.0))
    absb = float(np.abs(M).sum())
    scale = max(np.abs(M).max(), 1e-300)
    exact: float | None = None
    method = "bound"
    if np.all(M >= -tol * scale):
        exact, method = lower, "exact (non-negative M: c = 1 is optimal)"
    elif T <= exact_limit:
        exact, method = _enumerate_vertices(M), "exact (vertex enumeration)"
    value = exact if exact is not None else min(spectral, absb)
    if method == "bound":
        method = "spectral" if spectral <= absb else "abs"
    return {"lower": lower, "spectral": spectral, "abs": absb, "exact": exact, "value": max(float(value), 0.0),
            "method": method}


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
    rtol: float = RANK_RTOL
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
        out = resid > RANGE_RTOL * np.maximum(norm, 1e-300)
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

    def box_sensitivity_sq(self, columns: list[int] | np.ndarray, exact_limit: int = 20) -> dict[str, Any]:
        """Δ² when contributions ``columns`` may each change by at most 1 ([K] Theorem 12)."""
        return box_quadratic_max(self.block_matrix(columns), exact_limit=exact_limit)


def brute_force_sensitivity_sq(A: np.ndarray, B: np.ndarray, shift: np.ndarray, rcond: float = 1e-10) -> float:
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

