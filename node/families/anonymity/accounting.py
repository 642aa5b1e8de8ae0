"""The anonymity layer's accounting: the node's projection before it accepts a run, and the onion
run's relay plan and view.

What each mechanism really licenses (``hushnet.families.views.VIEWS``): onion-relayed RW DP-SGD is
charged at **local DP** per contribution — per delivery the relay plan hides the sender from the
receiver, but every node also relays the walk's other hops and sees part of its trajectory, which no
random-walk bound covers; the source-anonymous walk charges every update as attributable (source
anonymity has no DP theorem, entropy is a diagnostic).  The ledger cost of both is the family
default: the contribution seen in the clear.  :func:`ldp_decision` (contributions each seen in the
clear, at the best order) is shared with secure summation.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from hushnet.families.anonymity.params import RW_DPSGD_ONION, anon_walk_params
from hushnet.families.views import VIEWS
from hushnet.families.walk.accounting import evaluate_policy
from hushnet.families.walk.params import RW_DPSGD
from hushnet.runs.spec import Budget, PolicyDecision, RunSpec


def onion_relay_plan(spec: RunSpec, W=None):
    """The :class:`~hushnet.families.anonymity.onion.RelayPlan` of an onion run (the machines derive the same)."""
    from hushnet.families.anonymity.onion import relay_plan
    from hushnet.protocols.registry import transition_matrix

    hops = int(spec.protocol_params.get("hops", 3))
    slots = int(spec.protocol_params.get("slots", hops + 8))
    return relay_plan(
        W if W is not None else transition_matrix(spec.graph, spec.weights), hops, slots
    )


def sender_known(spec: RunSpec, W=None) -> bool:
    """Whether the receiver may know the sender: plain links, or onion relaying whose relay plan cannot
    make the last relay independent of the sender on this graph (then the anonymous view is not granted)."""
    if spec.view_model == "sender-known":
        return True
    return spec.protocol == RW_DPSGD_ONION and not onion_relay_plan(spec, W).independent


def refuse(spec: RunSpec, reason: str) -> PolicyDecision:
    return PolicyDecision(
        False,
        f"cannot project this node's privacy loss: {reason}",
        None,
        spec.budget.delta,
        "certified",
    )


def project_onion(
    spec: RunSpec, vertex: int, local: Budget | None = None, W: Any = None
) -> PolicyDecision:
    """Onion-relayed RW DP-SGD: charged at **local DP** per contribution (``N_u`` contributions, each seen
    in the clear).  The relay plan hides each delivery's sender from its receiver, but every node also
    relays the walk's other hops and sees part of its trajectory, which no random-walk bound covers
    (``VIEWS["onion-relay"]``).  Refused unless relaying is on (``hops ≥ 1``) and the spec says
    ``view_model = "anonymous"`` (what the mechanism provides per delivery)."""
    hops = int(spec.protocol_params.get("hops", 3))
    if hops < 1:
        return refuse(spec, f"{RW_DPSGD_ONION} with hops < 1 relays nothing")
    if spec.view_model != "anonymous":
        return refuse(
            spec,
            f"{RW_DPSGD_ONION} hides the sender: its spec must say view_model = 'anonymous' "
            "(each delivery's sender is hidden from its receiver; the charge is local DP)",
        )
    from hushnet.families.anonymity.onion import onion_view

    plan = onion_relay_plan(spec, W)
    walk = evaluate_policy(
        replace(spec, protocol=RW_DPSGD, view_model="sender-known"), vertex, local, W
    )
    if walk.epsilon_row is None:  # refused before any projection (δ, noise condition …): say why
        return walk
    n_u = float(walk.details.get("N_u", 0.0))
    dec = ldp_decision(
        spec,
        vertex,
        local,
        spec.n,
        n_u,
        spec.sigma,
        "local DP: onion relays observe the walk's trajectory",
        "onion-relay",
    )
    return replace(
        dec,
        details={**dec.details, "accounting_view": {**onion_view(plan), "charged_as": "local DP"}},
    )


def ldp_decision(
    spec: RunSpec,
    vertex: int,
    local: Budget | None,
    n: int,
    contributions: float,
    sigma: float,
    what: str,
    view: str,
) -> PolicyDecision:
    """``contributions`` Gaussian releases with noise multiplier ``sigma``, each seen in the clear."""
    from hushnet.runs.spec import _best_order_dp

    budget = local or spec.budget
    refused = PolicyDecision.delta_refusal(spec.budget.delta, budget.delta)
    if refused is not None:
        return refused
    if not (sigma > 0 and math.isfinite(sigma)):
        return refuse(
            spec,
            f"{spec.protocol} needs sigma > 0 (noise multiplier): a release without noise is not private",
        )
    row = _best_order_dp(
        np.full(n, contributions / (2.0 * sigma**2)), math.inf, math.log(1.0 / spec.budget.delta)
    )
    row[vertex] = 0.0
    det = {
        "N_u": float(contributions),
        "accounting_view": {**VIEWS[view].as_dict(), "charged_as": what},
    }
    return PolicyDecision.certified(row, spec.budget.delta, budget.epsilon, det, what)


def project_anon_walk(
    spec: RunSpec, vertex: int, local: Budget | None = None, W: Any = None
) -> PolicyDecision:
    p = anon_walk_params(spec)
    return ldp_decision(
        spec,
        vertex,
        local,
        spec.n,
        float(p["updates_per_node"]),
        spec.sigma,
        "every update charged as attributable (no anonymity credit)",
        "source-anonymous-walk",
    )
