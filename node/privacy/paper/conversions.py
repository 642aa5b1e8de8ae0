"""The classic conversions the papers (and their code) use; hushnet certifies with the improved ones.

Mironov's ``ε = ε_α + ln(1/δ)/(α − 1)`` is valid but looser than the improved rule of
:mod:`hushnet.privacy.conversions`; Dwork–Roth's Gaussian calibration is valid only for ε ≤ 1.
They are here so that reproductions print the papers' numbers, labelled "paper".
"""

from __future__ import annotations

import math
import warnings

import numpy as np

__all__ = [
    "gaussian_sigma_classic",
    "classic_epsilon_from_rdp_slope",
    "classic_linear_best_order_epsilon",
]


def gaussian_sigma_classic(sensitivity: float, eps: float, delta: float) -> float:
    """Dwork–Roth ``σ = Δ sqrt(2 ln(1.25/δ))/ε``; only valid for ε ≤ 1 (kept because papers use it)."""
    if eps > 1.0:
        warnings.warn(
            "classic Gaussian calibration is only valid for eps <= 1", RuntimeWarning, stacklevel=2
        )
    return float(sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / eps)


def classic_epsilon_from_rdp_slope(slope: float, delta: float) -> float:
    """(ε, δ) implied by an RDP curve ``ε(α) = slope·α`` (Theorem 1 is linear in α) via Mironov's
    classic rule over hushnet's default orders (the Muffliato paper's conversion)."""
    from hushnet.privacy import conversions

    orders = conversions.DEFAULT_ORDERS
    return conversions.rdp_to_dp(orders, slope * orders, delta, method="classic")[0]


def classic_linear_best_order_epsilon(slope: np.ndarray, log_inv_delta: float) -> np.ndarray:
    """Mironov's rule at the best real order for linear curves ``ε(α) = s·α`` with no cap on α:
    ``α* = 1 + sqrt(L/s)``, ``ε = α* s + L/(α* − 1)`` with ``L = ln(1/δ)`` (vectorised over s).

    This is how the random-walk paper turns Theorem 3 into (ε, δ); it ignores the noise condition
    that caps α, which is one reason the value is not a guarantee."""
    L = float(log_inv_delta)
    a = 1.0 + np.sqrt(L / np.maximum(slope, 1e-300))
    return a * slope + L / (a - 1.0)
