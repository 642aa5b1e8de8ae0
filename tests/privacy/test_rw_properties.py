"""Hypothesis property tests of the random-walk accountant on random small connected graphs."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hushnet.privacy import randomwalk as rw
from hushnet.privacy.graphs import graph_from_edges, metropolis_hastings


@st.composite
def connected_graphs(draw):
    """A random spanning tree plus random extra edges, on 3..12 nodes."""
    n = draw(st.integers(3, 12))
    parents = [draw(st.integers(0, i - 1)) for i in range(1, n)]
    edges = {(p, i) for i, p in zip(range(1, n), parents)}
    extra = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=2 * n))
    edges |= {(min(a, b), max(a, b)) for a, b in extra if a != b}
    g = graph_from_edges(n, np.array(sorted(edges)))
    variant = draw(st.sampled_from(["hamilton", "lazy"]))
    W = metropolis_hastings(g).toarray()
    if variant == "lazy":  # another valid symmetric bi-stochastic W on the same support
        W = 0.5 * (np.eye(n) + W)
    return g, W


def brute(W: np.ndarray, T: int) -> np.ndarray:
    P = np.eye(W.shape[0])
    acc = np.zeros_like(P)
    for t in range(1, T + 1):
        P = P @ W
        acc += P / t
    return acc


@settings(max_examples=40, deadline=None)
@given(connected_graphs(), st.integers(1, 80), st.floats(1.1, 6.0), st.floats(0.5, 5.0))
def test_spectral_exact_equals_bruteforce_and_is_nonnegative(gW, T, alpha, sigma):
    g, W = gW
    S = rw.rw_single_loss_matrix(W, T, alpha, sigma)
    ref = alpha / sigma**2 * brute(W, T)
    np.fill_diagonal(ref, 0.0)
    assert np.allclose(S, ref, rtol=1e-9, atol=1e-12)
    assert (S >= -1e-14).all()
    fp = rw.rw_single_loss_matrix(W, T, alpha, sigma, passage="first_passage")
    assert (fp >= 0).all() and (fp <= S + 1e-12).all()
    sk = rw.rw_single_loss_matrix(W, T, alpha, sigma, sender_known=True)
    assert (sk >= S - 1e-14).all()


@settings(max_examples=30, deadline=None)
@given(
    connected_graphs(),
    st.integers(2, 300),
    st.floats(1.5, 4.0),
    st.floats(3.0, 8.0),
    st.floats(1.01, 3.0),
)
def test_certified_losses_monotone_decreasing_in_sigma(gW, T, alpha, sigma, factor):
    g, W = gW
    for horizon in ("exact", "harmonic"):
        lo = rw.rw_pndp_matrix(W, T, alpha, sigma, horizon=horizon, constraint="proof").matrix
        hi = rw.rw_pndp_matrix(
            W, T, alpha, sigma * factor, horizon=horizon, constraint="proof"
        ).matrix
        off = ~np.eye(g.n, dtype=bool)
        pos = lo[off] > 0
        assert (hi[off] <= lo[off]).all() and (hi[off][pos] < lo[off][pos]).all()
        assert (lo >= 0).all()
        assert np.allclose(hi, lo / factor**2, rtol=1e-10, atol=1e-15)


@settings(max_examples=30, deadline=None)
@given(connected_graphs(), st.integers(1, 200))
def test_certified_harmonic_dominates_exact_and_lnT_is_below(gW, T):
    g, W = gW
    ex = rw.rw_pndp_matrix(W, T, 2.0, 2.0, constraint="proof", contributions=1.0).matrix
    hm = rw.rw_pndp_matrix(
        W, T, 2.0, 2.0, horizon="harmonic", constraint="proof", contributions=1.0
    ).matrix
    ln = rw.rw_pndp_matrix(W, T, 2.0, 2.0, bound="paper", contributions=1.0).matrix
    assert (hm >= ex - 1e-12).all()
    # ln T < H_T: the paper form sits below the harmonic form by exactly (α/σ²)(H_T − ln T)/n per pair
    gap = (2.0 / 4.0) * (rw.harmonic_number(T) - np.log(T)) / g.n
    off = ~np.eye(g.n, dtype=bool)
    hm_raw = rw.rw_single_loss_matrix(W, T, 2.0, 2.0, horizon="harmonic")
    assert np.allclose((hm_raw - ln)[off], gap, rtol=1e-9, atol=1e-13)
