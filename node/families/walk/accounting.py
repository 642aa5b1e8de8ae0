"""The random walk's accounting: the node's projection before it accepts a run, the certified ledger
charge per contribution, and the paper's (uncertified) Theorem 3 row.

The certified random-walk bound (random-walk paper, Thm 3, exact horizon, with the spec's noise
condition) is *linear in the number of contributions*: ``ε_{u→v}(α) = N_u · α · s_{uv}/σ²``.  So
charging every contribution with the per-contribution row ``α·s_{u,:}/σ²`` composes on the ledger to
exactly the run-level value the node projected when it accepted the run; per order the charge is
``min(walk bound, α/(2σ²))`` (:class:`~hushnet.runs.accounting.ContributionCost`).  Over plain links
the receiver's gRPC peer *is* the sender, so only the sender-known view is accountable.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from hushnet.privacy.conversions import DEFAULT_ORDERS
from hushnet.runs.accounting import ContributionCost
from hushnet.runs.spec import Budget, PolicyDecision, RunSpec, evaluate_policy


def project_walk(
    spec: RunSpec, vertex: int, local: Budget | None = None, W: Any = None
) -> PolicyDecision:
    """Plain-link walks (``rw-dpsgd``, ``pad-complete-sgd``): the anonymous-sender view is refused —
    without onion relaying the receiver's gRPC peer *is* the sender."""
    if spec.view_model != "sender-known":
        return PolicyDecision(
            False,
            f"cannot project this node's privacy loss: view_model={spec.view_model!r} needs onion "
            "relaying (the anonymity family); plain links reveal the sender, so only "
            "'sender-known' is accountable",
            None,
            spec.budget.delta,
            "certified",
        )
    from hushnet.protocols.onion import VIEWS

    dec = evaluate_policy(spec, vertex, local, W)
    return replace(dec, details={**dec.details, "accounting_view": VIEWS["plain-links"].as_dict()})


def walk_cost(spec: RunSpec, vertex: int, ids: list[str], W=None, orders=None) -> ContributionCost:
    """Random-walk bound (exact horizon, the spec's view model and noise condition) ∧ local DP, per contribution."""
    from hushnet.privacy.randomwalk import alpha_max, rw_single_loss_matrix
    from hushnet.protocols.registry import transition_matrix

    o = np.asarray(DEFAULT_ORDERS if orders is None else orders, dtype=float)
    targets = [ids[v] for v in range(len(ids)) if v != vertex]
    if W is None:
        W = transition_matrix(spec.graph, spec.weights)
    known = spec.view_model == "sender-known"  # plain links: the receiver knows the sender
    S = rw_single_loss_matrix(W, spec.steps, 1.0, 1.0, horizon="exact", sender_known=known)
    row = np.delete(S[vertex], vertex)
    amax = alpha_max(spec.sigma, spec.constraint)
    view = "sender-known" if known else spec.view_model
    name = (
        f"random-walk bound ({view}, exact horizon, {spec.constraint} noise condition) ∧ local-DP"
    )
    return ContributionCost(targets, o, row, amax, name)


def paper_row(
    spec: RunSpec, vertex: int, contributions: float, W=None, *, sender_known: bool | None = None
) -> np.ndarray:
    """Theorem 3 as printed (ln T horizon, no σ condition), best order — labelled "paper".

    ``sender_known``: whether the receiver knows the sender (default: the spec's view model says so;
    onion relaying, :mod:`hushnet.families.anonymity`, decides it from its relay plan)."""
    from hushnet.privacy.paper.randomwalk import theorem3_printed_row
    from hushnet.protocols.registry import transition_matrix

    if W is None:
        W = transition_matrix(spec.graph, spec.weights)
    known = spec.view_model == "sender-known" if sender_known is None else sender_known
    return theorem3_printed_row(
        W,
        spec.steps,
        spec.sigma,
        vertex,
        contributions,
        spec.budget.delta,
        sender_known=known,
    )


#: what the random-walk report's "paper" column is
RW_PAPER_LABEL = (
    "paper: random-walk paper Thm 3 as printed (ln T horizon, no noise condition); not a guarantee"
)
