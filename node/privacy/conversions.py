"""Conversions between privacy notions: Rényi DP, Gaussian DP and (ε, δ)-DP.

The conversions to (ε, δ), each result saying which one produced it:

* ``rdp_to_dp`` / ``rdp_epsilon``: the one RDP → (ε, δ) rule every certified caller uses — the
  improved conversion of Balle et al. 2020 (Prop. 12 of arXiv:2004.00010) / Canonne–Kamath–Steinke
  2020 (eq. 20), exactly as Google's ``dp-accounting`` applies it (``RdpAccountant``, its
  ``compute_epsilon``): ``ε = ε_α + ln(1 − 1/α) − ln(δ α)/(α − 1)``, and ``ε = 0`` when
  ``δ² ≥ 1 − e^{−ε_α}`` (total-variation bound).  The correction ``ln(1 − 1/α) − ln α/(α − 1)`` is
  negative for every α > 1, so it is never above Mironov's classic ``ε_α + ln(1/δ)/(α − 1)``;
  it matters most where a noise condition caps the usable α (the random walk).  The classic rule
  stays available as ``method="classic"``: it is what the papers' code uses, so figures that
  reproduce them report both.  ``linear_rdp_to_dp`` is the same rule for curves ``ε_α = s·α``
  with a cap on α (the walk's noise condition).
* ``gdp_epsilon``: the tight (ε, δ) curve of a Gaussian mechanism (μ-GDP, [K] Lemma 2/4).
  Exact for linear-Gaussian views and compositions of Gaussian mechanisms (μ² add up); never
  larger than any RDP conversion.  ``gaussian_pld_epsilon`` computes the same composition with
  ``dp-accounting``'s privacy-loss-distribution accountant, an independent check (pessimistic by
  its discretisation: a few 1e-9 above the exact value at the default interval).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "DEFAULT_ORDERS",
    "CONVERSION_LABEL",
    "gaussian_rdp",
    "rdp_epsilon",
    "rdp_to_dp",
    "linear_rdp_to_dp",
    "gaussian_pld_epsilon",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu",
    "gaussian_sigma_tight",
    "rdp_gaussian_mu",
]

#: Rényi orders used when composing ledgers and converting to (ε, δ).
DEFAULT_ORDERS: np.ndarray = np.concatenate(
    [
        np.linspace(1.1, 10.9, 99),
        np.arange(11.0, 64.0),
        np.array([64.0, 80.0, 96.0, 128.0, 256.0, 512.0, 1024.0]),
    ]
)


def gaussian_rdp(alpha, sens_sq):
    """RDP of the Gaussian mechanism: ``α·Δ²/(2σ²)`` with ``sens_sq = Δ²/σ²`` (vectorised)."""
    return np.asarray(alpha, dtype=float) * np.asarray(sens_sq, dtype=float) / 2.0


#: how every certified (ε, δ) derived from an RDP curve is labelled
CONVERSION_LABEL = "RDP->(eps,delta): improved conversion (Balle et al. 2020 / Canonne-Kamath-Steinke 2020, dp-accounting)"
CLASSIC_LABEL = (
    "RDP->(eps,delta): classic Mironov eps_a + ln(1/delta)/(a-1) (the papers' conversion)"
)
#: below this order dp-accounting does not apply the improved rule (unstable as α → 1): Mironov's is used
_IMPROVED_MIN_ORDER = 1.01


def rdp_epsilon(
    orders, rdp, delta: float, *, method: str = "improved"
) -> tuple[np.ndarray, np.ndarray]:
    """(ε, δ) of RDP curves, best order per curve: ``rdp[..., k]`` is the RDP at ``orders[k]``.

    Vectorised over leading axes (pairs, targets); returns ``(ε, α)`` arrays of the leading shape.
    ``method="improved"`` (default, what hushnet certifies) is dp-accounting's rule, term for term
    (see the module docstring); ``"classic"`` is Mironov's.  Infinite entries are skipped; a curve
    infinite everywhere gives ``(inf, nan)``.  Negative RDP (rounding) counts as 0.
    """
    a = np.atleast_1d(np.asarray(orders, dtype=float))
    if a.ndim != 1 or np.any(a <= 1.0):
        raise ValueError("Rényi orders must be a 1-D array of values > 1")
    r = np.asarray(rdp, dtype=float)
    r = np.broadcast_to(r, (r.shape[:-1] if r.ndim else ()) + a.shape)
    return _rule(np.broadcast_to(a, r.shape), r, delta, method)


def rdp_to_dp(orders, rdp_values, delta: float, *, method: str = "improved") -> tuple[float, float]:
    """One (α, ε_α)-RDP curve → (ε, δ)-DP; returns ``(ε, best order)`` (see :func:`rdp_epsilon`).

    ``rdp_values`` may be ``inf`` at some orders (those orders are skipped); if every order is
    infinite the result is ``(inf, nan)``.
    """
    a = np.atleast_1d(np.asarray(orders, dtype=float))
    r = np.broadcast_to(np.asarray(rdp_values, dtype=float), a.shape)
    eps, alpha = rdp_epsilon(a, r, delta, method=method)
    return float(eps), float(alpha)


def linear_rdp_to_dp(
    slope, delta: float, alpha_max: float = math.inf, *, method: str = "improved"
) -> tuple[np.ndarray, np.ndarray]:
    """Best (ε, δ) of linear RDP curves ``ε_α = slope·α`` over ``α ∈ (1, alpha_max]``, vectorised.

    Candidates: :data:`DEFAULT_ORDERS` up to the cap, the cap itself, an order just above 1 (where the
    total-variation rule can give ε = 0), and Mironov's continuous
    optimum ``α* = 1 + √(ln(1/δ)/slope)`` (clamped) — so the result is never above the classic
    continuous optimum — then a golden-section refinement between the best candidate's neighbours
    (vectorised).  Every evaluated α is a valid order, so the result is sound whatever the shape of
    the curve in α.  A zero slope gives 0 (improved) or the value at the largest order (classic).
    """
    if not alpha_max > 1.0:
        raise ValueError("alpha_max must be > 1")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    s = np.maximum(np.asarray(slope, dtype=float), 0.0)
    log_inv = math.log(1.0 / delta)
    grid = DEFAULT_ORDERS[DEFAULT_ORDERS <= alpha_max]
    if math.isfinite(alpha_max):
        grid = np.append(grid, alpha_max)
    with np.errstate(divide="ignore"):
        a_star = np.where(s > 0, 1.0 + np.sqrt(log_inv / np.where(s > 0, s, 1.0)), grid[-1])
    a_star = np.clip(a_star, 1.0 + 1e-9, alpha_max)
    cands = [np.broadcast_to(grid, s.shape + grid.shape), a_star[..., None]]
    if (
        method == "improved"
    ):  # α → 1⁺: KL ≤ slope·α, so (0, δ) when the total-variation bound already meets δ
        cands.append(np.full(s.shape + (1,), 1.0 + 1e-9))
    orders = np.sort(np.concatenate(cands, axis=-1), axis=-1)
    eps, alpha = _rule(orders, s[..., None] * orders, delta, method)
    if method == "classic":  # α* is the exact optimum of Mironov's convex form
        return eps, alpha
    i = np.argmin(np.where(orders == alpha[..., None], 0, 1), axis=-1)
    # bracket: the best candidate's neighbours; below the smallest candidate, down to where the improved
    # rule starts (1.01: below it the value is Mironov's, which only grows as α → 1)
    lo = np.where(
        i > 0,
        np.take_along_axis(orders, np.maximum(i - 1, 0)[..., None], axis=-1)[..., 0],
        min(_IMPROVED_MIN_ORDER * (1 + 1e-12), float(orders.min())),
    )
    hi = np.take_along_axis(orders, np.minimum(i + 1, orders.shape[-1] - 1)[..., None], axis=-1)[
        ..., 0
    ]
    g = (math.sqrt(5.0) - 1.0) / 2.0
    f = lambda x: _rule(x[..., None], (s * x)[..., None], delta, method)[0]  # noqa: E731
    for _ in range(
        60
    ):  # golden section, both interior points evaluated each step (cheap, vectorised)
        x1, x2 = hi - g * (hi - lo), lo + g * (hi - lo)
        f1, f2 = f(x1), f(x2)
        left = f1 <= f2
        hi, lo = np.where(left, x2, hi), np.where(left, lo, x1)
    x1, x2 = hi - g * (hi - lo), lo + g * (hi - lo)
    f1, f2 = f(x1), f(x2)
    better = np.minimum(f1, f2) < eps
    alpha = np.where(better, np.where(f1 <= f2, x1, x2), alpha)
    return np.where(better, np.minimum(f1, f2), eps), alpha


def _rule(
    orders: np.ndarray, rdp: np.ndarray, delta: float, method: str
) -> tuple[np.ndarray, np.ndarray]:
    """The conversion itself, per order, then the best order of each curve (last axis).

    ``orders`` and ``rdp`` have one shape (orders may differ per curve).  Improved: dp-accounting's
    ``compute_epsilon`` term for term — ``ε_α + ln(1 − 1/α) − ln(δα)/(α − 1)`` for α > 1.01 (never
    above the classic value there), and 0 when ``δ² + expm1(−ε_α) > 0`` (δ ≥ the total variation
    ``√(1 − e^{−KL})``, KL ≤ ε_α).  Negative RDP (rounding) counts as 0; infinite entries are skipped.
    """
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if method not in ("improved", "classic"):
        raise ValueError("method must be 'improved' or 'classic'")
    a = orders
    r = np.maximum(rdp, 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        eps = r + math.log(1.0 / delta) / (a - 1.0)
        if method == "improved":
            better = r + np.log1p(-1.0 / a) - np.log(delta * a) / (a - 1.0)
            eps = np.where(a > _IMPROVED_MIN_ORDER, np.minimum(eps, better), eps)
            eps = np.where(delta**2 + np.expm1(-r) > 0.0, 0.0, eps)
    eps = np.where(np.isfinite(eps), eps, np.inf)
    i = np.argmin(eps, axis=-1)
    best = np.take_along_axis(eps, i[..., None], axis=-1)[..., 0]
    alpha = np.take_along_axis(a, i[..., None], axis=-1)[..., 0]
    return np.maximum(best, 0.0), np.where(np.isfinite(best), alpha, np.nan)


def rdp_epsilon_dominating(
    orders: np.ndarray, rdp_max: np.ndarray, delta: float
) -> tuple[float, int, float]:
    """An upper bound on the improved rule's ε (:func:`rdp_epsilon`) of **every** curve ``c`` with
    ``0 ≤ c ≤ rdp_max`` elementwise (no NaN) at ``delta``: ``(bound, order index, rounding scale)``.

    Why: a node's first charge of a run converts its new row toward n − 1 targets (159 orders each)
    because it knows no best order for any of them yet; one conversion of the pointwise maximum
    clears them all when the maximum is well within budget (issue 12).

    Soundness.  Per order α, :func:`_rule` gives a curve ``c`` the value ``w_c(α)``: either 0 (the
    total-variation case) or the formula ``v_c(α)`` — ``fl(fl(r + A) − B)`` or ``fl(r + C)`` and
    their minimum (α > 1.01), with ``r = max(c_α, 0)`` and ``A = ln(1 − 1/α)``, ``B = ln(δα)/(α − 1)``,
    ``C = ln(1/δ)/(α − 1)`` depending on (α, δ) only; non-finite values count as +∞.  IEEE
    round-to-nearest addition and subtraction are monotone in each operand and ``max(·, 0)`` and
    ``min`` are monotone, so ``c_α ≤ m_α`` gives ``v_c(α) ≤ v_m(α)`` **when A, B, C are the same
    doubles** in both evaluations.  Its ε is ``max(min_α w_c(α), 0) ≤ max(w_c(α*), 0) ≤
    max(v_c(α*), 0)`` at any one order α*; this function returns ``max(v_m(α*), 0)`` at the α*
    minimising ``v_m`` (the total-variation case is left out: it sets a value to 0, which the final
    ``max(·, 0)`` never puts above ``max(v, 0)``, so the bound needs no monotonicity of ``expm1``).  The one gap is a math kernel rounding ``A``, ``B`` or ``C``
    differently in another array layout (a few ulp): the returned scale is ``|r| + |A| + |B| + |C|`` at
    α*, and a caller that proves ``bound + 1e-9·scale ≤ budget`` has many orders of magnitude to spare.
    A GDP conversion that is smaller only lowers the ledger's ε further (it takes the minimum).
    """
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    a = np.asarray(orders, dtype=np.float64)
    r = np.maximum(np.asarray(rdp_max, dtype=np.float64), 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        c = math.log(1.0 / delta) / (a - 1.0)
        lo = np.log1p(-1.0 / a)
        hi = np.log(delta * a) / (a - 1.0)
        eps = r + c  # the same expressions, in the same order, as _rule's
        better = r + lo - hi
        eps = np.where(a > _IMPROVED_MIN_ORDER, np.minimum(eps, better), eps)
    eps = np.where(np.isfinite(eps), eps, np.inf)
    i = int(np.argmin(eps))
    if not math.isfinite(eps[i]):
        return math.inf, i, math.inf
    scale = float(r[i] + abs(c[i]) + abs(lo[i]) + abs(hi[i]))
    return max(float(eps[i]), 0.0), i, scale


def gaussian_pld_epsilon(
    mus, delta: float, *, counts=None, value_discretization_interval: float = 1e-4
) -> float:
    """(ε, δ) of a composition of Gaussian mechanisms (μ_i-GDP, each ``counts[i]`` times) by
    ``dp-accounting``'s PLD accountant.  Exact answer: ``gdp_epsilon(√Σ counts·μ², δ)``; the PLD is a
    pessimistic discretisation of the same loss (tests pin the two together)."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    m = np.atleast_1d(np.asarray(mus, dtype=float))
    c = (
        np.ones(m.size, dtype=int)
        if counts is None
        else np.atleast_1d(np.asarray(counts, dtype=int))
    )
    if np.any(m < 0) or np.any(c < 0) or c.size != m.size:
        raise ValueError("need mus >= 0 and one non-negative count per mu")
    if np.any(np.isinf(m) & (c > 0)):
        return math.inf
    acc = pld_privacy_accountant.PLDAccountant(
        value_discretization_interval=value_discretization_interval
    )
    for mu, k in zip(m, c):
        if mu > 0 and k > 0:
            acc.compose(dp_accounting.GaussianDpEvent(noise_multiplier=1.0 / float(mu)), int(k))
    return float(max(acc.get_epsilon(delta), 0.0))


def _log_ndtr(x: float) -> float:
    from scipy import special  # lazily: a node process that never converts GDP need not load scipy

    return float(special.log_ndtr(x))


def gdp_delta(mu: float, eps: float) -> float:
    """δ(ε) of μ-GDP: ``Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)`` (computed in log space for stability)."""
    if mu < 0:
        raise ValueError("mu must be >= 0")
    if mu == 0.0:
        return 0.0
    if math.isinf(mu):
        return 1.0
    a = _log_ndtr(-eps / mu + mu / 2.0)
    b = eps + _log_ndtr(-eps / mu - mu / 2.0)
    if b >= a:
        return 0.0
    return float(math.exp(a) * -math.expm1(b - a))


def gdp_epsilon(mu: float, delta: float) -> float:
    """Smallest ε ≥ 0 with ``gdp_delta(mu, ε) ≤ δ`` (tight (ε, δ) of a Gaussian mechanism), never below
    it: the returned ε satisfies the inequality as computed."""
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if mu == 0.0:
        return 0.0
    if math.isinf(mu):
        return math.inf
    if gdp_delta(mu, 0.0) <= delta:
        return 0.0
    hi = max(1.0, mu * mu)
    while gdp_delta(mu, hi) > delta:
        hi *= 2.0
        if hi > 1e8:
            return math.inf
    from scipy import optimize

    eps = float(
        optimize.brentq(lambda e: gdp_delta(mu, e) - delta, 0.0, hi, xtol=1e-12, rtol=1e-12)
    )
    # brentq's answer may sit on either side of the root: step up until δ(ε) ≤ δ really holds
    step = max(eps * 1e-13, 1e-15)
    while gdp_delta(mu, eps) > delta:
        eps += step
        step *= 2.0
    return eps


def gdp_mu(eps: float, delta: float) -> float:
    """Largest μ such that μ-GDP is (ε, δ)-DP (δ(ε) is increasing in μ), never above it."""
    if not 0.0 < delta < 1.0 or eps < 0:
        raise ValueError("need eps >= 0 and delta in (0, 1)")
    lo, hi = 0.0, 1.0
    while gdp_delta(hi, eps) < delta:
        hi *= 2.0
    from scipy import optimize

    mu = float(optimize.brentq(lambda m: gdp_delta(m, eps) - delta, lo, hi, xtol=1e-14, rtol=1e-13))
    # brentq's answer may sit on either side of the root: step down until δ(ε) ≤ δ really holds
    step = max(mu * 1e-13, 1e-16)
    while mu > 0.0 and gdp_delta(mu, eps) > delta:
        mu = max(mu - step, 0.0)
        step *= 2.0
    return mu


def gaussian_sigma_tight(sensitivity: float, eps: float, delta: float) -> float:
    """σ for the Gaussian mechanism to be exactly (ε, δ)-DP (tight, via GDP); never below it, with
    μ = Δ/σ recomputed as callers do (the division's rounding can move μ up)."""
    sigma = float(sensitivity / gdp_mu(eps, delta))
    while gdp_delta(sensitivity / sigma, eps) > delta:
        sigma = math.nextafter(sigma, math.inf)
    return sigma


def rdp_gaussian_mu(rdp: float, alpha: float) -> float:
    """The μ of a Gaussian mechanism whose RDP at order α is ``rdp`` (``rdp = α μ²/2``)."""
    return float(math.sqrt(2.0 * rdp / alpha))
