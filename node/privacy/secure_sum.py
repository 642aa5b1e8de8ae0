"""Accounting of inputs released only inside a secure sum (distributed DP).

Setting.  In a secure-summation round (:mod:`hushnet.families.secagg.machines`) every member ``u`` of a set
``M`` hands in ``x_u + z_u`` with ``‖x_u − x'_u‖₂ ≤ Δ`` (clipped vectors: L2 sensitivity Δ) and
``z_u ~ N(0, s² I)`` drawn by ``u`` itself; the leader learns only ``S = Σ_{u∈U} (x_u + z_u)`` over the
survivors ``U`` (``|U| ≥ t``: below the threshold nothing is released), and ``S`` may be broadcast.

Observer coalitions.  Let ``A`` be the observing coalition: the observer itself if it is a member,
the leader if it colludes and is a member, and up to ``c`` members in all (``c`` is the run's
*collusion* parameter, ``c ≥ 1`` because an observer that is a member knows its own noise).  What
``A`` sees of an honest ``u ∉ A`` is a post-processing of

    ``S − Σ_{v∈U∩A} (x_v + z_v) = Σ_{v∈U∖A} x_v + Σ_{v∈U∖A} z_v``

(the coalition subtracts its own inputs and noise, which it knows).  The masks hide the individual
masked inputs from ``A`` as long as ``A`` stays within the secure sum's collusion tolerance
(:meth:`hushnet.families.secagg.params.SecAggParams.collusion_tolerance`; ``c`` below it is required and
checked here).  The honest survivors number ``|U∖A| ≥ |U| − c ≥ t − c`` *whatever* dropped out, so
the noise ``A`` does not know has variance at least ``(t − c)·s²`` per coordinate.  Calibrating

    ``s² = (σΔ)² / (t − c)``

makes it at least ``(σΔ)²``: changing ``x_u`` moves the mean by at most Δ, and the view is a Gaussian
mechanism with noise multiplier ≥ σ — RDP ``α/(2σ²)`` at every order and ``1/σ``-GDP, *exact* for
vector inputs too (the Rényi divergence of two isotropic Gaussians depends only on the L2 distance of
the means, and the other honest inputs are treated as known: worst case).  Rounds compose adaptively
(the next round's inputs depend on earlier sums): RDP adds, μ² adds.

What is *not* credited: amplification by sampling members (the sampling, if any, is public), any
hiding by survivors beyond ``t − c``, and a coalition larger than ``c`` (for ``|A| = c' > c`` the view is
still Gaussian with multiplier ``σ·√((t − c')/(t − c))``, see :func:`view_sigma`, but the run does
not certify it).  Dropouts cannot hurt: they remove survivors, never below ``t``; a round that aborts
releases nothing, and a member's charge is made when its masked input leaves (conservative).  A
leader that is not a member sees only ``S`` (it holds no shares): it is an observer with ``c``
members colluding at most.  A malicious leader that lies about the survivor set is outside the
semi-honest model of the secure sum (members check ``|U| ≥ t`` themselves).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

MECHANISM = "secure-summation"
VIEW_MODEL = "aggregate"


class SecureSumError(ValueError):
    """Secure-sum parameters that cannot be certified (one-line reason)."""


def check_collusion(threshold: int, collusion: int, tolerance: int) -> None:
    """``1 ≤ c < tolerance`` and ``c < t``: the coalition stays inside what the masks hide, and at least
    one honest survivor's noise remains.  ``tolerance`` is the secure sum's collusion tolerance."""
    if isinstance(collusion, bool) or not isinstance(collusion, (int, np.integer)):
        raise SecureSumError(f"collusion must be an integer, got {collusion!r}")
    if collusion < 1:
        raise SecureSumError(
            f"collusion c={collusion} < 1: an observer that is a member knows its own noise, "
            "so every coalition counts at least one member"
        )
    if not collusion < tolerance:
        raise SecureSumError(
            f"collusion c={collusion} is not below the secure sum's collusion tolerance "
            f"{tolerance} (threshold t={threshold}): the masks would not hide the inputs"
        )
    if not collusion < threshold:
        raise SecureSumError(
            f"collusion c={collusion} ≥ threshold t={threshold}: no honest survivor is guaranteed"
        )


def share_std(sigma: float, sensitivity: float, threshold: int, collusion: int) -> float:
    """Each member's noise std ``s = σΔ/√(t − c)``: any ``t − c`` honest survivors' noise sums to ``(σΔ)²``."""
    if not (sigma > 0 and math.isfinite(sigma)):
        raise SecureSumError(f"sigma must be a positive number (noise multiplier), got {sigma}")
    if not (sensitivity > 0 and math.isfinite(sensitivity)):
        raise SecureSumError(f"sensitivity must be a positive number, got {sensitivity}")
    if not 0 < collusion < threshold:
        raise SecureSumError(f"need 0 < c < t, got c={collusion}, t={threshold}")
    return float(sigma) * float(sensitivity) / math.sqrt(threshold - collusion)


def view_sigma(noise_std: float, sensitivity: float, threshold: int, collusion: int) -> float:
    """The certified noise multiplier of the coalition's view when each member added ``noise_std``:
    ``√(t − c)·s/Δ`` (the inverse of :func:`share_std`; ``c = t`` or ``s = 0`` gives 0: no protection)."""
    honest = threshold - collusion
    if honest <= 0 or noise_std <= 0:
        return 0.0
    if sensitivity <= 0:
        return math.inf
    return math.sqrt(honest) * float(noise_std) / float(sensitivity)


def gaussian_rdp(orders: np.ndarray, sigma: float) -> np.ndarray:
    """RDP ``α/(2σ²)`` of one Gaussian view with noise multiplier σ (∞ without noise)."""
    o = np.asarray(orders, dtype=float)
    if not sigma > 0:
        return np.full(o.shape, math.inf)
    return o / (2.0 * sigma * sigma)


@dataclass(frozen=True)
class SecureSumView:
    """The certified view of one secure-sum release toward any coalition of ≤ ``collusion`` members."""

    sigma: float  # certified noise multiplier of the aggregate view (the spec's σ)
    sensitivity: float  # Δ: L2 sensitivity of one member's input
    threshold: int  # t
    collusion: int  # c
    tolerance: int  # the secure sum's collusion tolerance (masks)

    def __post_init__(self) -> None:
        check_collusion(self.threshold, self.collusion, self.tolerance)
        share_std(self.sigma, self.sensitivity, self.threshold, self.collusion)  # validates σ, Δ

    @property
    def share_std(self) -> float:
        return share_std(self.sigma, self.sensitivity, self.threshold, self.collusion)

    @property
    def honest_survivors(self) -> int:
        """The fewest honest survivors a released sum can have toward the coalition: ``t − c``."""
        return self.threshold - self.collusion

    def rdp(self, orders: np.ndarray) -> np.ndarray:
        return gaussian_rdp(orders, self.sigma)

    @property
    def gdp_mu(self) -> float:
        return 1.0 / self.sigma

    def label(self) -> str:
        return (
            f"secure-sum Gaussian view (distributed DP): each member adds N(0, (σΔ)²/(t−c)), any coalition of "
            f"≤ c={self.collusion} members sees ≥ t−c={self.honest_survivors} honest survivors' noise ≥ σΔ "
            f"(t={self.threshold}, σ={self.sigma:g}): RDP α/(2σ²), exact"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "mechanism": MECHANISM,
            "view_model": VIEW_MODEL,
            "accountant": self.label(),
            "collusion": self.collusion,
            "threshold": self.threshold,
            "collusion_tolerance": self.tolerance,
            "sigma": self.sigma,
            "share_std": self.share_std,
            "dp_credit": True,
            "reason": "pairwise-masked secure summation: observers see only the sum of ≥ t survivors; a coalition "
            "of ≤ c members knows only its own noise",
        }


def composed_epsilon(rounds: float, sigma: float, delta: float) -> float:
    """Exact (ε, δ) of ``rounds`` adaptively composed Gaussian views with multiplier σ (μ = √rounds/σ, GDP)."""
    from hushnet.privacy.conversions import gdp_epsilon

    if rounds <= 0:
        return 0.0
    return gdp_epsilon(math.sqrt(rounds) / sigma, delta)


__all__ = [
    "SecureSumError",
    "check_collusion",
    "share_std",
    "view_sigma",
    "gaussian_rdp",
    "SecureSumView",
    "composed_epsilon",
    "MECHANISM",
    "VIEW_MODEL",
]
