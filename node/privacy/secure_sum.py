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
the means, and the other honest inputs are treated as known: worst case) — in exact arithmetic.  The
members hand in fixed-point words, so Δ is read as ``Δ_eff ≥ Δ`` and ``s² = (σΔ_eff)²/(t − c)`` (*Fixed
point* below).  Rounds compose adaptively (the next round's inputs depend on earlier sums): RDP adds,
μ² adds.

What is *not* credited: amplification by sampling members (the sampling, if any, is public), any
hiding by survivors beyond ``t − c``, and a coalition larger than ``c`` (for ``|A| = c' > c`` the view is
still Gaussian with multiplier ``σ·√((t − c')/(t − c))``, see :func:`view_sigma`, but the run does
not certify it).  Dropouts cannot hurt: they remove survivors, never below ``t``; a round that aborts
releases nothing, and a member's charge is made when its masked input leaves (conservative).  A
leader that is not a member sees only ``S`` (it holds no shares): it is an observer with ``c``
members colluding at most.  A malicious leader that lies about the survivor set is outside the
semi-honest model of the secure sum (members check ``|U| ≥ t`` themselves).

Fixed point (why Δ becomes Δ_eff; ``docs/design/spec/secagg.md``).  The masks live in the integers mod ``2^k``, so a member hands in
words on the grid ``qℤ^d`` (``q = 2^-f``, ``f = frac_bits``, ``R`` = round to nearest).  Rounding the
*noisy* share, ``R(x_u + z_u)``, is not sound: ``Σ_u R(x_u + z_u)`` is not a function of ``Σ_u (x_u + z_u)``
(with shares of std ≪ q each rounded share is nearly deterministic and the sum shows ``x_u``, although
``Σ s²`` is large; ``tests/privacy/test_secagg_rounding.py`` computes it).  So a member rounds its data and
its noise *apart* and hands in ``R(x_u) + R(z_u)`` (:func:`hushnet.families.secagg.machines.encode_input`).
The coalition's view is then a post-processing of ``O = Σ_{u∈H} R(x_u) + F(z)``, ``F(z) = Σ_{u∈H} R(z_u)``,
``H`` = the honest survivors (``|H| ≥ h = t − c``): the words are summed as integers mod ``2^k``, the masks
cancel exactly and the sum is decoded once, so wrap-around is a function of the exact integer sum; a
dropped member's masks are removed, it is simply not in ``H``.  For neighbouring inputs the data part
moves by the grid vector ``v = R(x'_u) − R(x_u)``, ``‖v‖₂ ≤ Δ + q√d`` (each rounding moves ≤ ``q√d/2``).
Pick ``b ≤ h`` honest members and grid vectors ``v_i`` with ``Σ v_i = v``; rounding commutes with grid
shifts (``R(z + v_i) = R(z) + v_i``, off the measure-zero ties), so ``O' = Σ R(x_u) + F(z + (v_i))`` and by
data processing ``D_α(O'‖O) ≤ D_α(N(v⃗, s²I) ‖ N(0, s²I)) = α/(2s²)·Σ‖v_i‖²`` (the same shift bounds
the trade-off function: μ-GDP with ``μ² = Σ‖v_i‖²/s²``).  Split every coordinate ``v_j = kq`` into b
integers as equal as possible (``k = ab + r``: r parts ``a + 1``, the rest ``a``): ``Σ_i k_i² = k²/b +
r(b − r)/b ≤ k²/b + ⌊b²/4⌋/b``.  Hence ``μ² ≤ [(Δ + q√d)² + d q² ⌊b²/4⌋] / (b s²)`` for every
``1 ≤ b ≤ h``, i.e. the Gaussian view with Δ replaced by ``Δ_eff² = h·min_b [(Δ + q√d)² + d q² ⌊b²/4⌋]/b``
(``b = h``: ``≤ (Δ + q√d)² + d q² h²/4``; ``h = 1``: ``Δ + q√d``, one share seen alone — the local-DP
bound of ``secagg-sum`` without ``collusion``; :func:`effective_sensitivity`).  The calibration adds the difference to the
noise, ``s = σΔ_eff/√h`` (at f = 24, d = 10⁶, h = 10, Δ = 2: Δ_eff/Δ − 1 ≈ 3·10⁻⁵), so the spec's σ stays
the certified multiplier; the ledger recomputes the multiplier from the std a member reports and ``d``.
With unequal shares the same split (proportional to ``s_i²``, parts rounded to the grid, each off by
< q) gives ``μ² ≤ ‖v‖²/S + d q² Σ_i 1/s_i²``, ``S = Σ_i s_i²`` over the honest shares.  The noise words
are encoded mod ``2^k`` without a range check (a refusal that depended on ``z_u`` would itself leak;
only the data part is range-checked, a function of ``x_u``).  Not covered: floating-point artefacts of
the Gaussian sampler below the grid (the grid step is far above float64 resolution of the noise).
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


def effective_sensitivity(
    sensitivity: float, honest: int, *, dim: int | None, frac_bits: int | None
) -> float:
    """The Δ_eff that stands for Δ in the Gaussian view once members hand in ``R(x) + R(z)`` on the grid
    ``q = 2^-frac_bits`` (see the module docstring, *Fixed point*): the view of ``h = honest`` honest
    shares of std ``s`` is Gaussian with ``μ² ≤ min_{1≤b≤h} [(Δ + q√d)² + d·q²·⌊b²/4⌋] / (b·s²)``, written
    ``Δ_eff² / (h·s²)``; ``h = 1`` gives ``Δ + q√d`` (one share seen alone: local DP).
    ``frac_bits=None``: exact arithmetic (a plain float sum), Δ_eff = Δ."""
    delta = float(sensitivity)
    if frac_bits is None:
        return delta
    if dim is None or isinstance(dim, bool) or int(dim) < 1:
        raise SecureSumError(
            f"the fixed-point rounding's charge depends on the input's dimension, got dim={dim!r}"
        )
    if honest < 1:
        raise SecureSumError(f"need at least one honest survivor, got {honest}")
    q, d = 2.0 ** -int(frac_bits), int(dim)
    shift = (delta + q * math.sqrt(d)) ** 2  # the grid shift of the data part, squared
    b = np.arange(1, int(honest) + 1, dtype=np.float64)  # honest shares that take part of the shift
    # splitting each coordinate k·q into b integers as equal as possible costs k²/b + r(b − r)/b, r = k mod b
    g = (shift + d * q * q * np.floor(b * b / 4.0)) / b
    return math.sqrt(honest * float(np.min(g)))


def share_std(
    sigma: float,
    sensitivity: float,
    threshold: int,
    collusion: int,
    *,
    dim: int | None,
    frac_bits: int | None,
) -> float:
    """Each member's noise std ``s = σΔ_eff/√(t − c)``: any ``t − c`` honest survivors' (rounded) noise gives
    the view the multiplier σ (:func:`effective_sensitivity`; ``frac_bits=None``: Δ_eff = Δ)."""
    if not (sigma > 0 and math.isfinite(sigma)):
        raise SecureSumError(f"sigma must be a positive number (noise multiplier), got {sigma}")
    if not (sensitivity > 0 and math.isfinite(sensitivity)):
        raise SecureSumError(f"sensitivity must be a positive number, got {sensitivity}")
    if not 0 < collusion < threshold:
        raise SecureSumError(f"need 0 < c < t, got c={collusion}, t={threshold}")
    honest = threshold - collusion
    eff = effective_sensitivity(sensitivity, honest, dim=dim, frac_bits=frac_bits)
    return float(sigma) * eff / math.sqrt(honest)


def view_sigma(
    noise_std: float,
    sensitivity: float,
    threshold: int,
    collusion: int,
    *,
    dim: int | None,
    frac_bits: int | None,
) -> float:
    """The certified noise multiplier of the coalition's view when each member added ``noise_std``:
    ``√(t − c)·s/Δ_eff`` (the inverse of :func:`share_std`; ``c = t`` or ``s = 0`` gives 0: no protection)."""
    honest = threshold - collusion
    if honest <= 0 or noise_std <= 0:
        return 0.0
    if sensitivity <= 0:
        return math.inf
    eff = effective_sensitivity(sensitivity, honest, dim=dim, frac_bits=frac_bits)
    return math.sqrt(honest) * float(noise_std) / eff


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
    #: the members' fixed-point grid 2^-frac_bits (None: exact arithmetic, a plain float sum)
    frac_bits: int | None
    #: the input's dimension d (None: not known yet — a projection from the spec, which needs only σ)
    dim: int | None = None

    def __post_init__(self) -> None:
        check_collusion(self.threshold, self.collusion, self.tolerance)
        share_std(  # validates σ, Δ (and d, when known)
            self.sigma,
            self.sensitivity,
            self.threshold,
            self.collusion,
            dim=1 if self.dim is None else self.dim,
            frac_bits=self.frac_bits,
        )

    @property
    def share_std(self) -> float:
        """Each member's noise std (needs ``dim`` with a fixed-point grid)."""
        if self.dim is None and self.frac_bits is not None:
            raise SecureSumError(
                "the share's std depends on the input's dimension (fixed-point rounding): dim unknown"
            )
        return share_std(
            self.sigma,
            self.sensitivity,
            self.threshold,
            self.collusion,
            dim=self.dim,
            frac_bits=self.frac_bits,
        )

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
        grid = (
            ""
            if self.frac_bits is None
            else f"; fixed point 2^-{self.frac_bits}: data and noise rounded apart, Δ_eff covers the rounding"
        )
        delta = "Δ" if self.frac_bits is None else "Δ_eff"
        return (
            f"secure-sum Gaussian view (distributed DP): each member adds N(0, (σ{delta})²/(t−c)), any coalition of "
            f"≤ c={self.collusion} members sees ≥ t−c={self.honest_survivors} honest survivors' noise ≥ σ{delta} "
            f"(t={self.threshold}, σ={self.sigma:g}{grid}): RDP α/(2σ²), "
            + ("exact" if self.frac_bits is None else "a bound (exact in real arithmetic)")
        )

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mechanism": MECHANISM,
            "view_model": VIEW_MODEL,
            "accountant": self.label(),
            "collusion": self.collusion,
            "threshold": self.threshold,
            "collusion_tolerance": self.tolerance,
            "sigma": self.sigma,
            "frac_bits": self.frac_bits,
            "dp_credit": True,
            "reason": "pairwise-masked secure summation: observers see only the sum of ≥ t survivors; a coalition "
            "of ≤ c members knows only its own noise",
        }
        if self.dim is not None or self.frac_bits is None:
            out["share_std"] = self.share_std
            out["effective_sensitivity"] = effective_sensitivity(
                self.sensitivity, self.honest_survivors, dim=self.dim, frac_bits=self.frac_bits
            )
        return out


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
    "effective_sensitivity",
    "gaussian_rdp",
    "SecureSumView",
    "composed_epsilon",
    "MECHANISM",
    "VIEW_MODEL",
]
