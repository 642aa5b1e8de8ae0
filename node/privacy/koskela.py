"""Streaming gossip with fresh noise each round (Koskela & Kulkarni 2025), accounted exactly.

The protocol ([K] eq. (3.1)): ``θ_{t+1} = W(θ_t + x_t + u_t)``, ``u_t ~ N(0, σ² I)``; at round t
node i sends ``m^i_t = θ^i_t + x^i_t + u^i_t``.  This is DP-GD with gossip averaging when
``x_t = −η ∇f(θ_t)`` and ``u_t = −η ξ_t`` (ν cancels).  Any observer set 𝒜 sees
``y = H_T (x̃ + ũ)`` with the block lower-triangular Toeplitz ``H_T`` (block (t,k) = ``S W^{t−k}``),
so the view is linear-Gaussian and the privacy of node j is *exactly* that of a Gaussian mechanism
with squared sensitivity ``Δ² = max_{c ∈ [−1,1]^T} cᵀ M_T c``, ``M_T = G_Tᵀ K_T⁺ G_T`` ([K] Thm 12,
docs/design/spec/gossip.md §2.3).  Noise the observers know (their own: SecLDP) is removed from ``K_T``.

Threat models, all one accountant (docs/design/spec/gossip.md §2.1 table): single node / secure neighbourhood summation
(``S = e_iᵀ``), closed neighbourhood (``S(N̄_i)``), coalitions ``S(𝒜)``, LDP (``S = I``), each with
the observers' noise counted (as in the papers) or known (the realistic default for hushnet).

Contributions are DP-GD's clipped gradient *vectors* (norm ≤ 1 per round), so the certified Δ² is the
maximum of ``tr(M X)`` over Gram matrices X of such vectors, not the Boolean program over
``c ∈ {±1}^T`` (whose vertex maximum can be smaller: issue 10 §1, docs/design/spec/gossip.md §2.3).
:func:`hushnet.privacy.linear_gaussian.box_quadratic_max` returns ``1ᵀM1`` when M is entrywise
non-negative (c = 1 is then optimal for vectors too), the vertex maximum only when an upper bound
valid for vectors meets it, and otherwise ``min(T λmax(M), 1ᵀ|M|1, SDP dual certificate)``, all
valid upper bounds ([K] §3.4, App. E), labelled in ``method``.  The ``c = 1`` value (``lower``) and
the scalar vertex maximum (``scalar``) are reported but never used as a guarantee.

Numerics: ``K_T`` is factorised with a relative eigenvalue threshold (``K_RTOL``).  With the
observers' noise counted ``K_T`` has full rank (block-triangular H_T with S on the diagonal) and
nothing is cut; with known noise (SecLDP) the cut removes
the structural null space, and a signal component outside the kept range makes the loss ``inf``
(never silently dropped) unless it is below ``RANGE_RTOL`` of the signal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
import scipy.sparse as sp

from hushnet.privacy.linear_gaussian import (
    RANGE_RTOL,
    box_quadratic_max,
    gaussian_loss,
    rdp_of,
)
from hushnet.privacy.matrix import PrivacyMatrix
from hushnet.privacy.muffliato import _csr, _neighbours, gossip_rows

__all__ = [
    "stream_kernel",
    "stream_sensitivity",
    "stream_sensitivities_all_sources",
    "explicit_H",
    "explicit_sensitivity_matrix",
    "observer_set",
    "gossip_stream_pair",
    "StreamOptions",
    "gossip_stream_loss_matrix",
    "coalition_sensitivity",
    "VIEWS",
]

VIEWS = ("neighbourhood", "aggregate", "single", "ldp")
KNOWN = ("own", "none", "observers")
K_RTOL = 1e-11  # relative eigenvalue threshold for K_T (a Gram matrix: singular-value ratio ~3e-6)


def observer_set(W, observer: int, view: str) -> np.ndarray:
    """The observed nodes 𝒜 for a view anchored at ``observer``."""
    Wc = _csr(W)
    if view == "neighbourhood":
        return np.concatenate([[observer], _neighbours(Wc, observer)]).astype(np.int64)
    if view in ("aggregate", "single"):
        return np.array([observer], dtype=np.int64)
    if view == "ldp":
        return np.arange(Wc.shape[0], dtype=np.int64)
    raise ValueError(f"unknown view {view!r}; use one of {VIEWS}")


def _known_set(
    observers: np.ndarray, anchor: int | None, known_noise: str | Iterable[int]
) -> np.ndarray:
    if isinstance(known_noise, str):
        if known_noise == "none":
            return np.zeros(0, dtype=np.int64)
        if known_noise == "own":
            return np.array([anchor if anchor is not None else observers[0]], dtype=np.int64)
        if known_noise == "observers":
            return np.asarray(observers, dtype=np.int64)
        raise ValueError(f"known_noise must be one of {KNOWN} or a list of nodes")
    return np.asarray(list(known_noise), dtype=np.int64)


def stream_kernel(
    W, T: int, observers: Sequence[int], known: Sequence[int] = ()
) -> tuple[np.ndarray, np.ndarray]:
    """``(K_T, X)``: the (Tm×Tm) noise covariance ``H̄_T H̄_Tᵀ`` and the signal blocks.

    ``X[a] = S W^a`` (m×n) for a = 0..T−1.  ``K_T`` is assembled with the exact recursion
    ``K[t,s] = F(t,s) + K[t−1,s−1]``, ``F(a,b) = X_a P_C X_bᵀ`` (docs/design/spec/gossip.md §2.3), where ``P_C`` drops
    the columns of the known noise.
    """
    obs = np.asarray(observers, dtype=np.int64)
    m = obs.size
    Y = gossip_rows(W, obs, T)  # (T, n, m): columns = rows of W^a for the observers
    X = Y.transpose(0, 2, 1).copy()  # (T, m, n)
    Xn = X.copy()
    kn = np.asarray(known, dtype=np.int64)
    if kn.size:
        Xn[:, :, kn] = 0.0
    flat = Xn.reshape(T * m, -1)
    F = (flat @ flat.T).reshape(T, m, T, m)
    K = F.copy()
    for t in range(1, T):
        K[t, :, 1:, :] += K[t - 1, :, :-1, :]
    return K.reshape(T * m, T * m), X


def _whitener(K: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(L, U)`` with ``L = Λ_r^{-1/2} U_rᵀ`` so that ``K⁺ = LᵀL``, and ``U_r`` spanning range(K)."""
    lam, U = np.linalg.eigh(0.5 * (K + K.T))
    top = lam[-1] if lam.size else 0.0
    keep = lam > K_RTOL * max(top, 0.0)
    Ur = U[:, keep]
    return Ur.T / np.sqrt(lam[keep])[:, None], Ur


def _signal(X: np.ndarray, j: int) -> np.ndarray:
    """``G_T`` for source j: (Tm×T), block (t,k) = ``S W^{t−k} e_j`` for k ≤ t."""
    T, m, _ = X.shape
    col = X[:, :, j].reshape(T * m)
    G = np.zeros((T * m, T))
    for k in range(T):
        G[k * m :, k] = col[: (T - k) * m]
    return G


def stream_sensitivity(
    W,
    T: int,
    observers: Sequence[int],
    source: int,
    *,
    known: Sequence[int] = (),
    exact_limit: int = 20,
) -> dict[str, Any]:
    """Δ_T(j → 𝒜)² with its bounds: ``lower`` (c=1), ``spectral``, ``abs``, ``exact``, ``value``.

    ``value`` is the certified squared sensitivity (per-round contribution bound 1): exact when
    known, else ``min(spectral, abs)``; ``inf`` when j's contribution leaves the noise's range
    (e.g. j's own noise is known to the observers).
    """
    if T == 0:
        return {
            "lower": 0.0,
            "spectral": 0.0,
            "abs": 0.0,
            "exact": 0.0,
            "value": 0.0,
            "method": "exact",
            "M": np.zeros((0, 0)),
        }
    K, X = stream_kernel(W, T, observers, known)
    L, Ur = _whitener(K)
    G = _signal(X, int(source))
    resid = G - Ur @ (Ur.T @ G)
    norms = np.linalg.norm(G, axis=0)
    if np.any(
        (np.linalg.norm(resid, axis=0) > RANGE_RTOL * np.maximum(norms, 1e-300)) & (norms > 0)
    ):
        out = box_quadratic_max(np.full((T, T), np.inf))
        out["M"] = np.full((T, T), np.inf)
        out["method"] = "infinite: the contribution leaves the range of the unknown noise"
        return out
    Z = L @ G
    M = Z.T @ Z
    out = box_quadratic_max(M, exact_limit=exact_limit)
    out["M"] = M
    return out


def stream_sensitivities_all_sources(
    W, T: int, observers: Sequence[int], *, known: Sequence[int] = (), exact_limit: int = 12
) -> tuple[np.ndarray, np.ndarray]:
    """Certified Δ² for every source j at once (one factorisation of K_T); also ``1ᵀM1``.

    Vectorised over sources: ``Z[:, k, j] = L[:, km:] X_stack[:(T−k)m, j]``.
    """
    K, X = stream_kernel(W, T, observers, known)
    Tn, m, n = X.shape
    L, Ur = _whitener(K)
    flat = X.reshape(T * m, n)
    r = L.shape[0]
    Z = np.empty((r, T, n))
    resid_bad = np.zeros(n, dtype=bool)
    for k in range(T):
        Gk = flat[: (T - k) * m]
        Z[:, k, :] = L[:, k * m :] @ Gk
        proj = Ur[k * m :].T @ Gk
        g2 = np.einsum("ij,ij->j", Gk, Gk)
        p2 = np.einsum("ij,ij->j", proj, proj)
        resid_bad |= (g2 - p2 > (RANGE_RTOL**2) * np.maximum(g2, 1e-300) + 1e-13 * g2) & (g2 > 0)
    Ms = np.einsum("rkj,rlj->jkl", Z, Z)
    value = np.empty(n)
    lower = np.einsum("jkl->j", Ms)
    for j in range(n):
        value[j] = (
            np.inf if resid_bad[j] else box_quadratic_max(Ms[j], exact_limit=exact_limit)["value"]
        )
    lower[resid_bad] = np.inf
    return value, lower


def explicit_H(
    W, T: int, observers: Sequence[int], known: Sequence[int] = ()
) -> tuple[np.ndarray, np.ndarray]:
    """Dense ``(H_T, H̄_T)``: signal and unknown-noise system matrices ((Tm)×(Tn)), for tests."""
    Wd = W.toarray() if sp.issparse(W) else np.asarray(W, dtype=float)
    n = Wd.shape[0]
    obs = np.asarray(observers, dtype=np.int64)
    m = obs.size
    S = np.zeros((m, n))
    S[np.arange(m), obs] = 1.0
    P = np.eye(n)
    powers = []
    for _a in range(T):
        powers.append(S @ P)
        P = Wd @ P
    H = np.zeros((T * m, T * n))
    for t in range(T):
        for k in range(t + 1):
            H[t * m : (t + 1) * m, k * n : (k + 1) * n] = powers[t - k]
    Hb = H.copy()
    kn = np.asarray(known, dtype=np.int64)
    for k in range(T):
        Hb[:, k * n + kn] = 0.0
    return H, Hb


def explicit_sensitivity_matrix(
    W, T: int, observers: Sequence[int], source: int, known: Sequence[int] = ()
) -> np.ndarray:
    """``M_T`` from the explicit ``H_T`` with ``pinv`` (reference for tests); ``inf`` if out of range."""
    H, Hb = explicit_H(W, T, observers, known)
    n = H.shape[1] // T
    G = H[:, [k * n + source for k in range(T)]]
    K = Hb @ Hb.T
    Kp = np.linalg.pinv(K, rcond=1e-10, hermitian=True)
    if np.linalg.norm(G - K @ Kp @ G) > 1e-6 * max(np.linalg.norm(G), 1e-300):
        return np.full((T, T), np.inf)
    return G.T @ Kp @ G


def coalition_sensitivity(
    W, T: int, coalition: Sequence[int], source: int, *, secldp: bool = False, exact_limit: int = 20
) -> dict[str, Any]:
    """Colluding set 𝒜 ([K] Thm 15; with ``secldp`` the members know their noise, Thm 16)."""
    coal = np.asarray(coalition, dtype=np.int64)
    if source in set(coal.tolist()):
        raise ValueError("the source must not belong to the coalition")
    return stream_sensitivity(
        W, T, coal, source, known=coal if secldp else (), exact_limit=exact_limit
    )


@dataclass(frozen=True)
class StreamOptions:
    """How one streaming-gossip pair is accounted: the observer ``view``, whose noise the observer
    knows (``known_noise``: "own", "none", "observers" or node ids), the δ at which to add an
    (ε, δ) value (``None``: RDP only), the per-round contribution bound ``sensitivity`` and the
    largest T for which the box maximum is enumerated exactly (``exact_limit``)."""

    view: str = "neighbourhood"
    known_noise: Any = "own"
    delta: float | None = None
    sensitivity: float = 1.0
    exact_limit: int = 20

    def __post_init__(self) -> None:
        if self.view not in VIEWS:
            raise ValueError(f"view must be one of {VIEWS}, got {self.view!r}")
        if isinstance(self.known_noise, str) and self.known_noise not in KNOWN:
            raise ValueError(
                f"known_noise must be one of {KNOWN} or node ids, got {self.known_noise!r}"
            )
        if self.delta is not None and not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta!r}")
        if not self.sensitivity > 0:
            raise ValueError(f"sensitivity must be > 0, got {self.sensitivity!r}")
        if not self.exact_limit >= 0:
            raise ValueError(f"exact_limit must be >= 0, got {self.exact_limit!r}")


def gossip_stream_pair(
    W,
    source: int,
    observer: int,
    T: int,
    alpha: float,
    sigma: float,
    options: StreamOptions | None = None,
) -> dict[str, Any]:
    """One pair of streaming gossip (T rounds, fresh noise, per-round contribution bound ``sensitivity``).

    Returns ``rdp``, ``sensitivity_sq`` (certified Δ²·sensitivity²), ``mu_gdp``, the bounds
    ``lower``/``spectral``/``abs``/``exact`` (unit per-round sensitivity) and the method used.
    """
    o = options if options is not None else StreamOptions()
    view, known_noise, delta, sensitivity, exact_limit = (
        o.view,
        o.known_noise,
        o.delta,
        o.sensitivity,
        o.exact_limit,
    )
    if not alpha > 1 or not sigma > 0:
        raise ValueError("need alpha > 1 and sigma > 0")
    if source == observer:
        raise ValueError("source and observer must differ")
    obs = observer_set(W, observer, view)
    known = _known_set(obs, observer, known_noise)
    res = stream_sensitivity(W, T, obs, source, known=known, exact_limit=exact_limit)
    sens_sq = sensitivity**2 * res["value"]
    out = gaussian_loss(
        sens_sq,
        alpha,
        sigma,
        delta,
        bound="certified",
        view=view,
        protocol="gossip-stream",
        source=int(source),
        observer=int(observer),
        steps=int(T),
    )
    out.update(
        {
            k: (None if res.get(k) is None else float(res[k]))
            for k in ("lower", "spectral", "abs", "sdp", "vector_lower", "scalar", "exact")
        }
    )
    out["method"] = res["method"]
    out["known_noise"] = known.tolist()
    out["note"] = (
        "certified: Gaussian mechanism with the box sensitivity of [K] Thm 12 over vector contributions "
        "(any model dimension): exact only when a certificate shows scalar and vector maxima agree, else "
        "the smallest valid upper bound (method); 'lower' (c = 1) and 'scalar' (±1 contributions only) "
        "are not guarantees"
    )
    return out


def gossip_stream_loss_matrix(
    W,
    T: int,
    alpha: float,
    sigma: float,
    *,
    view: str = "neighbourhood",
    known_noise: str = "own",
    sensitivity: float = 1.0,
    exact_limit: int = 12,
) -> PrivacyMatrix:
    """All-pairs certified RDP of streaming gossip; row u = source, column v = observer, diag 0."""
    if not alpha > 1 or not sigma > 0:
        raise ValueError("need alpha > 1 and sigma > 0")
    Wc = _csr(W)
    n = Wc.shape[0]
    S = np.zeros((n, n))
    for v in range(n):
        obs = observer_set(Wc, v, view)
        known = _known_set(obs, v, known_noise)
        val, _ = stream_sensitivities_all_sources(Wc, T, obs, known=known, exact_limit=exact_limit)
        val[v] = 0.0
        S[:, v] = val
    notes = [
        f"certified: [K] streaming gossip, T = {T} rounds with fresh noise, view {view}, known noise: {known_noise}",
        "per-round contributions are vectors of norm <= 1 (any dimension): exact box maximum only where scalar and "
        "vector maxima provably agree (M >= 0, or the vertex maximum meets a vector bound), otherwise "
        "min(spectral, 1'|M|1, SDP dual certificate), all valid upper bounds for vector contributions",
    ]
    return PrivacyMatrix(
        matrix=rdp_of(alpha, sensitivity**2 * S, sigma),
        alpha=float(alpha),
        bound="certified",
        view=view,
        notes=notes,
        protocol="gossip-stream",
        sensitivity_sq=sensitivity**2 * S,
    )
