"""Accounting of secure sums (issue 10 §3): calibration, validation, soundness against every coalition and
dropout pattern, and the node-side projector/cost checked against an independent Gaussian-view computation."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from helpers.ddp import renyi_gaussian_numeric

from hushnet.privacy.conversions import DEFAULT_ORDERS, gdp_epsilon
from hushnet.privacy.secure_sum import (
    SecureSumError,
    SecureSumView,
    check_collusion,
    effective_sensitivity,
    share_std,
    view_sigma,
)
from hushnet.runs.spec import Budget, RunSpec


def test_share_std_makes_any_t_minus_c_honest_survivors_meet_the_target() -> None:
    exact = {"dim": None, "frac_bits": None}  # exact arithmetic: Δ_eff = Δ
    s = share_std(2.0, 0.5, 10, 3, **exact)
    assert s == pytest.approx(2.0 * 0.5 / math.sqrt(7))
    assert 7 * s * s == pytest.approx((2.0 * 0.5) ** 2)
    assert view_sigma(s, 0.5, 10, 3, **exact) == pytest.approx(2.0)
    # a bigger coalition than certified sees less unknown noise: the view is weaker, never stronger
    assert view_sigma(s, 0.5, 10, 5, **exact) < 2.0
    # on the fixed-point grid the noise covers Δ_eff > Δ (tests/privacy/test_secagg_rounding.py)
    grid = {"dim": 30, "frac_bits": 8}
    sg = share_std(2.0, 0.5, 10, 3, **grid)
    assert (
        sg == pytest.approx(2.0 * effective_sensitivity(0.5, 7, **grid) / math.sqrt(7)) and sg > s
    )
    assert view_sigma(sg, 0.5, 10, 3, **grid) == pytest.approx(2.0)
    assert (
        view_sigma(s, 0.5, 10, 3, **grid) < 2.0
    )  # the old calibration is no longer certified at σ


@pytest.mark.parametrize(
    "c,t,tol,msg",
    [
        (0, 5, 4, "< 1"),
        (4, 5, 4, "not below the secure sum's collusion tolerance"),
        (2, 2, 9, "no honest survivor"),
        (1.5, 5, 4, "integer"),
    ],
)
def test_bad_collusion_is_refused_with_one_line(c, t, tol, msg) -> None:
    with pytest.raises(SecureSumError, match=msg) as ei:
        check_collusion(t, c, tol)
    assert "\n" not in str(ei.value)


def test_every_coalition_and_dropout_pattern_sees_at_least_sigma_delta() -> None:
    """Enumerate (n = 7, t = 5, c = 2): every survivor set |U| ≥ t, every coalition A of ≤ c members (observer
    included), every honest target u ∈ U∖A: the noise A does not know has variance ≥ (σΔ)², and the Rényi
    divergence of A's view (vector input, shift of norm Δ in a random direction) is ≤ the charge α/(2σ²)."""
    n, t, c, sigma, delta_l2 = 7, 5, 2, 1.3, 0.7
    view = SecureSumView(sigma, delta_l2, t, c, tolerance=t - 1, frac_bits=None)
    s = view.share_std
    worst = math.inf
    for k in range(t, n + 1):
        for U in itertools.combinations(range(n), k):
            for a in range(1, c + 1):
                for A in itertools.combinations(range(n), a):
                    honest = [u for u in U if u not in A]
                    if not honest:
                        continue
                    worst = min(worst, len(honest) * s * s)
    assert worst >= (sigma * delta_l2) ** 2 * (1 - 1e-12)
    # vector input: the view is N(Σx + shift, worst·I); only the shift's norm matters — checked by quadrature
    rng = np.random.default_rng(1)
    shift = rng.standard_normal(6)
    shift *= delta_l2 / np.linalg.norm(shift)
    for alpha in (1.5, 2.0, 8.0, 32.0):
        numeric = renyi_gaussian_numeric(alpha, float(np.linalg.norm(shift)), math.sqrt(worst))
        assert numeric <= view.rdp(np.array([alpha]))[0] * (1 + 1e-7)
        assert numeric == pytest.approx(
            view.rdp(np.array([alpha]))[0], rel=1e-6
        )  # exact: the bound is attained


def _spec(**pp) -> RunSpec:
    return (
        RunSpec(
            protocol="secagg-dpsgd",
            task="logreg",
            graph="complete:8",
            steps=12,
            seed=3,
            budget=Budget(50.0, 1e-5),
            sigma=1.5,
            clip=0.5,
            step_size=0.1,
            noise="public-seed",
            protocol_params={"threshold": 6, "collusion": 2, **pp},
        )
        .with_run_id()
        .validate()
    )


def test_projector_and_cost_match_an_independent_gaussian_view() -> None:
    from hushnet.engine.actions import LedgerEntry
    from hushnet.families.secagg.accounting import ddp_cost, member_rounds, project_ddp

    spec = _spec()
    dec = project_ddp(spec, 2)
    assert dec.accept, dec.reason
    av = dec.details["accounting_view"]
    assert av["collusion"] == 2 and av["threshold"] == 6 and av["view_model"] == "aggregate"
    ids = [f"n{i}" for i in range(8)]
    cost = ddp_cost(spec, 2, ids)
    d = 7
    s = share_std(1.5, 1.0, 6, 2, dim=d, frac_bits=24)  # Δ = 2·clip
    ev = LedgerEntry(
        2, 0, "gradient", "aggregate", 1.0, s, 99.0, "secagg-dpsgd", spec.run_id, {"dim": d}
    )  # σ field ignored
    entry = cost.entry(ev, spec.run_id, "n2")
    assert sorted(entry.rdp) == [i for i in ids if i != "n2"]
    o = np.asarray(DEFAULT_ORDERS, dtype=float)
    # independent: the coalition's view has unknown-noise std √(t−c)·s on a shift of Δ_eff — by quadrature
    std = math.sqrt(6 - 2) * s
    eff = effective_sensitivity(1.0, 6 - 2, dim=d, frac_bits=24)
    for j in (0, len(o) // 2, len(o) - 1):
        if o[j] <= 64:
            assert entry.rdp["n0"][j] == pytest.approx(
                renyi_gaussian_numeric(float(o[j]), eff, std), rel=1e-6
            )
    assert entry.gdp_mu["n5"] == pytest.approx(1.0 / 1.5)
    # the projected row composes the rounds; exact GDP is never above it
    assert member_rounds(spec, 2) == 12
    eps_gdp = gdp_epsilon(math.sqrt(12) / 1.5, 1e-5)
    assert eps_gdp <= dec.worst_epsilon + 1e-9
    # more noise than declared in the entry is never under-charged; a sensitivity above the public Δ is refused
    with pytest.raises(ValueError, match="exceeds the public"):
        cost.entry(
            LedgerEntry(
                2, 0, "gradient", "aggregate", 1.5, s, 1.5, "secagg-dpsgd", spec.run_id, {"dim": d}
            ),
            spec.run_id,
            "n2",
        )


def test_projector_refuses_bad_parameters_with_the_reason() -> None:
    from hushnet.families.secagg.accounting import project_ddp

    dec = project_ddp(_spec(collusion=5), 0)  # tolerance t − 1 = 5: c must be below it
    assert not dec.accept and "collusion tolerance" in dec.reason
    dec = project_ddp(_spec(collusion=0), 0)
    assert not dec.accept and "knows its own noise" in dec.reason
    dec = project_ddp(_spec(threshold=9), 0)
    assert not dec.accept and "threshold" in dec.reason


def test_a_clip_beyond_the_fixed_point_range_is_refused() -> None:
    """A member whose gradient is out of range drops out — a dropout that would depend on its data — so the
    public clip must keep every entry in range: bits 16, frac_bits 12, 6 members → ±1.33 < clip 1.5."""
    from dataclasses import replace

    from hushnet.families.secagg.accounting import project_ddp

    spec = replace(_spec(bits=16, frac_bits=12, sample=6, threshold=5), clip=1.5, run_id="")
    dec = project_ddp(spec.with_run_id(), 0)
    assert not dec.accept and "fixed-point range" in dec.reason and "\n" not in dec.reason
    assert project_ddp(replace(spec, clip=1.0).with_run_id(), 0).accept


def test_plain_aggregation_is_charged_as_local_dp_of_the_share() -> None:
    from hushnet.families.secagg.accounting import project_ddp

    sec, plain = project_ddp(_spec(), 1), project_ddp(_spec(aggregation="plain"), 1)
    # the leader sees each share in the clear: multiplier σ/√(t−c) = σ/2, i.e. the secure run's row at σ = 0.75
    from dataclasses import replace

    same = project_ddp(replace(_spec(), sigma=0.75, run_id="").with_run_id(), 1)
    assert (
        plain.worst_epsilon == pytest.approx(same.worst_epsilon)
        and plain.worst_epsilon > 2 * sec.worst_epsilon
    )
    assert plain.details["accounting_view"]["view_model"] == "plain"


def test_sampled_rounds_are_counted_exactly_from_the_public_schedule() -> None:
    from hushnet.families.secagg.accounting import member_rounds
    from hushnet.families.secagg.dpsgd import round_members

    spec = _spec(sample=7, threshold=5, collusion=2)
    for v in range(8):
        assert member_rounds(spec, v) == sum(
            v in round_members(8, 7, spec.seed, r) for r in range(12)
        )
    assert sum(member_rounds(spec, v) for v in range(8)) == 7 * 12


def test_secagg_sum_gets_the_credit_only_when_its_spec_calibrates_for_it() -> None:
    """secagg-sum: with protocol_params.collusion the members add σΔ/√(t−c) and are charged α/(2σ²) as the
    sum's Gaussian view; without it, the old behaviour (noise σΔ, local-DP Gaussian bound) is unchanged."""
    from hushnet.engine.actions import LedgerEntry
    from hushnet.families.secagg.accounting import (
        project_secagg,
        secagg_sum_calibration,
        secagg_sum_cost,
    )

    base = dict(
        protocol="secagg-sum",
        task="sum",
        graph="complete:10",
        steps=1,
        seed=1,
        budget=Budget(10.0, 1e-5),
        sigma=2.0,
    )
    old = RunSpec(**base, protocol_params={"threshold": 8}).with_run_id()
    new = RunSpec(**base, protocol_params={"threshold": 8, "collusion": 3}).with_run_id()
    ids = [f"n{i}" for i in range(10)]
    assert secagg_sum_calibration(old) is None
    assert secagg_sum_cost(old, 0, ids).bound_name.startswith("local-DP Gaussian bound")
    view = secagg_sum_calibration(new, sensitivity=4.0, dim=1)
    eff = effective_sensitivity(4.0, 5, dim=1, frac_bits=24)  # the default grid's charge
    assert view.share_std == pytest.approx(2.0 * eff / math.sqrt(5)) and 0 < eff - 4.0 < 1e-6
    cost = secagg_sum_cost(new, 0, ids)
    ev = LedgerEntry(
        0,
        0,
        "value",
        "aggregate",
        4.0,
        view.share_std,
        view.share_std / 4.0,
        "secagg-sum",
        new.run_id,
        {"dim": 1},
    )
    e = cost.entry(ev, new.run_id, "n0")
    assert e.rdp["n1"] == pytest.approx(np.asarray(DEFAULT_ORDERS) / (2 * 2.0**2))
    d_old, d_new = project_secagg(old, 0), project_secagg(new, 0)
    assert (
        d_old.accept and d_new.accept and d_old.worst_epsilon == pytest.approx(d_new.worst_epsilon)
    )
    assert d_new.details["accounting_view"]["collusion"] == 3
    bad = RunSpec(**base, protocol_params={"threshold": 8, "collusion": 7}).with_run_id()
    assert not project_secagg(bad, 0).accept
