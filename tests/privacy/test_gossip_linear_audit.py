"""Generic linear-Gaussian view, property tests on random graphs, and the empirical audit."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hushnet.privacy import audit
from hushnet.privacy import koskela as ks
from hushnet.privacy import muffliato as mf
from hushnet.privacy.conversions import DEFAULT_ORDERS, rdp_to_dp
from hushnet.privacy.graphs import graph_from_edges, metropolis_hastings, parse_graph
from hushnet.privacy.linear_gaussian import (
    LinearGaussianView,
    box_quadratic_max,
    brute_force_sensitivity_sq,
    gaussian_loss,
    projection_weights,
    sign_vectors,
)


def test_view_range_and_infinity():
    B = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    A = np.array([[1.0, 0.0], [0.0, 2.0], [0.0, 0.0]])
    v = LinearGaussianView(A, B)
    assert v.coordinate_sensitivity_sq(1) == pytest.approx(4.0)
    A2 = np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]])  # second shift leaves range(B)
    v2 = LinearGaussianView(A2, B)
    assert v2.coordinate_sensitivity_sq(0) == pytest.approx(1.0)
    assert v2.coordinate_sensitivity_sq(1) == math.inf
    assert brute_force_sensitivity_sq(A2, B, np.array([0.0, 1.0])) == math.inf
    rep = gaussian_loss(v2.coordinate_sensitivity_sq(1), 2.0, 1.0, 1e-5, bound="certified")
    assert rep["rdp"] == math.inf and rep["epsilon"] == math.inf and rep["bound"] == "certified"


def test_gaussian_conversions():
    rep = gaussian_loss(1.0, 3.0, 2.0, 1e-5)
    assert rep["rdp"] == pytest.approx(3.0 / 8.0) and rep["mu_gdp"] == pytest.approx(0.5)
    # tight ε never exceeds the RDP (Mironov) conversion of the same Gaussian
    eps_rdp, _ = rdp_to_dp(DEFAULT_ORDERS, DEFAULT_ORDERS * 1.0 / (2 * 4.0), 1e-5)
    assert rep["epsilon"] <= eps_rdp + 1e-12


def test_box_quadratic_max_matches_enumeration():
    rng = np.random.default_rng(1)
    for T in (3, 6, 9):
        X = rng.normal(size=(T + 2, T))
        M = X.T @ X
        best = max(float(c @ M @ c) for c in sign_vectors(T))
        r = box_quadratic_max(M, exact_limit=20)
        assert r["scalar"] == pytest.approx(
            best, rel=1e-12
        )  # the vertex maximum (scalar contributions only)
        assert r["lower"] <= best + 1e-9 <= r["value"] + 1e-9 <= min(r["spectral"], r["abs"]) + 2e-9
        r2 = box_quadratic_max(M, exact_limit=0)
        assert r2["value"] >= best - 1e-9  # without enumeration: a valid upper bound
        assert r2["value"] == pytest.approx(r["value"], rel=1e-12)  # one rule, enumeration or not


def _random_graph(n: int, p: float, seed: int):
    g = parse_graph(f"er:{n}:{p}:{seed}")
    if not g.is_connected():
        rng = np.random.default_rng(seed)
        perm = rng.permutation(n)
        extra = np.stack([perm[:-1], perm[1:]], axis=1)  # a random spanning path makes it connected
        edges = np.concatenate([g.edges(), np.sort(extra, axis=1)])
        g = graph_from_edges(n, np.unique(edges, axis=0))
    return g


@settings(max_examples=12, deadline=None)
@given(
    n=st.integers(5, 14),
    p=st.floats(0.1, 0.6),
    seed=st.integers(0, 10_000),
    T=st.integers(1, 6),
    view=st.sampled_from(["neighbourhood", "aggregate"]),
    known=st.booleans(),
)
def test_exact_equals_bruteforce_pinv(n, p, seed, T, view, known):
    """Hypothesis: the fast accountant equals a dense computation from A, B with pinv."""
    g = _random_graph(n, p, seed)
    W = metropolis_hastings(g)
    S = mf.exact_sensitivity_matrix(W, T, view=view, own_noise_known=known)
    assert np.all(S >= 0) and np.all(S <= 1 + 1e-9)
    rng = np.random.default_rng(seed)
    for _ in range(4):
        u, v = rng.choice(n, size=2, replace=False)
        ref = mf.dense_exact_pair(W, int(u), int(v), T, view=view, own_noise_known=known)
        assert S[u, v] == pytest.approx(ref, abs=1e-7)
    # more rounds can only reveal more (the view grows)
    S2 = mf.exact_sensitivity_matrix(W, T + 1, view=view, own_noise_known=known)
    assert np.all(S2 >= S - 1e-8)


@settings(max_examples=10, deadline=None)
@given(
    n=st.integers(5, 12),
    seed=st.integers(0, 10_000),
    T=st.integers(1, 5),
    s1=st.floats(0.3, 3.0),
    s2=st.floats(0.3, 3.0),
    alpha=st.floats(1.1, 20.0),
)
def test_monotone_in_sigma_and_nonnegative(n, seed, T, s1, s2, alpha):
    g = _random_graph(n, 0.35, seed)
    W = metropolis_hastings(g)
    lo, hi = sorted((s1, s2))
    for bound in ("certified", "paper"):
        a = mf.muffliato_loss_matrix(W, T, alpha, lo, bound=bound).matrix
        b = mf.muffliato_loss_matrix(W, T, alpha, hi, bound=bound).matrix
        assert np.all(a >= 0) and np.all(b >= 0) and np.all(b <= a + 1e-12)
    ka = ks.gossip_stream_loss_matrix(W, T, alpha, lo, exact_limit=6).matrix
    kb = ks.gossip_stream_loss_matrix(W, T, alpha, hi, exact_limit=6).matrix
    assert np.all(kb >= 0) and np.all(kb <= ka + 1e-12)


@settings(max_examples=10, deadline=None)
@given(r=st.integers(2, 60), n=st.integers(15, 40), seed=st.integers(0, 1000))
def test_projection_weights_match_svd(r, n, seed):
    rng = np.random.default_rng(seed)
    k = max(1, r // 2)
    M = rng.normal(size=(n, k)) @ rng.normal(size=(k, r))  # rank-deficient on purpose
    U, s, _ = np.linalg.svd(M, full_matrices=False)
    Ur = U[:, s > 1e-9 * s[0]]
    np.testing.assert_allclose(projection_weights(M), (Ur * Ur).sum(1), atol=1e-10)


def test_audit_refutes_theorem1_on_hypercube():
    """Regression test of docs/design/spec/gossip.md §1.3.9 on the paper's Fig. 1a setting (hypercube d = 11, T = 19):
    a least-squares attacker trained on simulated runs beats Theorem 1's claim for the antipode,
    and never beats the certified value."""
    W = metropolis_hastings(parse_graph("hypercube:11"))
    r = audit.audit_muffliato(
        W, 2047, 0, 19, 1.0, audit.AuditOptions(n_train=3000, n_test=6000, seed=1)
    )
    assert r["paper_rdp_at_alpha2"] == pytest.approx(0.009453986, rel=1e-6)
    assert r["paper_epsilon"] < r["empirical_epsilon"] <= r["certified_epsilon"]
    assert r["certified_sensitivity_sq"] == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize(
    "spec,src,obs,T,view,cheb",
    [
        ("ring:9", 3, 0, 4, "neighbourhood", False),
        ("er:30:0.15:2", 11, 4, 5, "neighbourhood", True),
        ("hypercube:5", 31, 0, 6, "aggregate", False),
    ],
)
def test_certified_dominates_empirical(spec, src, obs, T, view, cheb):
    g = parse_graph(spec).largest_component()
    W = metropolis_hastings(g)
    r = audit.audit_muffliato(
        W,
        src,
        obs,
        T,
        1.0,
        audit.AuditOptions(n_train=2000, n_test=6000, seed=2),
        view=view,
        chebyshev=cheb,
    )
    assert r["empirical_epsilon"] <= r["certified_epsilon"] + 1e-12


def test_gossip_stream_audit():
    g = parse_graph("er:20:0.2:1").largest_component()
    W = metropolis_hastings(g)
    nb = ks.observer_set(W, 0, "neighbourhood")
    src = int(next(j for j in range(g.n - 1, 0, -1) if j not in set(nb.tolist())))
    r = audit.audit_gossip_stream(
        W, src, nb, 8, 0.5, audit.AuditOptions(n_train=2000, n_test=6000, seed=3), known=[0]
    )
    assert r["empirical_epsilon"] <= r["certified_epsilon"] + 1e-12
    assert r["pattern_sensitivity_sq"] <= r["certified_sensitivity_sq"] + 1e-9


def test_clopper_pearson_and_empirical_epsilon_sanity():
    lo, hi = audit.clopper_pearson(5, 100, 0.95)
    assert lo < 0.05 < hi
    rng = np.random.default_rng(0)
    same = audit.empirical_epsilon(rng.normal(size=4000), rng.normal(size=4000), 1e-5)
    assert same["epsilon_lower_bound"] < 0.3  # identical distributions: (almost) nothing to find
    far = audit.empirical_epsilon(rng.normal(size=4000), rng.normal(loc=4.0, size=4000), 1e-5)
    assert far["epsilon_lower_bound"] > 2.0
