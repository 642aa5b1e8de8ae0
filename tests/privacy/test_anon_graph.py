"""Exact-graph source anonymity: docs/design/spec/anonymity.md §3.2–§3.3, §3.7, §4.7, §5.2 items 11–12, §5.4.

"graph" = ``networkx.random_regular_graph(c, 300, seed=1)``, built with networkx directly.
"""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hushnet.privacy.anonymity import RRGModel, p_star
from hushnet.privacy.anonymity_graph import (
    as_adjacency,
    chain_of_custody_probability,
    definition1_entropies,
    destination_matrix,
    distance_matrix,
    first_passage_stream,
    graph_mean_shell_sizes,
    hitting_pmf_horizon,
    max_tv_to_stationary,
    mean_hitting_times,
    mix_then_hit_information,
    protocol_mean_iteration_time,
    return_time_tail,
    shell_counts,
    stationary_distribution,
    strong_adversary,
    transition_matrix,
    window_masses,
)

N = 300


class RefGraph:
    """Everything §4.7 needs for one degree, computed once per module."""

    def __init__(self, c: int) -> None:
        self.c = c
        self.nxg = nx.random_regular_graph(c, N, seed=1)
        self.adj = as_adjacency(self.nxg)
        self.dist = distance_matrix(self.adj)
        self.E = mean_hitting_times(self.adj)
        self.mass = window_masses(self.adj, 5.0, math.inf, E=self.E)
        self.model = RRGModel(N, c)
        self.A = graph_mean_shell_sizes(self.dist, 2, 6)
        self.p = {
            "tree": p_star(self.model, 2, 6, 634.0, mode="paw"),
            "graph": p_star(self.model, 2, 6, 634.0, mode="paw", A=self.A),
            "uniform": np.full(5, 0.2),
        }
        self.M = {k: destination_matrix(self.dist, v, 2) for k, v in self.p.items()}


@pytest.fixture(scope="module")
def g3() -> RefGraph:
    return RefGraph(3)


@pytest.fixture(scope="module")
def g4() -> RefGraph:
    return RefGraph(4)


@pytest.fixture(scope="module")
def strong3(g3: RefGraph):
    M = g3.M["graph"]
    # long enough that the certified bracket on H(S|D,T) is 3e-4 nats wide (tail mass 5e-5)
    return strong_adversary(g3.adj, M, t_max=6000, pi=stationary_distribution(M))


@pytest.fixture(scope="module")
def strong4(g4: RefGraph):
    M = g4.M["graph"]
    return strong_adversary(g4.adj, M, t_max=4500, pi=stationary_distribution(M))


def _g(request, c: int) -> RefGraph:
    return request.getfixturevalue(f"g{c}")


# ----------------------------------------------------------------------------- graph structure


def test_anon_graph_matches_hushnet_graph_spec(g3: RefGraph) -> None:
    """``regular:300:3:1`` of hushnet.privacy.graphs is the same graph as the spec's reference."""
    from hushnet.privacy.graphs import parse_graph

    assert (parse_graph("regular:300:3:1").adjacency != g3.adj).nnz == 0


SHELLS = {
    3: (
        11,
        [3, 5.87, 11.53, 21.78, 38.57, 60.90, 75.35, 59.11, 20.85, 2.00, 0.04],
        [(4, 6), (7, 12), (13, 24), (24, 47), (43, 80)],
    ),
    4: (
        7,
        [4, 11.69, 32.23, 74.72, 114.43, 58.65, 3.28],
        [(9, 12), (22, 36), (57, 91), (98, 130), (34, 88)],
    ),
}


@pytest.mark.parametrize("c", [3, 4])
def test_anon_exact_graph_shells(request, c: int) -> None:
    g = _g(request, c)
    diam, mean_shells, ranges = SHELLS[c]
    assert g.dist.max() == diam
    counts = shell_counts(g.dist)
    np.testing.assert_allclose(counts[:, 1:].mean(axis=0), mean_shells, atol=0.0051)
    for k, ell in enumerate(range(2, 7)):
        assert (counts[:, ell].min(), counts[:, ell].max()) == ranges[k]


@pytest.mark.parametrize("c", [3, 4])
def test_anon_kac_foster_and_model_agreement(request, c: int) -> None:
    g = _g(request, c)
    assert np.allclose(np.diag(g.E), N, atol=1e-6)  # Kac
    adjd = g.adj.toarray() > 0
    assert abs(g.E[adjd].mean() - (N - 1)) < 1e-6  # Foster
    graph_mean = np.array([g.E[g.dist == ell].mean() for ell in range(2, 7)])
    model = g.model.mean(np.arange(2, 7))
    rel = np.abs(graph_mean / model - 1)
    assert np.all(rel[:4] < 0.02)  # §5.2 item 12
    ref = {3: {2: 450.6, 4: 566.0, 6: 600.5}, 4: {2: 399.6, 4: 448.1, 6: 458.8}}[c]
    for ell, v in ref.items():
        assert abs(graph_mean[ell - 2] - v) < 0.051
    if c == 3:
        assert abs(rel[4] - 0.009) < 0.0005


def test_anon_return_time_tail_erratum_e9(g3: RefGraph, g4: RefGraph) -> None:
    t3 = return_time_tail(g3.adj, [218, 634], condition_ge=4)
    assert abs(t3[218] - 0.523) < 6e-4 and abs(t3[634] - 0.260) < 6e-4
    t4 = return_time_tail(g4.adj, [218], condition_ge=4)
    assert abs(t4[218] - 0.550) < 6e-4


def test_anon_destination_chain_not_doubly_stochastic(g3: RefGraph, g4: RefGraph) -> None:
    """§3.7: column sums of M on a sampled RRG range over [0.67, 1.19] (c=3), [0.95, 1.04] (c=4)."""
    for g, (lo, hi) in ((g3, (0.67, 1.19)), (g4, (0.95, 1.04))):
        M = g.M["graph"]
        np.testing.assert_allclose(M.sum(axis=1), 1.0, atol=1e-12)
        assert np.all(M[(g.dist < 2) | (g.dist > 6)] == 0)
        cs = M.sum(axis=0)
        assert abs(cs.min() - lo) < 0.006 and abs(cs.max() - hi) < 0.006


# ----------------------------------------------------------------------------- §4.3, §4.7 Definition 1


def test_anon_p_star_graph_mean_shells(g3: RefGraph, g4: RefGraph) -> None:
    np.testing.assert_allclose(g3.p["graph"], [0.0437, 0.0835, 0.1568, 0.2775, 0.4385], atol=5.1e-5)
    # the spec's c=4 row is reproduced at c=4's own midpoint kappa = 476.42 (with kappa = 634
    # the entries differ by ~1e-4; noted in the closing report)
    p4 = p_star(g4.model, 2, 6, 476.42, mode="paw", A=g4.A)
    np.testing.assert_allclose(p4, [0.0402, 0.1103, 0.2559, 0.3923, 0.2013], atol=5.1e-5)
    np.testing.assert_allclose(g4.p["graph"], [0.0402, 0.1103, 0.2559, 0.3923, 0.2013], atol=2e-4)


DEF1_REF = {  # (c, p): node min, node mean, distance min, distance mean
    (3, "tree"): (4.494, 4.907, 1.590, 1.595),
    (3, "graph"): (4.504, 4.921, 1.606, 1.609),
    (3, "uniform"): (4.153, 4.621, 1.255, 1.314),
    (4, "tree"): (5.091, 5.134, 0.917, 0.953),
    (4, "graph"): (5.630, 5.671, 1.609, 1.609),
    (4, "uniform"): (5.382, 5.418, 1.247, 1.267),
}


@pytest.mark.parametrize("key", sorted(DEF1_REF))
def test_anon_definition1_exact_graph(request, key: tuple[int, str]) -> None:
    c, which = key
    g = _g(request, c)
    r = definition1_entropies(g.dist, g.M[which], g.mass, 2, 6)
    got = (r.node_level.min(), r.node_level.mean(), r.distance_level.min(), r.distance_level.mean())
    np.testing.assert_allclose(got, DEF1_REF[key], atol=1.01e-3)


@pytest.mark.parametrize("c", [3, 4])
def test_anon_privacy_regression_section_5_4(request, c: int) -> None:
    """§5.4 item 21: deployed parameters (graph-mean shells) keep Definition 1 above the floors."""
    g = _g(request, c)
    r = definition1_entropies(g.dist, g.M["graph"], g.mass, 2, 6)
    assert r.alpha >= {3: 4.4, 4: 5.6}[c]
    assert r.distance_level.min() >= math.log(5) - 0.01
    max_node = np.log(shell_counts(g.dist)[:, 2:7].sum(axis=1)).mean()
    assert abs(max_node - {3: 4.93, 4: 5.68}[c]) < 0.01
    assert np.all(r.node_level <= np.log(shell_counts(g.dist)[:, 2:7].sum(axis=1)) + 1e-9)


# ----------------------------------------------------------------------------- §4.7 strong adversary


def test_anon_strong_adversary_c3(strong3) -> None:
    s = strong3
    assert abs(s.h_prior.mean() - 4.926) < 1e-3
    assert abs(s.h_given_t.mean() - 4.870) < 1e-3 and abs(s.h_given_t_upper.mean() - 4.870) < 1e-3
    assert (
        abs(s.mutual_information - 0.056) < 6e-4
        and s.mutual_information_lower <= s.mutual_information
    )
    assert abs(s.h_at_t[2].mean() - 1.763) < 1e-3 and abs(s.p_t[2] - 0.0049) < 1e-4
    assert abs(s.h_at_t[4].mean() - 3.112) < 1e-3 and abs(s.p_t[4] - 0.0043) < 1e-4
    assert abs(s.h_at_t[10].mean() - 4.513) < 1e-3
    assert abs(s.h_tail.mean() - 4.924) < 1e-3
    for k, v in {5: 3.495, 10: 4.231, 20: 4.589, 50: 4.817, 218: 4.917}.items():
        assert abs(s.h_le[k].mean() - v) < 1e-3, k
    assert abs(s.pmf_t[:11].sum() - 0.0328) < 2e-4  # P(T <= 10), §0 item 8 / §4.8


def test_anon_strong_adversary_c4(strong4) -> None:
    s = strong4
    assert abs(s.h_prior.mean() - 5.671) < 1e-3
    assert abs(s.h_given_t.mean() - 5.650) < 1e-3 and abs(s.h_given_t_upper.mean() - 5.650) < 1e-3
    assert abs(s.mutual_information - 0.021) < 6e-4
    assert abs(s.h_at_t[2].mean() - 2.451) < 1e-3 and abs(s.p_t[2] - 0.0025) < 1e-4
    assert abs(s.h_at_t[4].mean() - 4.256) < 1e-3 and abs(s.p_t[4] - 0.0024) < 1e-4
    assert abs(s.h_at_t[10].mean() - 5.576) < 1e-3
    assert abs(s.h_tail.mean() - 5.671) < 1e-3


def test_anon_timing_leak_alert(g3: RefGraph, strong3) -> None:
    """§5.4 item 22: the deployed p* stays within +20 % of the 0.056-nat baseline; dropping the
    countermeasure (uniform p) doubles the timing leak (0.102 nats) and fires the alert."""
    from hushnet.privacy.anonymity_setup import timing_leak_alert

    assert not timing_leak_alert(strong3.mutual_information, 0.056)
    uni = strong_adversary(g3.adj, g3.M["uniform"], t_max=1000, record_t=(), le_ks=())
    # a short horizon: the certified upper bound is loose, the lower bound shows the leak really rose
    assert abs(uni.mutual_information_lower - 0.102) < 2e-3 <= uni.mutual_information
    assert timing_leak_alert(uni.mutual_information_lower, 0.056)


def test_anon_cost_and_chain_of_custody(g3: RefGraph) -> None:
    """§2.7 / §4.8: exact long-run hops per update and the ping-pong probability."""
    M = g3.M["graph"]
    pi = stationary_distribution(M)
    hops = protocol_mean_iteration_time(M, g3.E, pi)
    assert abs(hops - 578.5) < 3.0
    assert abs(chain_of_custody_probability(M, pi) - 0.0072) < 1e-4
    assert pi.min() * N < 0.7 and pi.max() * N > 1.15  # source frequency far from uniform


def test_anon_mix_then_hit(g3: RefGraph) -> None:
    """[BEYOND] §6.6: a 30-hop burn-in removes almost all of the timing leak.

    After the burn-in the posterior given T is already quasi-stationary, so a 120-step horizon
    with the tail closure reproduces the full-horizon value (7.76e-4) to 1e-7.
    """
    M = g3.M["graph"]
    i30 = mix_then_hit_information(g3.adj, M, 30, t_max=120)
    assert abs(i30 - 0.0008) < 1.5e-4
    assert abs(max_tv_to_stationary(g3.adj, 30) - 0.168) < 6e-4
    assert abs(max_tv_to_stationary(g3.adj, 50) - 0.041) < 6e-4


# ----------------------------------------------------------------------------- §5.2 item 11 (Hypothesis)


@st.composite
def regular_graphs(draw):
    c = draw(st.sampled_from([3, 4]))
    n = draw(st.integers(min_value=8, max_value=30).filter(lambda k: (k * c) % 2 == 0))
    seed = draw(st.integers(min_value=0, max_value=10_000))
    g = nx.random_regular_graph(c, n, seed=seed)
    if not nx.is_connected(g):
        g = (
            nx.circulant_graph(n, list(range(1, c // 2 + 1)))
            if c % 2 == 0
            else nx.random_regular_graph(c, n, seed=seed + 1)
        )
    return c, g


@settings(max_examples=12, deadline=None)
@given(regular_graphs())
def test_anon_first_passage_identities(cg) -> None:
    c, g = cg
    if not nx.is_connected(g):
        return
    adj = as_adjacency(g)
    n = adj.shape[0]
    P = transition_matrix(adj)
    # hitting_pmf_horizon's e^{-tail} is the random-regular-graph model's geometric rate; a drawn graph
    # can mix more slowly (3-regular, n = 18 and 22: 1.8e-6 of the mass still missing at tail = 40),
    # so the identities are checked with the mass summed to well below their tolerances
    t_max = hitting_pmf_horizon(n, c, tail=80.0)
    tot = np.zeros((n, n))
    mean = np.zeros((n, n))
    for t, F in first_passage_stream(P, t_max):
        assert F.min() >= -1e-15
        tot += F
        mean += t * F
    np.testing.assert_allclose(tot, 1.0, atol=1e-9)  # Σ_t F_t → 1
    np.testing.assert_allclose(np.diag(mean), n, rtol=1e-6)  # Kac
    adjd = adj.toarray() > 0
    assert abs(mean[adjd].mean() - (n - 1)) < 1e-6 * n  # Foster
    E = mean_hitting_times(adj)
    np.testing.assert_allclose(mean, E, rtol=1e-6)  # streamed = fundamental matrix


@pytest.mark.parametrize(
    "graph",
    [nx.cycle_graph(30), nx.lollipop_graph(8, 12), nx.path_graph(20), nx.barbell_graph(8, 4)],
    ids=["cycle30", "lollipop", "path20", "barbell"],
)
@pytest.mark.parametrize("t_max", [25, 40, 80])
def test_anon_strong_adversary_short_horizon_is_a_bound(graph, t_max: int) -> None:
    """The certified strong-adversary numbers stay on the safe side when ``t_max`` cuts off real
    first-passage mass (a deployed graph can mix far more slowly than the horizon's model assumes):
    ``H(S|D=j,T)`` never above its value at a horizon with no mass left, ``I(S;T|D)`` never below, and
    ``H(S|D=j,T≥tail_from)`` exact (the tail's mass per source is known: every walk hits).  Closing
    the tail with the posterior at ``t_max`` (the quasi-stationary guess) claimed up to 0.25 nats of
    entropy too much on these graphs."""
    adj = as_adjacency(graph)
    n = adj.shape[0]
    M = np.full((n, n), 1.0 / (n - 1))
    np.fill_diagonal(M, 0.0)
    pi = np.full(n, 1.0 / n)
    kw = dict(pi=pi, record_t=(), le_ks=(), tail_from=20)
    truth = strong_adversary(adj, M, t_max=60_000, **kw)
    assert truth.tail_mass < 1e-12
    short = strong_adversary(adj, M, t_max=t_max, **kw)
    assert short.tail_mass > 0.3  # the horizon really cuts mass off
    assert np.all(short.h_given_t <= truth.h_given_t + 1e-12)
    assert short.mutual_information >= truth.mutual_information - 1e-12
    np.testing.assert_allclose(short.h_tail, truth.h_tail, atol=1e-9)
    # the bracket: the tail can add at most its mass times log(n - 1) nats
    assert np.all(short.h_given_t_upper >= truth.h_given_t - 1e-12)
