"""Central DP-SGD over the network, node side — **baseline: central DP-SGD with a trusted aggregator
(NOT decentralized)**.

The aggregator (:class:`~hushnet.protocols.central.CentralAggregator`) runs in the *operator's*
process (:mod:`hushnet.client.central`); every node runs :class:`~hushnet.protocols.central.CentralClient`
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

import base64
import json
import math
from typing import Any

import numpy as np

from hushnet.engine.actions import Fault, Finish, LedgerEntry, Send
from hushnet.engine.events import MessageArrived
from hushnet.engine.execute import execute
from hushnet.privacy.amplification import contributions_bound
from hushnet.privacy.conversions import DEFAULT_ORDERS
from hushnet.privacy.ledger import PrivacyEntry
from hushnet.runs.accounting import ContributionCost, dp_from_rdp
from hushnet.runs.driver import NodeEffects, RunDriver, RunRefused
from hushnet.runs.spec import Budget, PolicyDecision, RunSpec

PROTOCOL = "central-dpsgd"
LABEL = "baseline: central DP-SGD with a trusted aggregator (NOT decentralized)"
BOUND_NAME = (
    f"{LABEL}: Gaussian RDP α/(2σ²) per clipped gradient toward every other node, which sees only noisy "
    "models; the trusted aggregator (operator) sees every clipped gradient in the clear"
)
GRADIENT_COMMAND = "run.gradient"


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
    if budget.delta < delta:
        return PolicyDecision(
            False,
            f"spec δ={delta:g} exceeds this node's δ={budget.delta:g}",
            None,
            delta,
            "certified",
        )
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


class _GradientEffects(NodeEffects):
    """The node's effects, except that the reply to the aggregator is returned to the operator's call
    (not queued to a peer), a fault stops the batch, and a Finish is refused (a client never finishes)."""

    def __init__(self, driver: RunDriver, aggregator: int) -> None:
        super().__init__(driver)
        self.aggregator = aggregator
        self.reply: bytes | None = None

    def send(self, act: Send) -> None:
        if act.dst == self.aggregator:
            self.reply = act.payload
            self.driver.messages_out += 1
        else:
            super().send(act)

    def fault(self, act: Fault) -> bool:
        super().fault(act)
        return False

    def finish(self, act: Finish) -> None:
        raise RunRefused("protocol-error", "central client emitted Finish")


async def c_gradient(service, payload: bytes) -> bytes:
    """``run.gradient``: the operator's aggregator asks this node for its clipped gradient at one step.

    ``{"run_id", "request_b64"}`` → ``{"reply_b64"}``.  The ledger is charged first; a refused charge
    (budget exhausted) stops the run here and no gradient leaves.
    """
    run, args = service._run(payload)
    if run.spec.protocol != PROTOCOL:
        raise RunRefused(
            "wrong-protocol", f"run {run.run_id} is {run.spec.protocol}, not {PROTOCOL}"
        )
    if run.state in ("finished", "closed", "stopped", "cancelled"):
        raise RunRefused("run-over", f"run {run.run_id} is {run.state} at {run.node_id}")
    try:
        request = base64.b64decode(str(args.get("request_b64", "")), validate=True)
    except ValueError as exc:
        raise RunRefused("malformed", f"request is not base64: {exc}") from None
    if run.state == "accepted":
        run.start()
    run.messages_in += 1
    fx = _GradientEffects(run, aggregator=len(run.ids))
    if not execute(run.machine.handle(MessageArrived(fx.aggregator, request)), fx):
        if fx.faults:
            err = fx.faults[0].error
            raise RunRefused(getattr(err, "code", "protocol-error"), str(err))
        raise RunRefused(
            "budget", f"{run.node_id}: {run.reason}"
        )  # the charge was refused: no gradient left
    reply = fx.reply
    if reply is None:
        raise RunRefused("protocol-error", "the central client produced no gradient reply")
    run.note_progress(int(run.machine.last_step))
    return json.dumps({"node": run.node_id, "reply_b64": base64.b64encode(reply).decode()}).encode()
