"""Noise calibration: the σ that meets a target (ε, δ).

A node configures a privacy target, not a noise level; every accountant in hushnet therefore
needs the inverse map σ ↦ loss.  All the losses we account are non-increasing in σ (more
noise never leaks more), so one generic bracketing + bisection search serves them all:

* :func:`calibrate_sigma` takes any ``sigma -> pairwise losses`` callable — an RDP tensor
  ``(n, n, len(orders))`` converted with hushnet's one rule (dp-accounting's improved conversion), or directly an (ε at δ) matrix — and
  finds the smallest σ for the **worst pair**, the **mean pair** or **a given pair**;
* :func:`linear_rdp_epsilon` is the continuous-α conversion for RDP curves linear in α
  (every Gaussian-type accountant), with an optional cap α ≤ α_max for proofs that need it
  (random-walk Thm 3, P-AD Lemma 1) — grids of orders would miss a binding cap;
* :func:`gaussian_sigma` calibrates a single Gaussian mechanism (tight GDP, classic, or RDP).

The result says which aggregation, conversion and bound label were used.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hushnet.privacy.conversions import (
    DEFAULT_ORDERS,
    gaussian_sigma_tight,
    rdp_epsilon,
    rdp_to_dp,
)
from hushnet.privacy.options import resolve

__all__ = [
    "CalibrationError",
    "UnreachableTarget",
    "CalibrationResult",
    "calibrate_sigma",
    "CalibrationOptions",
    "linear_rdp_epsilon",
    "alpha_max_for_constraint",
    "gaussian_sigma",
]


class CalibrationError(ValueError):
    """Calibration could not be carried out (bad inputs or non-monotone loss)."""


class UnreachableTarget(CalibrationError):
    """No σ in the searched range meets the target (e.g. the conversion term ln(1/δ)/(α−1)
    alone already exceeds ε at the largest admissible order)."""


@dataclass(frozen=True)
class CalibrationResult:
    """The calibrated σ and the loss it achieves (at ``pair`` aggregation, in (ε, δ) units)."""

    sigma: float
    epsilon: float
    delta: float | None
    pair: str
    kind: str
    bound: str
    evaluations: int
    details: dict = field(default_factory=dict)


def alpha_max_for_constraint(sigma: float, k: float) -> float:
    """Largest α with ``k α(α−1) ≤ σ²``: ``(1 + √(1 + 4σ²/k))/2`` (∞ when k = 0).

    The random-walk accountant's noise conditions are ``k = 2`` (printed), ``k = 1/2`` (proof),
    ``k = 0`` (none); P-AD Lemma 1 (``σ ≥ L√(2α(α−1))``) is ``k = 2L²``.
    """
    if k < 0:
        raise ValueError("k must be >= 0")
    if k == 0:
        return math.inf
    return 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * sigma * sigma / k))


def linear_rdp_epsilon(
    slope, delta: float, alpha_max: float = math.inf
) -> tuple[np.ndarray, np.ndarray]:
    """Best Mironov conversion of an RDP curve ``ε(α) = slope·α`` over α ∈ (1, alpha_max].

    ``slope·α + ln(1/δ)/(α−1)`` is convex in α with minimiser ``α* = 1 + √(ln(1/δ)/slope)``;
    when ``α* > alpha_max`` the constraint binds and α = alpha_max.  Vectorised over ``slope``.
    Returns ``(ε, α used)``.
    """
    if not 0.0 < delta < 1.0:
        raise ValueError("delta must be in (0, 1)")
    if not alpha_max > 1.0:
        raise ValueError("alpha_max must be > 1")
    s = np.asarray(slope, dtype=float)
    lg = math.log(1.0 / delta)
    with np.errstate(divide="ignore"):
        a = np.where(s > 0, 1.0 + np.sqrt(lg / np.where(s > 0, s, 1.0)), np.inf)
    a = np.minimum(a, alpha_max)
    if np.any(~np.isfinite(a)):
        raise UnreachableTarget("zero RDP slope with no cap on α: ε → 0 only as α → ∞")
    return s * a + lg / (a - 1.0), a


def _reduce(values: np.ndarray, pair, exclude_diagonal: bool, kind: str) -> np.ndarray:
    """Pick the pairs: a given (u, v), all off-diagonal pairs of a square matrix, or all entries.

    For ``kind="rdp"`` the trailing axis holds the orders and the others index pairs; the result
    has shape ``(pairs, len(orders))``.  For ``kind="dp"`` it is a flat vector of pair losses.
    """
    v = np.asarray(values, dtype=float)
    pair_ndim = v.ndim - (1 if kind == "rdp" else 0)
    if isinstance(pair, tuple):
        if pair_ndim != 2:
            raise CalibrationError("a (u, v) pair needs an (n, n[, orders]) loss array")
        out = v[pair[0], pair[1]]
    elif pair_ndim == 2 and exclude_diagonal and v.shape[0] == v.shape[1]:
        out = v[~np.eye(v.shape[0], dtype=bool)]
    else:
        out = v
    return out.reshape(-1, v.shape[-1]) if kind == "rdp" else out.reshape(-1)


def _loss(values, *, kind: str, pair, delta, orders, exclude_diagonal) -> tuple[float, dict]:
    sel = _reduce(values, pair, exclude_diagonal, kind)
    if sel.size == 0:
        raise CalibrationError("no pair to calibrate on (empty loss array)")
    if kind == "dp":
        if pair == "mean":
            return float(np.mean(sel)), {}
        return float(np.max(sel)), {}
    # kind == "rdp": sel has shape (pairs, len(orders))
    if sel.shape[1] != len(orders):
        raise CalibrationError(
            f"RDP loss must have a trailing axis of len(orders)={len(orders)}, got {sel.shape}"
        )
    if pair == "mean":
        # B.8 convention: the mean pair's RDP curve, then one conversion.
        eps, a = rdp_to_dp(orders, sel.mean(axis=0), delta)
        return eps, {"best_order": a}
    # worst pair: convert each pair with the same rule, then take the largest
    per_pair, _ = rdp_epsilon(orders, sel, delta)
    i = int(np.argmax(per_pair))
    eps, a = rdp_to_dp(orders, sel[i], delta)
    return eps, {"best_order": a, "worst_index": i}


@dataclass(frozen=True)
class CalibrationOptions:
    """How :func:`calibrate_sigma` reads the loss and searches σ (checked once, here).

    ``pair``: "worst", "mean" or a ``(u, v)`` tuple; ``kind``: "dp" (ε arrays) or "rdp" (RDP
    tensors converted at ``delta`` on ``orders``); the search brackets from ``sigma_init`` within
    ``[sigma_min, sigma_max]`` to relative ``rtol``; ``bound`` labels the loss being calibrated.
    """

    pair: Any = "worst"
    kind: str = "dp"
    delta: float | None = None
    orders: Any = None
    exclude_diagonal: bool = True
    sigma_init: float = 1.0
    sigma_min: float = 1e-8
    sigma_max: float = 1e8
    rtol: float = 1e-7
    bound: str = "certified"

    def __post_init__(self) -> None:
        if self.kind not in ("dp", "rdp"):
            raise CalibrationError("kind must be 'dp' or 'rdp'")
        if not (
            self.pair in ("worst", "mean") or (isinstance(self.pair, tuple) and len(self.pair) == 2)
        ):
            raise CalibrationError("pair must be 'worst', 'mean' or a (u, v) tuple")
        if self.kind == "rdp" and self.delta is None:
            raise CalibrationError("kind='rdp' needs delta")
        if not 0 < self.sigma_min <= self.sigma_init <= self.sigma_max:
            raise CalibrationError("need 0 < sigma_min <= sigma_init <= sigma_max")
        if not self.rtol > 0:
            raise CalibrationError("rtol must be > 0")


def calibrate_sigma(
    loss_fn: Callable[[float], np.ndarray],
    target_eps: float,
    options: CalibrationOptions | None = None,
    **legacy: Any,
) -> CalibrationResult:
    """Smallest σ (to ``rtol``) whose loss meets ``target_eps``.

    ``loss_fn(σ)`` returns, for ``kind="dp"``, an array of ε values at the caller's δ (an
    ``(n, n)`` pairwise matrix — row = contributor, column = observer — whose diagonal is
    ignored when ``exclude_diagonal``; or any array of pair losses); for ``kind="rdp"`` an
    ``(n, n, len(orders))`` RDP tensor converted at ``delta`` with hushnet's one rule
    (:func:`hushnet.privacy.conversions.rdp_epsilon`, dp-accounting's improved conversion).
    ``options`` (:class:`CalibrationOptions`, or its fields as keywords: the old call form).
    ``pair`` is ``"worst"`` (max over pairs), ``"mean"`` (mean over pairs; for RDP, the mean
    RDP curve converted once, the random-walk paper's ε̄) or a tuple ``(u, v)``.

    The loss must be non-increasing in σ; we bracket by doubling/halving from ``sigma_init``,
    then bisect geometrically.  :class:`UnreachableTarget` is raised when even ``sigma_max``
    does not meet the target; if ``sigma_min`` already meets it, ``sigma_min`` is returned
    (``details["at_lower_limit"]``).  ``bound`` is the label of the loss being calibrated.
    """
    if not target_eps > 0:
        raise CalibrationError("target_eps must be > 0")
    o = resolve(CalibrationOptions, options, legacy, "calibrate_sigma")
    pair, kind, delta, orders, exclude_diagonal = (
        o.pair,
        o.kind,
        o.delta,
        o.orders,
        o.exclude_diagonal,
    )
    sigma_init, sigma_min, sigma_max, rtol, bound = (
        o.sigma_init,
        o.sigma_min,
        o.sigma_max,
        o.rtol,
        o.bound,
    )
    if kind == "rdp":
        orders = DEFAULT_ORDERS if orders is None else np.asarray(orders, dtype=float)
    evals = 0
    cache: dict[float, tuple[float, dict]] = {}

    def f(s: float) -> float:
        nonlocal evals
        if s not in cache:
            evals += 1
            val, info = _loss(
                loss_fn(s),
                kind=kind,
                pair=pair,
                delta=delta,
                orders=orders,
                exclude_diagonal=exclude_diagonal,
            )
            if math.isnan(val):
                raise CalibrationError(f"loss is NaN at sigma={s}")
            cache[s] = (val, info)
        return cache[s][0]

    def result(s: float, **extra) -> CalibrationResult:
        f(s)
        val, info = cache[s]
        label = pair if isinstance(pair, str) else f"pair{pair}"
        return CalibrationResult(s, val, delta, label, kind, bound, evals, {**info, **extra})

    lo = hi = sigma_init
    if f(hi) > target_eps:
        while f(hi) > target_eps:
            lo = hi
            if hi >= sigma_max:
                raise UnreachableTarget(
                    f"target eps={target_eps:g} unreachable: loss at sigma={hi:g} is {f(hi):g} "
                    f"(the loss is not driven below the target by noise alone; check delta and the orders)"
                )
            hi = min(hi * 2.0, sigma_max)
    else:
        while f(lo) <= target_eps:
            hi = lo
            if lo <= sigma_min:
                return result(lo, at_lower_limit=True)
            lo = max(lo / 2.0, sigma_min)
    # invariant: f(lo) > target >= f(hi)
    while hi / lo > 1.0 + rtol:
        mid = math.sqrt(lo * hi)
        if f(mid) <= target_eps:
            hi = mid
        else:
            lo = mid
    if f(lo) < f(hi) - 1e-12 * max(1.0, abs(f(hi))):
        raise CalibrationError("loss is not monotone in sigma on the bracket")
    return result(hi)


def gaussian_sigma(
    sensitivity: float, eps: float, delta: float, method: str = "tight", orders=None
) -> tuple[float, str]:
    """σ for one Gaussian mechanism of L2 sensitivity Δ to be (ε, δ)-DP.

    ``method="tight"``: exact, via μ-GDP (``σ = Δ/μ(ε, δ)``); ``"classic"``: Dwork–Roth
    ``Δ√(2 ln(1.25/δ))/ε`` (only valid for ε ≤ 1; the papers' choice); ``"rdp"``: the smallest σ
    for which the Gaussian RDP curve on ``orders`` converts to ε (improved RDP conversion).  Returns ``(σ, method)``.
    """
    if sensitivity <= 0 or eps <= 0 or not 0 < delta < 1:
        raise CalibrationError("need sensitivity > 0, eps > 0 and delta in (0, 1)")
    if method == "tight":
        return gaussian_sigma_tight(sensitivity, eps, delta), method
    if method == "classic":
        if eps > 1.0:
            raise CalibrationError("the classic Gaussian calibration is only valid for eps <= 1")
        from hushnet.privacy.paper.conversions import (
            gaussian_sigma_classic,  # the papers' rule, on request
        )

        return gaussian_sigma_classic(sensitivity, eps, delta), method
    if method == "rdp":
        o = DEFAULT_ORDERS if orders is None else np.asarray(orders, dtype=float)
        res = calibrate_sigma(
            lambda s: o * sensitivity**2 / (2.0 * s * s),
            eps,
            kind="rdp",
            delta=delta,
            orders=o,
            exclude_diagonal=False,
            pair="worst",
            sigma_init=sensitivity,
        )
        return res.sigma, method
    raise CalibrationError(f"unknown method {method!r}")
