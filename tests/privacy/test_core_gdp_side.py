"""Root finders of the tight Gaussian conversions land on the safe side of the root.

``gdp_epsilon`` solved ``δ(ε) = δ`` with brentq, which returns a point within its tolerance on
*either* side: on a grid of (μ, δ) about 40% of the answers had ``δ(ε) > δ`` (up to 1.3e-9 relative),
i.e. a certified ε slightly too small.  ``gdp_mu`` (hence ``gaussian_sigma_tight``) likewise returned a
μ slightly too large.  The certified answers must satisfy the inequality they claim.
"""

from __future__ import annotations

import math

import numpy as np

from hushnet.privacy.conversions import gaussian_sigma_tight, gdp_delta, gdp_epsilon, gdp_mu

_RNG = np.random.default_rng(12345)
MUS = 10 ** _RNG.uniform(-3, 1.5, 300)
DELTAS = 10 ** _RNG.uniform(-12, -1, 300)
EPSS = 10 ** _RNG.uniform(-2, 1.3, 300)


def test_gdp_epsilon_is_never_below_the_root():
    for mu, d in zip(MUS, DELTAS):
        e = gdp_epsilon(float(mu), float(d))
        if math.isfinite(e) and e > 0:
            assert gdp_delta(float(mu), e) <= d, (mu, d, e)


def test_gdp_mu_and_tight_sigma_are_never_above_the_root():
    for eps, d in zip(EPSS, DELTAS):
        m = gdp_mu(float(eps), float(d))
        assert gdp_delta(m, float(eps)) <= d, (eps, d, m)
        s = gaussian_sigma_tight(1.0, float(eps), float(d))
        assert gdp_delta(1.0 / s, float(eps)) <= d, (eps, d, s)
