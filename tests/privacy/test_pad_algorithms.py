"""P-AD algorithms and primitives: docs/design/spec/randomwalk.md PART D items 17–18 and §0.2 tools."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hushnet.privacy import amplification as A

# --- item 17: ring summation (Algorithm 1, Theorem 1) -----------------------------------------


@pytest.mark.parametrize(
    "K,n,expected", [(1, 3, 2), (1, 2, 2), (3, 4, 4), (5, 10, 6), (9, 10, 10), (10, 11, 11)]
)
def test_ring_noise_draws_is_ceiling(K, n, expected):
    assert A.ring_noise_draws(K, n) == expected == math.ceil(K * n / (n - 1))


@pytest.mark.parametrize("K,n", [(1, 3), (4, 5), (7, 8), (3, 12)])
def test_ring_sum_counts_draws_and_is_unbiased_with_exact_std(K, n):
    rng = np.random.default_rng(17)
    x = rng.uniform(0.0, 1.0, size=(K, n))
    sigma = 2.0
    runs = 10_000
    tau, draws = A.ring_sum(x, sigma, rng, runs=runs)
    assert draws == A.ring_noise_draws(K, n)  # the simulator's own count, not the formula
    std = math.sqrt(draws) * sigma
    # unbiased: the Monte Carlo mean is within 4 standard errors of the true sum
    assert abs(tau.mean() - x.sum()) < 4 * std / math.sqrt(runs)
    # empirical std matches sqrt(ceil(Kn/(n-1))) sigma within 5%
    assert tau.std(ddof=1) == pytest.approx(std, rel=0.05)
    g = A.ring_sum_guarantee(K, n, 0.5, 1e-6, 1e-6, sigma_loc=sigma)
    assert g.details["noise_draws"] == draws
    assert g.details["std"] == pytest.approx(std)
    ratio = g.details["std_ratio_to_trusted_aggregator"]
    assert ratio == pytest.approx(math.sqrt(draws / K))
    assert ratio <= math.sqrt(n / (n - 1) + 1 / K) + 1e-12
    # the printed floor count undercounts whenever n-1 does not divide Kn
    if (K * n) % (n - 1):
        assert g.details["noise_draws_printed"] == draws - 1


def test_ring_sum_distributed_noise_variant_total_std():
    """Remark 1 with sigma/sqrt(n-1) (erratum 13): total std sqrt(1 + (Kn-1)/(n-1)) sigma."""
    rng = np.random.default_rng(3)
    K, n, sigma = 3, 6, 1.5
    tau, _ = A.ring_sum(np.zeros((K, n)), sigma, rng, runs=10_000, distributed=True)
    expected = sigma * math.sqrt(1 + (K * n - 1) / (n - 1))
    assert tau.std(ddof=1) == pytest.approx(expected, rel=0.05)


def test_ring_sum_guarantee_beats_ldp_std():
    g = A.ring_sum_guarantee(10, 100, 0.5, 1e-6, 1e-6, sigma_loc=1.0)
    assert g.bound == "certified"
    assert g.details["std_ldp"] / g.details["std"] == pytest.approx(math.sqrt(1000 / 11), rel=1e-12)
    e, d = A.advanced_composition(0.5, 1e-6, 10, 1e-6)
    assert (g.epsilon, g.delta) == (e, d)
    assert e == pytest.approx(math.sqrt(20 * math.log(1e6)) * 0.5 + 10 * 0.5 * math.expm1(0.5))


# --- item 18: randomized response and histogram debiasing ------------------------------------


@pytest.mark.parametrize("eps0,L", [(0.5, 2), (1.0, 5), (3.0, 10)])
def test_rr_gamma_gives_exactly_eps0(eps0, L):
    gamma = A.rr_gamma(eps0, L)
    assert A.rr_epsilon(gamma, L) == pytest.approx(eps0, rel=1e-12)
    p_true = 1 - gamma + gamma / L
    p_other = gamma / L
    assert math.log(p_true / p_other) == pytest.approx(eps0, rel=1e-12)


def test_rr_keeps_value_with_probability_one_minus_gamma_plus_gamma_over_L():
    rng = np.random.default_rng(5)
    L, gamma, N = 4, 0.6, 200_000
    y = A.randomized_response(np.full(N, 2), gamma, L, rng)
    p = 1 - gamma + gamma / L
    assert abs((y == 2).mean() - p) < 4 * math.sqrt(p * (1 - p) / N)
    assert set(np.unique(y)) == {0, 1, 2, 3}


def test_ring_histogram_debiased_is_unbiased_and_printed_rule_is_not():
    rng = np.random.default_rng(18)
    K, n, L, gamma, runs = 3, 40, 5, 0.4, 3000
    x = rng.integers(0, L, size=(K, n))
    h = np.bincount(x.ravel(), minlength=L)
    est, printed = [], []
    for _ in range(runs):
        tau, nd = A.ring_histogram(x, gamma, L, rng)
        est.append(A.debias_ring_histogram(tau, gamma, n, K, L, n_dummy=nd))
        printed.append((tau - gamma / L) / (1 - gamma))
    est = np.array(est)
    se = est.std(axis=0, ddof=1) / math.sqrt(runs)
    assert np.all(np.abs(est.mean(axis=0) - h) < 4 * se + 1e-9)
    assert (
        np.max(np.abs(np.mean(printed, axis=0) - h)) > 10
    )  # the printed debiasing is off in scale
    assert gamma * n * (K + 1) == pytest.approx(40 * 0.4 * 4)


def test_complete_histogram_debiased_is_unbiased():
    rng = np.random.default_rng(19)
    n, T, L, gamma, runs = 30, 600, 6, 0.5, 3000
    x = rng.integers(0, L, size=(n, 40))
    err = []
    for _ in range(runs):
        tau, h = A.complete_graph_histogram(x, T, gamma, L, rng)
        assert tau.sum() == T
        err.append(A.debias_complete_histogram(tau, gamma, T, L) - h)
    err = np.array(err)
    se = err.std(axis=0, ddof=1) / math.sqrt(runs)
    assert np.all(np.abs(err.mean(axis=0)) < 4 * se)


def test_complete_graph_sum_unbiased_with_sqrt_T_std():
    rng = np.random.default_rng(20)
    x = rng.uniform(size=(10, 50))
    diffs = np.array([np.subtract(*A.complete_graph_sum(x, 200, 0.5, rng)) for _ in range(4000)])
    assert abs(diffs.mean()) < 4 * math.sqrt(200) * 0.5 / math.sqrt(4000)
    assert diffs.std(ddof=1) == pytest.approx(math.sqrt(200) * 0.5, rel=0.05)


# --- §0.2 tools --------------------------------------------------------------------------------


def test_subsampling_amplification_limits():
    e, d = A.subsampling_amplification(1.0, 100, 1, delta=1e-6)
    assert e == pytest.approx(math.log1p(0.01 * math.expm1(1.0)))
    assert d == pytest.approx(1e-8)
    big, _ = A.subsampling_amplification(1.0, 100, 10_000)
    assert big == pytest.approx(1.0, rel=1e-12)  # the whole population is drawn: no amplification
    ms = np.arange(1, 200)
    vals = [A.subsampling_amplification(0.5, 50, m)[0] for m in ms]
    assert np.all(np.diff(vals) >= 0)  # non-decreasing in m (used by Thm 3's proof)


def test_heterogeneous_composition_matches_homogeneous_structure_and_caps_at_sum():
    assert A.heterogeneous_composition([], 1e-7) == 0.0
    small = [0.05] * 3
    assert A.heterogeneous_composition(small, 1e-7) == pytest.approx(
        0.15
    )  # capped by the basic sum
    eps = [0.01] * 10_000
    v = A.heterogeneous_composition(eps, 1e-7)
    q = 10_000 * 1e-4
    first = 10_000 * math.expm1(0.01) * 0.01 / (math.exp(0.01) + 1)
    assert v == pytest.approx(first + math.sqrt(2 * q * math.log(1 / (10_000 * 1e-7))))
    assert v < 100 * 1.0


def test_erlingsson_and_fmt_inverses_and_validity():
    eps0 = A.erlingsson_eps0(0.05, 1e-6, 10_000)
    assert A.erlingsson_shuffle_eps(eps0, 1e-6, 10_000) == pytest.approx(0.05)
    with pytest.raises(A.ValidityError, match="n=500"):
        A.erlingsson_shuffle_eps(0.1, 1e-6, 500)  # erratum 19: n >= 1000
    with pytest.raises(A.ValidityError):
        A.erlingsson_eps0(5.0, 1e-6, 10_000)  # would need eps0 >= 1/2
    e0 = A.fmt_eps0(0.3, 1e-6, 100_000)
    assert A.fmt_shuffle_eps(e0, 1e-6, 100_000) == pytest.approx(0.3, rel=1e-9)
    # the simplified FMT form 14 sqrt(ln(4/delta)) eps0/sqrt(n) upper-bounds the exact one for eps0 <= 1
    for e in (0.1, 0.5, 1.0):
        assert A.fmt_shuffle_eps(e, 1e-6, 100_000) <= 14 * math.sqrt(math.log(4e6)) * e / math.sqrt(
            100_000
        )


def test_contributions_bound_is_a_valid_tail_bound():
    from scipy import stats

    for T, n in [(100_000, 1000), (2000, 100), (50, 20)]:
        for method in ("chernoff", "exact"):
            N, how = A.contributions_bound(T, n, 1e-6, method=method)
            assert stats.binom.sf(math.floor(N), T, 1 / n) <= 1e-6
        assert A.contributions_bound(T, n, 1e-6, "exact")[0] <= A.contributions_bound(T, n, 1e-6)[0]
    assert A.contributions_bound(50, 20, 1e-6)[1] == "chernoff-wide"  # outside T >= 3 n ln(1/delta)
