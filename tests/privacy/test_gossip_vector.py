"""Streaming gossip with *vector* contributions: every entry point's certified value covers them.

DP-GD's per-round contribution is a clipped gradient vector, not a ±1 scalar.  With i.i.d. noise per
coordinate the squared sensitivity is ``tr(M X)`` over Gram matrices X of per-round vectors of norm
≤ 1, which can exceed the vertex maximum over ``{±1}^T`` (issue 10 §1: ring 8, T = 4, pair 0→1).
The reference values here are computed independently of the accountant: the observer's view is
built as an explicit Toeplitz system and inverted with ``pinv``, and the vector value is found by
optimising over unit vectors in the plane.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import optimize

from hushnet.cli import main
from hushnet.privacy.api import privacy_matrix, privacy_pair
from hushnet.privacy.graphs import metropolis_hastings, parse_graph
from hushnet.privacy.linear_gaussian import box_quadratic_max, sdp_box_bound

ISSUE_VECTOR_VALUE = (
    3.7602807574  # unit vectors at 0°, 0°, −150.8°, 47° (issue 10, checked at 60 digits)
)
PLANAR_OPTIMUM = (
    3.7603225077  # the best planar choice is a little higher still (found by the search below)
)
ISSUE_SCALAR_VALUE = 3.7599339041  # what the vertex enumeration certified before the fix


def view_matrices(W: np.ndarray, T: int, observer: int) -> np.ndarray:
    """``M[u]`` (n, T, T) for every source u, from the explicit view of [K] eq. (3.1), own noise known.

    ``θ_{t+1} = W(θ_t + x_t + u_t)``; the observer records ``m_t = θ_t + x_t + u_t`` for itself and its
    neighbours, t < T, so ``y = H (x + u)`` with block ``(t, k) = S W^{t−k}``.  Its own noise columns
    are removed from the covariance; ``M[u] = G_uᵀ K⁺ G_u`` with ``G_u`` the columns of source u.
    """
    n = W.shape[0]
    obs = np.concatenate(
        [[observer], np.flatnonzero((W[observer] != 0) & (np.arange(n) != observer))]
    )
    m = obs.size
    powers = [np.linalg.matrix_power(W, a)[obs] for a in range(T)]
    H = np.zeros((T * m, T * n))
    for t in range(T):
        for k in range(t + 1):
            H[t * m : (t + 1) * m, k * n : (k + 1) * n] = powers[t - k]
    Hb = H.copy()
    Hb[:, [k * n + observer for k in range(T)]] = 0.0
    K = Hb @ Hb.T
    Kp = np.linalg.pinv(K, rcond=1e-10, hermitian=True)
    out = np.zeros((n, T, T))
    for u in range(n):
        G = H[:, [k * n + u for k in range(T)]]
        assert (
            np.linalg.norm(G - K @ Kp @ G) <= 1e-6 * max(np.linalg.norm(G), 1e-300) or u == observer
        )
        out[u] = G.T @ Kp @ G
    return out


def planar_value(M: np.ndarray, starts: int = 40, seed: int = 0) -> float:
    """max over unit vectors in R² of Σ M_st ⟨x_s, x_t⟩ = Σ M_st cos(θ_s − θ_t) (multi-start BFGS)."""
    T = M.shape[0]

    def neg(th):
        d = th[:, None] - th[None, :]
        return -float(np.sum(M * np.cos(d)))

    def grad(th):
        d = th[:, None] - th[None, :]
        return 2.0 * np.sum(M * np.sin(d), axis=1)

    rng = np.random.default_rng(seed)
    best = -np.inf
    for _ in range(starts):
        r = optimize.minimize(
            neg, rng.uniform(-np.pi, np.pi, T), jac=grad, method="BFGS", options={"gtol": 1e-12}
        )
        best = max(best, -r.fun)
    return best


def planar_values(Ms: np.ndarray, starts: int = 24, iters: int = 400, seed: int = 0) -> np.ndarray:
    """The same for a stack of M's, vectorised: rank-2 ascent ``V ← rownormalise(M V)`` from many starts
    (each value is attained by unit vectors in the plane, so it is a valid lower value)."""
    rng = np.random.default_rng(seed)
    N, T, _ = Ms.shape
    V = rng.standard_normal((N, starts, T, 2))
    V /= np.linalg.norm(V, axis=-1, keepdims=True)
    for _ in range(iters):
        G = np.einsum("nij,nsjk->nsik", Ms, V)
        V = G / np.maximum(np.linalg.norm(G, axis=-1, keepdims=True), 1e-300)
    vals = np.einsum("nsik,nij,nsjk->ns", V, Ms, V)
    return vals.max(axis=1)


def scalar_values(Ms: np.ndarray) -> np.ndarray:
    T = Ms.shape[1]
    C = np.array(np.meshgrid(*[[1.0, -1.0]] * T, indexing="ij")).reshape(T, -1).T
    return np.einsum("ci,nij,cj->nc", C, Ms, C).max(axis=1)


def dense_W(graph) -> np.ndarray:
    return metropolis_hastings(
        parse_graph(graph) if isinstance(graph, str) else graph, "hamilton"
    ).toarray()


def ring8() -> np.ndarray:
    return dense_W("ring:8")


def test_issue_reproduction_vectors_beat_the_vertex_maximum():
    """The reference itself: plane vectors exceed the scalar maximum on ring 8, T = 4, pair 0→1."""
    M = view_matrices(ring8(), 4, 1)[0]
    assert scalar_values(M[None])[0] == pytest.approx(ISSUE_SCALAR_VALUE, abs=1e-9)
    th = np.radians([0.0, 0.0, -150.8, 47.0])
    assert float(np.sum(M * np.cos(th[:, None] - th[None, :]))) == pytest.approx(
        ISSUE_VECTOR_VALUE, abs=1e-9
    )
    assert planar_value(M) == pytest.approx(PLANAR_OPTIMUM, abs=1e-9)


def test_cli_pair_certifies_the_vector_value(capsys):
    code = main(
        [
            "privacy",
            "pair",
            "--graph",
            "ring:8",
            "--protocol",
            "gossip-stream",
            "--alpha",
            "2",
            "--sigma",
            "1",
            "--steps",
            "4",
            "--source",
            "0",
            "--observer",
            "1",
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["bound"] == "certified"
    vec = planar_value(view_matrices(ring8(), 4, 1)[0])
    assert out["rdp"] >= vec - 1e-9  # α = 2, σ = 1: RDP = Δ²
    assert out["rdp"] >= PLANAR_OPTIMUM > ISSUE_VECTOR_VALUE
    assert out["scalar"] == pytest.approx(
        ISSUE_SCALAR_VALUE, abs=1e-9
    )  # reported, labelled, not certified
    assert out["exact"] is None and "sdp" in out["method"]
    assert out["rdp"] <= min(out["spectral"], out["abs"]) + 1e-12  # the tightest valid bound won


def test_api_matrix_and_pair_certify_the_vector_value():
    pm = privacy_matrix("ring:8", "gossip-stream", alpha=2, sigma=1, steps=4)
    pair = privacy_pair("ring:8", "gossip-stream", source=0, observer=1, alpha=2, sigma=1, steps=4)
    assert pm.matrix[0, 1] >= ISSUE_VECTOR_VALUE and pair["rdp"] >= ISSUE_VECTOR_VALUE
    assert pm.matrix[0, 1] == pytest.approx(pair["rdp"], rel=1e-7)
    assert any("vector" in note for note in pm.notes)


def test_node_ledger_certifies_the_vector_value():
    from hushnet.families.gossip.accounting import certified_sensitivities
    from hushnet.runs.spec import Budget, RunSpec

    sp = RunSpec(
        protocol="gossip-stream",
        task="mean",
        graph="ring:8",
        steps=4,
        seed=1,
        budget=Budget(1e6, 1e-5),
        sigma=1.0,
        protocol_params={},
    ).with_run_id()
    row = certified_sensitivities(sp, 0, ring8())[0]
    assert row[1] >= ISSUE_VECTOR_VALUE


def test_box_bound_is_sound_for_vectors_and_exact_only_with_a_certificate():
    rng = np.random.default_rng(4)
    for T in (3, 4, 6, 8):
        for _ in range(6):
            X = rng.normal(size=(T + 1, T)) + 0.3 * rng.normal(size=(T + 1, 1))
            M = X.T @ X
            r = box_quadratic_max(M, exact_limit=12)
            vec = planar_value(M, starts=10)
            assert r["value"] >= vec - 1e-9
            assert r["value"] >= r["scalar"] - 1e-9
            assert r["value"] <= min(r["spectral"], r["abs"]) + 1e-12
            if (
                r["exact"] is not None
            ):  # claimed exact: scalar and vector maxima agree (up to rounding)
                assert r["scalar"] == pytest.approx(r["value"], rel=1e-9)
                assert vec <= r["scalar"] + 1e-9
            up, lo, _ = sdp_box_bound(M)
            assert (
                lo <= vec + 1e-9 or lo >= vec - 1e-9
            )  # lo is attained (any dimension), up is a bound
            assert up >= max(vec, lo) - 1e-9


def test_two_rounds_and_nonnegative_M_are_exact():
    M = np.array([[1.0, -0.3], [-0.3, 0.5]])
    r = box_quadratic_max(M)
    assert r["exact"] == pytest.approx(2.1) and r["value"] == pytest.approx(2.1)
    r = box_quadratic_max(np.array([[1.0, 0.2, 0.1], [0.2, 1.0, 0.0], [0.1, 0.0, 0.5]]))
    assert r["exact"] == pytest.approx(r["lower"]) and "non-negative" in r["method"]


@pytest.mark.parametrize("T", [4, 5, 6])
def test_er18_no_certified_value_below_a_planar_contribution(T):
    """Issue 10 §1: on an 18-node Erdős–Rényi graph the scalar vertex maximum fell below what 2-D
    contributions achieve on many pairs; the certified matrix must cover every one of them."""
    g = parse_graph("er:18:0.3:3")
    assert g.is_connected()
    Wd = dense_W(g)
    pm = privacy_matrix(g, "gossip-stream", alpha=2, sigma=1, steps=T)
    below_scalar = 0
    for v in range(g.n):
        Ms = np.delete(view_matrices(Wd, T, v), v, axis=0)
        cert = np.delete(pm.matrix[:, v], v)
        planar = planar_values(Ms)
        assert np.all(cert >= planar - 1e-9 * np.maximum(planar, 1.0)), (v, np.max(planar - cert))
        below_scalar += int(np.sum(scalar_values(Ms) < planar - 1e-9))
    assert below_scalar > 0  # the setting does exercise the vector case


def test_audit_with_a_planar_pattern_stays_below_the_certified_value():
    """The audit runs the protocol with the source's per-round contributions as unit vectors in the
    plane (the worst planar pattern of the issue's pair): the pattern's own sensitivity exceeds the
    scalar maximum, yet neither it nor the attacker's empirical ε passes the certified value."""
    from hushnet.privacy import audit
    from hushnet.privacy.koskela import observer_set

    W = metropolis_hastings(parse_graph("ring:8"), "hamilton")
    M = view_matrices(W.toarray(), 4, 1)[0]
    V = planar_values(M[None], starts=8)  # warm the reference (value only)
    rng = np.random.default_rng(0)
    best, pattern = -np.inf, None
    for _ in range(20):  # the pattern itself: rank-2 ascent from a few starts
        P = rng.standard_normal((4, 2))
        P /= np.linalg.norm(P, axis=1, keepdims=True)
        for _ in range(400):
            P = M @ P
            P /= np.linalg.norm(P, axis=1, keepdims=True)
        val = float(np.trace(P.T @ M @ P))
        if val > best:
            best, pattern = val, P
    assert best == pytest.approx(V[0], abs=1e-9)
    with pytest.raises(ValueError, match="norm <= 1"):
        audit.audit_gossip_stream(
            W, 0, observer_set(W, 1, "neighbourhood"), 4, 1.0, known=[1], pattern=2 * pattern
        )
    r = audit.audit_gossip_stream(
        W,
        0,
        observer_set(W, 1, "neighbourhood"),
        4,
        1.0,
        audit.AuditOptions(n_train=3000, n_test=8000, seed=5),
        known=[1],
        pattern=pattern,
    )
    assert r["pattern_sensitivity_sq"] == pytest.approx(best, rel=1e-7)
    assert (
        r["pattern_sensitivity_sq"] > r["scalar_sensitivity_sq"] + 3e-4
    )  # the old certified value
    assert r["pattern_sensitivity_sq"] <= r["certified_sensitivity_sq"] + 1e-9
    assert r["empirical_epsilon"] <= r["certified_epsilon"] + 1e-12
