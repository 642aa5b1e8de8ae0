"""Generic σ calibration (node/privacy/calibration.py): B.8 table, pairs, monotonicity, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import comb

from hushnet.privacy import calibration as C
from hushnet.privacy.conversions import DEFAULT_ORDERS, gdp_delta, rdp_to_dp

N, T, DELTA = 2048, 20000, 1e-6
K_CONSTRAINT = {"strict": 2.0, "proof": 0.5, "none": 0.0}


def complete_mean_A() -> float:
    """B.4.4 reference convention: N_u = T/n, ln T, M = 0 -> mean(A) = T ln T / n^2."""
    return (T / N) * math.log(T) / N


def hypercube_mean_A(d: int = 11) -> float:
    """B.2 mean identity on the hypercube with W = (I + A)/(d+1): eigenvalues 1 - 2k/(d+1) with
    multiplicity C(d, k); mean(A) = N_u (ln T/n + sum_{i>=2} ln(1 - lambda_i)/(n(n-1)))."""
    n = 2**d
    s = sum(comb(d, k) * math.log(2 * k / (d + 1)) for k in range(1, d + 1))
    return (T / n) * (math.log(T) / n + s / (n * (n - 1)))


def mean_pair_callable(mean_A: float, k: float, n_pairs: int = 4):
    """sigma -> (n, n) matrix of (eps, delta) losses: every pair at the mean loss, alpha optimised
    continuously under the sigma-constraint (the random-walk closed form as the callable)."""

    def fn(sigma: float) -> np.ndarray:
        eps, _ = C.linear_rdp_epsilon(
            mean_A / sigma**2, DELTA, C.alpha_max_for_constraint(sigma, k)
        )
        return np.full((n_pairs, n_pairs), float(eps))

    return fn


B8 = {  # target -> {convention: (complete, hypercube)}
    0.5: {"strict": (39.84, 39.84), "proof": (20.02, 20.02), "none": (3.260, 3.237)},
    1.0: {"strict": (20.27, 20.27), "proof": (10.18, 10.18), "none": (1.644, 1.633)},
    2.0: {"strict": (10.47, 10.47), "proof": (5.260, 5.259), "none": (0.836, 0.830)},
}


def test_mean_A_reference_values():
    assert complete_mean_A() == pytest.approx(0.04722, rel=1e-3)
    assert hypercube_mean_A() == pytest.approx(0.04656, rel=1e-3)


@pytest.mark.parametrize("target", sorted(B8))
@pytest.mark.parametrize("conv", ["strict", "proof", "none"])
def test_b8_table(target, conv):
    for graph, mean_A in enumerate((complete_mean_A(), hypercube_mean_A())):
        r = C.calibrate_sigma(mean_pair_callable(mean_A, K_CONSTRAINT[conv]), target, pair="mean")
        assert r.sigma == pytest.approx(B8[target][conv][graph], rel=1.5e-3)  # 3 significant digits
        assert r.epsilon <= target and r.pair == "mean"


def test_sigma_decreases_with_target():
    fn = mean_pair_callable(complete_mean_A(), 0.5)
    sig = [C.calibrate_sigma(fn, t, pair="mean").sigma for t in (0.25, 0.5, 1, 2, 4, 8)]
    assert np.all(np.diff(sig) < 0)


def test_worst_mean_and_given_pair_on_an_analytic_loss():
    """eps_uv(sigma) = c_uv / sigma^2 has sigma = sqrt(c/eps): check each aggregation."""
    rng = np.random.default_rng(0)
    c = rng.uniform(0.1, 5.0, size=(6, 6))
    np.fill_diagonal(c, 1e6)  # the diagonal is not a privacy loss and must be ignored
    off = c[~np.eye(6, dtype=bool)]
    fn = lambda s: c / s**2  # noqa: E731
    target = 0.7
    worst = C.calibrate_sigma(fn, target, pair="worst")
    mean = C.calibrate_sigma(fn, target, pair="mean")
    given = C.calibrate_sigma(fn, target, pair=(2, 4))
    assert worst.sigma == pytest.approx(math.sqrt(off.max() / target), rel=1e-6)
    assert mean.sigma == pytest.approx(math.sqrt(off.mean() / target), rel=1e-6)
    assert given.sigma == pytest.approx(math.sqrt(c[2, 4] / target), rel=1e-6)
    assert worst.sigma >= given.sigma and worst.sigma >= mean.sigma


def test_rdp_kind_worst_pair_equals_per_pair_conversion():
    orders = DEFAULT_ORDERS
    mus = np.array([[0.0, 1.0, 2.0], [1.0, 0.0, 0.5], [2.0, 0.5, 0.0]])
    fn = lambda s: orders[None, None, :] * (mus[..., None] / s) ** 2 / 2  # noqa: E731
    r = C.calibrate_sigma(fn, 1.0, kind="rdp", delta=1e-5, pair="worst")
    eps, _ = rdp_to_dp(orders, orders * (2.0 / r.sigma) ** 2 / 2, 1e-5)
    assert eps == pytest.approx(1.0, abs=1e-5)
    assert r.details["best_order"] > 1


def test_unreachable_targets_raise():
    orders = np.array([2.0, 4.0, 8.0])
    # the conversion's floor ln(1 - 1/a) - ln(delta a)/(a-1) >= 1.54 at these orders: 1.0 is unreachable for
    # sigma <= 1e4 (only once the RDP is below ~delta^2 does the total-variation case give eps = 0)
    with pytest.raises(C.UnreachableTarget, match="unreachable"):
        C.calibrate_sigma(
            lambda s: np.full((2, 2, 3), 1.0 / s**2) * orders,
            1.0,
            kind="rdp",
            delta=1e-6,
            orders=orders,
            sigma_max=1e4,
        )
    # a loss floor that noise cannot remove
    with pytest.raises(C.UnreachableTarget):
        C.calibrate_sigma(lambda s: np.full((3, 3), 0.5 + 1.0 / s), 0.4)
    with pytest.raises(C.CalibrationError):
        C.calibrate_sigma(lambda s: np.ones((2, 2)), -1.0)
    with pytest.raises(C.CalibrationError):
        C.calibrate_sigma(lambda s: np.ones((2, 2, 3)), 1.0, kind="rdp")  # no delta


def test_target_met_at_lower_limit_is_flagged():
    # the target is already met at sigma_min: sigma_min is returned and flagged
    r = C.calibrate_sigma(lambda s: np.full((2, 2), s), 1.0, sigma_min=1e-3)
    assert r.details.get("at_lower_limit") and r.sigma == pytest.approx(1e-3)


def test_gaussian_sigma_methods():
    s_t, _ = C.gaussian_sigma(1.0, 1.0, 1e-5)
    assert gdp_delta(1.0 / s_t, 1.0) == pytest.approx(1e-5, rel=1e-6)
    s_c, _ = C.gaussian_sigma(1.0, 1.0, 1e-5, "classic")
    s_r, _ = C.gaussian_sigma(1.0, 1.0, 1e-5, "rdp")
    assert s_t < s_c and s_t < s_r  # the tight calibration needs the least noise
    with pytest.raises(C.CalibrationError):
        C.gaussian_sigma(1.0, 2.0, 1e-5, "classic")


def test_linear_rdp_epsilon_clamps():
    eps, a = C.linear_rdp_epsilon(1e-4, 1e-6)
    assert a == pytest.approx(1 + math.sqrt(math.log(1e6) / 1e-4))
    eps_c, a_c = C.linear_rdp_epsilon(1e-4, 1e-6, alpha_max=10.0)
    assert a_c == 10.0 and eps_c > eps
    assert C.alpha_max_for_constraint(3.0, 2.0) == pytest.approx((1 + math.sqrt(1 + 2 * 9)) / 2)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.floats(0.01, 50.0), min_size=2, max_size=12),
    st.floats(0.05, 20.0),
    st.sampled_from(["worst", "mean"]),
)
def test_calibrated_sigma_is_tight_and_feasible(cs, target, pair):
    c = np.array(cs)
    fn = lambda s: c / s + 0.1 * c / s**2  # noqa: E731  (decreasing in sigma)
    r = C.calibrate_sigma(fn, target, pair=pair, exclude_diagonal=False, rtol=1e-9)
    agg = np.max if pair == "worst" else np.mean
    assert agg(fn(r.sigma)) <= target * (1 + 1e-12)
    assert agg(fn(r.sigma * (1 - 1e-6))) > target
