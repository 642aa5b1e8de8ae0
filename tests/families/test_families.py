"""The family list: every protocol in exactly one family, dispatch without registration side effects,
and a family list that stays cheap to import."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from hushnet.families import FAMILIES, Family, RunCost, UnknownRunProtocol, family_of, protocols
from hushnet.protocols.registry import PROTOCOLS


def test_every_protocol_in_exactly_one_family() -> None:
    seen: dict[str, str] = {}
    for f in FAMILIES:
        assert isinstance(f, Family) and f.name and f.protocols
        for p in f.protocols:
            assert p not in seen, f"{p} in {seen[p]} and {f.name}"
            seen[p] = f.name
            assert family_of(p) is f
    assert set(seen) == set(protocols()) == set(PROTOCOLS)
    assert {f.name for f in FAMILIES} == {"walk", "pad", "gossip", "anonymity", "secagg", "central"}


def test_unknown_protocol_names_the_available_ones() -> None:
    with pytest.raises(UnknownRunProtocol, match="unknown protocol 'gossip-magic'.*rw-dpsgd"):
        family_of("gossip-magic")


def test_costs_are_run_costs() -> None:
    from hushnet.runs.accounting import contribution_cost
    from hushnet.runs.spec import Budget, RunSpec

    ids = [f"n{v}" for v in range(8)]
    for proto, extra in (
        ("rw-dpsgd", {}),
        ("local-dp-sgd", {}),
        ("central-dpsgd", {}),
        ("pad-complete-sum", {"task": "sum"}),
    ):
        spec = RunSpec(
            protocol=proto,
            task=extra.get("task", "logreg"),
            graph="complete:8",
            steps=20,
            seed=1,
            budget=Budget(50.0, 1e-5),
            sigma=3.0,
            cap=10,
        ).with_run_id()
        cost = contribution_cost(spec, 0, ids)
        assert isinstance(cost, RunCost), proto
        assert cost.curves(3.0).shape == (7, cost.orders.size)


def test_dispatch_needs_no_import_side_effect() -> None:
    """A fresh process maps every protocol's spec to machine parameters without importing the run service
    (registration by import was how families used to be wired)."""
    code = textwrap.dedent("""
        import sys
        from hushnet.families import protocols, family_of
        from hushnet.runs.spec import Budget, RunSpec
        for p in protocols():
            spec = RunSpec(protocol=p, task="logreg", graph="complete:8", steps=4, rounds=4, seed=1,
                           budget=Budget(50.0, 1e-5), sigma=3.0, gamma=0.5, cap=10)
            assert isinstance(spec.machine_params(), dict), p
        assert "hushnet.runs.service" not in sys.modules
    """)
    subprocess.run([sys.executable, "-c", code], check=True)


def test_family_list_is_cheap_to_import() -> None:
    """Every node process imports the family list; heavy libraries load only when a family needs them."""
    code = "import sys, hushnet.families; bad = [m for m in ('scipy', 'networkx', 'hushnet.privacy') if m in sys.modules]; assert not bad, bad"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    "proto,task",
    [
        ("rw-dpsgd", "logreg"),
        ("pad-complete-sum", "sum"),
        ("central-dpsgd", "logreg"),
        ("anon-walk-sgd", "logreg"),
        ("muffliato", "mean"),
        ("secagg-sum", "sum"),
    ],
)
def test_every_family_refuses_a_spec_delta_above_the_nodes(proto: str, task: str) -> None:
    """One refusal for a δ the node does not allow (PolicyDecision.delta_refusal), before any
    projection: a row at a larger δ is not within the node's budget whatever its ε."""
    from hushnet.runs.spec import Budget, RunSpec

    spec = RunSpec(
        protocol=proto,
        task=task,
        graph="complete:8",
        steps=20,
        seed=1,
        budget=Budget(50.0, 1e-5),
        sigma=3.0,
        cap=10,
    ).with_run_id()
    d = family_of(proto).project(spec, 0, Budget(50.0, 1e-7), None)
    assert not d.accept and d.reason == "spec δ=1e-05 exceeds this node's δ=1e-07", d.reason
    assert d.epsilon_row is None and d.delta == 1e-5 and d.bound == "certified"
