"""Closed-form source-anonymity model: docs/design/spec/anonymity.md §4.2–§4.6 reference values and §5.1 properties."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hushnet.privacy.anonymity import (
    MODES,
    RRGModel,
    entropy,
    entropy_w,
    kappa_midpoint,
    log_likelihood,
    mean_iteration_time,
    mean_return_time_nonretro,
    p_star,
    posterior_w,
    return_tail_conditioned,
    t1_return_bound,
    theorem1_rho,
    theorem2_bound,
    theorem3_alpha,
    theorem3_proof_rho,
    tree_shell_sizes,
    tv_distance,
)

N = 300
ELLS = np.arange(2, 7)
LOG5 = math.log(5)
M3 = RRGModel(N, 3)
M4 = RRGModel(N, 4)


# ----------------------------------------------------------------------------- §5.1 items 1–3


@pytest.mark.parametrize("c", [3, 4])
@pytest.mark.parametrize("ell", range(1, 8))
def test_anon_sp_pmf_normalised_with_paper_mean(c: int, ell: int) -> None:
    m = RRGModel(N, c)
    t = np.arange(0, 6001)
    f = m.sp_pmf(t, ell)
    assert np.all(f >= 0)
    assert abs(f.sum() - 1.0) < 1e-9
    assert abs((t * f).sum() - c * ell / (c - 2)) < 1e-6
    # decay rate gamma: f(t+2)/f(t) -> e^{-2 gamma} (t^{-3/2} prefactor ~ 1 at large t)
    tt = 3000 + ((3000 - ell) % 2)
    ratio = f[tt + 2] / f[tt]
    assert abs(-0.5 * math.log(ratio) - m.gamma) < 2e-3


@pytest.mark.parametrize("c", [3, 4])
def test_anon_not_sp_pmf_normalised_with_eq3_mean(c: int) -> None:
    m = RRGModel(N, c)
    t = np.arange(0, 60001)
    for ell in (2, 6):
        f = m.nsp_pmf(t, ell)
        assert f[: ell + 1].sum() == 0.0
        assert abs(f.sum() - 1.0) < 1e-12
        assert abs((t * f).sum() - (ell + 1.0 / (1.0 - math.exp(-m.a)))) < 1e-6


@pytest.mark.parametrize("delta", [1.0, 5.0, 12.0])
def test_anon_lemma1_closed_form_equals_brute_force(delta: float) -> None:
    m = M3
    A = tree_shell_sizes(3, ELLS)
    for kappa in (math.inf, 634.0, 218.0):
        lam = np.exp(log_likelihood(m, 2, 6, kappa, mode="paw", delta=delta, A=A))
        center = m.truncated_mean_assumption2(ELLS, kappa, printed=True)
        k = np.arange(int(2 * delta) + 1)
        t = center[:, None] - delta + k[None, :]  # real-valued t, as in the proof
        brute = (
            m.phi(ELLS)[:, None] / A[:, None] * math.expm1(m.a) * np.exp(-m.a * (t - ELLS[:, None]))
        ).sum(axis=1)
        np.testing.assert_allclose(lam, brute, rtol=1e-12)


# ----------------------------------------------------------------------------- §5.1 items 4–6


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("c", [3, 4])
def test_anon_p_star_makes_w_uniform_at_kappa(mode: str, c: int) -> None:
    m = RRGModel(N, c)
    for kappa in (634.0, 100.0, math.inf):
        p = p_star(m, 2, 6, kappa, mode=mode)
        assert p.shape == (5,) and np.all(p >= 0) and abs(p.sum() - 1) < 1e-12
        w = posterior_w(p, m, 2, 6, kappa, mode=mode)
        np.testing.assert_allclose(w, 0.2, atol=1e-12)
        assert abs(float(entropy(w)) - LOG5) < 1e-12


@pytest.mark.parametrize("mode", ["paw", "cor"])
def test_anon_p_star_and_w_invariant_in_delta(mode: str) -> None:
    kp = np.array([8.0, 50.0, 218.0, 1000.0, math.inf])
    p5 = p_star(M3, 2, 6, 634, mode=mode, delta=5)
    w5 = posterior_w(p5, M3, 2, 6, kp, mode=mode, delta=5)
    for delta in (0.5, 2.0, 17.0, 60.0):
        p = p_star(M3, 2, 6, 634, mode=mode, delta=delta)
        np.testing.assert_allclose(p, p5, atol=1e-12)
        np.testing.assert_allclose(
            posterior_w(p, M3, 2, 6, kp, mode=mode, delta=delta), w5, atol=1e-12
        )


def test_anon_full_mode_depends_on_delta() -> None:
    """Erratum E11: δ cancels under Assumption 1 (PAW/COR) but not without it (FULL)."""
    for kappa in (20.0, 634.0):
        spread = {}
        for mode in MODES:
            d = log_likelihood(M3, 2, 6, kappa, mode=mode, delta=5) - log_likelihood(
                M3, 2, 6, kappa, mode=mode, delta=40
            )
            spread[mode] = float(d.max() - d.min())
        assert spread["paw"] < 1e-12 and spread["cor"] < 1e-12
        assert spread["full"] > 1e-6


def test_anon_truncated_mean_exact_vs_brute_force_and_prop1_erratum() -> None:
    m = M3
    for ell in (2, 4, 6):
        for kappa in (10, 50, 218, 634, 3000):
            t = np.arange(ell + 1, kappa + 1)
            f = m.nsp_pmf(t, ell)
            brute = (t * f).sum() / f.sum()
            assert abs(float(m.truncated_mean_nsp(ell, kappa)) - brute) < 1e-9
    printed = float(m.truncated_mean_nsp(2, 218, printed=True))
    assert abs(printed - 607.12) < 0.01 and printed > 218  # E4: a mean given T <= 218 above 218
    ref = {10: (751.5, 6.49), 218: (607.1, 104.0), 634: (603.6, 264.0), math.inf: (602.5, 602.5)}
    for kappa, (pr, co) in ref.items():
        assert abs(float(m.truncated_mean_nsp(2, kappa, printed=True)) - pr) < 0.051
        assert abs(float(m.truncated_mean_nsp(2, kappa)) - co) < 0.051


def test_anon_side_information_must_exceed_ell2() -> None:
    with pytest.raises(ValueError):
        log_likelihood(M3, 2, 6, 6.0)
    with pytest.raises(ValueError):
        theorem1_rho(M3, 2, 6, 634, 5.0)


# ----------------------------------------------------------------------------- §5.1 items 7–8

KP_GRID = np.concatenate([np.arange(7, 6001, dtype=float), [math.inf]])


@pytest.mark.parametrize("c", [3, 4])
@pytest.mark.parametrize("kappa", [100.0, 476.0, 634.0, 2000.0])
def test_anon_theorem1_bounds_hold_on_grid(c: int, kappa: float) -> None:
    m = RRGModel(N, c)
    for mode, checks in (
        ("paw", [("printed", "printed"), ("printed", "tight"), ("shifted", "tight")]),
        ("cor", [("corrected", "tight"), ("corrected", "printed"), ("shifted", "tight")]),
    ):
        p = p_star(m, 2, 6, kappa, mode=mode)
        w = posterior_w(p, m, 2, 6, KP_GRID, mode=mode)
        tv = tv_distance(w, np.full(5, 0.2))
        for version, norm in checks:
            rho = theorem1_rho(
                m, 2, 6, kappa, KP_GRID, version=version, normalizer=norm, shift_mode=mode
            )
            assert np.all(tv <= rho + 1e-12), (mode, version, norm)
    # the printed bound is not a bound in FULL mode (docs/design/spec/anonymity.md §3.6): it fails somewhere on the grid
    if c == 3 and kappa == 634.0:
        p = p_star(m, 2, 6, kappa, mode="full")
        tv = tv_distance(posterior_w(p, m, 2, 6, KP_GRID, mode="full"), np.full(5, 0.2))
        assert np.any(tv > theorem1_rho(m, 2, 6, kappa, KP_GRID) + 1e-6)


def test_anon_theorem2_lower_bounds_entropy_and_is_decreasing() -> None:
    for c in (3, 4):
        m = RRGModel(N, c)
        for mode in MODES:
            p = p_star(m, 2, 6, 634, mode=mode)
            w = posterior_w(p, m, 2, 6, KP_GRID[::7], mode=mode)
            rho = tv_distance(w, np.full(5, 0.2))
            assert np.all(entropy(w) >= theorem2_bound(rho, 5) - 1e-12)
    r = np.linspace(1e-6, 1 - 1 / 5 - 1e-6, 2000)
    b = theorem2_bound(r, 5)
    assert np.all(np.diff(b) <= 0)
    pos = b > 0  # strictly decreasing until the clamp at 0 takes over
    assert pos.sum() > 1000 and np.all(np.diff(b[pos]) < 0)
    assert theorem2_bound(0.0, 5) == pytest.approx(LOG5)
    assert theorem2_bound(0.8, 5) == 0.0  # vacuous at rho >= 1 - 1/K


# ----------------------------------------------------------------------------- §4.2 constants (item 9)


def test_anon_constants_section_4_2() -> None:
    assert M3.c_prime == 0.5 and abs(M4.c_prime - 0.6667) < 1e-4
    assert N / M3.c_prime == 600.0 and abs(N / M4.c_prime - 450.0) < 1e-9
    assert abs(mean_return_time_nonretro(N, 3) - 598.50) < 0.01
    assert abs(mean_return_time_nonretro(N, 4) - 449.50) < 0.01
    assert abs(t1_return_bound(N, 3, 2, 0.3) - 218.00) < 0.01
    assert abs(t1_return_bound(N, 4, 2, 0.3) - 164.50) < 0.01
    assert abs(kappa_midpoint(N, 3, 2, 0.3) - 633.89) < 0.01
    assert abs(kappa_midpoint(N, 4, 2, 0.3) - 476.42) < 0.01
    assert abs(M3.gamma - 0.05889) < 1e-5 and abs(M4.gamma - 0.14384) < 1e-5
    np.testing.assert_allclose(
        M3.p_sp(ELLS), [0.25333, 0.12833, 0.06583, 0.03458, 0.01896], atol=6e-6
    )
    np.testing.assert_allclose(
        M4.p_sp(ELLS), [0.11444, 0.04037, 0.01568, 0.00745, 0.00471], atol=6e-6
    )
    np.testing.assert_allclose(M3.mean(ELLS), [451.39, 527.21, 565.49, 585.08, 595.34], atol=0.006)
    np.testing.assert_allclose(M4.mean(ELLS), [401.17, 435.43, 447.50, 452.18, 454.41], atol=0.006)
    np.testing.assert_allclose(M3.mean_nsp([2, 6]), [602.5, 606.5], atol=0.01)
    np.testing.assert_allclose(M4.mean_nsp([2, 6]), [452.5, 456.5], atol=0.01)
    # eq. (6) tail values quoted in §3.3
    np.testing.assert_allclose(
        return_tail_conditioned([218, 634], N, 3, 2), [0.698, 0.348], atol=6e-4
    )
    assert abs(float(return_tail_conditioned(218, N, 4, 2)) - 0.620) < 6e-4


# ----------------------------------------------------------------------------- §4.3 p* tables


P_STAR_REF = {
    ("paw", 3): [0.0333, 0.0648, 0.1288, 0.2576, 0.5155],
    ("cor", 3): [0.0377, 0.0681, 0.1306, 0.2562, 0.5074],
    ("full", 3): [0.0366, 0.0672, 0.1301, 0.2564, 0.5097],
    ("paw", 4): [0.0083, 0.0248, 0.0743, 0.2230, 0.6696],
    ("cor", 4): [0.0088, 0.0252, 0.0747, 0.2231, 0.6682],
    ("full", 4): [0.0086, 0.0251, 0.0746, 0.2230, 0.6687],
}


@pytest.mark.parametrize("key", sorted(P_STAR_REF))
def test_anon_p_star_table_tree_shells(key: tuple[str, int]) -> None:
    mode, c = key
    p = p_star(RRGModel(N, c), 2, 6, 634, mode=mode, delta=5)
    np.testing.assert_allclose(p, P_STAR_REF[key], atol=5.1e-5)


def test_anon_p_star_lemma2_kappa_infinity() -> None:
    p = p_star(M3, 2, 6, math.inf, mode="paw", full_mean_at_infinity=True)
    np.testing.assert_allclose(p, [0.0335, 0.0650, 0.1290, 0.2576, 0.5149], atol=5.1e-5)
    # E10: with Assumption 2's mean instead, p* moves by < 0.2 % relative
    q = p_star(M3, 2, 6, math.inf, mode="paw")
    assert np.max(np.abs(q / p - 1)) < 2e-3


# ----------------------------------------------------------------------------- §4.4 Fig. 1 table

FIG1_KP = np.array([8, 12, 20, 50, 100, 218, 400, 634, 1000, math.inf])
FIG1_REF = {
    "paw": [1.3713, 1.5707, 1.6027, 1.6089, 1.6093, 1.6094, 1.6094, 1.6094, 1.6094, 1.6094],
    "full": [1.2152, 1.2705, 1.2587, 1.4013, 1.5768, 1.6094, 1.6094, 1.6094, 1.6094, 1.6088],
    "cor": [1.6088, 1.6088, 1.6088, 1.6089, 1.6090, 1.6092, 1.6094, 1.6094, 1.6093, 1.6082],
    "base_paw": [0.9388, 1.1123, 1.1904, 1.2339, 1.2447, 1.2500, 1.2519, 1.2527, 1.2532, 1.2535],
    "base_full": [0.7275, 0.7597, 0.7502, 0.8305, 1.0924, 1.2828, 1.2862, 1.2794, 1.2716, 1.2539],
}
FIG1_RHO = [6.173, 0.963, 0.3615, 0.1041, 0.0438, 0.0148, 0.0044, 0.0, 0.0025, 0.0044]
FIG1_THM2 = [0.0, 0.0, 0.298, 1.102, 1.358, 1.508, 1.574, 1.6094, 1.588, 1.574]


def test_anon_fig1_reference_table() -> None:
    u = np.full(5, 0.2)
    for mode in MODES:
        H = entropy_w(p_star(M3, 2, 6, 634, mode=mode), M3, 2, 6, FIG1_KP, mode=mode)
        np.testing.assert_allclose(H, FIG1_REF[mode], atol=1e-4, err_msg=mode)
    np.testing.assert_allclose(
        entropy_w(u, M3, 2, 6, FIG1_KP, mode="paw"), FIG1_REF["base_paw"], atol=1e-4
    )
    np.testing.assert_allclose(
        entropy_w(u, M3, 2, 6, FIG1_KP, mode="full"), FIG1_REF["base_full"], atol=1e-4
    )
    rho = theorem1_rho(M3, 2, 6, 634, FIG1_KP)
    np.testing.assert_allclose(rho, FIG1_RHO, rtol=1.5e-3, atol=1e-4)
    np.testing.assert_allclose(theorem2_bound(rho, 5), FIG1_THM2, atol=1e-3)


def test_anon_fig1_invariants() -> None:
    kp = np.concatenate([np.arange(7, 3001, dtype=float), [math.inf]])
    u = np.full(5, 0.2)
    for mode in MODES:
        H = entropy_w(p_star(M3, 2, 6, 634, mode=mode), M3, 2, 6, kp, mode=mode)
        base = entropy_w(u, M3, 2, 6, kp, mode=mode)
        assert np.all(H >= base - 1e-12), mode
        assert (
            abs(
                float(entropy_w(p_star(M3, 2, 6, 634, mode=mode), M3, 2, 6, 634.0, mode=mode))
                - LOG5
            )
            < 1e-12
        )
    H = entropy_w(p_star(M3, 2, 6, 634, mode="paw"), M3, 2, 6, kp, mode="paw")
    assert np.all(theorem2_bound(theorem1_rho(M3, 2, 6, 634, kp), 5) <= H + 1e-12)


def test_anon_fig1_c4_values() -> None:
    p = p_star(M4, 2, 6, 634, mode="paw")
    H = entropy_w(p, M4, 2, 6, np.array([8, 12, 20, 50, 100, 218, 634, 2000, math.inf]), mode="paw")
    np.testing.assert_allclose(H[:5], [1.3717, 1.5720, 1.6031, 1.6089, 1.6093], atol=1e-4)
    np.testing.assert_allclose(H[5:], LOG5, atol=1e-4)
    assert abs(float(entropy_w(np.full(5, 0.2), M4, 2, 6, 634.0, mode="paw")) - 0.93) < 0.01


# ----------------------------------------------------------------------------- §4.5 Fig. 2 table

FIG2_REF = [  # 1-δ', t1, α_emp, ρ_max, α_bound
    (0.5, 419.9, 1.6094, 0.0044, 1.574),
    (0.7, 218.0, 1.6094, 0.0147, 1.509),
    (0.8, 137.9, 1.6094, 0.0288, 1.432),
    (0.9, 67.2, 1.6092, 0.0711, 1.236),
    (0.95, 34.8, 1.6080, 0.1640, 0.885),
    (0.99, 10.0, 1.5542, 1.2187, 0.0),
]


@pytest.mark.parametrize("row", FIG2_REF)
def test_anon_fig2_reference_table(row: tuple[float, ...]) -> None:
    cov, t1, a_emp, rho, a_bound = row
    r = theorem3_alpha(M3, 2, 6, 634.0, 1.0 - cov, mode="paw")
    assert abs(r.t1 - t1) < 0.051
    assert abs(r.alpha_emp - a_emp) < 1e-4
    assert abs(r.rho_max - rho) < 6e-5 + 5e-4 * rho
    assert abs(r.alpha_bound - a_bound) < 1e-3


def test_anon_fig2_claim_and_certified_bounds() -> None:
    """Near-optimal (≥ log5 − 0.002) up to 90 % coverage; certified bounds are valid lower bounds."""
    for cov in (0.5, 0.7, 0.8, 0.9, 0.95, 0.99):
        for mode in ("paw", "cor"):
            r = theorem3_alpha(
                M3, 2, 6, 634.0, 1 - cov, mode=mode, version="shifted", normalizer="tight"
            )
            assert r.alpha_bound <= r.alpha_emp + 1e-12
        if cov <= 0.9:
            assert theorem3_alpha(M3, 2, 6, 634.0, 1 - cov, mode="paw").alpha_emp > LOG5 - 0.002
    # Corollary 1 (ε -> 2ε) is weaker than Theorem 3
    r1 = theorem3_alpha(M3, 2, 6, 634.0, 0.3, mode="paw")
    r2 = theorem3_alpha(M3, 2, 6, 634.0, 0.3, mode="paw", eps_scale=2.0)
    assert r2.rho_max > r1.rho_max and r2.alpha_bound < r1.alpha_bound
    # the proof's order-wise ρ is a finite positive number (labelled paper, not checked as a bound)
    assert 0 < theorem3_proof_rho(M3, 2, 6, 0.3) < 1


# ----------------------------------------------------------------------------- §4.6 Fig. 3 table

FIG3_REF = {  # ℓ2: (α, T c=3, T c=4)
    2: (0.0, 451.4, 401.2),
    3: (0.693, 501.5, 426.8),
    4: (1.099, 537.8, 441.1),
    5: (1.386, 562.9, 448.6),
    6: (1.609, 579.6, 452.5),
    7: (1.792, 590.5, 454.7),
    8: (1.946, 597.4, 456.2),
}


@pytest.mark.parametrize("ell2", sorted(FIG3_REF))
def test_anon_fig3_reference_table(ell2: int) -> None:
    alpha, t3, t4 = FIG3_REF[ell2]
    for m, ref in ((M3, t3), (M4, t4)):
        p = p_star(m, 2, ell2, 634.0, mode="paw")
        assert abs(mean_iteration_time(m, p, 2) - ref) < 0.051
        assert abs(float(entropy_w(p, m, 2, ell2, 634.0, mode="paw")) - alpha) < 5e-4
