"""Conversions between privacy notions: Rényi DP, Gaussian DP and (ε, δ)-DP.

Two conversions to (ε, δ) live here, and each result says which one produced it:

* ``rdp_to_dp``: Mironov's ``ε = ε_RDP(α) + ln(1/δ)/(α − 1)``, minimised over a grid of orders.
  Valid for any RDP curve; it is the conversion the papers' code uses, so figures match.
* ``gdp_epsilon``: the tight (ε, δ) curve of a Gaussian mechanism (μ-GDP, [K] Lemma 2/4).
  Exact for linear-Gaussian views, where the privacy loss is a Gaussian with total
  sensitivity ``μ = Δ/σ``; it is never larger than the Mironov value.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = [
    "DEFAULT_ORDERS",
    "gaussian_rdp",
    "rdp_to_dp",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu",
    "gaussian_sigma_classic",
    "gaussian_sigma_tight",
    "rdp_gaussian_mu",
]

#: Rényi orders used when composing ledgers and converting to (ε, δ).
DEFAULT_ORDERS: np.ndarray = np.concatenate(
    [np.linspace(1.1, 10.9, 99), np.arange(11.0, 64.0), np.array([64.0, 80.0, 96.0, 128.0, 256.0, 512.0, 1024.0])]
)


def gaussian_rdp(alpha, sens_sq):
    """RDP of the Gaussian mechanism: ``α·Δ²/(2σ²)`` with ``sens_sq = Δ²/σ²`` (vectorised)."""
    return np.asarray(alpha, dtype=float) * np.asarray(sens_sq, dtype=float) / 2.0


def rdp_to_dp(orders, rdp_values, delta: float) -> tuple[float, float]:
    """(α, ε_α)-RDP curve → (ε, δ)-DP by Mironov's conversion; returns ``(ε, best order)``.

    ``rdp_values`` may be ``inf`` at some orders (those orders are skipped); if every order is
    infinite the result is ``(inf, nan)``.
    """
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    a = np.atleast_1d(np.asarray(orders, dtype=float))
    r = np.broadcast_to(np.asarray(rdp_values, dtype=float), a.shape)
    if np.any(a <= 1.0):
        raise ValueError("Rényi orders must be > 1")
    eps = r + math.log(1.0 / delta) / (a - 1.0)
    if not np.isfinite(eps).any():
        return math.inf, math.nan
    i = int(np.nanargmin(np.where(np.isfinite(eps), eps, np.inf)))
    return float(max(eps[i], 0.0)), float(a[i])


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
    """Smallest ε ≥ 0 with ``gdp_delta(mu, ε) ≤ δ`` (tight (ε, δ) of a Gaussian mechanism)."""
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

    return float(optimize.brentq(lambda e: gdp_delta(mu, e) - delta, 0.0, hi, xtol=1e-12, rtol=1e-12))


def gdp_mu(eps: float, delta: float) -> float:
    """Largest μ such that μ-GDP is (ε, δ)-DP (δ(ε) is increasing in μ)."""
    if not 0.0 < delta < 1.0 or eps < 0:
        raise ValueError("need eps >= 0 and delta in (0, 1)")
    lo, hi = 0.0, 1.0
    while gdp_delta(hi, eps) < delta:
        hi *= 2.0
    from scipy import optimize

    return float(optimize.brentq(lambda m: gdp_delta(m, eps) - delta, lo, hi, xtol=1e-14, rtol=1e-13))


def gaussian_sigma_tight(sensitivity: float, eps: float, delta: float) -> float:
    """σ for the Gaussian mechanism to be exactly (ε, δ)-DP (tight, via GDP)."""
    return float(sensitivity / gdp_mu(eps, delta))


def gaussian_sigma_classic(sensitivity: float, eps: float, delta: float) -> float:
    """Dwork–Roth ``σ = Δ sqrt(2 ln(1.25/δ))/ε``; only valid for ε ≤ 1 (kept because papers use it)."""
    if eps > 1.0:
        import warnings

        warnings.warn("classic Gaussian calibration is only valid for eps <= 1", RuntimeWarning, stacklevel=2)
    return float(sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / eps)


def rdp_gaussian_mu(rdp: float, alpha: float) -> float:
    """The μ of a Gaussian mechanism whose RDP at order α is ``rdp`` (``rdp = α μ²/2``)."""
    return float(math.sqrt(2.0 * rdp / alpha))

