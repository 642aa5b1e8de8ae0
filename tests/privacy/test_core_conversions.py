"""DP conversions: the improved RDP→(ε,δ) rule (dp-accounting's), Mironov's, tight Gaussian DP, PLD, calibration."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

from hushnet.privacy.conversions import (
    DEFAULT_ORDERS,
    gaussian_pld_epsilon,
    gaussian_rdp,
    gaussian_sigma_tight,
    gdp_delta,
    gdp_epsilon,
    gdp_mu,
    linear_rdp_to_dp,
    rdp_epsilon,
    rdp_to_dp,
)
from hushnet.privacy.paper.conversions import gaussian_sigma_classic


def test_mironov_conversion_formula():
    eps, order = rdp_to_dp([2.0], [0.5], 1e-5, method="classic")
    assert eps == pytest.approx(0.5 + math.log(1e5))
    assert order == 2.0
    eps_grid, _ = rdp_to_dp(
        DEFAULT_ORDERS, gaussian_rdp(DEFAULT_ORDERS, 1.0), 1e-5, method="classic"
    )
    assert eps_grid < eps


def test_improved_conversion_formula_by_hand():
    """ε = ε_α + ln(1 − 1/α) − ln(δα)/(α − 1): at α = 2, δ = 1e-5, ε_α = 0.5 it is 0.5 − ln 2 + ln(1e5/2);
    at α = 11, ε_α = 3: 3 + ln(10/11) − ln(11e-5)/10.  A changed formula fails here first."""
    assert rdp_to_dp([2.0], [0.5], 1e-5)[0] == pytest.approx(
        0.5 - math.log(2) + math.log(1e5 / 2), rel=1e-14
    )
    assert rdp_to_dp([11.0], [3.0], 1e-5)[0] == pytest.approx(
        3 + math.log(10 / 11) - math.log(11e-5) / 10, rel=1e-14
    )
    # the total-variation case: δ ≥ √(1 − e^{−ε_α}) releases at ε = 0
    assert rdp_to_dp([2.0], [1e-7], 1e-3)[0] == 0.0
    assert rdp_to_dp([2.0], [1e-5], 1e-3)[0] > 0.0


@pytest.mark.parametrize("delta", [1e-9, 1e-6, 1e-5, 1e-3, 0.05])
def test_improved_conversion_equals_dp_accounting_on_a_grid(delta):
    """The rule is dp-accounting's ``compute_epsilon`` (RdpAccountant), order by order and best order."""
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    rng = np.random.default_rng(0)
    orders = DEFAULT_ORDERS
    curves = [gaussian_rdp(orders, mu * mu) for mu in (0.01, 0.1, 0.5, 1.0, 3.0, 10.0)]
    curves += [rng.uniform(0, 5, orders.size) * orders ** rng.uniform(0, 1.5) for _ in range(6)]
    curves += [np.where(orders <= 11.8, orders * 0.37, np.inf)]  # a capped walk curve
    ours, alphas = rdp_epsilon(orders, np.array(curves), delta)
    for c, e, a in zip(curves, ours, alphas):
        ref, ref_order = compute_epsilon(orders, c, delta)
        assert e == pytest.approx(ref, rel=1e-12, abs=1e-15)
        if ref > 0:
            assert a == ref_order
        for k in (0, 17, 99, 150):  # every single order too
            if np.isfinite(c[k]):
                assert rdp_to_dp(orders[k : k + 1], c[k : k + 1], delta)[0] == pytest.approx(
                    compute_epsilon(orders[k : k + 1], c[k : k + 1], delta)[0], rel=1e-12, abs=1e-15
                )


@settings(max_examples=80, deadline=None)
@given(st.floats(0.02, 30.0), st.floats(1e-12, 0.2))
def test_improved_conversion_is_sound_and_never_above_classic(mu, delta):
    """Sound: for a Gaussian mechanism the exact (ε, δ) is μ-GDP's, and no valid conversion of its RDP
    curve can go below it — an under-counting formula fails here.  Never above Mironov's."""
    curve = gaussian_rdp(DEFAULT_ORDERS, mu * mu)
    improved, _ = rdp_to_dp(DEFAULT_ORDERS, curve, delta)
    classic, _ = rdp_to_dp(DEFAULT_ORDERS, curve, delta, method="classic")
    assert improved <= classic + 1e-12
    assert improved >= gdp_epsilon(mu, delta) - 1e-9
    for a, r in zip(DEFAULT_ORDERS[::7], curve[::7]):  # order by order, not only at the best one
        assert (
            rdp_to_dp([a], [r], delta)[0] <= rdp_to_dp([a], [r], delta, method="classic")[0] + 1e-12
        )


def test_linear_curves_with_a_cap():
    """The walk's curves ε_α = sα with α ≤ α_max: never above the classic continuous optimum, sound
    against the exact Gaussian value (sα is the RDP of μ² = 2s), and the cap is respected."""
    slopes = np.array([1e-4, 1e-2, 0.05, 0.3, 2.0])
    for amax in (1.36, 11.8, math.inf):
        eps, alpha = linear_rdp_to_dp(slopes, 1e-5, amax)
        L = math.log(1e5)
        a = np.minimum(1 + np.sqrt(L / slopes), amax)
        classic = slopes * a + L / (a - 1)
        assert np.all(eps <= classic + 1e-12) and np.all(alpha <= amax)
        assert np.all(eps >= [gdp_epsilon(math.sqrt(2 * s), 1e-5) - 1e-9 for s in slopes])
    # issue 10: at σ = 16, strict condition, α ≤ 11.8 the classic floor alone is ln(1e5)/10.8 ≈ 1.07
    eps_c, _ = linear_rdp_to_dp(np.array([1e-6]), 1e-5, 11.8, method="classic")
    eps_i, _ = linear_rdp_to_dp(np.array([1e-6]), 1e-5, 11.8)
    assert eps_c[0] == pytest.approx(math.log(1e5) / 10.8 + 11.8e-6, rel=1e-9)
    assert eps_i[0] < eps_c[0] - 0.3


@pytest.mark.parametrize(
    "mus,counts,delta",
    [([0.5], [1], 1e-5), ([0.2], [25], 1e-5), ([1.0, 0.3], [2, 5], 1e-6), ([2.0], [1], 1e-3)],
)
def test_pld_accountant_agrees_with_exact_gdp(mus, counts, delta):
    """dp-accounting's PLD accountant and the exact μ-GDP conversion of a composition of Gaussians
    (μ² add up): PLD is pessimistic by its discretisation; observed 2e-9..5e-9 at the default 1e-4."""
    exact = gdp_epsilon(math.sqrt(sum(c * m * m for m, c in zip(mus, counts))), delta)
    pld = gaussian_pld_epsilon(mus, delta, counts=counts)
    assert exact - 1e-9 <= pld <= exact + 1e-8


def test_infinite_orders_are_skipped():
    eps, order = rdp_to_dp([2.0, 3.0], [math.inf, 1.0], 1e-3)
    assert order == 3.0 and math.isfinite(eps)
    assert rdp_to_dp([2.0], [math.inf], 1e-3)[0] == math.inf


def test_gdp_delta_matches_closed_form():
    mu, eps = 1.3, 0.7
    expected = norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)
    assert gdp_delta(mu, eps) == pytest.approx(expected, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.floats(0.05, 20.0), st.floats(1e-10, 1e-2))
def test_gdp_round_trip_and_tight_below_mironov(mu, delta):
    eps = gdp_epsilon(mu, delta)
    assert gdp_delta(mu, eps) <= delta * (1 + 1e-6)
    if eps > 1e-9:
        assert gdp_mu(eps, delta) == pytest.approx(mu, rel=1e-6)
    mironov, _ = rdp_to_dp(
        DEFAULT_ORDERS, gaussian_rdp(DEFAULT_ORDERS, mu * mu), delta, method="classic"
    )
    assert eps <= mironov + 1e-9
    improved, _ = rdp_to_dp(DEFAULT_ORDERS, gaussian_rdp(DEFAULT_ORDERS, mu * mu), delta)
    assert eps <= improved + 1e-9


def test_gdp_monotone_in_mu():
    mus = np.linspace(0.1, 5, 30)
    eps = [gdp_epsilon(m, 1e-5) for m in mus]
    assert all(a < b for a, b in zip(eps, eps[1:]))


def test_sigma_calibrations():
    sigma = gaussian_sigma_tight(1.0, 1.0, 1e-5)
    assert gdp_epsilon(1.0 / sigma, 1e-5) == pytest.approx(1.0, rel=1e-8)
    classic = gaussian_sigma_classic(1.0, 1.0, 1e-5)
    assert classic == pytest.approx(math.sqrt(2 * math.log(1.25e5)))
    assert sigma < classic
    with pytest.warns(RuntimeWarning):
        gaussian_sigma_classic(1.0, 2.0, 1e-5)


def test_bad_delta_raises():
    with pytest.raises(ValueError):
        rdp_to_dp([2.0], [1.0], 0.0)
    with pytest.raises(ValueError):
        gdp_epsilon(1.0, 1.5)
