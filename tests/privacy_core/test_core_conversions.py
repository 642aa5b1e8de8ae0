"""DP conversions: Mironov RDP→(ε,δ), tight Gaussian DP, calibration round trips."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy.stats import norm

from hushnet.privacy.conversions import (
    DEFAULT_ORDERS,
    gaussian_rdp,
    gaussian_sigma_classic,
    gaussian_sigma_tight,
    gdp_delta,
    gdp_epsilon,
    gdp_mu,
    rdp_to_dp,
)


def test_mironov_conversion_formula():
    eps, order = rdp_to_dp([2.0], [0.5], 1e-5)
    assert eps == pytest.approx(0.5 + math.log(1e5))
    assert order == 2.0
    eps_grid, _ = rdp_to_dp(DEFAULT_ORDERS, gaussian_rdp(DEFAULT_ORDERS, 1.0), 1e-5)
    assert eps_grid < eps


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
    mironov, _ = rdp_to_dp(DEFAULT_ORDERS, gaussian_rdp(DEFAULT_ORDERS, mu * mu), delta)
    assert eps <= mironov + 1e-9


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
