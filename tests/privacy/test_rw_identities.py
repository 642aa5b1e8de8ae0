"""Random-walk accountant: identities and small-graph reference values (docs/design/spec/randomwalk.md PART D 1–12)."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest
import scipy.linalg as sla
import scipy.sparse as sp

from hushnet.privacy import randomwalk as rw
from hushnet.privacy.graphs import graph_from_edges, metropolis_hastings, parse_graph
from hushnet.privacy.paper import randomwalk as prw  # the printed formulas (labelled "paper")


def W_of(spec: str) -> sp.csr_matrix:
    return metropolis_hastings(parse_graph(spec))


def brute_sum(W, T: int) -> np.ndarray:
    """Σ_{t=1}^T W^t / t by direct dense powers (the straightforward oracle)."""
    Wd = W.toarray() if sp.issparse(W) else np.asarray(W)
    P = np.eye(Wd.shape[0])
    acc = np.zeros_like(P)
    for t in range(1, T + 1):
        P = P @ Wd
        acc += P / t
    return acc


# --- D1: weights -------------------------------------------------------------------------------------------------
def test_hamilton_plus_one_weights_on_P4_ring_and_regular():
    g = graph_from_edges(4, np.array([[0, 1], [1, 2], [2, 3]]))
    W = metropolis_hastings(g).toarray()
    ref = np.array([[2, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 2]]) / 3
    assert np.allclose(W, ref, atol=1e-12)
    gr = parse_graph("ring:9")
    assert np.allclose(
        metropolis_hastings(gr).toarray(), (np.eye(9) + gr.adjacency.toarray()) / 3, atol=1e-12
    )
    gh = parse_graph("hypercube:4")
    assert np.allclose(
        metropolis_hastings(gh).toarray(), (np.eye(16) + gh.adjacency.toarray()) / 5, atol=1e-12
    )


# --- D2: matrix log ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["ring:20", "hypercube:4", "grid:4x5", "er:30:0.2:3"])
def test_M_equals_scipy_logm_and_has_zero_row_sums(spec):
    g = parse_graph(spec)
    if not g.is_connected():
        g = g.largest_component()
    W = metropolis_hastings(g)
    n = W.shape[0]
    M = rw.rw_M_matrix(W)
    ref = -np.real(sla.logm(np.eye(n) - W.toarray() + np.ones((n, n)) / n))
    assert np.abs(M - ref).max() < 1e-10
    assert np.abs(M.sum(axis=1)).max() < 1e-10


# --- D3: exact finite sum ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "spec,T", [("ring:20", 500), ("ring:11", 7), ("hypercube:3", 40), ("grid:3x4", 150)]
)
def test_exact_spectral_sum_equals_direct_powers_and_harmonic_within_tail(spec, T):
    W = W_of(spec)
    alpha, sigma = 3.0, 2.0
    S = rw.rw_single_loss_matrix(W, T, alpha, sigma, horizon="exact")
    ref = alpha / sigma**2 * brute_sum(W, T)
    np.fill_diagonal(ref, 0.0)
    assert np.abs(S - ref).max() < 1e-10
    Sh = rw.rw_single_loss_matrix(W, T, alpha, sigma, horizon="harmonic")
    lam = np.linalg.eigvalsh(W.toarray())[:-1]
    a = np.abs(lam)
    spec_bound = (
        alpha / sigma**2 * np.sum(a ** (T + 1) / ((T + 1) * (1 - a)))
    )  # docs/design/spec/randomwalk.md §D.3 bound
    assert np.abs(S - Sh).max() <= spec_bound + 1e-12
    # the certified harmonic form adds a proven tail bound, so it dominates the exact sum
    Pc = rw.rw_pndp_matrix(
        W, T, alpha, sigma, horizon="harmonic", constraint="proof", contributions=1.0
    )
    assert (Pc.components[rw.WALK] >= S - 1e-12).all()
    # the certified matrix is that walk bound capped by local DP α/(2σ²) per contribution (issue 10 §2b)
    ldp = np.full_like(S, alpha / (2 * sigma**2))
    np.fill_diagonal(ldp, 0.0)
    np.testing.assert_array_equal(Pc.matrix, np.minimum(Pc.components[rw.WALK], ldp))


def test_power_harmonic_sum_against_direct_series():
    lam = np.array([-1.0, -0.999, -0.5, 0.0, 0.3, 0.9, 0.99, 0.99999, 1.0])
    for T in (1, 2, 17, 300, 5000):
        t = np.arange(1, T + 1)
        ref = np.array([np.sum(l**t / t) for l in lam])
        got = rw.power_harmonic_sum(lam, T)
        assert np.allclose(got, ref, rtol=1e-12, atol=1e-13), T
        tail = rw.power_harmonic_tail_bound(lam[:-1], T)
        exact_tail = np.abs(
            np.where(np.abs(lam[:-1]) < 1, -np.log1p(-np.clip(lam[:-1], -1, 0.999999999)), 0)
            - ref[:-1]
        )
        finite = np.abs(lam[:-1]) < 0.9999
        assert (exact_tail[finite] <= tail[finite] * (1 + 1e-9) + 1e-15).all()
    assert rw.harmonic_number(1150) == pytest.approx(np.sum(1.0 / np.arange(1, 1151)), rel=1e-14)


# --- D4 / D12: complete graph --------------------------------------------------------------------------------------
def test_complete_graph_M_zero_and_single_loss_alpha_H_T_over_n():
    n, T, alpha, sigma = 40, 300, 2.5, 1.3
    W = W_of(f"complete:{n}")
    assert np.abs(rw.rw_M_matrix(W)).max() < 1e-12
    S = rw.rw_single_loss_matrix(W, T, alpha, sigma)
    off = S[~np.eye(n, dtype=bool)]
    assert np.allclose(off, alpha * rw.harmonic_number(T) / (n * sigma**2), rtol=1e-12)


def test_complete_graph_reference_totals_n2048():
    """Spec B.4.4 / G values at n = 2048 (eigenvalues only: every off-diagonal entry equals the mean when M = 0)."""
    W = W_of("complete:2048")
    n, alpha, sigma = 2048, 2.0, 1.0
    mean = lambda T, h: rw.rw_mean_single_loss(W, T, h) * alpha / sigma**2  # noqa: E731
    assert mean(1150, "lnT") * 1150 / n == pytest.approx(
        3.8646e-3, rel=1e-4
    )  # paper total, N_u = T/n
    assert mean(20000, "lnT") * 20000 / n == pytest.approx(9.4447e-2, rel=1e-4)
    assert mean(1150, "exact") == pytest.approx(
        7.446e-3, rel=1e-3
    )  # per contribution, exact = α H_T/(nσ²)
    assert mean(20000, "exact") == pytest.approx(1.0235e-2, rel=1e-3)
    assert mean(1150, "exact") * 1150 / n == pytest.approx(
        4.181e-3, rel=1e-3
    )  # certified totals (H_T)
    assert mean(20000, "exact") * 20000 / n == pytest.approx(9.995e-2, rel=1e-3)
    # D12: total over N_u = T/n contributions is 2H_T/n times the LDP total N_u α/(2σ²)
    T = 1150
    ldp_total = (T / n) * alpha / (2 * sigma**2)
    assert mean(T, "exact") * T / n == pytest.approx(
        2 * rw.harmonic_number(T) / n * ldp_total, rel=1e-12
    )
    # the full matrix on a smaller complete graph: every pair equal, and the pair function agrees
    W64 = W_of("complete:64")
    P = rw.rw_pndp_matrix(W64, 1150, alpha, sigma, constraint="proof")
    off = P.off_diagonal()
    assert np.allclose(off, 2 * rw.harmonic_number(1150) / 64 * (1150 / 64), rtol=1e-12)
    assert rw.rw_pair_loss(
        W64, 3, 7, 1150, alpha, sigma, rw.WalkLossOptions(constraint="proof")
    ) == pytest.approx(off[0], rel=1e-12)
    assert rw.rw_pndp_matrix(W64, 1150, alpha, sigma, bound="paper").matrix[0, 1] == pytest.approx(
        2 * math.log(1150) / 64 * (1150 / 64), rel=1e-12
    )


# --- D5 / D6: symmetry, scaling, mean identity ---------------------------------------------------------------------
@pytest.mark.parametrize("horizon", ["exact", "harmonic", "lnT"])
def test_symmetry_scaling_and_mean_identity(horizon):
    W = W_of("grid:5x6")
    n, T = 30, 400
    base = rw.rw_single_loss_matrix(W, T, 2.0, 1.0, horizon=horizon)
    assert np.abs(base - base.T).max() < 1e-12
    scaled = rw.rw_single_loss_matrix(W, T, 6.0, 3.0, horizon=horizon)
    assert np.allclose(scaled, base * (6.0 / 9.0) / 2.0, rtol=1e-12, atol=1e-15)
    P1 = rw.rw_pndp_matrix(W, T, 2.0, 1.0, bound="paper", horizon=horizon, contributions=3.0).matrix
    P2 = rw.rw_pndp_matrix(W, T, 2.0, 1.0, bound="paper", horizon=horizon, contributions=6.0).matrix
    assert np.allclose(P2, 2 * P1, rtol=1e-12)
    Nv = np.linspace(1, 4, n)
    Pv = rw.rw_pndp_matrix(W, T, 2.0, 1.0, bound="paper", horizon=horizon, contributions=Nv).matrix
    assert np.allclose(Pv, base * Nv[:, None], rtol=1e-12)
    capped = rw.rw_pndp_matrix(
        W, T, 2.0, 1.0, bound="paper", horizon=horizon, contributions=Nv, max_contributions=2
    )
    assert np.allclose(capped.matrix, base * np.minimum(Nv, 2)[:, None], rtol=1e-12)
    assert any("capped" in note for note in capped.notes)
    if horizon == "lnT":  # D6 closed-form mean
        lam = np.linalg.eigvalsh(W.toarray())[:-1]
        Nu = T / n
        P = rw.rw_pndp_matrix(W, T, 2.0, 1.0, bound="paper")
        mean = P.off_diagonal().mean()
        ref = 2 * Nu * math.log(T) / n + 2 * Nu * np.sum(np.log(1 - lam)) / (n * (n - 1))
        assert mean == pytest.approx(ref, rel=1e-10)
    off = base[~np.eye(n, dtype=bool)].mean()
    assert rw.rw_mean_single_loss(W, T, horizon) * 2.0 == pytest.approx(off, rel=1e-10)


# --- D7 / D8: ring and hypercube reference values, corrected ring closed form -------------------------------------
def test_ring12_and_hypercube3_M_by_distance():
    M = rw.rw_M_matrix(W_of("ring:12"))
    ref = [0.495698, 0.000000, -0.159129, -0.231049, -0.264648, -0.274653]
    assert np.allclose(M[0, 1:7], ref, atol=1e-6)
    assert np.all(np.diff(M[0, 1:7]) < 0)
    assert np.allclose(M[0, 11:5:-1], ref, atol=1e-6)  # distance, not offset
    Mh = rw.rw_M_matrix(W_of("hypercube:3"))
    assert np.allclose(Mh[0, [1, 3, 7]], [0.137327, -0.137327, -0.209247], atol=1e-6)
    assert np.allclose(Mh[0, [2, 4]], 0.137327, atol=1e-6) and np.allclose(
        Mh[0, [5, 6]], -0.137327, atol=1e-6
    )


def test_ring_closed_form_corrected_equals_recipe_and_printed_form_does_not():
    n, T, alpha, sigma = 12, 1000, 2.0, 1.0
    W = W_of(f"ring:{n}")
    S = rw.rw_single_loss_matrix(W, T, alpha, sigma)
    exact_ref = [2.238974, 1.247578, 0.929321, 0.785480, 0.718282, 0.698272]
    assert np.allclose(S[0, 1:7], exact_ref, atol=1e-6)
    for u in (0, 5):
        for v in range(n):
            if u == v:
                continue
            cf = rw.ring_single_loss_closed_form(n, (v - u) % n, T, alpha, sigma)
            assert cf == pytest.approx(S[u, v], rel=1e-9)
    for a in range(1, 7):
        assert rw.ring_M_closed_form(n, a) == pytest.approx(rw.rw_M_matrix(W)[0, a], abs=1e-9)
    totals = rw.rw_pndp_matrix(W, T, alpha, sigma, bound="paper").matrix[0, 1:7]
    assert np.allclose(totals, [178.557, 95.941, 69.420, 57.433, 51.833, 50.166], atol=1e-3)
    # the printed Theorem 5 (u+v−2, factor 2, cos(πak/n)) is not the loss: regression against using it as oracle
    printed = [prw.ring_loss_printed_thm5(n, 1, 1 + d, T, alpha, sigma) for d in range(1, 7)]
    lnT_single = rw.rw_single_loss_matrix(W, T, alpha, sigma, horizon="lnT")[0, 1:7]
    assert np.max(np.abs(np.array(printed) - lnT_single)) > 0.1
    # …and it is not even a function of the distance (u+v dependence)
    assert (
        abs(
            prw.ring_loss_printed_thm5(n, 1, 3, T, alpha, sigma)
            - prw.ring_loss_printed_thm5(n, 4, 6, T, alpha, sigma)
        )
        > 1e-3
    )


# --- D9: star ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "n,leaf_leaf,centre_leaf,printed_ll,printed_cl",
    [(11, 0.498, 0.978, 0.0211, 0.207), (101, 0.0563, 0.149, 2.0e-4, 0.0201)],
)
def test_star_true_loss_vs_printed_theorem4(n, leaf_leaf, centre_leaf, printed_ll, printed_cl):
    T = 10 * n
    W = rw.star_transition_matrix(n)
    S = rw.rw_single_loss_matrix(W, T, 2.0, 1.0)
    assert S[1, 2] == pytest.approx(leaf_leaf, rel=3e-3)  # the spec prints 3 significant digits
    assert S[0, 1] == pytest.approx(centre_leaf, rel=3e-3)
    assert (
        S[0, 1] > S[1, 2] and S[1, 0] > S[2, 1]
    )  # pairs with the centre leak more (the valid claim)
    p_ll = prw.star_loss_printed_thm4(n, 2.0, 1.0, centre_pair=False)
    p_cl = prw.star_loss_printed_thm4(n, 2.0, 1.0, centre_pair=True)
    assert p_ll == pytest.approx(printed_ll, rel=1e-2) and p_cl == pytest.approx(
        printed_cl, rel=1e-2
    )
    assert (
        p_ll < S[1, 2] and p_cl < S[0, 1]
    )  # the printed bound is below the true value: not a bound


# --- D10: sender-known ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["grid:4x5", "er:25:0.25:1", "hypercube:4"])
def test_sender_known_dominates_anonymous(spec):
    g = parse_graph(spec)
    g = g if g.is_connected() else g.largest_component()
    W = metropolis_hastings(g)
    for horizon in ("exact", "lnT"):
        a = rw.rw_single_loss_matrix(W, 200, 2.0, 1.0, horizon=horizon)
        s = rw.rw_single_loss_matrix(W, 200, 2.0, 1.0, horizon=horizon, sender_known=True)
        assert (s >= a - 1e-15).all()
    # brute force of max(S[u,v], max_{w ∈ N(v)} S[u, w]) with the diagonal S[u,u] (App. B.1 / reference maxi_priv)
    Sd = 2.0 * brute_sum(W, 200)
    A = g.adjacency.toarray() > 0
    ref = np.array([[max(Sd[u, v], Sd[u, A[v]].max()) for v in range(g.n)] for u in range(g.n)])
    np.fill_diagonal(ref, 0.0)
    s_exact = rw.rw_single_loss_matrix(W, 200, 2.0, 1.0, sender_known=True)
    assert np.abs(ref - s_exact).max() < 1e-10


def test_sender_known_on_hypercube_is_anonymous_shifted_by_one_hop():
    d = 6
    g = parse_graph(f"hypercube:{d}")
    W = metropolis_hastings(g)
    a = rw.rw_single_loss_matrix(W, 300, 2.0, 1.0)
    s = rw.rw_single_loss_matrix(W, 300, 2.0, 1.0, sender_known=True)
    dist = g.shortest_path_lengths(0)
    for k in range(2, d + 1):
        assert np.allclose(s[0, dist == k], a[0, dist == k - 1][0], rtol=1e-12)
    full = rw.rw_single_loss_matrix(W, 300, 2.0, 1.0, horizon="exact")
    assert np.allclose(
        s[0, dist == 1], 2.0 * brute_sum(W, 300)[0, 0], rtol=1e-10
    )  # picks the diagonal S[u,u]
    assert full[0, 1] < s[0, 1]


# --- D11: first passage and collusion ------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["ring:20", "grid:4x4", "hypercube:4"])
def test_first_passage_below_power_and_collusion_inequality(spec):
    W = W_of(spec)
    T = 300
    fp = rw.rw_single_loss_matrix(W, T, 2.0, 1.0, passage="first_passage")
    pw = rw.rw_single_loss_matrix(W, T, 2.0, 1.0)
    assert (fp <= pw + 1e-12).all() and (fp >= 0).all()
    # brute-force first passage for one target by explicit Markov chain with v absorbing
    n = W.shape[0]
    v = n - 1
    Wd = W.toarray()
    Q = Wd.copy()
    Q[:, v] = 0.0
    f = Wd[:, v].copy()
    ref = f.copy()
    for i in range(2, T + 1):
        f = Q @ f
        ref += f / i
    assert np.allclose(fp[:-1, v], 2.0 * ref[:-1], rtol=1e-9, atol=1e-13)
    F = [n - 1, n // 2, 1]
    for u in (0, 2):
        sharp = rw.rw_collusion_loss(
            W, u, F, T, 2.0, 1.0, passage="first_passage", contributions=1.0
        )
        basic = rw.rw_collusion_loss(W, u, F, T, 2.0, 1.0, passage="power", contributions=1.0)
        assert basic == pytest.approx(sum(pw[u, x] for x in F), rel=1e-10)
        assert sharp <= basic + 1e-12
        assert (
            sharp >= max(fp[u, x] for x in F) - 1e-12
        )  # a coalition learns at least what its best member does


def test_first_passage_mean_ratio_spec_values():
    """Spec B.4.2 [COMPUTED]: mean first-passage/power ratio 0.186 (ring 20), 0.315 (Davis), 0.123 (star 11)."""

    def ratio(W, n):
        fp = rw.rw_single_loss_matrix(W, 500, 2.0, 1.0, passage="first_passage")
        pw = rw.rw_single_loss_matrix(W, 500, 2.0, 1.0)
        off = ~np.eye(n, dtype=bool)
        return float(np.mean(fp[off] / pw[off]))

    assert ratio(W_of("ring:20"), 20) == pytest.approx(0.186, abs=1.5e-3)
    davis = nx.convert_node_labels_to_integers(nx.davis_southern_women_graph())
    Wd = metropolis_hastings(graph_from_edges(32, np.array(davis.edges())))
    assert ratio(Wd, 32) == pytest.approx(0.315, abs=1.5e-3)
    star = metropolis_hastings(
        graph_from_edges(11, np.array([[0, i] for i in range(1, 11)]))
    )  # Hamilton "+1" star
    assert ratio(star, 11) == pytest.approx(0.123, abs=1.5e-3)


# --- pair function ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw",
    [
        dict(bound="paper"),
        dict(bound="paper", sender_known=True),
        dict(constraint="proof"),
        dict(constraint="proof", horizon="harmonic"),
        dict(constraint="proof", sender_known=True, contributions=np.arange(1, 21)),
        dict(constraint="proof", passage="first_passage"),
    ],
)
def test_pair_loss_matches_matrix(kw):
    rw._SPECTRUM_CACHE.clear()  # exercise the cheap (no-eigh) path first
    W = W_of("grid:4x5")
    vals = [(0, 19), (3, 4), (7, 12)]
    pairs = [rw.rw_pair_loss(W, u, v, 150, 2.0, 1.0, rw.WalkLossOptions(**kw)) for u, v in vals]
    P = rw.rw_pndp_matrix(W, 150, 2.0, 1.0, **kw).matrix
    for (u, v), x in zip(vals, pairs):
        assert x == pytest.approx(P[u, v], rel=1e-9)
        assert rw.rw_pair_loss(W, u, v, 150, 2.0, 1.0, rw.WalkLossOptions(**kw)) == pytest.approx(
            P[u, v], rel=1e-9
        )  # cached path
    assert rw.rw_pair_loss(W, 2, 2, 150, 2.0, 1.0, rw.WalkLossOptions(**kw)) == 0.0


def test_dense_and_sparse_inputs_agree():
    W = metropolis_hastings(parse_graph("er:40:0.15:2").largest_component())
    a = rw.rw_pndp_matrix(W, 100, 2.0, 3.0).matrix
    b = rw.rw_pndp_matrix(W.toarray(), 100, 2.0, 3.0).matrix
    assert np.allclose(a, b, rtol=1e-12, atol=1e-15)


def test_summary_by_distance():
    g = parse_graph("hypercube:5")
    W = metropolis_hastings(g)
    P = rw.rw_pndp_matrix(W, 500, 2.0, 1.0, bound="paper")
    s = P.summary(g)
    assert s["bound"] == "paper" and s["view"] == "anonymous"
    assert set(s["mean_by_distance"]) == {str(k) for k in range(1, 6)}
    means = [s["mean_by_distance"][str(k)] for k in range(1, 6)]
    assert np.all(np.diff(means) < 0)
    dist = g.shortest_path_lengths(0)
    assert means[1] == pytest.approx(
        P.matrix[0, dist == 2].mean(), rel=1e-12
    )  # distance-transitive
    assert s["min"] <= s["mean"] <= s["max"]
    assert P.summary()["mean_by_distance"] == s["mean_by_distance"]  # adjacency from W's support
    dp = P.to_dp(1e-6, method="classic")
    assert dp[0, 1] == pytest.approx(P.matrix[0, 1] + math.log(1e6), rel=1e-12)
    a = P.alpha  # the certified default: dp-accounting's improved rule at the matrix's order
    improved = P.matrix[0, 1] + math.log1p(-1 / a) - math.log(1e-6 * a) / (a - 1)
    assert P.to_dp(1e-6)[0, 1] == pytest.approx(improved, rel=1e-12) and improved < dp[0, 1]
