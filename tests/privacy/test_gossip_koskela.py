"""Koskela–Kulkarni streaming gossip: §2.8 unit values, §5 items 18–23, every threat model."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from hushnet.privacy import koskela as ks
from hushnet.privacy.graphs import graph_from_edges, metropolis_hastings, parse_graph


def _nx_W(g: nx.Graph):
    return metropolis_hastings(graph_from_edges(g.number_of_nodes(), np.array(list(g.edges()))))


@pytest.fixture(scope="module")
def er100():
    g = nx.gnp_random_graph(100, 0.15, seed=0)
    assert g.number_of_edges() == 750
    return _nx_W(g)


def test_complete_graph_values():
    n = 10
    W = np.full((n, n), 1.0 / n)
    got = [ks.stream_sensitivity(W, T, [0], 1)["value"] for T in range(1, 6)]
    np.testing.assert_allclose(
        got, [0, 0.0091743119, 0.0379857256, 0.0868076669, 0.1515213485], atol=1e-10
    )
    assert got[1] == pytest.approx(1 / (n * n + n - 1), rel=1e-12)
    assert ks.stream_sensitivity(W, 10, [0], 1)["value"] == pytest.approx(0.5870394698, rel=1e-9)
    assert ks.stream_sensitivity(W, 50, [0], 1)["lower"] == pytest.approx(4.5740994645, rel=1e-9)
    spec = [ks.stream_sensitivity(W, T, [0], 1)["spectral"] for T in range(2, 6)]
    np.testing.assert_allclose(
        spec, [0.0183486239, 0.0590466388, 0.1228134688, 0.2036575746], rtol=1e-8
    )


def test_cycle8_values():
    W = metropolis_hastings(parse_graph("ring:8"))
    ref = {
        1: {2: 0.09090909, 3: 0.23294951, 5: 0.59113537, 8: 1.17311639, 12: 1.91549193},
        2: {3: 0.00974314, 5: 0.07266916, 8: 0.25575133, 12: 0.60312135},
        4: {5: 0.00047036, 8: 0.01995953, 12: 0.13333917},
    }
    for j, row in ref.items():
        for T, val in row.items():
            assert ks.stream_sensitivity(W, T, [0], j)["value"] == pytest.approx(val, abs=2e-8)
        dist = min(j, 8 - j)
        for T in range(1, dist + 1):
            assert ks.stream_sensitivity(W, T, [0], j)["value"] == pytest.approx(0.0, abs=1e-14)


def test_er_threat_models(er100):
    """§2.8 "other threat models" and §2.5's Theorem 16 counter-example (ER(100, .15), seed 0)."""
    W = er100
    nb = ks.observer_set(W, 85, "neighbourhood")
    assert nb.size == 13
    secldp = {10: 0.427, 30: 0.504, 60: 0.524}
    for T, val in secldp.items():
        r = ks.coalition_sensitivity(W, T, nb, 0, secldp=True)
        assert r["lower"] / T == pytest.approx(val, abs=1.5e-3)
        assert r["value"] >= r["lower"] - 1e-9
        assert val > 13 / 87  # Theorem 16's bound m/(n-m) is violated (spec FLAG)
    r = ks.stream_sensitivity(W, 200, nb, 0)
    assert r["lower"] / 200 == pytest.approx(0.0611, abs=2e-4)
    single = ks.stream_sensitivity(W, 200, [85], 0, known=[85])
    assert single["lower"] / 200 == pytest.approx(0.0100, abs=1e-4)
    assert single["lower"] / 200 == pytest.approx(1 / 99, rel=0.05)  # §5 item 22


def test_er_asymptotics(er100):
    W = er100
    Wd = W.toarray()
    i = 85
    nbrs = [j for j in range(100) if j != i and Wd[i, j] > 0]
    non = [j for j in range(100) if j != i and Wd[i, j] == 0]
    for j in (nbrs[0], non[0]):
        val = ks.stream_sensitivity(W, 400, [i], j)["lower"] / 400
        assert 0.008 <= val <= 0.012


def test_ba_converges_towards_one_over_n():
    g = nx.barabasi_albert_graph(100, 3, seed=0, initial_graph=nx.complete_graph(5))
    W = _nx_W(g)
    i = 85
    j = int(sorted(g.neighbors(i))[0])
    a = ks.stream_sensitivity(W, 200, [i], j)["lower"] / 200
    b = ks.stream_sensitivity(W, 400, [i], j)["lower"] / 400
    assert abs(b - 0.01) < abs(a - 0.01)


def test_properties_and_bounds():
    """§5 item 18: lower ≤ scalar ≤ certified ≤ min(spectral, abs); λmax(M) ≤ 1; Δ² ≤ T; monotone in T."""
    for seed in range(3):
        g = parse_graph(f"er:25:0.2:{seed}").largest_component()
        W = metropolis_hastings(g)
        i, j = 0, int(g.n - 1)
        prev = 0.0
        for T in range(1, 11):
            r = ks.stream_sensitivity(W, T, [i], j, exact_limit=12)
            assert r["lower"] >= -1e-12
            assert r["lower"] <= r["scalar"] + 1e-9
            assert r["scalar"] <= r["value"] + 1e-9 <= min(r["spectral"], r["abs"]) + 2e-9
            assert np.linalg.eigvalsh(r["M"])[-1] <= 1 + 1e-9
            assert r["value"] <= T + 1e-9
            assert r["value"] >= prev - 1e-9
            prev = r["value"]
            if T <= g.shortest_path_lengths(i)[j]:
                assert r["value"] == pytest.approx(0.0, abs=1e-12)


def test_ldp_threat_model_is_T():
    W = metropolis_hastings(parse_graph("ring:7"))
    for T in (1, 3, 6):
        r = ks.stream_sensitivity(W, T, np.arange(7), 2)
        assert r["value"] == pytest.approx(T, rel=1e-9)


@pytest.mark.parametrize(
    "model", ["single", "single-known", "nbhd", "nbhd-own", "coalition", "secldp"]
)
def test_recursion_equals_explicit_H(model):
    """§5 item 19: the K-recursion equals the explicit H_T with pinv, every threat model."""
    g = parse_graph("er:14:0.3:7").largest_component()
    W = metropolis_hastings(g)
    nb = ks.observer_set(W, 0, "neighbourhood")
    obs, known = {
        "single": ([0], []),
        "single-known": ([0], [0]),
        "nbhd": (nb, []),
        "nbhd-own": (nb, [0]),
        "coalition": ([0, 3, 5], []),
        "secldp": ([0, 3, 5], [0, 3, 5]),
    }[model]
    src = next(j for j in range(g.n - 1, 0, -1) if j not in set(np.asarray(obs).tolist()))
    for T in (1, 4, 7):
        M = ks.stream_sensitivity(W, T, obs, src, known=known)["M"]
        Mx = ks.explicit_sensitivity_matrix(W, T, obs, src, known=known)
        np.testing.assert_allclose(M, Mx, rtol=1e-10, atol=1e-10 * max(1.0, np.abs(Mx).max()))


def test_known_source_noise_is_infinite():
    W = metropolis_hastings(parse_graph("ring:6"))
    r = ks.stream_sensitivity(W, 3, [0, 1], 1, known=[0, 1])
    assert r["value"] == np.inf and "infinite" in r["method"]
    pair = ks.gossip_stream_pair(W, 1, 0, 3, 2.0, 1.0, ks.StreamOptions(known_noise=[0, 1]))
    assert pair["rdp"] == np.inf


def test_all_sources_vectorised_and_matrix_api():
    g = parse_graph("er:16:0.3:1").largest_component()
    W = metropolis_hastings(g)
    T = 6
    nb = ks.observer_set(W, 2, "neighbourhood")
    val, lower = ks.stream_sensitivities_all_sources(W, T, nb, known=[2], exact_limit=12)
    for j in range(g.n):
        if j == 2:
            continue
        r = ks.stream_sensitivity(W, T, nb, j, known=[2], exact_limit=12)
        assert val[j] == pytest.approx(r["value"], rel=1e-9, abs=1e-12)
        assert lower[j] == pytest.approx(r["lower"], rel=1e-9, abs=1e-12)
    pm = ks.gossip_stream_loss_matrix(W, T, 2.0, 1.0)
    assert pm.bound == "certified" and np.all(np.diag(pm.matrix) == 0)
    np.testing.assert_allclose(
        pm.matrix[:, 2][np.arange(g.n) != 2], np.delete(val, 2), rtol=1e-9, atol=1e-12
    )
    pm2 = ks.gossip_stream_loss_matrix(W, T, 4.0, 2.0)
    np.testing.assert_allclose(pm2.matrix, pm.matrix * 2 / 4, rtol=1e-12)
    pair = ks.gossip_stream_pair(W, 5, 2, T, 2.0, 1.0, ks.StreamOptions(delta=1e-5))
    assert pair["rdp"] == pytest.approx(pm.matrix[5, 2], rel=1e-9) and pair["epsilon"] > 0


def test_muffliato_is_first_block_column():
    """§3: Muffliato averaging = streaming gossip with contributions/noise only at t = 0."""
    from hushnet.privacy import muffliato as mf

    g = parse_graph("er:20:0.25:3").largest_component()
    W = metropolis_hastings(g)
    T = 5
    nb = ks.observer_set(W, 0, "neighbourhood")
    # view of [K] restricted to round-0 inputs: rows S W^t, t < T — exactly the Muffliato rows
    M = mf.observer_view_matrix(W, 0, T, own_noise_known=False)  # neighbours only, noise counted
    _, X = ks.stream_kernel(W, T, nb[1:])
    Rk = X.reshape(-1, g.n)
    np.testing.assert_allclose(
        np.sort(np.linalg.svd(M.T, compute_uv=False)),
        np.sort(np.linalg.svd(Rk, compute_uv=False)),
        atol=1e-12,
    )
