"""Source anonymity for random-walk learning (Egger et al.): the closed-form model.

This module holds the *paper's mathematics* (spec ``docs/design/spec/anonymity.md`` §§2–4): the
first-hitting-time model on random c-regular graphs (Tishby et al.), the destination-distance
distribution ``p*_{κ,δ}`` (Lemmas 2 and 4), the distance-level posterior ``W_{δ,κ'}`` a destination
forms (eq. (5)), its entropy, and Theorems 1–3 / Corollary 1 with the computable versions of §3.6.

Three evaluation modes exist because the paper is partly wrong (errata E1, E4, §3.9):

* ``"paw"`` – *paper as written*: Assumptions 1–2 with Proposition 1 **as printed**. Use it only to
  reproduce the paper's figures; its numbers are labelled "paper".
* ``"cor"`` – same assumptions with the **exact** truncated geometric mean (§3.5). This is what a
  deployment should publish (with the graph-mean shell sizes, decision D3).
* ``"full"`` – no Assumption 1: the mixture pmf (corrected shortest-path part + geometric part),
  truncated mean and window mass computed numerically; here ``δ`` matters.

Nothing here is a differential-privacy guarantee: anonymity is never credited to the DP accountant
(docs/design/spec/anonymity.md §6.7). A "certified" entropy bound in this module means a bound that is *proved and verified*
inside its stated model (corrected or shifted Theorem 1, Theorem 2). Companion modules:
:mod:`hushnet.privacy.anonymity_graph` (exact evaluation on the deployed graph) and
:mod:`hushnet.privacy.anonymity_setup` (public setup, destination sampling, reports, Monte Carlo —
the interface the walk protocol uses).

Logs are natural (entropies in nats); time is counted in hops.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, Sequence

import numpy as np
from scipy.special import gammaln, logsumexp

from hushnet.privacy.options import resolve

Mode = Literal["paw", "cor", "full"]
Normalizer = Literal["printed", "tight"]
MODES: tuple[str, ...] = ("paw", "cor", "full")

__all__ = [
    "Theorem3Options",
    "Mode",
    "MODES",
    "RRGModel",
    "tree_shell_sizes",
    "log_likelihood",
    "p_star",
    "posterior_w",
    "entropy",
    "entropy_w",
    "tv_distance",
    "theorem1_rho",
    "theorem2_bound",
    "theorem3_proof_rho",
    "Theorem3Result",
    "theorem3_alpha",
    "corollary1_alpha",
    "design_kappa",
    "mean_iteration_time",
    "t1_return_bound",
    "kappa_midpoint",
    "mean_return_time_nonretro",
    "return_tail_nonretro",
    "return_tail_conditioned",
]


# ---------------------------------------------------------------------------------------------
# First-hitting-time model on a random c-regular graph (docs/design/spec/anonymity.md §3.2)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RRGModel:
    """Hitting-time model of a simple random walk on an RRG with ``n`` nodes and degree ``c``.

    The model says ``T_FH(i, j)`` depends only on ``ℓ = dist(i, j)``: with probability
    ``P(SP|ℓ)`` the walk arrives along a tree-like shortest path (ballot-theorem law, erratum E1
    corrected), otherwise it arrives after a geometric time of rate ``a = c'/n`` (eq. (2)).
    """

    n: int
    c: int

    def __post_init__(self) -> None:
        if self.c < 3:
            raise ValueError(
                f"the RRG model needs degree c >= 3 (c' = (c-2)/(c-1) > 0); got c={self.c}"
            )
        if self.n < 3:
            raise ValueError(f"need n >= 3 nodes, got {self.n}")

    # --- constants ---------------------------------------------------------------------------
    @property
    def c_prime(self) -> float:
        """``c' = (c−2)/(c−1)``."""
        return (self.c - 2) / (self.c - 1)

    @property
    def a(self) -> float:
        """Geometric rate ``a = c'/N`` of the not-shortest-path arrival."""
        return self.c_prime / self.n

    @property
    def q(self) -> float:
        """``q = e^{−a}``."""
        return math.exp(-self.a)

    @property
    def gamma(self) -> float:
        """Exponential decay rate of the SP pmf: ``log c − ½ log(c−1) − log 2``."""
        return math.log(self.c) - 0.5 * math.log(self.c - 1) - math.log(2.0)

    @property
    def geometric_mean_excess(self) -> float:
        """``1/(1 − e^{−a})`` = mean of the geometric excess ``T − ℓ`` in the not-SP case."""
        return -1.0 / math.expm1(-self.a)

    # --- SP / not-SP split ---------------------------------------------------------------------
    def p_sp(self, ell: np.ndarray | float) -> np.ndarray:
        """``P(SP|ℓ) = (c−1)^{−ℓ} + 1/N``."""
        ell = np.asarray(ell, dtype=float)
        return (self.c - 1.0) ** (-ell) + 1.0 / self.n

    def phi(self, ell: np.ndarray | float) -> np.ndarray:
        """``φ_ℓ = P(¬SP|ℓ) = 1 − (c−1)^{−ℓ} − 1/N``."""
        return 1.0 - self.p_sp(ell)

    # --- pmfs ------------------------------------------------------------------------------------
    def sp_pmf(self, t: np.ndarray | int, ell: int) -> np.ndarray:
        """Corrected shortest-path pmf (erratum E1), evaluated with ``lgamma``.

        ``P(T=t|ℓ,SP) = (ℓ/t)·binom(t,(t−ℓ)/2)·((c−1)/c)^{(t+ℓ)/2}·(1/c)^{(t−ℓ)/2}`` for ``t ≥ ℓ``,
        ``t−ℓ`` even; 0 otherwise. It is the ballot-theorem first passage of a ±1 walk biased
        towards the target.
        """
        t = np.asarray(t, dtype=np.int64)
        out = np.zeros(t.shape, dtype=float)
        ok = (t >= ell) & ((t - ell) % 2 == 0) & (t > 0)
        if ell <= 0:
            raise ValueError("the SP pmf needs ell >= 1")
        tt = t[ok].astype(float)
        k = (tt - ell) / 2.0
        logp = (
            math.log(ell)
            - np.log(tt)
            + gammaln(tt + 1.0)
            - gammaln(k + 1.0)
            - gammaln(tt - k + 1.0)
            + (tt + ell) / 2.0 * math.log((self.c - 1.0) / self.c)
            - k * math.log(self.c)
        )
        out[ok] = np.exp(logp)
        return out

    def nsp_pmf(self, t: np.ndarray | int, ell: int) -> np.ndarray:
        """Not-shortest-path pmf, eq. (2): ``(e^{a}−1)·e^{−a(t−ℓ)}`` for ``t > ℓ``."""
        t = np.asarray(t, dtype=float)
        return np.where(t > ell, math.expm1(self.a) * np.exp(-self.a * (t - ell)), 0.0)

    def pmf(self, t: np.ndarray | int, ell: int) -> np.ndarray:
        """Mixture ``P(T=t|ℓ) = P(SP|ℓ)·SP-pmf + φ_ℓ·not-SP-pmf`` (used by the FULL mode)."""
        return float(self.p_sp(ell)) * self.sp_pmf(t, ell) + float(self.phi(ell)) * self.nsp_pmf(
            t, ell
        )

    # --- means -------------------------------------------------------------------------------------
    def mean_sp(self, ell: np.ndarray | float) -> np.ndarray:
        """``E[T|ℓ,SP] = cℓ/(c−2)``."""
        return self.c * np.asarray(ell, dtype=float) / (self.c - 2.0)

    def mean_nsp(self, ell: np.ndarray | float) -> np.ndarray:
        """``E[T|ℓ,¬SP] = ℓ + 1/(1−e^{−a})``, eq. (3)."""
        return np.asarray(ell, dtype=float) + self.geometric_mean_excess

    def mean(self, ell: np.ndarray | float) -> np.ndarray:
        """``E[T|ℓ] = P(SP|ℓ)·cℓ/(c−2) + φ_ℓ·(ℓ + 1/(1−e^{−a}))``."""
        return self.p_sp(ell) * self.mean_sp(ell) + self.phi(ell) * self.mean_nsp(ell)

    def truncated_mean_nsp(
        self, ell: np.ndarray | float, kappa: np.ndarray | float, *, printed: bool = False
    ) -> np.ndarray:
        """``E[T|ℓ,¬SP,T≤κ]``: exact (default) or Proposition 1 as printed (erratum E4).

        Exact: ``ℓ + 1/(1−q) − m q^m/(1−q^m)``, ``m = κ−ℓ``. Printed:
        ``ℓ/(1−e^{−a(κ−ℓ)}) + 1/(1−e^{−a})``, which can exceed ``κ`` (impossible for a mean given
        ``T ≤ κ``). ``κ = ∞`` gives ``ℓ + 1/(1−q)`` in both. Requires ``κ > ℓ``.
        """
        ell = np.asarray(ell, dtype=float)
        kappa = np.asarray(kappa, dtype=float)
        m = kappa - ell
        if np.any(m <= 0):
            raise ValueError(
                "the truncated mean needs kappa > ell (Prop. 1 diverges as kappa -> ell+)"
            )
        finite = np.isfinite(m)
        m_safe = np.where(finite, m, 1.0)
        if printed:
            corr = np.where(finite, ell / (-np.expm1(-self.a * m_safe)), ell)
            return corr + self.geometric_mean_excess
        return ell + self.geometric_mean_excess - _g(m_safe, self.a) * finite

    def truncated_mean_assumption2(
        self, ell: np.ndarray | float, kappa: np.ndarray | float, *, printed: bool
    ) -> np.ndarray:
        """Assumption 2: ``Ē(ℓ,κ) = φ_ℓ·E[T|ℓ,¬SP,T≤κ]`` (``P(¬SP|ℓ,T≤κ) ≈ φ_ℓ``)."""
        return self.phi(ell) * self.truncated_mean_nsp(ell, kappa, printed=printed)


def _g(m: np.ndarray | float, a: float) -> np.ndarray:
    """``g(m) = m q^m/(1−q^m)`` with ``q = e^{−a}``; ``g(∞) = 0`` (caller masks infinities)."""
    m = np.asarray(m, dtype=float)
    return m * np.exp(-a * m) / (-np.expm1(-a * m))


def tree_shell_sizes(c: int, ells: Sequence[int] | np.ndarray) -> np.ndarray:
    """Tree shell count ``A(ℓ) = c(c−1)^{ℓ−1}`` (what the paper uses; wrong for c=4, N=300, D3)."""
    ells = np.asarray(ells, dtype=float)
    return c * (c - 1.0) ** (ells - 1.0)


def _shells(model: RRGModel, ells: np.ndarray, A: np.ndarray | None) -> np.ndarray:
    if A is None:
        return tree_shell_sizes(model.c, ells)
    A = np.asarray(A, dtype=float)
    if A.shape != ells.shape:
        raise ValueError(
            f"A must give one shell size per distance {ells.tolist()}, got shape {A.shape}"
        )
    if np.any(A <= 0):
        raise ValueError("every shell in [ell1, ell2] must be non-empty (A > 0)")
    return A


def _ells(ell1: int, ell2: int) -> np.ndarray:
    if not (1 <= ell1 <= ell2):
        raise ValueError(f"need 1 <= ell1 <= ell2, got [{ell1}, {ell2}]")
    return np.arange(ell1, ell2 + 1)


# ---------------------------------------------------------------------------------------------
# FULL mode: the mixture pmf tabulated once per (model, ℓ-range)
# ---------------------------------------------------------------------------------------------


@lru_cache(maxsize=32)
def _full_tables(
    n: int, c: int, ell1: int, ell2: int, t_max: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mixture pmf ``P(T=t|ℓ)`` for t = 0..t_max and its cumulative sums (mass and t·mass)."""
    model = RRGModel(n, c)
    t = np.arange(t_max + 1)
    pmf = np.stack([model.pmf(t, int(ell)) for ell in range(ell1, ell2 + 1)])
    cum = np.cumsum(pmf, axis=1)
    cum_t = np.cumsum(pmf * t, axis=1)
    for arr in (pmf, cum, cum_t):
        arr.setflags(write=False)
    return pmf, cum, cum_t


def _full_t_max(model: RRGModel) -> int:
    """Horizon for the FULL tables: ``40·N/c'`` leaves a geometric tail below ``e^{−40}``."""
    return int(math.ceil(40.0 / model.a))


def _full_log_mass(
    model: RRGModel, ell1: int, ell2: int, kappa: np.ndarray, delta: float
) -> np.ndarray:
    """log window mass ``Σ_{t=⌈μ−δ⌉}^{⌊μ+δ⌋} P(T=t|ℓ)`` with ``μ = E[T|ℓ,T≤κ]``; shape (len κ, K)."""
    t_max = _full_t_max(model)
    pmf, cum, cum_t = _full_tables(model.n, model.c, ell1, ell2, t_max)
    kappa = np.atleast_1d(np.asarray(kappa, dtype=float))
    k_idx = np.where(np.isfinite(kappa), np.minimum(kappa, t_max), t_max)
    k_idx = np.floor(k_idx).astype(np.int64)
    mass_le = cum[:, k_idx].T  # (nk, K)
    if np.any(mass_le <= 0):
        raise ValueError(
            "FULL mode needs kappa' with positive mass P(T <= kappa'|ell) for every ell"
        )
    mu = cum_t[:, k_idx].T / mass_le
    lo = np.ceil(mu - delta).astype(np.int64)
    hi = np.floor(mu + delta).astype(np.int64)
    lo = np.clip(lo, 0, t_max)
    hi = np.clip(hi, 0, t_max)
    rows = np.arange(ell2 - ell1 + 1)[None, :]
    below = np.where(lo > 0, cum[rows, np.maximum(lo - 1, 0)], 0.0)
    mass = cum[rows, hi] - below
    return np.log(mass)


# ---------------------------------------------------------------------------------------------
# Likelihood Λ, p*, posterior W
# ---------------------------------------------------------------------------------------------


def log_likelihood(
    model: RRGModel,
    ell1: int,
    ell2: int,
    kappa: float | np.ndarray,
    *,
    mode: Mode = "cor",
    delta: float = 5.0,
    A: np.ndarray | None = None,
    full_mean_at_infinity: bool = False,
) -> np.ndarray:
    """``log Λ_{δ,κ}(ℓ)`` for ℓ = ell1..ell2 (Lemma 1 / Lemma 3 per-node window likelihood).

    ``kappa`` may be an array (then the result has shape ``(len(kappa), K)``) and may be ``inf``
    (no side information). ``A`` are the shell sizes on [ell1, ell2] (default: tree formula).
    ``full_mean_at_infinity`` uses the full ``E[T|ℓ]`` at ``κ=∞`` as Lemma 1 literally does
    (erratum E10; differs from Assumption 2 by < 0.2 % in ``p*``).

    Computed in log-space because Λ is ~1e−3..1e−5 (§3.8 pitfalls).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    ells = _ells(ell1, ell2)
    shells = _shells(model, ells, A)
    kappa_arr = np.asarray(kappa, dtype=float)
    scalar = kappa_arr.ndim == 0
    kappa_arr = np.atleast_1d(kappa_arr)
    if np.any(kappa_arr <= ell2):
        raise ValueError(f"side information kappa' must exceed ell2={ell2} (§3.8 pitfalls)")
    if mode == "full":
        out = _full_log_mass(model, ell1, ell2, kappa_arr, delta) - np.log(shells)[None, :]
    else:
        a = model.a
        phi = model.phi(ells)
        log_k = (
            np.log(phi)
            - np.log(shells)
            + math.log(math.expm1(a))
            + a * (delta + ells)
            + math.log(math.expm1(-a * (2 * delta + 1)) / math.expm1(-a))
        )
        ebar = model.truncated_mean_assumption2(
            ells[None, :], kappa_arr[:, None], printed=(mode == "paw")
        )
        if full_mean_at_infinity:
            ebar = np.where(np.isinf(kappa_arr)[:, None], model.mean(ells)[None, :], ebar)
        out = log_k[None, :] - a * ebar
    return out[0] if scalar else out


def _normalize_log(logw: np.ndarray) -> np.ndarray:
    return np.exp(logw - logsumexp(logw, axis=-1, keepdims=True))


def p_star(
    model: RRGModel,
    ell1: int,
    ell2: int,
    kappa: float = math.inf,
    *,
    mode: Mode = "cor",
    delta: float = 5.0,
    A: np.ndarray | None = None,
    full_mean_at_infinity: bool = False,
) -> np.ndarray:
    """Destination-distance distribution ``p*_{κ,δ}`` on ℓ = ell1..ell2 (Lemma 4; Lemma 2 at κ=∞).

    ``p*(ℓ) ∝ 1/Λ_{δ,κ}(ℓ)``; in PAW/COR modes ``δ`` cancels exactly (§3.7). Returns an array of
    length ``ell2−ell1+1`` summing to 1 (index 0 is distance ``ell1``).
    """
    return _normalize_log(
        -log_likelihood(
            model,
            ell1,
            ell2,
            kappa,
            mode=mode,
            delta=delta,
            A=A,
            full_mean_at_infinity=full_mean_at_infinity,
        )
    )


def posterior_w(
    p: np.ndarray,
    model: RRGModel,
    ell1: int,
    ell2: int,
    kappa_prime: float | np.ndarray,
    *,
    mode: Mode = "cor",
    delta: float = 5.0,
    A: np.ndarray | None = None,
) -> np.ndarray:
    """Distance-level posterior ``W_{δ,κ'}(ℓ) ∝ p(ℓ)·Λ_{δ,κ'}(ℓ)`` (eq. (5)).

    ``p`` is any distance distribution on [ell1, ell2] (``p*`` or the uniform baseline). With an
    array ``kappa_prime`` the result has one row per ``κ'``.
    """
    p = np.asarray(p, dtype=float)
    if p.shape != (ell2 - ell1 + 1,):
        raise ValueError("p must have one entry per distance in [ell1, ell2]")
    with np.errstate(divide="ignore"):
        logp = np.log(p)
    return _normalize_log(
        logp + log_likelihood(model, ell1, ell2, kappa_prime, mode=mode, delta=delta, A=A)
    )


def entropy(w: np.ndarray, axis: int = -1) -> np.ndarray:
    """Shannon entropy in nats with ``0·log 0 = 0``."""
    w = np.asarray(w, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(w > 0, -w * np.log(np.where(w > 0, w, 1.0)), 0.0)
    return terms.sum(axis=axis)


def entropy_w(
    p: np.ndarray,
    model: RRGModel,
    ell1: int,
    ell2: int,
    kappa_prime: float | np.ndarray,
    *,
    mode: Mode = "cor",
    delta: float = 5.0,
    A: np.ndarray | None = None,
) -> np.ndarray:
    """``H(W_{δ,κ'})`` — the distance-level anonymity the paper plots (max ``log(ℓ2−ℓ1+1)``)."""
    return entropy(posterior_w(p, model, ell1, ell2, kappa_prime, mode=mode, delta=delta, A=A))


def tv_distance(p: np.ndarray, q: np.ndarray, axis: int = -1) -> np.ndarray:
    """``d_TV(P‖Q) = ½ Σ |P − Q|``."""
    return 0.5 * np.abs(np.asarray(p) - np.asarray(q)).sum(axis=axis)


# ---------------------------------------------------------------------------------------------
# Theorems 1–3, Corollary 1 (docs/design/spec/anonymity.md §3.6)
# ---------------------------------------------------------------------------------------------


def theorem1_rho(
    model: RRGModel,
    ell1: int,
    ell2: int,
    kappa: float,
    kappa_prime: float | np.ndarray,
    *,
    version: Literal["printed", "corrected", "shifted"] = "printed",
    normalizer: Normalizer = "printed",
    eps_scale: float = 1.0,
    shift_mode: Literal["paw", "cor"] = "cor",
) -> np.ndarray:
    """Theorem 1 upper bound on ``d_TV(W_{δ,κ'} ‖ W_{δ,κ})``.

    ``version="shifted"`` ([BEYOND], hushnet's certified variant) removes the two slack steps of
    the paper's proof: with ``Δ_ℓ = Ē(ℓ,κ') − Ē(ℓ,κ)`` (per-ℓ ``φ_ℓ``, ``shift_mode`` model) and any
    constant ``s`` (``W`` is invariant to a common factor), ``λ_ℓ = e^{−a(Δ_ℓ−s)}`` gives
    ``d_TV ≤ Σ|λ_ℓ−1| / Σλ_ℓ ≤ Σ(e^{x_ℓ}−1) / Σe^{−x_ℓ}``, ``x_ℓ = a|Δ_ℓ − s|``, ``s`` = midrange.
    It is a proved bound in the PAW/COR model (ignores ``normalizer``).

    ``version="printed"`` uses ``ε_ℓ = ℓ|1/(1−e^{−a(κ'−ℓ)}) − 1/(1−e^{−a(κ−ℓ)})|`` (a valid bound
    for the PAW model); ``"corrected"`` uses ``ε_ℓ = |g(κ−ℓ) − g(κ'−ℓ)|`` (valid for COR).
    ``normalizer="printed"`` is the paper's ``1/(ℓ2−ℓ1)``; ``"tight"`` the valid ``1/K`` (E6).
    ``φ = φ_{ℓ2}`` as in the paper's numerics. ``eps_scale=2`` gives Corollary 1.
    """
    ells = _ells(ell1, ell2).astype(float)
    kp = np.asarray(kappa_prime, dtype=float)
    scalar = kp.ndim == 0
    kp = np.atleast_1d(kp)
    if np.any(kp <= ell2) or kappa <= ell2:
        raise ValueError(
            "Theorem 1 needs kappa, kappa' > ell2 (eps_ell diverges as kappa' -> ell+)"
        )
    a = model.a
    phi = float(model.phi(ell2))

    def inv(kap: np.ndarray) -> np.ndarray:  # 1/(1−e^{−a(κ−ℓ)}), := 1 at ∞
        fin = np.isfinite(kap)
        m = np.where(fin, kap - ells, 1.0)
        return np.where(fin, 1.0 / (-np.expm1(-a * m)), 1.0)

    def gg(kap: np.ndarray) -> np.ndarray:  # g(κ−ℓ), := 0 at ∞
        fin = np.isfinite(kap)
        m = np.where(fin, kap - ells, 1.0)
        return np.where(fin, _g(m, a), 0.0)

    kk = np.full((1, 1), float(kappa))
    kpp = kp[:, None]
    if version == "shifted":
        printed = shift_mode == "paw"
        dlt = model.truncated_mean_assumption2(
            ells[None, :], kpp, printed=printed
        ) - model.truncated_mean_assumption2(ells[None, :], kk, printed=printed)
        s_mid = 0.5 * (dlt.max(axis=-1, keepdims=True) + dlt.min(axis=-1, keepdims=True))
        x = a * np.abs(eps_scale * (dlt - s_mid))
        rho = np.expm1(x).sum(axis=-1) / np.exp(-x).sum(axis=-1)
        return rho[0] if scalar else rho
    if version == "printed":
        eps = ells * np.abs(inv(kpp) - inv(kk))
    elif version == "corrected":
        eps = np.abs(gg(kk) - gg(kpp))
    else:
        raise ValueError("version must be 'printed', 'corrected' or 'shifted'")
    eps = eps * eps_scale
    if normalizer == "printed":
        if ell2 == ell1:
            raise ValueError("the printed 1/(ell2-ell1) constant is undefined for ell1 == ell2")
        norm = 1.0 / (ell2 - ell1)
    elif normalizer == "tight":
        norm = 1.0 / (ell2 - ell1 + 1)
    else:
        raise ValueError("normalizer must be 'printed' or 'tight'")
    rho = norm * np.expm1(a * phi * eps).sum(axis=-1)
    return rho[0] if scalar else rho


def theorem2_bound(rho: float | np.ndarray, n_distances: int) -> np.ndarray:
    """Theorem 2: ``H ≥ (1−ρ)·log K + ρ log ρ − ρ``, clamped at 0.

    Vacuous (returns 0) for ``ρ ≥ 1−1/K`` where Zhang's inequality no longer applies (E8).
    On ``(0, 1−1/K)`` the right-hand side decreases in ρ, so plugging in an upper bound on ρ is valid.
    """
    rho = np.asarray(rho, dtype=float)
    K = int(n_distances)
    with np.errstate(divide="ignore", invalid="ignore"):
        rlogr = np.where(rho > 0, rho * np.log(np.where(rho > 0, rho, 1.0)), 0.0)
    val = (1.0 - rho) * math.log(K) + rlogr - rho
    val = np.where(rho >= 1.0 - 1.0 / K, 0.0, np.maximum(val, 0.0))
    return val[()] if val.ndim == 0 else val


def theorem3_proof_rho(model: RRGModel, ell1: int, ell2: int, delta_prime: float) -> float:
    """Order-wise ρ of Theorem 3's proof (App. F), labelled *paper*: not a certified bound.

    ``ρ ≈ (1/(ℓ2−ℓ1))·[(e^{b(ℓ2+1)} − e^{bℓ1})/(e^b − 1) − K]``, ``b = c'φε/(2N)``,
    ``ε = max{(1−δ')e^{−(2ℓ1−ℓ2)c'/N} − 1, −1/ln(1−δ') − ½}`` (the O(·) dropped).
    """
    cp, n = model.c_prime, model.n
    phi = float(model.phi(ell2))
    eps = max(
        (1 - delta_prime) * math.exp(-(2 * ell1 - ell2) * cp / n) - 1.0,
        -1.0 / math.log(1 - delta_prime) - 0.5,
    )
    b = cp * phi * eps / (2 * n)
    K = ell2 - ell1 + 1
    return ((math.exp(b * (ell2 + 1)) - math.exp(b * ell1)) / math.expm1(b) - K) / (ell2 - ell1)


def t1_return_bound(n: int, c: int, ell1: int, delta_prime: float) -> float:
    """``t1 = 2ℓ1 − (N/c')·ln(1−δ')``: ``P(κ' ≥ t1) ≥ 1−δ'`` under eq. (6) (optimistic, E9)."""
    return 2 * ell1 - (n / RRGModel(n, c).c_prime) * math.log(1.0 - delta_prime)


def kappa_midpoint(n: int, c: int, ell1: int, delta_prime: float) -> float:
    """Midpoint design rule of App. F: ``κ = 2ℓ1 + (N/c')·ln(2/(1−δ'))`` (633.89 for N=300, c=3, δ'=0.3)."""
    return 2 * ell1 + (n / RRGModel(n, c).c_prime) * math.log(2.0 / (1.0 - delta_prime))


def mean_return_time_nonretro(n: int, c: int) -> float:
    """``E[T_FR|¬RETRO] = 2 + 1/(1−e^{−c'/(N−2)})`` (Assumption 3; Corollary 1's κ)."""
    return 2.0 - 1.0 / math.expm1(-RRGModel(n, c).c_prime / (n - 2))


def return_tail_nonretro(t: np.ndarray | float, n: int, c: int) -> np.ndarray:
    """``P(T_FR > t|¬RETRO) = e^{−c'(t−2)/(N−2)}`` for t ≥ 3, else 1."""
    t = np.asarray(t, dtype=float)
    return np.where(t >= 3, np.exp(-RRGModel(n, c).c_prime * (t - 2) / (n - 2)), 1.0)


def return_tail_conditioned(t: np.ndarray | float, n: int, c: int, ell1: int) -> np.ndarray:
    """Eq. (6): ``P(T_FR ≥ t | ¬RETRO, T_FR ≥ 2ℓ1) = e^{−c'(t−2ℓ1)/(N−2)}`` (lighter on real graphs, E9)."""
    t = np.asarray(t, dtype=float)
    return np.where(t >= 2 * ell1, np.exp(-RRGModel(n, c).c_prime * (t - 2 * ell1) / (n - 2)), 1.0)


@dataclass(frozen=True)
class Theorem3Result:
    """Computable Theorem 3 at one ``δ'`` (docs/design/spec/anonymity.md §3.6): all numbers over ``κ' ∈ [t1, ∞]``.

    ``alpha_emp`` is the model's actual worst entropy (in ``mode``), ``alpha_bound`` the
    Theorem-2-of-Theorem-1 lower bound in the chosen bound ``version``/``normalizer``.
    """

    delta_prime: float
    t1: float
    kappa: float
    mode: str
    version: str
    normalizer: str
    alpha_emp: float
    kappa_prime_at_min: float
    rho_max: float
    alpha_bound: float


def _kappa_grid(model: RRGModel, t1: float, ell2: int, grid_factor: float) -> np.ndarray:
    lo = max(math.ceil(t1), ell2 + 1)
    hi = max(lo, math.ceil(grid_factor / model.a))
    return np.concatenate([np.arange(lo, hi + 1, dtype=float), [math.inf]])


@dataclass(frozen=True)
class Theorem3Options:
    """The knobs of :func:`theorem3_alpha`: the routing distribution ``p`` (default ``p*_{κ,δ}`` in
    the same ``mode``; pass the uniform vector for the baseline), the slack ``delta`` of ``p*``,
    shell sizes ``A`` (default: the model's), which Theorem 1 ``version`` and ``normalizer``,
    ``eps_scale``, and how far the κ' grid reaches (``grid_factor``·N/c')."""

    p: np.ndarray | None = None
    mode: Mode = "paw"
    delta: float = 5.0
    A: np.ndarray | None = None
    version: Literal["printed", "corrected", "shifted"] = "printed"
    normalizer: Normalizer = "printed"
    eps_scale: float = 1.0
    grid_factor: float = 20.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.version not in ("printed", "corrected", "shifted"):
            raise ValueError(
                f"version must be 'printed', 'corrected' or 'shifted', got {self.version!r}"
            )
        if self.normalizer not in ("printed", "tight"):
            raise ValueError(f"normalizer must be 'printed' or 'tight', got {self.normalizer!r}")
        if not self.eps_scale > 0 or not self.grid_factor > 0:
            raise ValueError("eps_scale and grid_factor must be > 0")


def theorem3_alpha(
    model: RRGModel,
    ell1: int,
    ell2: int,
    kappa: float,
    delta_prime: float,
    options: Theorem3Options | None = None,
    **legacy: Any,
) -> Theorem3Result:
    """``α_emp = min_{κ'≥t1} H(W_{δ,κ'})`` and ``α_bound = THM2(max_{κ'≥t1} THM1(κ,κ'))``.

    ``options`` (:class:`Theorem3Options`, or its fields as keywords: the old call form).
    The grid is the integers ``⌈t1⌉ … ⌈grid_factor·N/c'⌉`` plus ``κ' = ∞`` (§3.6).
    """
    o = resolve(Theorem3Options, options, legacy, "theorem3_alpha")
    p, mode, delta, A, version = o.p, o.mode, o.delta, o.A, o.version
    normalizer, eps_scale, grid_factor = o.normalizer, o.eps_scale, o.grid_factor
    t1 = t1_return_bound(model.n, model.c, ell1, delta_prime)
    grid = _kappa_grid(model, t1, ell2, grid_factor)
    if p is None:
        p = p_star(model, ell1, ell2, kappa, mode=mode, delta=delta, A=A)
    H = entropy_w(p, model, ell1, ell2, grid, mode=mode, delta=delta, A=A)
    shift_mode = "paw" if mode == "paw" else "cor"
    rho = theorem1_rho(
        model,
        ell1,
        ell2,
        kappa,
        grid,
        version=version,
        normalizer=normalizer,
        eps_scale=eps_scale,
        shift_mode=shift_mode,
    )
    i_min = int(np.argmin(H))
    rho_max = float(np.max(rho))
    return Theorem3Result(
        delta_prime=delta_prime,
        t1=t1,
        kappa=kappa,
        mode=mode,
        version=version,
        normalizer=normalizer,
        alpha_emp=float(H[i_min]),
        kappa_prime_at_min=float(grid[i_min]),
        rho_max=rho_max,
        alpha_bound=float(theorem2_bound(rho_max, ell2 - ell1 + 1)),
    )


def corollary1_alpha(
    model: RRGModel,
    ell1: int,
    ell2: int,
    delta_prime: float,
    *,
    design: Literal["mean", "infinity"] = "mean",
    mode: Mode = "paw",
    delta: float = 5.0,
    A: np.ndarray | None = None,
    version: Literal["printed", "corrected", "shifted"] = "printed",
    normalizer: Normalizer = "printed",
) -> Theorem3Result:
    """Corollary 1: with ``κ = E[T_FR|¬RETRO]`` (``design="mean"``) or ``κ → ∞`` (the §III design),
    Theorem 3 holds with ``ε`` replaced by ``2ε`` — computed as :func:`theorem3_alpha` with that
    ``κ`` and ``eps_scale=2``."""
    kappa = mean_return_time_nonretro(model.n, model.c) if design == "mean" else math.inf
    return theorem3_alpha(
        model,
        ell1,
        ell2,
        kappa,
        delta_prime,
        mode=mode,
        delta=delta,
        A=A,
        version=version,
        normalizer=normalizer,
        eps_scale=2.0,
    )


def design_kappa(
    model: RRGModel,
    ell1: int,
    ell2: int,
    delta_prime: float,
    *,
    mode: Mode = "cor",
    delta: float = 5.0,
    A: np.ndarray | None = None,
    candidates: np.ndarray | None = None,
    grid_factor: float = 20.0,
) -> tuple[float, float]:
    """The paper's design objective ``min_κ max_{κ'∈[t1,∞]} |H(W_{δ,κ}) − H(W_{δ,κ'})|``.

    ``H(W_{δ,κ}) = log K`` for ``p*_{κ,δ}``, so this maximises the worst entropy
    ``min_{κ'≥t1} H(W_{δ,κ'})``. Returns ``(κ, α_emp(κ))`` over ``candidates`` (default: 200
    geometric points between ``t1`` and ``grid_factor·N/c'`` plus ``κ = ∞``).
    """
    t1 = t1_return_bound(model.n, model.c, ell1, delta_prime)
    grid = _kappa_grid(model, t1, ell2, grid_factor)
    if candidates is None:
        lo = max(t1, ell2 + 1.0)
        candidates = np.concatenate([np.geomspace(lo, grid_factor / model.a, 200), [math.inf]])
    best = (math.nan, -math.inf)
    for kappa in np.asarray(candidates, dtype=float):
        p = p_star(model, ell1, ell2, kappa, mode=mode, delta=delta, A=A)
        worst = float(np.min(entropy_w(p, model, ell1, ell2, grid, mode=mode, delta=delta, A=A)))
        if worst > best[1]:
            best = (float(kappa), worst)
    return best


def mean_iteration_time(model: RRGModel, p: np.ndarray, ell1: int) -> float:
    """``T_{ℓ1,ℓ2} = Σ_ℓ p(ℓ)·E[T_FH|ℓ]`` — hops per model update (Fig. 3's x-axis)."""
    p = np.asarray(p, dtype=float)
    ells = np.arange(ell1, ell1 + p.size)
    return float(np.dot(p, model.mean(ells)))
