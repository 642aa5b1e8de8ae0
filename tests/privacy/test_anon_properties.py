"""Property tests (Hypothesis) of the source-anonymity model and small-graph consistency checks."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hushnet.privacy.anonymity import (
    RRGModel,
    corollary1_alpha,
    design_kappa,
    entropy,
    mean_return_time_nonretro,
    p_star,
    posterior_w,
    theorem1_rho,
    theorem2_bound,
    theorem3_alpha,
    tv_distance,
)
from hushnet.privacy.anonymity_graph import (
    as_adjacency,
    definition1_entropies,
    destination_matrix,
    distance_matrix,
    first_passage_stream,
    transition_matrix,
    window_masses,
    window_masses_grid,
)

models = st.builds(
    lambda n, c: RRGModel(n, c),
    st.integers(min_value=30, max_value=600),
    st.integers(min_value=3, max_value=6),
)


@st.composite
def settings_(draw):
    m = draw(models)
    ell1 = draw(st.integers(min_value=2, max_value=3))
    ell2 = draw(st.integers(min_value=ell1 + 1, max_value=ell1 + 5))
    kappa = draw(
        st.one_of(st.just(math.inf), st.floats(min_value=ell2 + 1.0, max_value=20.0 / m.a))
    )
    kp = draw(
        st.lists(
            st.one_of(st.just(math.inf), st.floats(min_value=ell2 + 1.0, max_value=40.0 / m.a)),
            min_size=1,
            max_size=8,
        )
    )
    delta = draw(st.floats(min_value=0.5, max_value=20.0))
    return m, ell1, ell2, kappa, np.array(kp), delta


@settings(max_examples=40, deadline=None)
@given(settings_())
def test_anon_property_p_star_and_bounds(case) -> None:
    m, l1, l2, kappa, kp, delta = case
    K = l2 - l1 + 1
    for mode in ("paw", "cor"):
        p = p_star(m, l1, l2, kappa, mode=mode, delta=delta)
        assert np.all(p > 0) and abs(p.sum() - 1) < 1e-12
        np.testing.assert_allclose(
            p, p_star(m, l1, l2, kappa, mode=mode, delta=1.0), atol=1e-12
        )  # δ cancels
        np.testing.assert_allclose(
            posterior_w(p, m, l1, l2, kappa, mode=mode, delta=delta), 1 / K, atol=1e-12
        )
        w = posterior_w(p, m, l1, l2, kp, mode=mode, delta=delta)
        rho = tv_distance(w, np.full(K, 1 / K))
        H = entropy(w)
        assert np.all(H <= math.log(K) + 1e-12) and np.all(H >= theorem2_bound(rho, K) - 1e-12)
        version = "printed" if mode == "paw" else "corrected"
        bound = theorem1_rho(m, l1, l2, kappa, kp, version=version, normalizer="tight")
        shifted = theorem1_rho(m, l1, l2, kappa, kp, version="shifted", shift_mode=mode)
        assert np.all(bound >= 0) and np.all(shifted >= 0)
        assert np.all(rho <= bound + 1e-12) and np.all(rho <= shifted + 1e-12)


@settings(max_examples=15, deadline=None)
@given(models, st.floats(min_value=0.05, max_value=0.95))
def test_anon_property_theorem3_and_corollary1(m: RRGModel, delta_prime: float) -> None:
    kappa = 2 * 2 + (m.n / m.c_prime) * math.log(2 / (1 - delta_prime))
    for mode, version in (("paw", "printed"), ("cor", "shifted")):
        r = theorem3_alpha(
            m,
            2,
            6,
            kappa,
            delta_prime,
            mode=mode,
            version=version,
            normalizer="tight",
            grid_factor=8.0,
        )
        assert 0 <= r.alpha_bound <= r.alpha_emp <= math.log(5) + 1e-12
    for design in ("mean", "infinity"):
        c = corollary1_alpha(m, 2, 6, delta_prime, design=design)
        assert 0 <= c.alpha_bound <= c.alpha_emp


def test_anon_corollary1_is_weaker_than_theorem3() -> None:
    m = RRGModel(300, 3)
    assert corollary1_alpha(m, 2, 6, 0.3).kappa == pytest.approx(mean_return_time_nonretro(300, 3))
    for design in ("mean", "infinity"):
        c = corollary1_alpha(m, 2, 6, 0.3, design=design)
        t = theorem3_alpha(m, 2, 6, c.kappa, 0.3)
        assert (
            c.rho_max > t.rho_max and c.alpha_bound < t.alpha_bound and c.alpha_emp == t.alpha_emp
        )


def test_anon_design_kappa_beats_given_candidates() -> None:
    m = RRGModel(300, 3)
    cands = np.array([250.0, 400.0, 634.0, 1200.0, math.inf])
    k, a = design_kappa(m, 2, 6, 0.3, mode="paw", candidates=cands)
    per = [theorem3_alpha(m, 2, 6, float(x), 0.3, mode="paw").alpha_emp for x in cands]
    assert k in cands and a == pytest.approx(max(per), abs=1e-12)


# ----------------------------------------------------------------------------- small graphs


@pytest.fixture(scope="module")
def small():
    g = nx.random_regular_graph(3, 40, seed=4)
    assert nx.is_connected(g)
    return as_adjacency(g)


def test_anon_window_masses_brute_force(small) -> None:
    """Window masses with side information equal a brute-force computation from stored pmfs."""
    adj = small
    n = adj.shape[0]
    t_max = 400
    F_all = np.stack(
        [F.copy() for _, F in first_passage_stream(transition_matrix(adj), t_max)]
    )  # (t_max, n, n)
    t = np.arange(1, t_max + 1)[:, None, None]
    for kappa in (15.0, 60.0):
        k = int(kappa)
        mu = (t[:k] * F_all[:k]).sum(0) / F_all[:k].sum(0)
        lo, hi = np.ceil(mu - 3.0), np.floor(mu + 3.0)
        brute = np.where((t >= lo) & (t <= hi), F_all, 0.0).sum(0)
        brute[np.diag_indices(n)] = 0
        np.testing.assert_allclose(window_masses(adj, 3.0, kappa), brute, atol=1e-14)
    grid = window_masses_grid(adj, 3.0, [15.0, 60.0, math.inf])
    for g, kappa in zip(grid, (15.0, 60.0, math.inf)):
        np.testing.assert_allclose(g, window_masses(adj, 3.0, kappa), atol=1e-15)


def test_anon_definition1_node_level_brute_force(small) -> None:
    adj = small
    dist = distance_matrix(adj)
    p = np.array([0.2, 0.3, 0.5])
    M = destination_matrix(dist, p, 2)
    mass = window_masses(adj, 3.0)
    r = definition1_entropies(dist, M, mass, 2, 4)
    for j in (0, 7, 23):
        w = np.array([M[i, j] * mass[i, j] for i in range(adj.shape[0]) if i != j])
        q = w[w > 0] / w.sum()
        assert abs(r.node_level[j] + (q * np.log(q)).sum()) < 1e-12
        per_ell = []
        for ell in (2, 3, 4):
            sel = dist[:, j] == ell
            per_ell.append((M[sel, j] * mass[sel, j]).mean() if sel.any() else 0.0)
        W = np.array(per_ell) / sum(per_ell)
        W = W[W > 0]
        assert abs(r.distance_level[j] + (W * np.log(W)).sum()) < 1e-12
