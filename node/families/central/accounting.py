"""Central DP-SGD's accounting — **baseline: central DP-SGD with a trusted aggregator (NOT
decentralized)**: the node's acceptance projection and the ledger cost of each gradient request.

The aggregator (:class:`~hushnet.families.central.machines.CentralAggregator`) runs in the *operator's*
process (:mod:`hushnet.families.central.operator`); every node runs :class:`~hushnet.families.central.machines.CentralClient`
in its run driver.  Requests travel over the operator's authenticated control channel: the
``run.gradient`` command of the ``Control`` RPC, which the node serves only to callers whose
mutual-TLS certificate is an operator certificate issued by the node's own network CA.  The
client machine additionally refuses a request that does not come from the aggregator vertex or
replays an earlier step.

**What each party observes, and the bound.**  The aggregator receives each sampled node's clipped
gradient *in the clear*: there is no privacy toward it — it is trusted by assumption, and the report
says so.  It adds N(0, (2·C·σ)²) to the gradient and steps (sensitivity of a clipped gradient under
replacement: 2C).  Every other node observes only models the aggregator sent it (when sampled),
a post-processing of the noisy updates; so each contribution of u costs at most the Gaussian RDP
``α/(2σ²)`` toward every other node (certified; the amplification by the aggregator's uniform
sampling is *not* claimed).  The projection bounds u's Binomial(T, 1/n) number of samples with the
Chernoff bound of P-AD App. D at δ̂ = the spec's δ; the ledger is charged per real request, before
the gradient leaves.  The final model stays with the operator.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from hushnet.engine.actions import LedgerEntry
from hushnet.families.central.params import LABEL
from hushnet.privacy.amplification import contributions_bound
from hushnet.privacy.conversions import DEFAULT_ORDERS
from hushnet.privacy.ledger import PrivacyEntry
from hushnet.runs.accounting import ContributionCost, dp_from_rdp
from hushnet.runs.spec import Budget, PolicyDecision, RunSpec

BOUND_NAME = (
    f"{LABEL}: Gaussian RDP α/(2σ²) per clipped gradient toward every other node, which sees only noisy "
    "models; the trusted aggregator (operator) sees every clipped gradient in the clear"
)


class CentralCost(ContributionCost):
    """Each request is charged with the *aggregator's* noise (the spec's σ), not the node's own (none)."""

    def __init__(self, spec: RunSpec, targets: list[str], orders: np.ndarray) -> None:
        super().__init__(targets, orders, None, math.inf, BOUND_NAME)
        self.sigma = float(spec.sigma)
        self.max_sensitivity = 2.0 * float(spec.clip)

    def entry(self, ev: LedgerEntry, run_id: str, node_id: str) -> PrivacyEntry:
        if ev.kind != "gradient":
            raise ValueError(f"central DP-SGD records gradient contributions, got {ev.kind!r}")
        if ev.sensitivity > self.max_sensitivity * (1.0 + 1e-12):
            raise ValueError(
                f"gradient sensitivity {ev.sensitivity:g} exceeds the public 2C={self.max_sensitivity:g}"
            )
        return PrivacyEntry.from_row(
            run_id,
            ev.protocol,
            "trusted-aggregator",
            "certified",
            self.targets,
            self.curves(self.sigma),
            note=f"clipped gradient sent in the clear to the trusted aggregator at step {ev.step} "
            f"({BOUND_NAME})",
        )


def central_cost(spec: RunSpec, vertex: int, ids: list[str], W=None, orders=None) -> CentralCost:
    o = np.asarray(DEFAULT_ORDERS if orders is None else orders, dtype=float)
    return CentralCost(spec, [ids[v] for v in range(len(ids)) if v != vertex], o)


def central_projector(
    spec: RunSpec, vertex: int, local_budget: Budget | None, W=None
) -> PolicyDecision:
    """Certified row toward the other nodes (central model); the aggregator is trusted, not in the row."""
    budget = local_budget or spec.budget
    delta = spec.budget.delta
    refused = PolicyDecision.delta_refusal(delta, budget.delta)
    if refused is not None:
        return refused
    n = spec.n if W is None else int(W.shape[0])
    bound, method = contributions_bound(int(spec.steps), float(n), delta)
    n_u = float(min(math.ceil(bound), spec.steps))
    o = np.asarray(DEFAULT_ORDERS, dtype=float)
    eps = dp_from_rdp(o, n_u * o / (2.0 * spec.sigma**2), delta)
    row = np.full(n, eps)
    row[vertex] = 0.0
    details: dict[str, Any] = {
        "N_u": n_u,
        "contributions": f"{method} bound on Binomial(T, 1/n) at δ̂={delta:g}",
        "accounting_view": {
            "label": "central: other nodes see noisy models only; the trusted "
            "aggregator (operator) sees the clipped gradients in the clear",
            "view_model": "central",
            "mechanism": "trusted aggregator",
        },
        "baseline": LABEL,
    }
    if eps > budget.epsilon:
        return PolicyDecision(
            False,
            f"over budget: projected certified loss toward every other node is ε={eps:.4g} at "
            f"δ={delta:g} ({LABEL}), this node's budget is ε={budget.epsilon:g}",
            row,
            delta,
            "certified",
            details,
        )
    return PolicyDecision(
        True,
        f"within budget (certified ε={eps:.4g} toward every other node; {LABEL}; "
        "the aggregator is trusted and sees clipped gradients)",
        row,
        delta,
        "certified",
        details,
    )
