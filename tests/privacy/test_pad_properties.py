"""Property tests for the P-AD bounds: non-negative, monotone in the noise, consistent forms."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hushnet.privacy import amplification as A
from hushnet.privacy.conversions import DEFAULT_ORDERS, rdp_to_dp
from hushnet.privacy.ledger import Ledger, PrivacyEntry


@settings(max_examples=40, deadline=None)
@given(
    st.integers(10, 10**6),
    st.floats(1.0, 500.0),
    st.floats(0.05, 5.0),
    st.floats(0.1, 50.0),
    st.floats(1e-9, 1e-3),
)
def test_sgd_epsilon_non_negative_and_decreasing_in_sigma(n, N_u, L, sigma, delta):
    e1 = A.sgd_epsilon(n, N_u, L, sigma, delta)
    e2 = A.sgd_epsilon(n, N_u, L, sigma * 1.3, delta)
    # ε = 0 is a valid answer: (0, δ) when the total variation of the mechanism is already ≤ δ
    assert e1.epsilon >= 0 and e2.epsilon <= e1.epsilon * (1 + 1e-12)
    assert e1.details["alpha"] <= A.sgd_alpha_max(sigma, L) * (1 + 1e-12)
    # the optimum over orders is never above the conversion of the admissible RDP curve on a fine grid
    grid = np.linspace(1.0001, A.sgd_alpha_max(sigma, L), 4000)
    curve = A.sgd_rdp_curve(grid, n, N_u, L, sigma)
    assert rdp_to_dp(grid, curve, delta)[0] >= e1.epsilon * (1 - 1e-9)


@settings(max_examples=40, deadline=None)
@given(st.floats(0.0, 5.0), st.integers(2, 10**5), st.integers(1, 10**6))
def test_subsampling_never_amplifies_beyond_eps(eps, n, m):
    e, _ = A.subsampling_amplification(eps, n, m)
    assert 0.0 <= e <= eps + 1e-12


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0.0, 3.0), max_size=40), st.floats(1e-9, 1e-3))
def test_heterogeneous_composition_non_negative_and_at_most_the_sum(eps, delta):
    v = A.heterogeneous_composition(eps, delta)
    assert 0.0 <= v <= sum(eps) + 1e-12


@settings(max_examples=30, deadline=None)
@given(st.integers(50, 10**5), st.floats(0.01, 0.99))
def test_thm3_non_negative_and_below_ldp_analogue_for_large_n(n, eps):
    g = A.complete_sum_guarantee(n, 100 * n, eps, 1e-7, 1e-7, 1e-7)
    assert g.epsilon > 0 and g.details["eps_c"] <= eps
    ldp, _ = A.advanced_composition(eps, 1e-7, g.details["N_u"], 1e-7)
    assert g.epsilon <= ldp  # eps_c <= eps, and the composition is monotone


def test_sgd_rdp_curve_is_inf_beyond_validity_and_feeds_the_ledger():
    n, N_u, L, sigma = 2000, 12, 0.4, 1.2
    curve = A.sgd_rdp_curve(DEFAULT_ORDERS, n, N_u, L, sigma)
    a_max = A.sgd_alpha_max(sigma, L)
    assert np.all(np.isinf(curve[DEFAULT_ORDERS > a_max])) and np.all(
        np.isfinite(curve[DEFAULT_ORDERS <= a_max])
    )
    with Ledger(":memory:") as led:
        led.charge(
            PrivacyEntry("run", "pad-sgd", "anonymous", "certified", {v: curve for v in ("1", "2")})
        )
        s = led.spent("1", delta=1e-6)
        assert s.method == "rdp" and s.best_order <= a_max
        exact = A.sgd_epsilon(n, N_u, L, sigma, 1e-6).epsilon
        assert s.epsilon >= exact * (1 - 1e-9)  # a grid of orders can only be looser


def test_collusion_helpers():
    assert A.colluders_effective_n(1000, 4) == 250
    weaker = A.sgd_nrdp(2.0, int(A.colluders_effective_n(1000, 4)), 10, 1.0, 5.0).rdp
    assert weaker > A.sgd_nrdp(2.0, 1000, 10, 1.0, 5.0).rdp
    with pytest.raises(A.ValidityError, match="colluders"):
        A.ring_sum_guarantee(5, 100, 0.5, 1e-6, 1e-6, colluders=2)
