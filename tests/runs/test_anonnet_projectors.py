"""Node-side projections of the anonymity layer (no network): which view each run is accounted with."""

from __future__ import annotations

import numpy as np

from hushnet.families import family_of
from hushnet.families.anonymity.accounting import project_anon_walk, project_onion
from hushnet.families.secagg.accounting import project_secagg
from hushnet.families.walk.accounting import project_walk
from hushnet.runs.spec import Budget, RunSpec, parse_spec_toml

BASE = dict(
    task="logreg",
    graph="regular:10:4:1",
    steps=200,
    seed=3,
    budget=Budget(50.0, 1e-5),
    sigma=3.0,
    cap=30,
)


def test_every_anonymity_protocol_and_plain_walk_projects_through_its_family() -> None:
    """The run service asks the protocol's family: plain walks refuse the anonymous view, onion walks
    and the secure sum use their own projectors (not the generic walk policy)."""
    plain_anon = RunSpec(protocol="rw-dpsgd", view_model="anonymous", **BASE).with_run_id()
    for p in ("rw-dpsgd", "pad-complete-sgd"):
        d = family_of(p).project(
            RunSpec(**{**plain_anon.__dict__, "protocol": p, "run_id": ""}).with_run_id(),
            0,
            None,
            None,
        )
        assert not d.accept and "needs onion relaying" in d.reason
    for p in ("rw-dpsgd-onion", "secagg-sum", "anon-walk-sgd"):
        spec = RunSpec(protocol=p, view_model="anonymous", **BASE).with_run_id()
        got = family_of(p).project(spec, 0, None, None)
        want = {
            "rw-dpsgd-onion": project_onion,
            "secagg-sum": project_secagg,
            "anon-walk-sgd": project_anon_walk,
        }[p]
        ref = want(spec, 0, None, None)
        assert (got.accept, got.reason, got.bound, got.details) == (
            ref.accept,
            ref.reason,
            ref.bound,
            ref.details,
        )
        np.testing.assert_array_equal(got.epsilon_row, ref.epsilon_row)


def test_anonymous_view_only_with_onion_relaying() -> None:
    plain_anon = RunSpec(protocol="rw-dpsgd", view_model="anonymous", **BASE).with_run_id()
    d = project_walk(plain_anon, 0)
    assert not d.accept and "needs onion relaying" in d.reason
    onion_sk = RunSpec(protocol="rw-dpsgd-onion", view_model="sender-known", **BASE).with_run_id()
    assert not project_onion(onion_sk, 0).accept
    no_hops = RunSpec(
        protocol="rw-dpsgd-onion", view_model="anonymous", protocol_params={"hops": 0}, **BASE
    ).with_run_id()
    assert not project_onion(no_hops, 0).accept

    onion = RunSpec(
        protocol="rw-dpsgd-onion", view_model="anonymous", protocol_params={"hops": 3}, **BASE
    ).with_run_id()
    plain = RunSpec(protocol="rw-dpsgd", **BASE).with_run_id()
    a, s = project_onion(onion, 0), project_walk(plain, 0)
    assert a.accept and s.accept
    # onion relaying hides each delivery's sender, but its relays see the walk's trajectory: local DP,
    # never below the plain walk's certified sender-known bound
    assert a.details["accounting_view"]["view_model"] == "local"
    assert s.details["accounting_view"]["view_model"] == "sender-known"
    assert np.all(a.epsilon_row >= s.epsilon_row - 1e-12)
    assert a.details["N_u"] == s.details["N_u"]


def test_secagg_and_anon_walk_charge_without_anonymity_credit() -> None:
    sec = RunSpec(
        protocol="secagg-sum",
        task="sum",
        graph="complete:8",
        steps=1,
        seed=1,
        budget=Budget(50.0, 1e-5),
        sigma=2.0,
        protocol_params={"members": [0, 1, 2, 3, 4], "threshold": 3},
    ).with_run_id()
    d = project_secagg(sec, 2)
    assert (
        d.accept
        and d.details["N_u"] == 1.0
        and d.details["accounting_view"]["view_model"] == "aggregate"
    )
    # one Gaussian release at σ: the RDP curve α/(2σ²) converted by hushnet's one rule (improved), toward
    # everyone; never above Mironov's min over α of α/(2σ²) + ln(1/δ)/(α−1)
    from hushnet.privacy.conversions import linear_rdp_to_dp

    L = np.log(1e5)
    a = 1 + np.sqrt(L * 2 * 4.0)
    assert np.allclose(np.delete(d.epsilon_row, 2), linear_rdp_to_dp(1 / 8.0, 1e-5)[0], rtol=1e-12)
    assert np.all(np.delete(d.epsilon_row, 2) < a / 8.0 + L / (a - 1))
    assert project_secagg(sec, 6).details["N_u"] == 0.0  # not a member: nothing to charge
    from dataclasses import replace

    assert not project_secagg(replace(sec, sigma=0.0), 2).accept
    walk = RunSpec(
        protocol="anon-walk-sgd",
        task="logreg",
        graph="regular:12:3:1",
        steps=1,
        seed=1,
        budget=Budget(50.0, 1e-5),
        sigma=2.0,
        protocol_params={"updates_per_node": 4},
    ).with_run_id()
    w = project_anon_walk(walk, 0)
    assert w.details["N_u"] == 4.0 and w.details["accounting_view"]["dp_credit"] is False


def test_protocol_params_in_toml_and_signed_bytes() -> None:
    text = """
[run]
protocol = "rw-dpsgd-onion"
graph = "regular:10:4:1"
view_model = "anonymous"
steps = 50
sigma = 2.0
seed = 1
[run.protocol_params]
hops = 2
[task]
name = "logreg"
[budget]
epsilon = 10.0
delta = 1e-5
"""
    spec = parse_spec_toml(text)
    assert spec.machine_params()["onion_hops"] == 2
    assert b"protocol_params" in spec.canonical_bytes()
    plain = RunSpec(protocol="rw-dpsgd", **BASE)
    assert (
        b"protocol_params" not in plain.canonical_bytes()
    )  # older specs keep their bytes and run ids
