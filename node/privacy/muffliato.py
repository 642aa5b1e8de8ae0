"""Muffliato (Cyffers et al., NeurIPS 2022) privacy accounting: the paper's bounds and the exact one.

Muffliato averaging adds Gaussian noise once, ``x⁰ = x + η``, then gossips: every message is a
row of ``P_t(W)`` applied to the same ``x + η``.  [M] Theorem 1 adds up the Rényi divergences of
the individual messages as if they were independent; they are not (they share η), and the
observer can do far better by combining them.  Spec gossip.md §1.3.9 shows the observer recovers
the antipode's noisy input *exactly* on the paper's own hypercube setting.  Hence two numbers:

* ``bound="paper"``: [M] eq. (6) (Theorem 1), unclipped — a labelled reproduction, never a
  guarantee; the printed formulas live in :mod:`hushnet.privacy.paper.muffliato`.  (Figures clip it at the LDP value α Δ²/2σ² when drawing, as the paper's code does.)
* ``bound="certified"``: the exact Rényi divergence of the observer's whole Gaussian view,
  ``α Δ²/(2σ²) · ‖Π_{row(R̃_v)} e_u‖²`` where ``R̃_v`` stacks the rows the observer sees with the
  observer's own column removed (it knows its own noise) — [K] Lemma 6 applied to Muffliato.

How the certified value is computed: the observer's rows span a block Krylov space of W, so an
orthonormal basis is grown round by round with block Arnoldi (re-orthogonalised, with deflation);
``Δ²(u→v) = ‖Π_v e_u‖²`` for every source at once.  Stacking the explicit rows ``W^t`` and
factorising them instead loses rank as T grows (powers of W are badly conditioned) and would
*under*-state the loss; a test checks the Arnoldi dimension against exact arithmetic modulo a
prime.  Muffliato-GD is accounted as one joint view across rounds (the state carries noise from
round to round; adding per-round values under-states the loss, also tested).

Conventions (fixed by the issue): the observer of view ``"neighbourhood"`` sees ``x^t_w`` for
every w in its closed neighbourhood at t = 0..T−1 and knows its own noise; view ``"aggregate"``
sees only what secure summation would give it: its own input and the weighted sums
``Σ_w W_vw x^t_w`` it receives at t = 0..T−1.  Rounds are plain gossip unless ``chebyshev``
(Alg. 1 with Def. 3 initialisation); acceleration changes messages but not the exact loss,
because ``P_t(W)`` rows span the same space as the ``W^s`` rows, s ≤ t.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import scipy.sparse as sp

from hushnet.privacy.graphs import chebyshev_gamma, spectral_gap
from hushnet.privacy.linear_gaussian import (
    brute_force_sensitivity_sq,
    gaussian_loss,
    projection_weights,
    rdp_of,
)
from hushnet.privacy.matrix import PrivacyMatrix
from hushnet.privacy.view_basis import IMAGE_ATOL, pairwise_view_basis, svd_basis

__all__ = [
    "muffliato_loss_matrix",
    "muffliato_pair",
    "MuffliatoOptions",
    "muffliato_observer_losses",
    "exact_sensitivity_matrix",
    "observer_sensitivities",
    "observer_view_matrix",
    "t_mix",
    "gossip_rows",
    "simulate",
    "randomized_schedule",
    "randomized_products_view",
    "randomized_exact_matrix",
    "muffliato_gd_loss",
    "muffliato_gd_state_space",
    "krylov_weights",
    "krylov_basis",
    "VIEWS",
]

VIEWS = ("neighbourhood", "aggregate")


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------
def _csr(W) -> sp.csr_matrix:
    return W.tocsr() if sp.issparse(W) else sp.csr_matrix(np.asarray(W, dtype=float))


def _neighbours(Wc: sp.csr_matrix, v: int) -> np.ndarray:
    """Nodes w ≠ v with W_vw ≠ 0 (the communication graph is W's support)."""
    row = Wc.indices[Wc.indptr[v] : Wc.indptr[v + 1]]
    vals = Wc.data[Wc.indptr[v] : Wc.indptr[v + 1]]
    return np.sort(row[(row != v) & (vals != 0)])


def _adjacency(Wc: sp.csr_matrix) -> sp.csr_matrix:
    A = (Wc != 0).astype(float).tolil()
    A.setdiag(0.0)
    A = A.tocsr()
    A.eliminate_zeros()
    return A


def _gamma(Wc, chebyshev: bool, gamma: float | None) -> float | None:
    if not chebyshev:
        return None
    return chebyshev_gamma(Wc, kind="code") if gamma is None else float(gamma)


def t_mix(W, sigma: float, randomized: bool = False, spread: float = 0.25) -> int:
    """The reference code's ``T_mix``: ``⌈λ^{-1/2} ln(n/σ² · max(spread, σ²))⌉`` (docs/design/spec/gossip.md §1.2.2).

    ``λ`` is the code's gap ``1 − λ₂(W)``; ``randomized`` uses ``1/λ`` (``T_mix_randomized``).
    """
    Wc = _csr(W)
    n = Wc.shape[0]
    lam = spectral_gap(Wc, kind="code")
    rate = lam if randomized else math.sqrt(lam)
    return int(math.ceil(math.log(n / sigma**2 * max(spread, sigma**2)) / rate))


def gossip_rows(
    W,
    nodes: Sequence[int],
    T: int,
    *,
    chebyshev: bool = False,
    gamma: float | None = None,
    extra_multiply: bool = False,
) -> np.ndarray:
    """``Y[t][:, k]`` = row ``nodes[k]`` of ``P_t(W)`` (as a column), t = 0..T−1.  Shape (T, n, k).

    ``P_t`` is ``W^t``, or the rescaled Chebyshev polynomial of Def. 3 with ``chebyshev``.  With
    ``extra_multiply`` the rows are those of ``W P_t(W)`` (what secure summation reveals).
    Rows are propagated as columns with ``Wᵀ`` (sparse), so nothing n×n is formed.
    """
    Wc = _csr(W)
    n = Wc.shape[0]
    Wt = Wc.T.tocsr()
    idx = np.asarray(nodes, dtype=np.int64)
    Y = np.zeros((T, n, idx.size))
    if T == 0:
        return Y
    cur = np.zeros((n, idx.size))
    cur[idx, np.arange(idx.size)] = 1.0
    prev = None
    g = _gamma(Wc, chebyshev, gamma)
    for t in range(T):
        Y[t] = Wt @ cur if extra_multiply else cur
        if t == T - 1:
            break
        nxt = np.asarray(Wt @ cur)
        if g is not None and prev is not None:
            nxt = g * nxt + (1.0 - g) * prev
        prev, cur = cur, nxt
    return Y


def simulate(
    W, x0: np.ndarray, T: int, *, chebyshev: bool = False, gamma: float | None = None
) -> Iterator[np.ndarray]:
    """Run Alg. 1 from the noisy inputs ``x0`` (n or n×N); yields ``x^t`` for t = 0..T.

    Def. 3 initialisation (``x¹ = W x⁰``), so the mean is preserved exactly (docs/design/spec/gossip.md §1.2.2).
    """
    Wc = _csr(W)
    g = _gamma(Wc, chebyshev, gamma)
    prev, cur = None, np.asarray(x0, dtype=float)
    for t in range(T + 1):
        yield cur
        if t == T:
            return
        nxt = np.asarray(Wc @ cur)
        if g is not None and prev is not None:
            nxt = g * nxt + (1.0 - g) * prev
        prev, cur = cur, nxt


# --------------------------------------------------------------------------------------------
# exact (certified) accountant
# --------------------------------------------------------------------------------------------
def _view_nodes(Wc: sp.csr_matrix, v: int, view: str, own_noise_known: bool = True) -> np.ndarray:
    """Whose messages the observer records.  With ``own_noise_known=False`` (the optimistic model of
    [M] eq. (5), used by the spec's §1.3.9 table) the observer's own states are left out, because
    seeing ``x_v + η_v`` while knowing ``x_v`` would reveal ``η_v``."""
    if view == "neighbourhood":
        # The observer's own states are not stacked: row v of P_t(W) is a combination of e_v and
        # its neighbours' earlier rows (row v of W^t = Σ_w W_vw · row w of W^{t−1}), so once its own
        # noise is known (column v removed) they add nothing; without that knowledge they are
        # excluded by [M]'s model.  ``dense_exact_pair`` stacks them and the tests compare.
        return _neighbours(Wc, v).astype(np.int64)
    if view == "aggregate":
        return np.array([v], dtype=np.int64)
    raise ValueError(f"unknown view {view!r}; use one of {VIEWS}")


def _assemble(Y: np.ndarray, v: int, view: str, own_noise_known: bool) -> np.ndarray:
    """n×r matrix whose columns are the observer's rows; own column (coordinate v) zeroed if known."""
    T, n, m = Y.shape
    M = Y.transpose(1, 0, 2).reshape(n, T * m)
    if view == "aggregate" and own_noise_known:  # the observer also holds its own input x_v + η_v
        e = np.zeros((n, 1))
        e[v, 0] = 1.0
        M = np.concatenate([e, M], axis=1)
    else:
        M = M.copy()
    if own_noise_known:
        M[v, :] = 0.0
    return M


def observer_view_matrix(
    W,
    observer: int,
    T: int,
    *,
    view: str = "neighbourhood",
    chebyshev: bool = False,
    gamma: float | None = None,
    own_noise_known: bool = True,
) -> np.ndarray:
    """The observer's view as an n×r matrix R̃ᵀ: view = R̃ᵀ... i.e. ``O = Mᵀ(x + η)`` up to known terms.

    Columns: for view "neighbourhood", rows ``P_t(W)[w, :]`` for t < T, w ∈ N̄(v); for
    "aggregate", ``e_v`` and ``(W P_t(W))[v, :]``.  Row v (the observer's own coordinate) is zero
    when the observer knows its own noise: known noise protects nobody.  ``own_noise_known=False``
    is [M]'s optimistic model (neighbours' messages only; the observer's noise counts as cover).
    """
    Wc = _csr(W)
    nodes = _view_nodes(Wc, observer, view, own_noise_known)
    Y = gossip_rows(
        Wc, nodes, T, chebyshev=chebyshev, gamma=gamma, extra_multiply=view == "aggregate"
    )
    return _assemble(Y, observer, view, own_noise_known)


def _svd_left(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Left singular vectors and values; falls back to LAPACK's gesvd when gesdd fails to converge
    (it happens, rarely, on some well-scaled inputs)."""
    try:
        U, sv, _ = np.linalg.svd(X, full_matrices=False)
    except np.linalg.LinAlgError:
        import scipy.linalg as sla

        U, sv, _ = sla.svd(X, full_matrices=False, lapack_driver="gesvd")
    return U, sv


def krylov_weights(
    W, fixed: Sequence[int], start: Sequence[int] | np.ndarray, expansions: int, rtol: float = 1e-9
) -> np.ndarray:
    """``‖Π_S e_u‖²`` for every u (see :func:`krylov_basis`, whose basis vectors' squared rows these are)."""
    B = krylov_basis(W, fixed, start, expansions, rtol)
    return np.einsum("ij,ij->i", B, B)


def krylov_basis(
    W, fixed: Sequence[int], start: Sequence[int] | np.ndarray, expansions: int, rtol: float = 1e-9
) -> np.ndarray:
    """Orthonormal basis (n×r) of ``S = span{e_f : f ∈ fixed} + span{W^t X₀ : t ≤ expansions}`` minus the
    fixed part (its squared rows are ``‖Π_S e_u‖²`` minus the fixed part), by block Arnoldi with full
    re-orthogonalisation and deflation.

    Why this works for Muffliato: the observer's rows span a block Krylov space of W (rows of
    ``W^t`` for its neighbours, t < T), so an orthonormal basis can be grown one round at a time
    at cost O(n·k·d) per round instead of factorising the whole (T·d)-row view.  Knowing its own
    noise, the observer's space is ``P_v S`` with ``P_v`` removing coordinate v; that equals
    ``(S + span e_v) ∩ e_v^⊥``, so e_v is put first in the basis (``fixed``) and every Krylov
    direction is orthogonalised against it; the weights of the remaining basis vectors are the
    sensitivities.  (And ``S + span e_v`` is closed under the recursion because
    ``W e_v ∈ span{e_w : w ∈ N̄(v)}``.)  ``start`` is either node indices (unit vectors) or an
    n×d array.  New directions shorter than ``rtol`` (inputs have unit norm, ‖W‖₂ ≤ 1) count as
    already present.
    """
    Wc = _csr(W)
    n = Wc.shape[0]
    fixed = np.asarray(fixed, dtype=np.int64)
    if isinstance(start, np.ndarray) and start.ndim == 2:
        X = start.astype(float, copy=True)
    else:
        idx = np.asarray(start, dtype=np.int64)
        X = np.zeros((n, idx.size))
        X[idx, np.arange(idx.size)] = 1.0
    cap = fixed.size + X.shape[1] * (expansions + 1)
    Q = np.zeros((n, min(cap, n)), order="F")
    Q[fixed, np.arange(fixed.size)] = 1.0
    k = fixed.size
    new = X  # the directions added by the last expansion (the start, before the first one)
    for step in range(expansions + 1):
        if step > 0:
            X = np.asarray(Wc @ new)
        if k:
            for _ in range(2):  # "twice is enough"
                X -= Q[:, :k] @ (Q[:, :k].T @ X)
        if X.shape[1] == 0:
            break
        U, sv = _svd_left(X)
        keep = sv > rtol
        if not keep.any() or k >= Q.shape[1]:
            break
        new = U[:, keep][:, : Q.shape[1] - k]
        if k:
            new -= Q[:, :k] @ (Q[:, :k].T @ new)
            new, _ = np.linalg.qr(new)
        Q[:, k : k + new.shape[1]] = new
        k += new.shape[1]
    return Q[:, fixed.size : k].copy()


def _krylov_observer(
    Wc: sp.csr_matrix, v: int, T: int, view: str, own_noise_known: bool
) -> np.ndarray:
    n = Wc.shape[0]
    if T <= 0:
        return np.zeros(n)
    fixed = [v] if own_noise_known else []
    if view == "neighbourhood":
        start: Any = _neighbours(Wc, v)
    elif view == "aggregate":
        start = np.asarray(Wc.T[:, [v]].toarray())  # (W P_0)[v, :] = W[v, :] as a column
    else:
        raise ValueError(f"unknown view {view!r}; use one of {VIEWS}")
    s = krylov_weights(Wc.T.tocsr(), fixed, start, T - 1)
    s[v] = 0.0
    return np.clip(s, 0.0, 1.0)


def observer_sensitivities(
    W,
    observer: int,
    T: int,
    *,
    view: str = "neighbourhood",
    chebyshev: bool = False,
    gamma: float | None = None,
    own_noise_known: bool = True,
    method: str = "krylov",
) -> np.ndarray:
    """``Δ²(u → observer)`` for every source u, in units of Δ² (so in [0, 1]); entry u = v is 0.

    ``method="krylov"`` (default) grows an orthonormal basis of the observer's row space round by
    round (block Arnoldi, :func:`krylov_weights`); acceleration does not change that space.
    ``method="rows"`` stacks the explicit rows ``P_t(W)[w, :]`` and factorises them — kept as a
    cross-check; it under-counts the rank when T is large, because explicit powers are badly
    conditioned (on grid 10×10, T = 30 it finds 41 of the 60 dimensions an exact computation
    modulo a prime finds), which would under-state the loss.
    """
    Wc = _csr(W)
    if method == "krylov":
        return _krylov_observer(Wc, observer, T, view, own_noise_known)
    if method != "rows":
        raise ValueError("method must be 'krylov' or 'rows'")
    M = observer_view_matrix(
        Wc,
        observer,
        T,
        view=view,
        chebyshev=chebyshev,
        gamma=gamma,
        own_noise_known=own_noise_known,
    )
    s = projection_weights(M)
    s[observer] = 0.0
    return np.clip(s, 0.0, 1.0)


def exact_sensitivity_matrix(
    W,
    T: int,
    *,
    view: str = "neighbourhood",
    chebyshev: bool = False,
    gamma: float | None = None,
    own_noise_known: bool = True,
    observers: Sequence[int] | None = None,
    method: str = "krylov",
    mem_bytes: float = 2.5e8,
) -> np.ndarray:
    """``S[u, v] = Δ²(u → v)/Δ²`` for all sources u and the given observers v (all by default).

    One orthonormal basis per observer serves every source at once: ``S[u, v] = ‖Π_v e_u‖²``.
    With ``method="rows"`` observers are processed in batches whose explicit rows are propagated
    together (memory bounded by ``mem_bytes``) and factorised through Gram matrices.
    """
    Wc = _csr(W)
    n = Wc.shape[0]
    obs = np.arange(n) if observers is None else np.asarray(observers, dtype=np.int64)
    S = np.zeros((n, obs.size))
    if method == "krylov":
        for k, v in enumerate(obs):
            S[:, k] = _krylov_observer(Wc, int(v), T, view, own_noise_known)
        return S
    if method != "rows":
        raise ValueError("method must be 'krylov' or 'rows'")
    g = _gamma(Wc, chebyshev, gamma)
    sizes = np.array([_view_nodes(Wc, int(v), view, own_noise_known).size for v in obs])
    per_obs = 8.0 * max(T, 1) * n * max(float(sizes.mean()) if sizes.size else 1.0, 1.0)
    batch = max(1, int(mem_bytes // per_obs))
    for start in range(0, obs.size, batch):
        chunk = obs[start : start + batch]
        lists = [_view_nodes(Wc, int(v), view, own_noise_known) for v in chunk]
        nodes = np.concatenate(lists)
        Y = gossip_rows(
            Wc, nodes, T, chebyshev=chebyshev, gamma=g, extra_multiply=view == "aggregate"
        )
        off = 0
        for k, v in enumerate(chunk):
            m = lists[k].size
            M = _assemble(Y[:, :, off : off + m], int(v), view, own_noise_known)
            off += m
            s = projection_weights(M)
            s[v] = 0.0
            S[:, start + k] = np.clip(s, 0.0, 1.0)
    return S


def dense_exact_pair(
    W,
    source: int,
    observer: int,
    T: int,
    *,
    view: str = "neighbourhood",
    own_noise_known: bool = True,
) -> float:
    """Straightforward reference: build R̃ from dense matrix powers and use ``pinv`` (tests, baseline)."""
    Wd = W.toarray() if sp.issparse(W) else np.asarray(W, dtype=float)
    n = Wd.shape[0]
    P = np.eye(n)
    rows = []
    nbrs = ([observer] if own_noise_known else []) + [
        w for w in range(n) if w != observer and Wd[observer, w] != 0
    ]
    if view == "aggregate" and own_noise_known:
        rows.append(np.eye(n)[observer])
    for _t in range(T):
        if view == "neighbourhood":
            rows.extend(P[w] for w in nbrs)
        else:
            rows.append((Wd @ P)[observer])
        P = Wd @ P
    R = np.array(rows).reshape(-1, n)
    B = R.copy()
    if own_noise_known:
        B[:, observer] = 0.0
    e = np.zeros(n)
    e[source] = 1.0
    return brute_force_sensitivity_sq(R, B, e)


# --------------------------------------------------------------------------------------------
# public API (used by the CLI)
# --------------------------------------------------------------------------------------------
def _check(T: int, alpha: float, sigma: float, bound: str, view: str) -> None:
    if T < 0:
        raise ValueError("T must be >= 0")
    if not alpha > 1:
        raise ValueError("Rényi order alpha must be > 1")
    if not sigma > 0:
        raise ValueError("sigma must be > 0")
    if bound not in ("certified", "paper"):
        raise ValueError("bound must be 'certified' or 'paper'")
    if view not in VIEWS:
        raise ValueError(f"view must be one of {VIEWS}")


def muffliato_loss_matrix(
    W,
    T: int,
    alpha: float,
    sigma: float,
    *,
    bound: str = "certified",
    view: str = "neighbourhood",
    chebyshev: bool = False,
    graph=None,
    sensitivity: float = 1.0,
) -> PrivacyMatrix:
    """All-pairs Rényi loss ``ε_{u→v}`` of Muffliato averaging after T gossip rounds.

    Row u = source, column v = observer, diagonal 0.  ``certified``: exact RDP of the whole view
    (observer knows its own noise).  ``paper``: [M] Theorem 1, unclipped (a reproduction, not a
    guarantee; for view "aggregate" it is the neighbourhood value, which bounds it in the paper's
    own logic because the aggregate is post-processing of the neighbourhood messages).
    ``graph`` is accepted for symmetry with the other accountants; W's support is the graph.
    """
    _check(T, alpha, sigma, bound, view)
    scale = sensitivity**2
    if bound == "paper":  # labelled reproduction of the printed bound
        from hushnet.privacy.paper.muffliato import thm1_matrix

        F = thm1_matrix(W, T, convention="paper")
        np.fill_diagonal(F, 0.0)
        mat = rdp_of(alpha, scale * F, sigma)
        notes = [
            "paper: [M] Theorem 1 eq. (6), t = 0..T-1, unclipped; NOT a guarantee (docs/design/spec/gossip.md §1.3.9)",
            "acceleration does not change it (messages are post-processing of W^s rows)",
        ]
        if view == "aggregate":
            notes.append(
                "aggregate view: Theorem 1 has no such view; the neighbourhood value is shown"
            )
        return PrivacyMatrix(
            matrix=mat,
            alpha=float(alpha),
            bound="paper",
            view=view,
            notes=notes,
            protocol="muffliato",
        )
    S = exact_sensitivity_matrix(W, T, view=view, chebyshev=chebyshev, own_noise_known=True)
    mat = rdp_of(alpha, scale * S, sigma)
    notes = [
        "certified: exact Rényi divergence of the observer's whole Gaussian view (projected Gaussian mechanism)",
        "observer knows its own noise; cap alpha*Delta^2/(2 sigma^2) is the LDP value",
        f"{'Chebyshev-accelerated' if chebyshev else 'plain'} gossip, T = {T} rounds",
    ]
    return PrivacyMatrix(
        matrix=mat,
        alpha=float(alpha),
        bound="certified",
        view=view,
        notes=notes,
        protocol="muffliato",
        sensitivity_sq=scale * S,
    )


def muffliato_observer_losses(
    W,
    observer: int,
    T: int,
    alpha: float,
    sigma: float,
    *,
    bound: str = "certified",
    view: str = "neighbourhood",
    chebyshev: bool = False,
    convention: str = "paper",
    sensitivity: float = 1.0,
) -> np.ndarray:
    """Loss from every source u to one observer (cheap: only the observer's rows are propagated)."""
    _check(T, alpha, sigma, bound, view)
    Wc = _csr(W)
    if bound == "certified":
        s = observer_sensitivities(Wc, observer, T, view=view, chebyshev=chebyshev)
        return rdp_of(alpha, sensitivity**2 * s, sigma)
    from hushnet.privacy.paper.muffliato import thm1_to_observer  # labelled reproduction

    return rdp_of(alpha, sensitivity**2 * thm1_to_observer(Wc, observer, T, convention), sigma)


@dataclass(frozen=True)
class MuffliatoOptions:
    """How one Muffliato pair is accounted: ``bound`` ("certified" exact view divergence, or
    "paper" [M] Theorem 1), observer ``view``, Chebyshev-accelerated gossip, the δ at which to add
    an (ε, δ) value (``None``: RDP only) and the input's L2 ``sensitivity``."""

    bound: str = "certified"
    view: str = "neighbourhood"
    chebyshev: bool = False
    delta: float | None = None
    sensitivity: float = 1.0

    def __post_init__(self) -> None:
        if self.bound not in ("certified", "paper"):
            raise ValueError("bound must be 'certified' or 'paper'")
        if self.view not in VIEWS:
            raise ValueError(f"view must be one of {VIEWS}")
        if self.delta is not None and not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta!r}")
        if not self.sensitivity > 0:
            raise ValueError(f"sensitivity must be > 0, got {self.sensitivity!r}")


def muffliato_pair(
    W,
    source: int,
    observer: int,
    T: int,
    alpha: float,
    sigma: float,
    options: MuffliatoOptions | None = None,
) -> dict[str, Any]:
    """One pair: ``{"rdp", "sensitivity_sq", "mu_gdp", "bound", "view", ...}`` (+ ``epsilon`` with delta).

    ``sensitivity_sq`` is Δ² in the units of the input (RDP = α·sensitivity_sq/(2σ²)).  For the
    paper bound, ``mu_gdp``/``epsilon`` are what the paper's number *would* imply if it were a
    Gaussian guarantee — labelled "paper".
    """
    o = options if options is not None else MuffliatoOptions()
    bound, view, chebyshev, delta, sensitivity = (
        o.bound,
        o.view,
        o.chebyshev,
        o.delta,
        o.sensitivity,
    )
    _check(T, alpha, sigma, bound, view)
    if source == observer:
        raise ValueError("source and observer must differ")
    vec = muffliato_observer_losses(
        W,
        observer,
        T,
        2.0,
        1.0,
        bound=bound,
        view=view,
        chebyshev=chebyshev,
        sensitivity=sensitivity,
    )
    sens_sq = float(vec[source])  # at α = 2, σ = 1 the RDP equals Δ²
    out = gaussian_loss(
        sens_sq,
        alpha,
        sigma,
        delta,
        bound=bound,
        view=view,
        protocol="muffliato",
        source=int(source),
        observer=int(observer),
        steps=int(T),
        chebyshev=bool(chebyshev),
    )
    out["ldp_rdp"] = float(rdp_of(alpha, sensitivity**2, sigma))
    if bound == "paper":
        out["note"] = (
            "paper: [M] Theorem 1 (eq. 6), unclipped; not a guarantee (docs/design/spec/gossip.md §1.3.9)"
        )
    else:
        out["note"] = (
            "certified: exact divergence of the whole Gaussian view; observer knows its own noise"
        )
    return out


# --------------------------------------------------------------------------------------------
# Alg. 2: randomized Muffliato with a seeded public schedule
# --------------------------------------------------------------------------------------------
def randomized_schedule(W, T: int, seed: int) -> np.ndarray:
    """Seeded activation schedule of Alg. 2: edge {v,w} w.p. ``p = 2 W_vw / n``; the leftover
    probability is an idle step (docs/design/spec/gossip.md §1.2.3 FLAG).  Returns (T, 2) ints, ``[-1, -1]`` = idle."""
    Wc = _csr(W)
    n = Wc.shape[0]
    E = sp.triu(_adjacency(Wc), k=1).tocoo()
    p = 2.0 * np.asarray(Wc[E.row, E.col]).ravel() / n
    idle = max(0.0, 1.0 - p.sum())
    probs = np.concatenate([p, [idle]])
    probs /= probs.sum()
    rng = np.random.default_rng(seed)
    pick = rng.choice(probs.size, size=T, p=probs)
    out = np.full((T, 2), -1, dtype=np.int64)
    act = pick < p.size
    out[act, 0] = E.row[pick[act]]
    out[act, 1] = E.col[pick[act]]
    return out


def randomized_products_view(
    schedule: np.ndarray, n: int
) -> tuple[dict[int, list[np.ndarray]], list[tuple[int, int, int]]]:
    """Replay Alg. 2: ``views[v]`` = the rows ``(W_{0:t})_{w,:}`` v received (as arrays);
    also returns the message log ``(t, sender, receiver)``.  O(n²) memory."""
    P = np.eye(n)
    views: dict[int, list[np.ndarray]] = {v: [] for v in range(n)}
    log: list[tuple[int, int, int]] = []
    for t, (a, b) in enumerate(schedule):
        if a < 0:
            continue
        views[int(a)].append(P[b].copy())
        views[int(b)].append(P[a].copy())
        log.append((t, int(b), int(a)))
        log.append((t, int(a), int(b)))
        avg = 0.5 * (P[a] + P[b])
        P[a] = avg
        P[b] = avg
    return views, log


def randomized_exact_matrix(
    W,
    T: int,
    alpha: float,
    sigma: float,
    seed: int,
    *,
    bound: str = "certified",
    sensitivity: float = 1.0,
) -> PrivacyMatrix:
    """All pairs for Alg. 2 given the seeded schedule; ``paper`` = Corollary 2 (Thm 1 per message)."""
    Wc = _csr(W)
    n = Wc.shape[0]
    sched = randomized_schedule(Wc, T, seed)
    views, _ = randomized_products_view(sched, n)
    steps = [
        (t, int(a), int(b), True, True, True, True) for t, (a, b) in enumerate(sched) if a >= 0
    ]
    mat = np.zeros((n, n))
    for v in range(n):
        rows = views[v]
        if not rows:
            continue
        R = np.array(rows)
        if bound == "paper":
            from hushnet.privacy.paper.muffliato import cor2_column  # labelled reproduction

            col = cor2_column(R)
        else:
            M = R.T.copy()
            M[v, :] = 0.0
            col = np.clip(projection_weights(M), 0.0, 1.0)
            # the explicit rows of long averaging products lose directions (grid 8×8, 3000 activations:
            # 26 of 33 exact dimensions): the backward orthonormal basis keeps them; the larger of the two
            Q = pairwise_view_basis(steps, n, v)
            Q[v, :] = 0.0
            Q = svd_basis(Q, IMAGE_ATOL)
            col = np.maximum(col, np.clip(np.einsum("ij,ij->i", Q, Q), 0.0, 1.0))
        col[v] = 0.0
        mat[:, v] = col
    notes = [f"randomized Muffliato (Alg. 2), seeded schedule seed={seed}, T={T} activations"]
    notes.append(
        "paper: [M] Corollary 2 / Theorem 1, unclipped"
        if bound == "paper"
        else "certified: exact view divergence, observer knows its own noise"
    )
    return PrivacyMatrix(
        matrix=rdp_of(alpha, sensitivity**2 * mat, sigma),
        alpha=float(alpha),
        bound=bound,
        view="neighbourhood",
        notes=notes,
        protocol="muffliato-randomized",
    )


# --------------------------------------------------------------------------------------------
# Alg. 3: Muffliato-GD, fresh noise each gradient round, composed across rounds
# --------------------------------------------------------------------------------------------
def muffliato_gd_loss(
    Ws: Sequence,
    K: int,
    alpha: float,
    sigma: float,
    *,
    delta_phi: float = 1.0,
    bound: str = "certified",
    view: str = "neighbourhood",
    chebyshev: bool = True,
    gammas: Sequence[float] | None = None,
) -> PrivacyMatrix:
    """Pairwise RDP of Muffliato-GD (Alg. 3) after ``len(Ws)`` gradient rounds with K gossip steps.

    Round r gossips ``θ̂ + N(0, ν²σ²)`` with ``W_r`` for K steps (accelerated by default); the
    per-round sensitivity is ``Δ_φ`` (ν cancels).

    * ``certified``: the whole run as one linear-Gaussian view, hidden state included
      (:func:`muffliato_gd_state_space` logic, all pairs), with the box bound of
      :func:`~hushnet.privacy.linear_gaussian.box_quadratic_max` (``min(spectral, 1ᵀ|M|1, SDP)`` of [K]
      §2.3 unless M ≥ 0) — valid for vector and adaptively chosen gradients ([K] App. A).  Dense: O(n) factorisations of a
      (R·K·d)×(n·R) matrix, so for moderate n.
    * ``composed``: exact per-round values added in RDP, as if rounds were independent mechanisms
      (docs/design/spec/gossip.md §1.3.9 item 5).  **Not a guarantee**: the state carries earlier noise into later
      rounds and the joint view can leak more (the tests exhibit a case).
    * ``paper``: [M] Theorem 6/11, eq. (13).
    """
    if bound not in ("certified", "composed", "paper"):
        raise ValueError("bound must be 'certified', 'composed' or 'paper'")
    if view != "neighbourhood":
        raise ValueError("Muffliato-GD accounting supports the neighbourhood view")
    _check(K, alpha, sigma, "certified", view)
    n = _csr(Ws[0]).shape[0]
    total = np.zeros((n, n))
    if bound == "certified":
        for v in range(n):
            total[:, v] = _gd_observer_all_sources(Ws, K, v, chebyshev, gammas)
        notes = [
            f"certified: Muffliato-GD, {len(Ws)} rounds x K={K}, joint view with hidden state, "
            "min(spectral, 1'|M|1) box bound (valid for adaptive gradients)"
        ]
    else:
        for r, W in enumerate(Ws):
            if bound == "paper":
                from hushnet.privacy.paper.muffliato import thm1_matrix  # labelled reproduction

                F = thm1_matrix(W, K, convention="paper")
                np.fill_diagonal(F, 0.0)
                total += F
            else:
                g = None if gammas is None else gammas[r]
                total += exact_sensitivity_matrix(W, K, view=view, chebyshev=chebyshev, gamma=g)
        notes = [
            f"Muffliato-GD: {len(Ws)} rounds x K={K} gossip steps, per-round values added in RDP",
            "paper: [M] Theorem 6/11 eq. (13); not a guarantee"
            if bound == "paper"
            else "composed: per-round exact values added; NOT a guarantee (state carries noise across rounds)",
        ]
    mat = rdp_of(alpha, delta_phi**2 * total, sigma)
    return PrivacyMatrix(
        matrix=mat, alpha=float(alpha), bound=bound, view=view, notes=notes, protocol="muffliato-gd"
    )


def _gd_joint_view(
    Ws: Sequence, K: int, observer: int, chebyshev: bool, gammas: Sequence[float] | None
) -> np.ndarray:
    """Stacked messages the observer receives over all rounds, as a map of all per-round inputs
    (rounds × nodes; a source's contribution enters exactly like its noise)."""
    R = len(Ws)
    Wcs = [_csr(W) for W in Ws]
    n = Wcs[0].shape[0]
    rows: list[np.ndarray] = []
    S = np.zeros((n, n * R))  # state θ^r as a map of all inputs
    for r, Wc in enumerate(Wcs):
        watch = _neighbours(Wc, observer)
        g = _gamma(Wc, chebyshev, None if gammas is None else gammas[r])
        X = S.copy()
        X[:, r * n : (r + 1) * n] += np.eye(n)
        prev = None
        for k in range(K):
            rows.append(X[watch])
            nxt = np.asarray(Wc @ X)
            if g is not None and prev is not None:
                nxt = g * nxt + (1 - g) * prev
            prev, X = X, nxt
        S = X
    return np.concatenate(rows, axis=0)


def _gd_observer_all_sources(
    Ws: Sequence, K: int, observer: int, chebyshev: bool, gammas: Sequence[float] | None
) -> np.ndarray:
    """Certified box Δ² of every source toward ``observer`` for the joint Muffliato-GD view.

    The view's rows are ``yᵀ(S_r + E_r)`` for y in round r's block Krylov space ``Y_r`` of ``W_r``
    (neighbours' rows of ``P_k(W_r)``, k < K; grown by :func:`krylov_basis`, never from explicit powers)
    with ``S_r = P_K(W_{r−1})(S_{r−1} + E_{r−1})``, so the functional of y has block r equal to y and block
    r' < r equal to ``P_K(W_{r'})ᵀ ⋯ P_K(W_{r−1})ᵀ y``: block triangular with orthonormal diagonal blocks,
    whose row space is computed stably.  Factorising the explicit stacked rows lost directions
    (grid 6×6, 2 rounds × K = 20: 60 of 70 exact dimensions) and under-stated Δ².  For source u,
    ``M = Gᵀ(BBᵀ)⁺G`` is the block of the projector on that row space (observer coordinates removed:
    it knows its own noise) at u's coordinates."""
    from hushnet.privacy.linear_gaussian import box_quadratic_max

    R = len(Ws)
    Wcs = [_csr(W) for W in Ws]
    n = Wcs[0].shape[0]
    gs = [_gamma(Wc, chebyshev, None if gammas is None else gammas[r]) for r, Wc in enumerate(Wcs)]

    def full_step_T(r: int, Z: np.ndarray) -> np.ndarray:  # P_K(W_r)ᵀ Z (a polynomial in W_rᵀ)
        Wt, g = Wcs[r].T.tocsr(), gs[r]
        prev, cur = None, Z
        for _ in range(K):
            nxt = np.asarray(Wt @ cur)
            if g is not None and prev is not None:
                nxt = g * nxt + (1 - g) * prev
            prev, cur = cur, nxt
        return cur

    blocks = []
    for r, Wc in enumerate(Wcs):
        watch = _neighbours(Wc, observer)
        Y = krylov_basis(Wc.T.tocsr(), [], watch, K - 1, rtol=1e-9) if K > 0 else np.zeros((n, 0))
        F = np.zeros((n * R, Y.shape[1]))
        F[r * n : (r + 1) * n] = Y
        Z = Y
        for rp in range(r - 1, -1, -1):
            Z = full_step_T(rp, Z)
            F[rp * n : (rp + 1) * n] = Z
        blocks.append(F)
    F = np.concatenate(blocks, axis=1)
    F[[r * n + observer for r in range(R)], :] = 0.0
    Q = F
    if F.shape[1]:
        U, sv = _svd_left(F)
        Q = U[:, sv > 1e-10]
    out = np.zeros(n)
    for u in range(n):
        if u == observer:
            continue
        cols = [r * n + u for r in range(R)]
        M = Q[cols] @ Q[cols].T
        # valid for vector gradients: min(spectral, 1ᵀ|M|1, SDP certificate) unless M ≥ 0
        out[u] = box_quadratic_max(M, exact_limit=0)["value"]
    return out


def muffliato_gd_state_space(
    Ws: Sequence,
    K: int,
    source: int,
    observer: int,
    *,
    chebyshev: bool = True,
    gammas: Sequence[float] | None = None,
    own_noise_known: bool = True,
    exact_limit: int = 16,
) -> dict[str, Any]:
    """Muffliato-GD over all rounds at once, hidden state included (one linear-Gaussian view).

    Round r gossips ``θ^r + c_r e_u + ζ_r`` (ζ_r fresh, in units of the per-round noise; ``c_r`` the
    source's change, |c_r| ≤ 1 per round) for K steps with ``W_r``; ``θ^{r+1}`` is the result.  The
    observer records its neighbours' messages of every step of every round.  Because the state
    carries earlier rounds' noise, the rounds are *not* independent mechanisms; this accountant
    builds the joint view ``O = A c + B ζ`` explicitly and returns the box sensitivity of [K]
    Thm 12 (``value``: exact when M ≥ 0 or T small, else min(spectral, abs); ``abs``/``spectral``
    remain valid for adaptively chosen gradients, [K] App. A).  Compare ``composed`` = Σ_r of the
    per-round exact values (what :func:`muffliato_gd_loss` adds up).  Dense: for moderate n.
    """
    from hushnet.privacy.linear_gaussian import LinearGaussianView

    R = len(Ws)
    Wcs = [_csr(W) for W in Ws]
    n = Wcs[0].shape[0]
    watch = _neighbours(Wcs[0], observer)  # the graph may change per round: recomputed below
    rows_A: list[np.ndarray] = []
    rows_B: list[np.ndarray] = []
    # state as affine maps: θ = Sc @ c + Sz @ ζ  (Sc: n×R, Sz: n×nR)
    Sc = np.zeros((n, R))
    Sz = np.zeros((n, n * R))
    composed = 0.0
    for r, Wc in enumerate(Wcs):
        watch = _neighbours(Wc, observer)
        g = _gamma(Wc, chebyshev, None if gammas is None else gammas[r])
        Xc = Sc.copy()
        Xc[source, r] += 1.0
        Xz = Sz.copy()
        Xz[:, r * n : (r + 1) * n] += np.eye(n)
        prev_c = prev_z = None
        for k in range(K + 1):
            if k < K:
                rows_A.append(Xc[watch])
                rows_B.append(Xz[watch])
            if k == K:
                break
            nc, nz = np.asarray(Wc @ Xc), np.asarray(Wc @ Xz)
            if g is not None and prev_c is not None:
                nc = g * nc + (1 - g) * prev_c
                nz = g * nz + (1 - g) * prev_z
            prev_c, prev_z, Xc, Xz = Xc, Xz, nc, nz
        Sc, Sz = Xc, Xz
        composed += float(
            observer_sensitivities(Wc, observer, K, own_noise_known=own_noise_known)[source]
        )
    A = np.concatenate(rows_A, axis=0)
    B = np.concatenate(rows_B, axis=0)
    if own_noise_known:
        B[:, [r * n + observer for r in range(R)]] = 0.0
    res = LinearGaussianView(A, B).box_sensitivity_sq(list(range(R)), exact_limit=exact_limit)
    res["composed"] = composed
    res["rounds"] = R
    return res
