"""Pairwise network DP accountant for random-walk (token) learning — P-RW, spec ``randomwalk.md`` PART B.

A token walks on a public graph with a public, symmetric, bi-stochastic transition matrix ``W``; each holder adds
a clipped gradient plus Gaussian noise (noise multiplier ``σ``).  Node ``v`` sees the token only while holding it.
Theorem 3 of Cyffers–Bellet–Upadhyay (ICML 2024) bounds the Rényi loss of ``u``'s data towards ``v`` through the
*communicability* ``Σ_t (W^t)_{uv} / t``; this module evaluates that bound for every ordered pair.

Why a separate "certified" and "paper" path
--------------------------------------------
The published statement (and the authors' code) uses ``ln T`` for the stationary part, the *expected*
number of contributions ``T/n`` and no noise condition.  ``ln T < H_T = Σ_{t≤T} 1/t``, so that form is an
*under*-estimate of the proof's own sum, and the proof (weak convexity with c = 1) is only valid when
``α/(2σ²) ≤ 1/(α−1)``.  hushnet never presents such a number as a guarantee:

* ``bound="paper"``  — Theorem 3 as the reference code computes it: ``(α N_u/σ²)(ln T/n·J + M)`` with
  ``M = −logm(I − W + J/n)``, ``N_u = T/n``, no σ condition.  Labelled "paper"; used to reproduce figures.
* ``bound="certified"`` — what hushnet stands behind:
    - horizon ``"exact"`` (default): ``(α N_u/σ²) Σ_{t=1}^T (W^t)_{uv}/t`` evaluated exactly through the spectrum,
      or ``"harmonic"``: ``(α N_u/σ²)(H_T/n·J + M)`` **plus** a proven bound on the neglected tail
      ``Σ_{t>T}(W^t − J/n)/t`` (so it is ≥ the exact sum).  ``"lnT"`` is refused.
    - the σ condition of ``constraint`` (``"strict"``: σ² ≥ 2α(α−1) as printed, the default; ``"proof"``:
      σ² ≥ α(α−1)/2, what the proof needs) is enforced: violation raises ``ValueError``
      (``on_violation="refuse"``) or lowers α to the largest admissible order (``on_violation="clamp"``),
      recorded in ``notes`` and in ``PrivacyMatrix.alpha``.  ``constraint="none"`` is refused.
    - ``N_u``: the per-node number of contributions.  The default ``T/n`` is the *expected* count; it is a
      guarantee only when nodes enforce the hard cap ``N_max`` (Remark 5) — ``max_contributions`` applies a cap
      and the notes say which was used.
    - ``sender_known=True`` when the transport reveals the sender (plain gRPC, docs/design/spec/randomwalk.md §E.2): the App. B.1 bound
      ``max_{w ∈ N(v)} ε_{u→w}`` (taken together with the anonymous value, so it is never below it).
    - ``passage="first_passage"`` replaces ``(W^i)_{uv}`` by the exact first-passage probability (sound, tighter,
      not in the paper; a separate named mode).

Assumptions behind every value (Theorem 3's proof): the local updates are non-expansive (convex β-smooth losses,
step γ ≤ 2/β; amplification by iteration needs it — the training engine must enforce it), clipped gradients of
sensitivity Δ with noise std Δσ at every step, G and W public, no release of the final model x_T (a broadcast
x_T is an extra observation not covered, docs/design/spec/randomwalk.md §E.1), nodes not colluding (see :func:`rw_collusion_loss`).

Matrix conventions: row ``u`` = contributor, column ``v`` = observer, diagonal 0, values are RDP of order α.
All-pairs matrices use one ``eigh`` per graph (cached by the bytes of ``W``) and a single matrix product.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp
from scipy.special import digamma

from hushnet.privacy.matrix import PrivacyMatrix
from hushnet.privacy.options import resolve

__all__ = [
    "WalkLossOptions",
    "PrivacyMatrix",
    "with_local_dp",
    "WALK",
    "LOCAL_DP",
    "RWSpectrum",
    "CONSTRAINT_K",
    "alpha_max",
    "noise_condition_holds",
    "harmonic_number",
    "power_harmonic_sum",
    "power_harmonic_tail_bound",
    "rw_spectrum",
    "rw_eigenvalues",
    "rw_M_matrix",
    "vplambda",
    "compute_T_walk",
    "gossip_T_mix",
    "rw_single_loss_matrix",
    "rw_pndp_matrix",
    "rw_pair_loss",
    "rw_first_passage_single_matrix",
    "rw_collusion_loss",
    "rw_mean_single_loss",
    "calibrate_sigma_mean",
    "ring_single_loss_closed_form",
    "ring_M_closed_form",
    "star_transition_matrix",
]

# k in the σ condition  σ² ≥ k·α(α−1)  (docs/design/spec/randomwalk.md §B.4.2 / B.8).
CONSTRAINT_K: dict[str, float] = {"strict": 2.0, "proof": 0.5, "none": 0.0}
_HORIZONS = ("exact", "harmonic", "lnT")
_PASSAGES = ("power", "first_passage")
_EULER_GAMMA = 0.57721566490153286061


# ----------------------------------------------------------------------------------------------------------------
# Noise condition
# ----------------------------------------------------------------------------------------------------------------
def _k(constraint: str) -> float:
    try:
        return CONSTRAINT_K[constraint]
    except KeyError:
        raise ValueError(
            f"constraint must be one of {sorted(CONSTRAINT_K)}, got {constraint!r}"
        ) from None


def alpha_max(sigma: float, constraint: str) -> float:
    """Largest Rényi order allowed by ``σ² ≥ k α(α−1)``: ``(1 + √(1 + 4σ²/k))/2`` (∞ for ``"none"``)."""
    k = _k(constraint)
    if k == 0.0:
        return math.inf
    return 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * sigma * sigma / k))


def noise_condition_holds(alpha: float, sigma: float, constraint: str) -> bool:
    """Whether ``σ² ≥ k α(α−1)`` (with a 1e-12 relative slack so the boundary case α=2, σ=1, proof passes)."""
    k = _k(constraint)
    return sigma * sigma >= k * alpha * (alpha - 1.0) * (1.0 - 1e-12)


# ----------------------------------------------------------------------------------------------------------------
# Scalar series
# ----------------------------------------------------------------------------------------------------------------
def harmonic_number(T: int) -> float:
    """``H_T = Σ_{t=1}^T 1/t`` (exact sum for small T, digamma otherwise)."""
    T = int(T)
    if T < 1:
        raise ValueError("T must be ≥ 1")
    if T <= 64:
        return float(sum(1.0 / t for t in range(1, T + 1)))
    return float(digamma(T + 1) + _EULER_GAMMA)


def power_harmonic_tail_bound(lam: np.ndarray | float, T: int) -> np.ndarray:
    """Bound on ``|Σ_{t>T} λ^t/t| = |−ln(1−λ) − s_T(λ)|`` for ``|λ| ≤ 1, λ ≠ 1``.

    ``λ ≥ 0``: geometric bound ``λ^{T+1}/((T+1)(1−λ))``; ``λ < 0``: alternating series with decreasing terms,
    ``|λ|^{T+1}/(T+1)`` (this also covers λ = −1, a periodic chain).
    """
    lam = np.asarray(lam, dtype=float)
    a = np.abs(lam)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        lead = np.exp((T + 1) * np.log(np.maximum(a, 1e-300))) / (T + 1)
        out = np.where(lam >= 0, lead / np.maximum(1.0 - lam, 0.0), lead)
    out = np.where(a == 0, 0.0, out)
    return out


def power_harmonic_sum(lam: np.ndarray | float, T: int) -> np.ndarray:
    """``s_T(λ) = Σ_{t=1}^T λ^t / t`` for ``−1 ≤ λ ≤ 1`` (vectorised, accurate to ~1e-15).

    ``s_T(1) = H_T``.  For ``|λ| < 1`` it is ``−ln(1−λ)`` minus a tail; the tail is dropped when provably below
    1e-17, otherwise summed directly — forwards over t ≤ T or as the tail series, whichever is shorter.
    """
    T = int(T)
    lam = np.atleast_1d(np.asarray(lam, dtype=float))
    out = np.empty_like(lam)
    top = lam >= 1.0 - 1e-12
    out[top] = harmonic_number(T)
    rest = ~top
    tail = power_harmonic_tail_bound(np.where(rest, lam, 0.0), T)
    easy = rest & (tail < 1e-17)
    out[easy] = -np.log1p(-lam[easy])
    hard = np.flatnonzero(rest & ~easy)
    if hard.size:
        lh = lam[hard]
        a = np.abs(lh)
        with np.errstate(divide="ignore"):
            k_needed = np.where(a < 1.0, np.ceil(41.0 / np.maximum(1.0 - a, 1e-300)), np.inf)
        fwd = k_needed >= T
        if fwd.any():
            out[hard[fwd]] = _forward_power_sum(lh[fwd], 1, T)
        if (~fwd).any():
            lt = lh[~fwd]
            kmax = int(k_needed[~fwd].max())
            # tail = λ^{T+1} Σ_{k=0}^{K} λ^k / (T+1+k)
            tail_sum = _forward_power_sum(lt, 0, kmax, offset=T + 1)
            out[hard[~fwd]] = -np.log1p(-lt) - np.power(lt, T + 1) * tail_sum
    return out


def _forward_power_sum(
    lam: np.ndarray, t0: int, t1: int, offset: int = 0, chunk: int = 4096
) -> np.ndarray:
    """``Σ_{t=t0}^{t1} λ^t / (t + offset)`` for a vector λ, in chunks of t to bound memory."""
    acc = np.zeros_like(lam)
    logabs = np.log(np.maximum(np.abs(lam), 1e-300))
    neg = lam < 0
    for start in range(t0, t1 + 1, chunk):
        t = np.arange(start, min(t1, start + chunk - 1) + 1, dtype=float)
        mag = np.exp(np.outer(logabs, t))
        sign = np.where(neg[:, None] & (t[None, :] % 2 == 1), -1.0, 1.0)
        mag = np.where(np.abs(lam)[:, None] == 0, (t[None, :] == 0).astype(float), mag)
        acc += (sign * mag / (t + offset)[None, :]).sum(axis=1)
    return acc


# ----------------------------------------------------------------------------------------------------------------
# Spectrum of W (cached)
# ----------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RWSpectrum:
    """Eigen-decomposition of a symmetric bi-stochastic W (ascending eigenvalues; the last one is 1)."""

    eigenvalues: np.ndarray
    eigenvectors: np.ndarray
    adjacency: (
        sp.csr_matrix
    )  # off-diagonal support of W (the graph's edges under Metropolis–Hastings weights)

    @property
    def n(self) -> int:
        return int(self.eigenvalues.size)

    @property
    def periodic(self) -> bool:
        return bool(self.eigenvalues[0] <= -1.0 + 1e-10)


_SPECTRUM_CACHE: "OrderedDict[str, RWSpectrum]" = OrderedDict()
_EIGVALS_CACHE: "OrderedDict[str, np.ndarray]" = OrderedDict()
_CACHE_SIZE = (
    32  # entries; and at most _CACHE_BYTES of eigenvectors (an n = 2048 spectrum is 32 MB)
)
_CACHE_BYTES = 400 * 2**20


def _w_key(W: Any) -> str:
    h = hashlib.blake2b(digest_size=20)
    if sp.issparse(W):
        Wc = sp.csr_matrix(W)
        Wc.sort_indices()
        for arr in (Wc.data, Wc.indices, Wc.indptr):
            h.update(np.ascontiguousarray(arr).tobytes())
        h.update(repr(Wc.shape).encode())
        return "s" + h.hexdigest()
    A = np.ascontiguousarray(np.asarray(W, dtype=float))
    h.update(A.tobytes())
    h.update(repr(A.shape).encode())
    return "d" + h.hexdigest()


def _dense(W: Any) -> np.ndarray:
    if sp.issparse(W):
        return np.asarray(W.toarray(), dtype=float)
    return np.array(W, dtype=float, copy=True)


def _validate_W(Wd: np.ndarray) -> None:
    if Wd.ndim != 2 or Wd.shape[0] != Wd.shape[1] or Wd.shape[0] < 2:
        raise ValueError(f"W must be a square matrix with n ≥ 2, got shape {Wd.shape}")
    if Wd.min() < -1e-12:
        raise ValueError("W has negative entries; a transition matrix is non-negative")
    if np.abs(Wd - Wd.T).max() > 1e-10:
        raise ValueError(
            "W is not symmetric: Theorem 3 needs a symmetric bi-stochastic W (Assumption 2)"
        )
    if np.abs(Wd.sum(axis=1) - 1.0).max() > 1e-9:
        raise ValueError("W is not row-stochastic")


def _validate_sparse(Ws: sp.csr_matrix) -> None:
    """The checks of :func:`_validate_W` without densifying (used on the cheap single-pair path)."""
    if Ws.shape[0] != Ws.shape[1] or Ws.shape[0] < 2:
        raise ValueError(f"W must be a square matrix with n ≥ 2, got shape {Ws.shape}")
    if Ws.nnz and Ws.data.min() < -1e-12:
        raise ValueError("W has negative entries; a transition matrix is non-negative")
    asym = abs(Ws - Ws.T)
    if asym.nnz and asym.max() > 1e-10:
        raise ValueError(
            "W is not symmetric: Theorem 3 needs a symmetric bi-stochastic W (Assumption 2)"
        )
    if np.abs(np.asarray(Ws.sum(axis=1)).ravel() - 1.0).max() > 1e-9:
        raise ValueError("W is not row-stochastic")
    from scipy.sparse.csgraph import connected_components

    if connected_components(Ws, directed=False)[0] != 1:
        raise ValueError("W is not irreducible: the graph is disconnected")


def rw_spectrum(W: Any) -> RWSpectrum:
    """``eigh(W)`` once per W (cached by the bytes of W), after checking Assumption 2 and irreducibility."""
    key = _w_key(W)
    hit = _SPECTRUM_CACHE.get(key)
    if hit is not None:
        _SPECTRUM_CACHE.move_to_end(key)
        return hit
    Wd = _dense(W)
    _validate_W(Wd)
    Wd = 0.5 * (Wd + Wd.T)
    adj = sp.csr_matrix(Wd > 0, dtype=float)
    adj.setdiag(0)
    adj.eliminate_zeros()
    lam, phi = sla.eigh(Wd, driver="evd", overwrite_a=True, check_finite=False)
    if lam[-2] > 1.0 - 1e-10:
        raise ValueError(
            "W has eigenvalue 1 with multiplicity > 1: the graph is disconnected (not irreducible)"
        )
    spec = RWSpectrum(eigenvalues=lam, eigenvectors=phi, adjacency=sp.csr_matrix(adj))
    _SPECTRUM_CACHE[key] = spec
    while len(_SPECTRUM_CACHE) > 1 and (
        len(_SPECTRUM_CACHE) > _CACHE_SIZE
        or sum(x.eigenvectors.nbytes for x in _SPECTRUM_CACHE.values()) > _CACHE_BYTES
    ):
        _SPECTRUM_CACHE.popitem(last=False)
    return spec


def rw_eigenvalues(W: Any) -> np.ndarray:
    """Ascending eigenvalues of W (validated like :func:`rw_spectrum`); ``eigvalsh`` only, unless already cached.

    Enough for the mean loss, σ calibration, T_RW and T_gossip — about 3× cheaper than a full ``eigh``.
    """
    key = _w_key(W)
    if key in _SPECTRUM_CACHE:
        return _SPECTRUM_CACHE[key].eigenvalues
    hit = _EIGVALS_CACHE.get(key)
    if hit is not None:
        return hit
    Wd = _dense(W)
    _validate_W(Wd)
    lam = sla.eigh(
        0.5 * (Wd + Wd.T), eigvals_only=True, driver="evd", overwrite_a=True, check_finite=False
    )
    if lam[-2] > 1.0 - 1e-10:
        raise ValueError(
            "W has eigenvalue 1 with multiplicity > 1: the graph is disconnected (not irreducible)"
        )
    _EIGVALS_CACHE[key] = lam
    while len(_EIGVALS_CACHE) > _CACHE_SIZE:
        _EIGVALS_CACHE.popitem(last=False)
    return lam


def _from_spectrum(spec: RWSpectrum, g: np.ndarray) -> np.ndarray:
    """``Φ diag(g) Φᵀ``."""
    phi = spec.eigenvectors
    return (phi * g[None, :]) @ phi.T


def rw_M_matrix(W: Any) -> np.ndarray:
    """``M = −logm(I − W + J/n) = Σ_{λ_i<1} −ln(1−λ_i) φ_i φ_iᵀ`` (zero row sums)."""
    spec = rw_spectrum(W)
    g = np.zeros_like(spec.eigenvalues)
    g[:-1] = -np.log1p(
        -spec.eigenvalues[:-1]
    )  # λ_n = 1 (top) is excluded: connected ⇒ λ_i < 1 for i < n
    return _from_spectrum(spec, g)


def vplambda(W: Any) -> float:
    """The reference code's spectral gap: second-smallest eigenvalue of ``I − W`` (= 1 − λ₂(W))."""
    return float(1.0 - rw_eigenvalues(W)[-2])


def compute_T_walk(W: Any, sigma: float) -> int:
    """[CODE] ``graph.computeTwalk``: ``int(20·⌈ln(n)/λ⌉·(0.25+σ²)/σ²)`` with λ = vplambda (docs/design/spec/randomwalk.md §B.6)."""
    n = rw_eigenvalues(W).size
    lam = vplambda(W)
    return int(20 * math.ceil(math.log(n) / lam) * (0.25 + sigma**2) / sigma**2)


def gossip_T_mix(W: Any, sigma: float) -> int:
    """[CODE] ``graphutils.T_mix``: ``⌈(1/√λ) ln(n·max(1/4, σ²)/σ²)⌉`` gossip rounds (docs/design/spec/randomwalk.md §B.5)."""
    n = rw_eigenvalues(W).size
    lam = vplambda(W)
    return int(math.ceil(math.log(n * max(0.25, sigma**2) / sigma**2) / math.sqrt(lam)))


# ----------------------------------------------------------------------------------------------------------------
# Single-contribution matrices
# ----------------------------------------------------------------------------------------------------------------
def _horizon_weights(lam: np.ndarray, T: int, horizon: str) -> np.ndarray:
    """Per-eigenvalue weight g(λ) such that the single-contribution matrix is ``(α/σ²) Φ diag(g) Φᵀ``."""
    if horizon == "exact":
        return power_harmonic_sum(lam, T)
    g = np.empty_like(lam)
    g[:-1] = -np.log1p(-lam[:-1])  # ascending: the last eigenvalue is the stationary 1
    if horizon == "harmonic":
        g[-1] = harmonic_number(T)
    elif horizon == "lnT":
        g[-1] = math.log(T)
    else:
        raise ValueError(f"horizon must be one of {_HORIZONS}, got {horizon!r}")
    return g


def _csr_W(W: Any) -> sp.csr_matrix:
    Wc = sp.csr_matrix(W, dtype=float)
    return Wc


def rw_first_passage_single_matrix(
    W: Any, T: int, alpha: float, sigma: float, *, tol: float = 1e-14
) -> np.ndarray:
    """``(α/σ²) Σ_{i=1}^T f^{(i)}_{uv}/i`` with the exact first-passage probabilities (docs/design/spec/randomwalk.md §B.4.2, [SPEC] option).

    All columns at once: ``F_1 = W`` and ``F_i = W F_{i−1} − W diag(F_{i−1})`` (column v of ``W^{(−v)}`` zeroed).
    Because ``Σ_i f^{(i)}_{uv} ≤ 1``, the steps after i contribute at most ``(1 − Σ_{j≤i} f^{(j)}_{uv})/(i+1)``; the
    loop stops once that is below ``tol`` and *adds* it, so the result stays an upper bound.  Cost O(T·nnz·n).
    """
    Ws = _csr_W(W)
    coo = Ws.tocoo()
    rows, cols, data = coo.row, coo.col, coo.data
    F = Ws.toarray()
    acc = F.copy()
    cum = F.copy()
    for i in range(2, int(T) + 1):
        d = np.diag(F).copy()
        F = np.asarray(Ws @ F)
        F[rows, cols] -= data * d[cols]  # − W diag(F_{i−1}): drop the paths that already visited v
        acc += F / i
        cum += F
        if i < T:
            rem = np.maximum(1.0 - cum, 0.0)
            if rem.max() / (i + 1) < tol:
                acc += rem / (i + 1)
                break
    out = (alpha / sigma**2) * acc
    np.fill_diagonal(out, 0.0)
    return out


def _sender_known_from(
    S_full: np.ndarray, adjacency: sp.csr_matrix, block: int = 128
) -> np.ndarray:
    """``R[u, v] = max(S[u, v], max_{w ∈ N(v)} S[u, w])`` using the diagonal ``S[u, u]`` when u ∈ N(v)."""
    n = S_full.shape[0]
    adj = sp.csr_matrix(adjacency)
    indptr, indices = adj.indptr, adj.indices
    R = np.empty_like(S_full)
    for v0 in range(0, n, block):
        v1 = min(n, v0 + block)
        lo, hi = indptr[v0], indptr[v1]
        if hi == lo:
            R[:, v0:v1] = S_full[:, v0:v1]
            continue
        rows = S_full[indices[lo:hi]]  # S symmetric: row w = column w
        starts = indptr[v0:v1] - lo
        deg = np.diff(indptr[v0 : v1 + 1])
        red = np.maximum.reduceat(rows, np.minimum(starts, hi - lo - 1), axis=0)
        red[deg == 0] = -np.inf
        R[:, v0:v1] = np.maximum(red.T, S_full[:, v0:v1])
    return R


def rw_single_loss_matrix(
    W: Any,
    T: int,
    alpha: float,
    sigma: float,
    *,
    horizon: str = "exact",
    passage: str = "power",
    sender_known: bool = False,
) -> np.ndarray:
    """Per-contribution RDP matrix ``S[u, v]`` of order α (diag 0).  No σ condition is checked here.

    * ``horizon="exact"``: ``(α/σ²) Σ_{t=1}^T W^t/t``, exactly (spectral ``s_T``).
    * ``"harmonic"``: ``(α/σ²)(H_T/n·J + M)`` — the T→∞ limit of the pair-dependent part (no tail correction; the
      certified path of :func:`rw_pndp_matrix` adds the tail bound).
    * ``"lnT"``: ``(α/σ²)(ln T/n·J + M)`` — Theorem 3 as printed (an under-estimate: ln T < H_T).
    * ``passage="first_passage"`` (exact horizon only): first-passage probabilities instead of ``(W^i)_{uv}``.
    * ``sender_known``: App. B.1 — ``max_{w∈N(v)} S[u, w]`` (with ``S[u,u]`` when u ∈ N(v)), never below ``S[u,v]``.
      For ``horizon="lnT"`` this is the reference code's ``maxi_priv``, which picks the max over N(v) only; the
      extra ``max`` with ``S[u,v]`` does not change it on the paper's graphs but keeps "sender-known ≥ anonymous".
    """
    T = int(T)
    if T < 1:
        raise ValueError("T must be ≥ 1")
    if passage not in _PASSAGES:
        raise ValueError(f"passage must be one of {_PASSAGES}, got {passage!r}")
    if horizon not in _HORIZONS:
        raise ValueError(f"horizon must be one of {_HORIZONS}, got {horizon!r}")
    if passage == "first_passage":
        if horizon != "exact":
            raise ValueError("passage='first_passage' is a finite-T sum: use horizon='exact'")
        if sender_known:
            raise ValueError(
                "sender_known is defined for passage='power' only (App. B.1 uses (W^i)_{uw})"
            )
        rw_spectrum(W)  # validation (symmetric, stochastic, connected)
        return rw_first_passage_single_matrix(W, T, alpha, sigma)
    spec = rw_spectrum(W)
    g = _horizon_weights(spec.eigenvalues, T, horizon)
    S = _from_spectrum(spec, g)
    S *= alpha / sigma**2
    if horizon == "exact":
        # Σ_t W^t/t ≥ 0 entrywise; pairs farther apart than T come out as ±1e-18 rounding noise: clip it
        np.maximum(S, 0.0, out=S)
    if sender_known:
        S = _sender_known_from(S, spec.adjacency)
    np.fill_diagonal(S, 0.0)
    return S


# ----------------------------------------------------------------------------------------------------------------
# The PNDP matrix
# ----------------------------------------------------------------------------------------------------------------
def _resolve(
    bound: str,
    horizon: str | None,
    constraint: str,
    alpha: float,
    sigma: float,
    on_violation: str,
    notes: list[str],
) -> tuple[str, str, float]:
    """Apply the certified/paper rules; returns (horizon, constraint, alpha) actually used."""
    if bound == "paper":
        h = horizon or "lnT"
        if not noise_condition_holds(alpha, sigma, "strict"):
            notes.append(
                f"σ={sigma:g}, α={alpha:g} violate Theorem 3's printed condition σ² ≥ 2α(α−1)"
                + (
                    ""
                    if noise_condition_holds(alpha, sigma, "proof")
                    else " and the proof's σ² ≥ α(α−1)/2"
                )
            )
        notes.append(
            "paper: Theorem 3 as the reference code computes it (ln T horizon, N_u = T/n, no σ condition); "
            "not a guarantee"
            if h == "lnT"
            else f"paper bound evaluated with horizon={h}; not a guarantee"
        )
        return h, "none", alpha
    if bound != "certified":
        raise ValueError(f"bound must be 'certified' or 'paper', got {bound!r}")
    h = horizon or "exact"
    if h == "lnT":
        raise ValueError(
            "horizon='lnT' under-estimates the proof's sum (ln T < H_T): not allowed for bound='certified'"
        )
    if h not in ("exact", "harmonic"):
        raise ValueError(f"horizon must be one of {_HORIZONS}, got {h!r}")
    if constraint not in ("strict", "proof"):
        raise ValueError(
            "bound='certified' needs constraint='strict' (σ² ≥ 2α(α−1), printed) or 'proof' (σ² ≥ α(α−1)/2); "
            f"got {constraint!r}"
        )
    if not noise_condition_holds(alpha, sigma, constraint):
        amax = alpha_max(sigma, constraint)
        k = CONSTRAINT_K[constraint]
        msg = (
            f"σ={sigma:g} violates the {constraint} noise condition σ² ≥ {k:g}·α(α−1) at α={alpha:g} "
            f"(largest admissible α is {amax:.6g})"
        )
        if on_violation == "refuse":
            raise ValueError(
                msg + "; refusing (use on_violation='clamp', a larger σ, or bound='paper')"
            )
        if on_violation != "clamp":
            raise ValueError("on_violation must be 'refuse' or 'clamp'")
        if amax <= 1.0 + 1e-12:
            raise ValueError(msg + "; no order α > 1 is admissible")
        notes.append(
            msg + f"; α clamped to {amax:.6g} — the reported losses are RDP of order {amax:.6g}"
        )
        alpha = amax
    return h, constraint, alpha


def _contributions(
    contributions: Any, T: int, n: int, cap: float | None, bound: str, notes: list[str]
) -> np.ndarray:
    if contributions is None:
        N = np.full(n, T / n)
        if bound == "certified" and cap is None:
            notes.append(
                "N_u = T/n is the expected number of contributions; it is a guarantee only if every node caps its "
                "contributions at N_max = T/n (Remark 5)"
            )
    else:
        N = np.broadcast_to(np.asarray(contributions, dtype=float), (n,)).copy()
        if (N < 0).any():
            raise ValueError("contributions must be non-negative")
    if cap is not None:
        N = np.minimum(N, float(cap))
        notes.append(f"contributions capped at N_max = {cap:g} per node")
    return N


def _certified_harmonic_tail(spec: RWSpectrum | np.ndarray, T: int) -> float:
    """Entrywise bound on ``|Σ_{t>T} (W^t − J/n)_{uv}/t| ≤ max_{i≥2} |R_T(λ_i)|`` (Cauchy–Schwarz on φ rows)."""
    lam = spec.eigenvalues if isinstance(spec, RWSpectrum) else np.asarray(spec)
    return float(power_harmonic_tail_bound(lam[:-1], T).max())


@dataclass(frozen=True)
class WalkLossOptions:
    """How a random-walk loss is accounted (shared by :func:`rw_pndp_matrix` and :func:`rw_pair_loss`).

    ``bound``: "certified" or "paper" (Theorem 3 as the reference code computes it; a labelled
    reproduction).  ``horizon``: "exact" / "harmonic" (certified) or "lnT" (paper only); ``None`` is
    the bound's default.  ``contributions``: None → ``T/n`` (expected count), a scalar, or a per-node
    vector ``N_u``; ``max_contributions`` caps N_u (Remark 5).  ``constraint``: the σ condition
    ("strict" σ² ≥ 2α(α−1) as printed, "proof" σ² ≥ α(α−1)/2); ``on_violation``: "refuse" or "clamp"
    α to the largest admissible order.  ``passage``: "power" ((W^i)_uv) or "first_passage".
    """

    bound: str = "certified"
    horizon: str | None = None
    contributions: Any = None
    sender_known: bool = False
    constraint: str = "strict"
    passage: str = "power"
    max_contributions: float | None = None
    on_violation: str = "refuse"

    def __post_init__(self) -> None:
        if self.bound not in ("certified", "paper"):
            raise ValueError(f"bound must be 'certified' or 'paper', got {self.bound!r}")
        if self.horizon is not None and self.horizon not in _HORIZONS:
            raise ValueError(f"horizon must be one of {_HORIZONS}, got {self.horizon!r}")
        if self.bound == "certified" and self.horizon == "lnT":
            raise ValueError(
                "horizon='lnT' under-estimates the proof's sum (ln T < H_T): not allowed for "
                "bound='certified'"
            )
        if self.bound == "certified" and self.constraint not in ("strict", "proof"):
            raise ValueError(
                "bound='certified' needs constraint='strict' (σ² ≥ 2α(α−1), printed) or 'proof' "
                f"(σ² ≥ α(α−1)/2); got {self.constraint!r}"
            )
        if self.passage not in _PASSAGES:
            raise ValueError(f"passage must be one of {_PASSAGES}, got {self.passage!r}")
        if self.on_violation not in ("refuse", "clamp"):
            raise ValueError(f"on_violation must be 'refuse' or 'clamp', got {self.on_violation!r}")
        if self.max_contributions is not None and not self.max_contributions > 0:
            raise ValueError(f"max_contributions must be > 0, got {self.max_contributions!r}")


def rw_pndp_matrix(
    W: Any,
    T: int,
    alpha: float,
    sigma: float,
    options: WalkLossOptions | None = None,
    **legacy: Any,
) -> PrivacyMatrix:
    """All-pairs PNDP matrix ``ε_{u→v} = N_u · S[u, v]`` (RDP of order α), labelled certified or paper.

    ``options`` (:class:`WalkLossOptions`) says how; the same fields are also accepted as keywords (the
    old call form, kept for the many callers) and override ``options``.  See the module docstring
    for what "certified" means.
    """
    o = resolve(WalkLossOptions, options, legacy, "rw_pndp_matrix")
    bound, horizon, contributions, sender_known = (
        o.bound,
        o.horizon,
        o.contributions,
        o.sender_known,
    )
    constraint, passage, max_contributions, on_violation = (
        o.constraint,
        o.passage,
        o.max_contributions,
        o.on_violation,
    )
    T = int(T)
    notes: list[str] = []
    h, used_constraint, a = _resolve(bound, horizon, constraint, alpha, sigma, on_violation, notes)
    if bound == "paper" and passage != "power":
        notes.append("passage=first_passage is not the paper's bound; reported as requested")
    spec = rw_spectrum(W)
    n = spec.n
    if spec.periodic:
        notes.append(
            "W is periodic (eigenvalue −1, e.g. the printed Hamilton rule on a bipartite graph)"
        )
    N = _contributions(contributions, T, n, max_contributions, bound, notes)
    S = rw_single_loss_matrix(W, T, a, sigma, horizon=h, passage=passage, sender_known=sender_known)
    if bound == "certified" and h == "harmonic":
        tb = (a / sigma**2) * _certified_harmonic_tail(spec, T)
        S += tb
        np.fill_diagonal(S, 0.0)
        notes.append(
            f"harmonic horizon plus the tail bound {tb:.3e} per contribution (≥ the exact finite-T sum)"
        )
    if bound == "certified":
        notes.append(
            "assumes non-expansive updates (convex β-smooth losses, γ ≤ 2/β) and no release of x_T"
        )
    if passage == "first_passage":
        notes.append(
            "first-passage probabilities (tighter than (W^i)_uv; hushnet option, not in the paper)"
        )
    if sender_known:
        notes.append("sender-known view: App. B.1 bound max_{w∈N(v)} ε_{u→w}")
    Mx = S * N[:, None]
    np.fill_diagonal(Mx, 0.0)
    components = None
    if bound == "certified":
        Mx, components = with_local_dp(Mx, N, a, sigma)
        won = int(np.sum((components[LOCAL_DP] < components[WALK])[~np.eye(n, dtype=bool)]))
        notes.append(
            f"certified: per pair min(random-walk bound, local-DP bound N_u·α/(2σ²)), both valid; "
            f"local-DP won on {won} of {n * (n - 1)} pairs"
        )
    return PrivacyMatrix(
        matrix=Mx,
        alpha=float(a),
        bound=bound,
        view="sender-known" if sender_known else "anonymous",
        horizon=h,
        constraint=used_constraint,
        notes=notes,
        sigma=float(sigma),
        T=T,
        passage=passage,
        adjacency=spec.adjacency,
        components=components,
    )


WALK = "random-walk"
LOCAL_DP = "local-DP"


def with_local_dp(
    walk_rdp: np.ndarray, contributions: Any, alpha: float, sigma: float
) -> tuple[np.ndarray, dict]:
    """``min(walk bound, local-DP bound)`` per pair, and both components (the one rule of every entry point).

    Every view of a walk is a post-processing of the noisy contributions themselves, so the Gaussian
    RDP of ``N_u`` contributions seen in the clear, ``N_u·α/(2σ²)`` (composition of Gaussian
    mechanisms), is also a valid bound at every order, whatever the walk; the node's ledger charges
    the same minimum per contribution and per order (``hushnet.runs.accounting.ContributionCost``).
    On short rings with long walks the local-DP bound wins (ring:10, T = 1000, σ = 4: 6.25 vs 14.76).
    """
    walk = np.asarray(walk_rdp, dtype=float)
    n = walk.shape[0]
    N = np.broadcast_to(np.asarray(contributions, dtype=float), (n,))
    ldp = np.broadcast_to((N * alpha / (2.0 * sigma**2))[:, None], walk.shape).copy()
    np.fill_diagonal(ldp, 0.0)
    out = np.minimum(walk, ldp)
    return out, {WALK: walk, LOCAL_DP: ldp}


# ----------------------------------------------------------------------------------------------------------------
# One pair
# ----------------------------------------------------------------------------------------------------------------
def _row_power_sums(Ws: sp.csr_matrix, u: int, T: int) -> np.ndarray:
    """``Σ_{t=1}^T (W^t)_{u,:}/t`` by T sparse mat-vecs (W symmetric, so rows = columns)."""
    x = np.zeros(Ws.shape[0])
    x[u] = 1.0
    acc = np.zeros_like(x)
    for t in range(1, T + 1):
        x = Ws @ x
        acc += x / t
    return acc


def _first_passage_column(Ws: sp.csr_matrix, targets: Sequence[int], T: int) -> np.ndarray:
    """``Σ_{i=1}^T P_u(first visit of the set F at step i)/i`` for every start u (F = targets)."""
    F = np.asarray(list(targets), dtype=int)
    n = Ws.shape[0]
    keep = np.ones(n)
    keep[F] = 0.0
    f = np.asarray(Ws[:, F].sum(axis=1)).ravel()
    acc = f.copy()
    cum = f.copy()
    for i in range(2, T + 1):
        f = Ws @ (keep * f)
        acc += f / i
        cum += f
        rem = max(float((1.0 - cum).max()), 0.0)
        if i < T and rem / (i + 1) < 1e-15:
            acc += np.maximum(1.0 - cum, 0.0) / (i + 1)
            break
    return acc


def rw_pair_loss(
    W: Any,
    u: int,
    v: int,
    T: int,
    alpha: float,
    sigma: float,
    options: WalkLossOptions | None = None,
) -> float:
    """``ε_{u→v}`` for one pair, equal to ``rw_pndp_matrix(...).matrix[u, v]`` with the same options.

    Cheaper than the matrix: O(n) from a cached spectrum, else T sparse mat-vecs (exact horizon) when that costs
    less than an ``eigh``; first passage uses one column recursion.  With ``on_violation="clamp"`` the value is at
    the clamped order (see :func:`rw_pndp_matrix`).  Certified values are ``min(walk bound, local-DP bound)``
    (:func:`with_local_dp`), as in the matrix.
    """
    o = resolve(WalkLossOptions, options, {}, "rw_pair_loss")
    bound, horizon, contributions, sender_known = (
        o.bound,
        o.horizon,
        o.contributions,
        o.sender_known,
    )
    constraint, passage, max_contributions, on_violation = (
        o.constraint,
        o.passage,
        o.max_contributions,
        o.on_violation,
    )
    T = int(T)
    if u == v:
        return 0.0
    notes: list[str] = []
    h, _, a = _resolve(bound, horizon, constraint, alpha, sigma, on_violation, notes)
    Ws = _csr_W(W)
    n = Ws.shape[0]
    N = _contributions(contributions, T, n, max_contributions, bound, notes)[u]
    key_cached = _w_key(W) in _SPECTRUM_CACHE
    if passage == "first_passage":
        if h != "exact":
            raise ValueError("passage='first_passage' is a finite-T sum: use horizon='exact'")
        if sender_known:
            raise ValueError("sender_known is defined for passage='power' only")
        rw_spectrum(W)
        return _cap(
            float(N * (a / sigma**2) * _first_passage_column(Ws, [v], T)[u]), N, a, sigma, bound
        )
    if passage != "power":
        raise ValueError(f"passage must be one of {_PASSAGES}")
    cheap_iter = h == "exact" and not key_cached and T * max(Ws.nnz, n) < n**3 // 4
    if cheap_iter:
        _validate_sparse(Ws)
        row = _row_power_sums(Ws, u, T)
        row_tail = 0.0
    else:
        spec = rw_spectrum(W)
        g = _horizon_weights(spec.eigenvalues, T, h)
        phi = spec.eigenvectors
        if sender_known:
            row = (phi[u] * g) @ phi.T
        else:
            row = np.zeros(n)
            row[v] = float((phi[u] * g) @ phi[v])
        row_tail = (
            _certified_harmonic_tail(spec, T) if (bound == "certified" and h == "harmonic") else 0.0
        )
    if h == "exact":
        row = np.maximum(row, 0.0)  # as in rw_single_loss_matrix: the exact sum is non-negative
    val = row[v]
    if sender_known:
        lo, hi = Ws.indptr[v], Ws.indptr[v + 1]
        nb = Ws.indices[lo:hi][(Ws.indices[lo:hi] != v) & (Ws.data[lo:hi] > 0)]
        if nb.size:
            val = max(val, float(row[nb].max()))
    return _cap(float(N * (a / sigma**2) * (val + row_tail)), N, a, sigma, bound)


def _cap(walk: float, N: float, alpha: float, sigma: float, bound: str) -> float:
    """One pair's certified value: the walk bound capped by the local-DP bound (paper values untouched)."""
    return min(walk, float(N) * alpha / (2.0 * sigma**2)) if bound == "certified" else walk


# ----------------------------------------------------------------------------------------------------------------
# Collusion, means
# ----------------------------------------------------------------------------------------------------------------
def rw_collusion_loss(
    W: Any,
    u: int,
    coalition: Iterable[int],
    T: int,
    alpha: float,
    sigma: float,
    *,
    passage: str = "first_passage",
    contributions: float | None = None,
) -> float:
    """Loss of u towards a colluding set F (App. D / docs/design/spec/randomwalk.md §B.4.8), u ∉ F, order α, per ``contributions`` (default T/n).

    ``passage="first_passage"``: ``(α/σ²) Σ_i P_u(first hit of F at i)/i`` — the sharp form.
    ``passage="power"``: ``(α/σ²) Σ_i Σ_{v∈F} (W^i)_{uv}/i = Σ_{v∈F} ε_{u→v}`` (basic composition).
    No σ condition is checked here: combine with :func:`noise_condition_holds` for a certified use.
    """
    F = sorted(set(int(x) for x in coalition))
    if u in F:
        raise ValueError("u must not belong to the coalition")
    if not F:
        return 0.0
    Ws = _csr_W(W)
    n = Ws.shape[0]
    rw_spectrum(W)
    N = T / n if contributions is None else float(contributions)
    if passage == "first_passage":
        val = _first_passage_column(Ws, F, int(T))[u]
    elif passage == "power":
        val = float(_row_power_sums(Ws, u, int(T))[F].sum())
    else:
        raise ValueError(f"passage must be one of {_PASSAGES}")
    return float(N * (alpha / sigma**2) * val)


def rw_mean_single_loss(W: Any, T: int, horizon: str = "exact") -> float:
    """``mean_{u≠v}`` of the per-contribution matrix at α/σ² = 1, from the eigenvalues alone (O(n)).

    Entries of ``Σ_t W^t/t`` sum to ``n H_T`` (bi-stochastic) and its trace is ``Σ_i s_T(λ_i)``; for the ln T/H_T
    forms ``M 1 = 0`` gives ``mean = c/n + Σ_{i≥2} ln(1−λ_i)/(n(n−1))`` (docs/design/spec/randomwalk.md §B.4.2 closed-form mean).
    """
    lam = rw_eigenvalues(W)
    n = lam.size
    g = _horizon_weights(lam, int(T), horizon)
    total = n * g[-1]  # row sums: g(1)·n (eigenvector 1/√n)
    return float((total - g.sum()) / (n * (n - 1)))


# ----------------------------------------------------------------------------------------------------------------
# σ calibration (docs/design/spec/randomwalk.md §B.8)
# ----------------------------------------------------------------------------------------------------------------
def _best_dp(mean_a: float, sigma: float, delta: float, constraint: str) -> tuple[float, float]:
    """``min_{α∈(1, α_max(σ)]} α·mean_a/σ² + ln(1/δ)/(α−1)`` and the minimiser (convex in α)."""
    L = math.log(1.0 / delta)
    a_star = 1.0 + math.sqrt(L * sigma**2 / mean_a) if mean_a > 0 else math.inf
    a = min(a_star, alpha_max(sigma, constraint))
    if not math.isfinite(a):
        return L * 0.0, a  # mean_a == 0 with no constraint: loss → 0
    if a <= 1.0:
        return math.inf, a
    return a * mean_a / sigma**2 + L / (a - 1.0), a


def calibrate_sigma_mean(
    W: Any,
    T: int,
    N_u: Any,
    target_eps: float,
    delta: float,
    constraint: str = "strict",
    *,
    horizon: str = "exact",
    rtol: float = 1e-10,
) -> float:
    """Smallest σ such that the mean pairwise (ε, δ) loss is ≤ ``target_eps`` (docs/design/spec/randomwalk.md §B.8).

    ``ε_{u→v}(α, σ) = α A_{uv}/σ²`` with ``A = N_u · S(α=σ=1)``; the (ε, δ) value is minimised over
    ``α ∈ (1, α_max(σ)]`` (``constraint``: strict k=2, proof k=1/2, none k=0), then σ is bisected.  ``N_u``: None →
    T/n, scalar, or per-node vector.  ``horizon``: "exact" (certified), "harmonic" or "lnT" (the spec's reference
    convention, used for its table).  Returns σ (noise multiplier).
    """
    lam = rw_eigenvalues(W)
    n = lam.size
    T = int(T)
    if N_u is None or np.ndim(N_u) == 0:
        Nu = T / n if N_u is None else float(N_u)
        mean_a = Nu * rw_mean_single_loss(W, T, horizon)
        if horizon == "harmonic":  # certified harmonic = H_T form + tail bound (see rw_pndp_matrix)
            mean_a += Nu * _certified_harmonic_tail(lam, T)
    else:
        Nv = np.asarray(N_u, dtype=float)
        S = rw_single_loss_matrix(W, T, 1.0, 1.0, horizon=horizon)
        if horizon == "harmonic":
            S += _certified_harmonic_tail(lam, T)
            np.fill_diagonal(S, 0.0)
        mean_a = float((Nv[:, None] * S).sum() / (n * (n - 1)))
    if not (target_eps > 0 and 0 < delta < 1):
        raise ValueError("need target_eps > 0 and 0 < delta < 1")
    f = lambda s: _best_dp(mean_a, s, delta, constraint)[0]  # noqa: E731 - decreasing in σ
    lo, hi = 1e-6, 1.0
    while f(hi) > target_eps:
        hi *= 2.0
        if hi > 1e12:
            raise ValueError(
                "no σ reaches the target (the conversion term ln(1/δ)/(α−1) alone exceeds it)"
            )
    while f(lo) <= target_eps and lo > 1e-12:
        lo /= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if f(mid) <= target_eps:
            hi = mid
        else:
            lo = mid
        if hi - lo <= rtol * hi:
            break
    return float(hi)


# ----------------------------------------------------------------------------------------------------------------
# Ring and star closed forms (docs/design/spec/randomwalk.md §B.4.5, B.4.6)
# ----------------------------------------------------------------------------------------------------------------
def ring_M_closed_form(n: int, a: int) -> float:
    """Corrected ring closed form of ``M_{u,u+a}`` for ``W = (I + A_R)/3``: ``(1/n)Σ_k cos(2πak/n) ln(3/(4 sin²(πk/n)))``."""
    k = np.arange(1, n)
    return float(
        np.sum(np.cos(2 * np.pi * a * k / n) * np.log(3.0 / (4.0 * np.sin(np.pi * k / n) ** 2))) / n
    )


def ring_single_loss_closed_form(
    n: int, a: int, T: int, alpha: float, sigma: float, horizon: str = "exact"
) -> float:
    """Corrected Theorem 5 (docs/design/spec/randomwalk.md §B.4.5): per-contribution loss at ring offset ``a``, ``W = (I + A_R)/3``.

    ``(α/(nσ²)) [c_T + Σ_{k=1}^{n−1} cos(2πak/n) g(λ_k)]`` with ``λ_k = (1 + 2cos(2πk/n))/3``; exact horizon uses
    ``c_T = H_T, g = s_T``; harmonic ``H_T, −ln(1−λ)``; lnT ``ln T, −ln(1−λ)``.
    """
    k = np.arange(1, n)
    lam = (1.0 + 2.0 * np.cos(2 * np.pi * k / n)) / 3.0
    if horizon == "exact":
        c, g = harmonic_number(T), power_harmonic_sum(lam, T)
    elif horizon in ("harmonic", "lnT"):
        c = harmonic_number(T) if horizon == "harmonic" else math.log(T)
        g = np.log(3.0 / (4.0 * np.sin(np.pi * k / n) ** 2))
    else:
        raise ValueError(f"horizon must be one of {_HORIZONS}")
    return float(alpha / (n * sigma**2) * (c + np.sum(np.cos(2 * np.pi * a * k / n) * g)))


def star_transition_matrix(n: int) -> np.ndarray:
    """The valid symmetric bi-stochastic star chain (centre 0): centre→leaf 1/(n−1), leaf self-loop (n−2)/(n−1)."""
    W = np.zeros((n, n))
    W[0, 1:] = W[1:, 0] = 1.0 / (n - 1)
    W[np.arange(1, n), np.arange(1, n)] = (n - 2.0) / (n - 1.0)
    return W
