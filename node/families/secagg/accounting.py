"""The secagg family's accounting: the node's projection before it accepts a run and the ledger cost,
for ``secagg-dpsgd`` and ``secagg-sum`` (the maths: :mod:`hushnet.privacy.secure_sum`).

* ``secagg-dpsgd`` (machine parameters: :func:`hushnet.families.secagg.params.ddp_params`, from the
  spec's ``steps`` = rounds, ``step_size``, ``sigma`` and ``protocol_params`` ``collusion``,
  ``threshold``, ``sample``, ``aggregation``, ``round_timeout``, ``leader_timeout``, ``frac_bits``,
  ``bits``, ``mask_degree``): every round a node is a member of is charged, toward **every other
  node**, the Gaussian view of :class:`hushnet.privacy.secure_sum.SecureSumView` (``α/(2σ²)``,
  μ = 1/σ), certified for any coalition of up to ``collusion`` members; the report's accounting view
  names ``c``.
* ``secagg-sum`` (:func:`project_secagg`): one contribution, the local-DP Gaussian bound of the input
  seen in the sum — unless ``protocol_params.collusion`` is set: then the members' noise is
  calibrated as ``σΔ_eff/√(t − c)`` and the charge is the same Gaussian view
  (:func:`secagg_sum_calibration`, which :mod:`hushnet.families.secagg.node` also asks for the noise).

The cost recomputes the certified multiplier from what the node's machine reports it added (its
share's std), the input's dimension it reports and the public ``t``, ``c``, ``frac_bits`` — never from a
σ field the machine chose.  Under secure aggregation Δ is read as Δ_eff ≥ Δ, which covers the
fixed-point rounding of the data and of the noise (rounded apart: :mod:`hushnet.privacy.secure_sum`,
*Fixed point*); the calibration adds it to the noise, so the projection's σ is unchanged.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from hushnet.engine.actions import LedgerEntry as EngineEntry
from hushnet.families.anonymity.accounting import ldp_decision, refuse
from hushnet.families.secagg.dpsgd import calibrate, round_members
from hushnet.families.secagg.params import (
    SECAGG_DPSGD,
    DDPParams,
    SecAggParams,
    ddp_params,
    sum_params,
)
from hushnet.privacy.conversions import DEFAULT_ORDERS
from hushnet.privacy.ledger import PrivacyEntry
from hushnet.privacy.secure_sum import SecureSumError, SecureSumView, gaussian_rdp, view_sigma
from hushnet.runs.accounting import ContributionCost
from hushnet.runs.spec import Budget, PolicyDecision, RunSpec, _best_order_dp


def spec_sensitivity(spec: RunSpec) -> float:
    """Δ of one member's input from public parameters: a mean of per-example gradients clipped to C moves by ≤ 2C."""
    return 2.0 * float(spec.clip)


def spec_view(spec: RunSpec) -> SecureSumView:
    """The certified view of the spec's rounds (validates c against t and the secure sum's tolerance)."""
    p = ddp_params(spec)
    return calibrate(DDPParams(**p), spec.n, spec_sensitivity(spec))


def member_rounds(spec: RunSpec, vertex: int) -> int:
    """How many rounds ``vertex`` is a member of (public sampling: exact, not an expectation)."""
    p = ddp_params(spec)
    sample = p.get("sample")
    if sample is None or sample >= spec.n:
        return int(spec.steps)
    return sum(
        vertex in round_members(spec.n, sample, spec.seed, r) for r in range(int(spec.steps))
    )


def entry_dim(ev: EngineEntry) -> int:
    """The input's dimension a secure-sum entry reports: the fixed-point rounding's Δ_eff depends on it."""
    d = (ev.detail or {}).get("dim")
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
        raise ValueError(
            f"a secure-sum entry must report its input's dimension (the fixed-point charge needs it), got {d!r}"
        )
    return int(d)


class SecureSumCost(ContributionCost):
    """Charge of one round's input: the Gaussian view toward every other node.

    ``factor`` = 1 for a secure sum (the view's multiplier is the spec's σ), ``1/√(t − c)`` for the
    plain (unmasked) aggregation, where the leader sees each noisy share: local DP of the share.
    """

    def __init__(
        self,
        targets: list[str],
        orders: np.ndarray,
        view: SecureSumView,
        *,
        secure: bool,
        max_sensitivity: float,
    ) -> None:
        label = (
            view.label()
            if secure
            else (
                "plain aggregation (no masks): local-DP Gaussian bound of the member's "
                "noisy share seen in the clear by the leader"
            )
        )
        super().__init__(targets, orders, None, math.inf, label)
        self.view = view
        self.secure = secure
        self.max_sensitivity = float(max_sensitivity)

    def _factor(self) -> float:
        return 1.0 if self.secure else 1.0 / math.sqrt(self.view.honest_survivors)

    def curves(self, sigma: float) -> np.ndarray:
        if not sigma > 0 or not math.isfinite(sigma):
            raise ValueError(f"cannot account a round with noise multiplier {sigma}")
        return np.array(
            np.broadcast_to(
                gaussian_rdp(self.orders, sigma * self._factor()),
                (len(self.targets), self.orders.size),
            )
        )

    def certified_sigma(self, ev: EngineEntry) -> float:
        """The multiplier the view really has, from the share std the machine added and the public t, c."""
        if ev.sensitivity > self.max_sensitivity * (1.0 + 1e-12):
            raise ValueError(
                f"input sensitivity {ev.sensitivity:g} exceeds the public Δ={self.max_sensitivity:g}"
            )
        sens = self.max_sensitivity
        if self.secure:
            return view_sigma(
                ev.noise_std,
                sens,
                self.view.threshold,
                self.view.collusion,
                dim=entry_dim(ev),
                frac_bits=self.view.frac_bits,
            )
        return ev.noise_std / sens

    def entry(self, ev: EngineEntry, run_id: str, node_id: str) -> PrivacyEntry:
        if ev.kind not in ("gradient", "value"):
            raise ValueError(
                f"a secure-sum round records a gradient or value input, got {ev.kind!r}"
            )
        sig = self.certified_sigma(ev)
        if not sig > 0:
            raise ValueError("the input carries no noise: its release would not be private")
        rdp = np.array(
            np.broadcast_to(gaussian_rdp(self.orders, sig), (len(self.targets), self.orders.size))
        )
        view = "aggregate" if self.secure else "plain"
        return PrivacyEntry.from_row(
            run_id,
            ev.protocol,
            view,
            "certified",
            self.targets,
            rdp,
            gdp_mu=[1.0 / sig] * len(self.targets),
            note=f"round {ev.step} input ({self.bound_name}; collusion c={self.view.collusion})",
        )


def _refuse(spec: RunSpec, reason: str) -> PolicyDecision:
    return PolicyDecision(
        False,
        f"cannot project this node's privacy loss: {reason}",
        None,
        spec.budget.delta,
        "certified",
    )


def _decision(
    spec: RunSpec,
    vertex: int,
    local: Budget | None,
    rounds: int,
    sigma: float,
    view: dict[str, Any],
    what: str,
) -> PolicyDecision:
    budget = local or spec.budget
    delta = spec.budget.delta
    refused = PolicyDecision.delta_refusal(delta, budget.delta)
    if refused is not None:
        return refused
    n = spec.n
    row = (
        _best_order_dp(np.full(n, rounds / (2.0 * sigma**2)), math.inf, math.log(1.0 / delta))
        if rounds
        else np.zeros(n)
    )
    row[vertex] = 0.0
    det = {"N_u": float(rounds), "accounting_view": view}
    return PolicyDecision.certified(row, delta, budget.epsilon, det, what)


def project_ddp(
    spec: RunSpec, vertex: int, local: Budget | None = None, W: Any = None
) -> PolicyDecision:
    """Certified row of a ``secagg-dpsgd`` run: ``N_u`` rounds (exact count from the public sampling),
    each the Gaussian view α/(2σ²) toward every other node (plain aggregation: local DP of the share)."""
    if not spec.graph.startswith("complete:"):
        return _refuse(
            spec,
            f"{SECAGG_DPSGD} runs on the complete graph (graph 'complete:N'), got {spec.graph!r}",
        )
    try:
        view = spec_view(spec)
    except (SecureSumError, ValueError, TypeError) as exc:
        return _refuse(spec, f"{SECAGG_DPSGD} parameters: {exc}")
    secure = ddp_params(spec).get("aggregation", "secure") == "secure"
    sigma = view.sigma if secure else view.sigma / math.sqrt(view.honest_survivors)
    info = (
        view.as_dict()
        if secure
        else {
            "mechanism": "plain-sum",
            "view_model": "plain",
            "collusion": view.collusion,
            "accountant": "local-DP Gaussian bound of the noisy share (no masks)",
        }
    )
    what = (
        f"secure-sum Gaussian view, any coalition of ≤ c={view.collusion} members"
        if secure
        else "plain aggregation: each noisy share seen by the leader"
    )
    return _decision(spec, vertex, local, member_rounds(spec, vertex), sigma, info, what)


def ddp_cost(spec: RunSpec, vertex: int, ids: list[str], W=None, orders=None) -> SecureSumCost:
    o = np.asarray(DEFAULT_ORDERS if orders is None else orders, dtype=float)
    secure = ddp_params(spec).get("aggregation", "secure") == "secure"
    return SecureSumCost(
        [ids[v] for v in range(len(ids)) if v != vertex],
        o,
        spec_view(spec),
        secure=secure,
        max_sensitivity=spec_sensitivity(spec),
    )


def sum_frac_bits(spec: RunSpec) -> int:
    """The fixed-point fraction bits of a ``secagg-sum`` spec (its ``frac_bits`` or the default)."""
    return SecAggParams(dim=1, **sum_params(spec)).frac_bits


def secagg_sum_calibration(
    spec: RunSpec, sensitivity: float | None = None, dim: int | None = None
) -> SecureSumView | None:
    """The certified view of a ``secagg-sum`` spec that asks for the distributed calibration
    (``protocol_params.collusion``), None for the old one (noise σΔ per member, local-DP bound).
    ``sensitivity``: the task's Δ (the node's own task, or the spec's declared one for the projection);
    ``dim``: the task's dimension (the share's std needs it: fixed-point rounding), None for a projection."""
    pp = spec.protocol_params
    if "collusion" not in pp:
        return None

    p = sum_params(spec)
    t = int(p["threshold"])
    # always against a malicious (equivocating) leader (secagg.py's threat model): without the consistency check
    # each member answers one unmask request, so the tolerance is 2t − n − 1, not the honest-but-curious t − 1
    sp_ = SecAggParams(dim=1, **p)
    tol = sp_.malicious_collusion_tolerance()
    sens = (
        float(sensitivity) if sensitivity is not None else 1.0
    )  # σ is a multiplier: the charge does not depend on Δ
    return SecureSumView(
        float(spec.sigma), sens, t, int(pp["collusion"]), tol, frac_bits=sp_.frac_bits, dim=dim
    )


def check_task_range(spec: RunSpec, task, members: int) -> None:
    """Refuse (ValueError) a value task whose declared range ``[lo, hi]`` does not fit the fixed-point
    range of a sum of ``members`` words: its out-of-range values would be clipped (the member's words
    never leave out of range, see :func:`~hushnet.families.secagg.machines.encode_input`), so the sum
    would be wrong for data the node declared valid.  Tasks without a declared range are not checked."""
    lo, hi = getattr(task, "lo", None), getattr(task, "hi", None)
    if lo is None or hi is None:
        return
    fp = SecAggParams(dim=1, **sum_params(spec)).fixed_point
    top = max(abs(float(lo)), abs(float(hi)))
    if top > fp.max_abs(members):
        raise ValueError(
            f"the task's values up to |{top:g}| exceed the fixed-point range ±{fp.max_abs(members):.3g} of a "
            f"sum of {members} members (bits={fp.bits}, frac_bits={fp.frac_bits})"
        )


class SecAggSumCost(SecureSumCost):
    """``secagg-sum`` with the distributed calibration: the Δ is the task's (value tasks), checked per entry."""

    def certified_sigma(self, ev: EngineEntry) -> float:
        return view_sigma(
            ev.noise_std,
            ev.sensitivity,
            self.view.threshold,
            self.view.collusion,
            dim=entry_dim(ev),
            frac_bits=self.view.frac_bits,
        )


def secagg_sum_cost(
    spec: RunSpec, vertex: int, ids: list[str], W=None, orders=None
) -> ContributionCost:
    view = secagg_sum_calibration(spec)
    o = np.asarray(DEFAULT_ORDERS if orders is None else orders, dtype=float)
    targets = [ids[v] for v in range(len(ids)) if v != vertex]
    if view is None:  # the old calibration: the local-DP Gaussian bound (unchanged behaviour)
        return ContributionCost(
            targets, o, None, math.inf, "local-DP Gaussian bound (contribution seen in the clear)"
        )
    return SecAggSumCost(targets, o, view, secure=True, max_sensitivity=math.inf)


def project_secagg(
    spec: RunSpec, vertex: int, local: Budget | None = None, W: Any = None
) -> PolicyDecision:
    """``secagg-sum``: one contribution, Gaussian bound of the sum seen in the clear (α/(2σ²)); the aggregate
    view is what the leader sees, no credit taken for other members' noise — unless
    ``protocol_params.collusion = c`` is set (:func:`secagg_sum_calibration`)."""
    p = sum_params(spec)
    n = spec.n
    if not set(p["members"]) <= set(range(n)) or not 0 <= p["leader"] < n:
        return refuse(spec, "members/leader outside the graph")
    try:  # threshold, fixed point, masking-graph degree: refused here with the reason, not at build time
        SecAggParams(dim=1, **p).fixed_point
    except ValueError as exc:
        return refuse(spec, f"secure-summation parameters: {exc}")
    if vertex not in p["members"]:
        return PolicyDecision(
            True,
            "not a member of the secure sum: no contribution",
            np.zeros(n),
            spec.budget.delta,
            "certified",
            {"N_u": 0.0},
        )
    try:  # protocol_params.collusion: noise calibrated σΔ_eff/√(t−c) per member, charged as the sum's Gaussian view
        view = secagg_sum_calibration(spec)
    except ValueError as exc:
        return refuse(spec, f"secure-sum calibration: {exc}")
    if view is not None:
        dec = ldp_decision(
            spec,
            vertex,
            local,
            n,
            1.0,
            spec.sigma,
            f"one input seen only inside the sum: Gaussian view of ≥ t−c honest survivors' noise "
            f"(c={view.collusion} colluding members)",
            "secure-summation",
        )
        if dec.details.get("accounting_view") is not None:
            dec.details["accounting_view"] = {
                **view.as_dict(),
                "charged_as": "secure-sum Gaussian view",
            }
        return dec
    return ldp_decision(
        spec,
        vertex,
        local,
        n,
        1.0,
        spec.sigma,
        "one contribution: Gaussian bound of the node's noisy input seen in the sum",
        "secure-summation",
    )


__all__ = [
    "spec_view",
    "spec_sensitivity",
    "member_rounds",
    "SecureSumCost",
    "entry_dim",
    "project_ddp",
    "project_secagg",
    "ddp_cost",
    "secagg_sum_calibration",
    "sum_frac_bits",
    "check_task_range",
    "secagg_sum_cost",
]
