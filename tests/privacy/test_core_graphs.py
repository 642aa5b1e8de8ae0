"""Graphs and weights: the properties every accountant and the bootstrap rely on (docs/design/spec/randomwalk.md PART D 1, gossip §0.2-0.3)."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hushnet.privacy.graphs import (
    GraphSpecError,
    chebyshev_gamma,
    graph_from_edges,
    is_periodic,
    metropolis_hastings,
    mixing_time,
    parse_graph,
    spectral_gap,
)


def test_path_graph_hamilton_matches_spec():
    W = metropolis_hastings(graph_from_edges(4, [(0, 1), (1, 2), (2, 3)])).toarray()
    expected = np.array([[2, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 2]]) / 3
    np.testing.assert_allclose(W, expected, atol=1e-12)


@pytest.mark.parametrize(
    "spec", ["ring:7", "ring:12", "hypercube:4", "regular:30:4:1", "complete:6"]
)
def test_regular_graphs_get_identity_plus_adjacency_over_d_plus_1(spec):
    g = parse_graph(spec)
    d = int(g.degrees[0])
    assert (g.degrees == d).all()
    W = metropolis_hastings(g).toarray()
    np.testing.assert_allclose(W, (np.eye(g.n) + g.adjacency.toarray()) / (d + 1), atol=1e-12)


def test_hypercube_numbering_and_antipodes():
    g = parse_graph("hypercube:5")
    assert g.n == 32 and g.num_edges == 5 * 16
    assert set(g.neighbors(0).tolist()) == {1, 2, 4, 8, 16}
    assert g.shortest_path_lengths(0)[31] == 5
    dist = g.shortest_path_lengths(0)
    np.testing.assert_array_equal(dist, [bin(i).count("1") for i in range(32)])


def test_grid_numbering():
    g = parse_graph("grid:3x4")
    assert g.n == 12 and g.num_edges == 3 * 3 + 2 * 4
    assert set(g.neighbors(5).tolist()) == {1, 4, 6, 9}


def test_seeded_families_are_reproducible_and_match_networkx():
    a, b = parse_graph("er:60:0.1:7"), parse_graph("er:60:0.1:7")
    assert (a.adjacency != b.adjacency).nnz == 0
    ref = nx.gnp_random_graph(60, 0.1, seed=7)
    assert a.num_edges == ref.number_of_edges()
    r = parse_graph("regular:300:3:1")
    assert set(map(tuple, r.edges().tolist())) == {
        tuple(sorted(e)) for e in nx.random_regular_graph(3, 300, seed=1).edges()
    }
    geo = parse_graph("geometric:40:0.3:2")
    assert geo.positions is not None and geo.positions.shape == (40, 2)
    sbm = parse_graph("sbm:10,12:0.6:0.05:3")
    assert sbm.n == 22


def test_edgelist_relabels_and_skips_junk(tmp_path):
    f = tmp_path / "g.txt"
    f.write_text("# comment\nnode,edge\n10 20\n20,30\n30\t10\nfoo bar\n1 2 3\n")
    g = parse_graph(f"edgelist:{f}")
    assert g.n == 3 and g.num_edges == 3


@pytest.mark.parametrize(
    "spec",
    [
        "nope:3",
        "ring",
        "ring:x",
        "ring:2",
        "grid:3by4",
        "er:10:2:1",
        "regular:5:3:1",
        "hypercube:30",
        "er:10:0.1",
    ],
)
def test_bad_specs_raise_clear_errors(spec):
    with pytest.raises(GraphSpecError):
        parse_graph(spec)


def test_spectral_quantities_reference_values():
    W = metropolis_hastings(parse_graph("hypercube:11"))
    assert spectral_gap(W) == pytest.approx(1 / 6, abs=1e-12)
    assert chebyshev_gamma(W) == pytest.approx(1.4289259788, abs=1e-9)
    assert chebyshev_gamma(gap=1.0) == pytest.approx(1.0718, abs=1e-4)
    Wg = metropolis_hastings(parse_graph("grid:45x45"))
    assert spectral_gap(Wg, kind="code") == pytest.approx(9.8512e-4, rel=1e-4)
    assert chebyshev_gamma(Wg) == pytest.approx(1.9391444, abs=1e-6)


def test_printed_rule_is_periodic_on_hypercube_and_warns():
    with pytest.warns(RuntimeWarning, match="periodic"):
        W = metropolis_hastings(parse_graph("hypercube:3"), variant="paper")
    assert is_periodic(W)
    assert spectral_gap(W) == pytest.approx(0.0, abs=1e-12)


def test_mixing_time_complete_graph_is_one_step():
    assert mixing_time(metropolis_hastings(parse_graph("complete:8"))) == 1
    assert mixing_time(metropolis_hastings(parse_graph("ring:12")), 0.25) > 1


@settings(max_examples=40, deadline=None)
@given(
    st.integers(3, 25),
    st.floats(0.1, 0.9),
    st.integers(0, 10_000),
    st.sampled_from(["hamilton", "paper"]),
)
def test_weights_are_symmetric_stochastic_on_the_graph(n, p, seed, variant):
    g = parse_graph(f"er:{n}:{p}:{seed}")
    with np.errstate(all="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            W = metropolis_hastings(g, variant=variant).toarray()
    np.testing.assert_allclose(W, W.T, atol=1e-12)
    np.testing.assert_allclose(W.sum(axis=1), 1.0, atol=1e-12)
    assert (W >= -1e-15).all()
    off = W - np.diag(np.diag(W))
    assert ((off > 0) <= (g.adjacency.toarray() > 0)).all()
    if variant == "hamilton":
        assert (np.diag(W) > 0).all()
    assert math.isfinite(spectral_gap(W))
