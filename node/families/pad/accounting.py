"""P-AD summations and histograms over the real network: what each node projects and is charged.

The sans-IO machines (:mod:`hushnet.families.pad.machines`) run unchanged in the node driver; the
ring direction is the graph's vertex order (vertex v hands the token to v+1 mod n, as in the
simulator).  This module is the family's *accounting*: the node's projection, the ledger cost of each
contribution and the papers' (uncertified) bounds, which :class:`hushnet.families.pad.PadFamily` gives
the run service.

**Which bound, and why it holds for what a node really observes.**  Over plain gRPC with mutual
TLS, a node v observes: every token it receives (the running sum or histogram, the global step,
the public ``aux`` counter), the authenticated identity of the node that sent it, the node it
forwards to, and acknowledgements (no data).  Noise is each node's own secret draw
(``noise = "secret"``); with ``noise = "public-seed"`` nothing below holds and the report says so.

* ``pad-ring-sum`` — **certified network bound (P-AD Thm 1's argument, Rényi form).**  On the
  directed ring the sender is public anyway (v−1), so sender-known costs nothing here.  Between
  two consecutive tokens that v receives lie exactly n−1 consecutive steps of the other nodes;
  Alg. 1 injects one N(0, σ_loc²) draw every n−1 steps (erratum 12: ``⌈Kn/(n−1)⌉`` draws), so
  every such window holds at least one fresh draw (variance ≥ σ_loc² also with the Remark 1
  variant, erratum 13), disjoint windows hold independent draws, and u contributes at most once
  per window.  v's view is a bijection of its first token and the K−1 differences, each u's
  contribution (L2 sensitivity Δ) plus independent Gaussian noise of variance ≥ σ_loc²: the
  Gaussian mechanism composed K times, ``K·α·Δ²/(2σ_loc²)`` toward every v ≠ u.  We charge
  ``α·Δ²/(2σ_loc²)`` per contribution, exact in K.  This is pairwise (no collusion: two
  colluders around u see u's contribution with only u's own noise, P-AD §3.3 — pairwise rows
  are what hushnet reports).  It needs the ring to be walked exactly: a skipped node shortens a
  window to n−2 steps, which may hold no noise, so ``on_peer_down = "deviate"`` is refused.
  Thm 1 itself (advanced composition of (ε, δ) visits) is the same argument with a looser
  composition; we keep the Rényi form because the ledger composes RDP.
* ``pad-ring-histogram`` — **local randomized-response bound.**  P-AD Thm 2 amplifies through
  Erlingsson et al.'s shuffling theorem, which needs n ≥ 1000, ε₀ < 1/2 (erratum 19) and gives
  an (ε, δ) statement the RDP ledger cannot compose.  What holds at every n: each of u's reports
  is RR_γ, pure ε₀-DP with ``e^{ε₀} = (1−γ+γ/L)/(γ/L)``, and v's view (token counts, senders,
  dummies drawn by node 0) is a post-processing of all reports plus data-independent coins.  A
  pure ε₀-DP mechanism is ``(α, min(ε₀, α ε₀²/2))``-RDP (Bun & Steinke 2016, Prop. 3.3), charged
  per report.
* ``pad-complete-sum`` / ``pad-complete-histogram`` — **local-DP bound.**  P-AD Thm 3 / Thm 6
  assume the token path is hidden, *including the previous sender and the next receiver*; a
  gRPC handoff reveals both (docs/design/spec/randomwalk.md §E.2), and their non-asymptotic forms rest on heuristic steps
  (labelled "paper" in :mod:`hushnet.privacy.amplification`).  No certified network bound applies,
  so each contribution is charged what it leaks in the clear: the Gaussian ``α·Δ²/(2σ_loc²)``
  (every contribution carries its own N(0, σ_loc²)) or the RR curve above.  The number of visits
  is random (uniform next holder): the projection uses the Chernoff bound of P-AD App. D at
  δ̂ = the spec's δ (a node is charged for the visits that really happen, and the ledger stops the
  run before a contribution that would exceed the node's budget leaves).

The result (the noisy sum, or the raw and debiased histogram) stays at the node that made the last
step and reaches only the operator (``run.model`` / ``run.report``); it is never broadcast to the
nodes, so it is not an extra observation of any pairwise view (docs/design/spec/randomwalk.md §E.1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from hushnet.engine.actions import LedgerEntry as EngineEntry
from hushnet.families.pad.params import (
    COMPLETE_HISTOGRAM,
    COMPLETE_SUM,
    RING,
    RING_HISTOGRAM,
    RING_SUM,
    SUMS,
)
from hushnet.privacy.amplification import (
    ValidityError,
    advanced_composition,
    complete_histogram_guarantee,
    complete_sum_guarantee,
    contributions_bound,
    erlingsson_shuffle_eps,
    gaussian_sigma_local,
    ring_sum_guarantee,
    rr_epsilon,
)
from hushnet.privacy.conversions import DEFAULT_ORDERS
from hushnet.privacy.ledger import PrivacyEntry
from hushnet.runs.accounting import dp_from_rdp
from hushnet.runs.spec import Budget, PolicyDecision, RunSpec

BOUND_NAMES = {
    RING_SUM: "P-AD Thm 1 argument, Rényi form: K Gaussian windows of std ≥ σ_loc toward each other node "
    "(ring, no collusion)",
    RING_HISTOGRAM: "local randomized-response bound: pure ε₀-DP report, RDP min(ε₀, αε₀²/2) "
    "(no shuffling amplification claimed: P-AD Thm 2 needs n ≥ 1000)",
    COMPLETE_SUM: "local-DP Gaussian bound (each contribution seen with its own noise; P-AD Thm 3 assumes a "
    "hidden sender and receiver, which gRPC does not give)",
    COMPLETE_HISTOGRAM: "local randomized-response bound (P-AD Thm 6 assumes a hidden sender and receiver, "
    "which gRPC does not give)",
}
#: the data-use kind each protocol's machine records (anything else is refused by the cost)
KIND = {
    RING_SUM: "value",
    COMPLETE_SUM: "value",
    RING_HISTOGRAM: "rr",
    COMPLETE_HISTOGRAM: "rr",
}


# ---- public parameters --------------------------------------------------------------------------


def public_sensitivity(spec: RunSpec) -> float:
    """L2 sensitivity of one summation contribution from the public spec: ``(hi − lo)·√dim``.

    The same formula as :meth:`hushnet.tasks.values.SumTask.sensitivity`; ``dim`` is ``[task] dim``
    (default 1).  A node whose data gives a larger dimension refuses the run (see :func:`build_machine`).
    """
    tp = spec.task_params
    lo, hi = float(tp.get("lo", 0.0)), float(tp.get("hi", 1.0))
    d = int(tp.get("dim", 1))
    if not hi > lo or d < 1:
        raise ValueError(
            f"the spec's task gives no bounded contribution (lo={lo}, hi={hi}, dim={d})"
        )
    return (hi - lo) * math.sqrt(d)


def public_eps0(spec: RunSpec) -> float:
    """ε₀ of one RR_γ report on ``bins`` values (the histogram's local guarantee)."""
    bins = int(spec.task_params.get("bins", 0))
    if bins < 2:
        raise ValueError("a histogram run needs [task] bins >= 2")
    if spec.gamma is None or not 0.0 < spec.gamma < 1.0:
        raise ValueError("a histogram run needs gamma in (0, 1)")
    return rr_epsilon(float(spec.gamma), bins)


def contributions(spec: RunSpec, n: int) -> tuple[float, str]:
    """How many of its values a node contributes: exactly K on the ring; on the complete graph the
    visit count is Binomial(T, 1/n), bounded with probability 1 − δ by P-AD App. D's Chernoff bound."""
    if spec.protocol in RING:
        return float(spec.rounds or 0), "exactly K (one visit per round)"
    bound, method = contributions_bound(int(spec.steps), float(n), spec.budget.delta)
    return float(
        min(math.ceil(bound), spec.steps)
    ), f"{method} bound on Binomial(T, 1/n) at δ̂={spec.budget.delta:g}"


def per_contribution_curve(spec: RunSpec, orders: np.ndarray) -> np.ndarray:
    """Certified RDP (on ``orders``) of one contribution toward any other node (module docstring)."""
    if spec.protocol in SUMS:
        if not (spec.sigma > 0 and math.isfinite(spec.sigma)):
            raise ValueError(f"cannot account a summation with noise std {spec.sigma}")
        return orders * public_sensitivity(spec) ** 2 / (2.0 * spec.sigma**2)
    e0 = public_eps0(spec)
    return np.minimum(e0, orders * e0 * e0 / 2.0)


# ---- ledger cost --------------------------------------------------------------------------------


@dataclass
class PadCost:
    """Per-contribution certified curves toward every other node (duck-types ``ContributionCost``).

    ``walk_slope`` is None: these bounds do not depend on the walk following W, so a deviation
    top-up (the walk's ``close(deviated=True)``) has nothing to add.
    """

    protocol: str
    targets: list[str]
    orders: np.ndarray
    per_contribution: np.ndarray
    bound_name: str
    sensitivity: float | None  # summations: the public Δ the curve was computed for
    eps0: float | None  # histograms: the public ε₀
    walk_slope: None = None
    alpha_max: float = math.inf

    def curves(self, sigma: float | None = None) -> np.ndarray:
        """(targets, orders) curve of one contribution; ``sigma`` is ignored (the bound is fixed by the spec)."""
        return np.array(
            np.broadcast_to(self.per_contribution, (len(self.targets), self.orders.size))
        )

    def entry(self, ev: EngineEntry, run_id: str, node_id: str) -> PrivacyEntry:
        if ev.kind != KIND[self.protocol]:
            raise ValueError(
                f"{self.protocol} records {KIND[self.protocol]!r} contributions, got {ev.kind!r}"
            )
        if self.sensitivity is not None and ev.sensitivity > self.sensitivity * (1.0 + 1e-12):
            raise ValueError(
                f"contribution sensitivity {ev.sensitivity:g} exceeds the public Δ={self.sensitivity:g}"
            )
        if self.eps0 is not None and float(ev.detail.get("eps0", math.inf)) > self.eps0 * (
            1.0 + 1e-12
        ):
            raise ValueError(
                f"report ε₀={ev.detail.get('eps0')} exceeds the public ε₀={self.eps0:g}"
            )
        return PrivacyEntry.from_row(
            run_id,
            ev.protocol,
            ev.view_model,
            "certified",
            self.targets,
            self.curves(),
            note=f"{ev.kind} contribution at step {ev.step} ({self.bound_name})",
        )


def pad_cost(spec: RunSpec, vertex: int, ids: list[str], W=None, orders=None) -> PadCost:
    o = np.asarray(DEFAULT_ORDERS if orders is None else orders, dtype=float)
    targets = [ids[v] for v in range(len(ids)) if v != vertex]
    sums = spec.protocol in SUMS
    return PadCost(
        spec.protocol,
        targets,
        o,
        per_contribution_curve(spec, o),
        BOUND_NAMES[spec.protocol],
        public_sensitivity(spec) if sums else None,
        None if sums else public_eps0(spec),
    )


# ---- projection (accept / refuse) ---------------------------------------------------------------


def pad_projector(
    spec: RunSpec, vertex: int, local_budget: Budget | None, W=None
) -> PolicyDecision:
    """The node's certified row for the run from public parameters, and its accept/refuse decision."""
    budget = local_budget or spec.budget
    delta = spec.budget.delta
    refused = PolicyDecision.delta_refusal(delta, budget.delta)
    if refused is not None:
        return refused
    n = spec.n if W is None else int(W.shape[0])
    if spec.protocol == RING_SUM and spec.on_peer_down == "deviate":
        return PolicyDecision(
            False,
            "pad-ring-sum with on_peer_down='deviate' is refused: skipping a node can leave a "
            "window between two visits without any noise draw (the ring bound would not hold)",
            None,
            delta,
            "certified",
        )
    try:
        curve = per_contribution_curve(spec, np.asarray(DEFAULT_ORDERS, dtype=float))
    except ValueError as exc:
        return PolicyDecision(
            False, f"cannot project this node's privacy loss: {exc}", None, delta, "certified"
        )
    n_u, how = contributions(spec, n)
    eps = dp_from_rdp(np.asarray(DEFAULT_ORDERS, dtype=float), n_u * curve, delta)
    row = np.full(n, eps)
    row[vertex] = 0.0
    view = (
        "ring: token values received from the public predecessor (sender known by construction)"
        if spec.protocol in RING
        else "sender-known: plain gRPC reveals who handed over the token and whom it goes to"
    )
    details: dict[str, Any] = {
        "N_u": n_u,
        "contributions": how,
        "bound_name": BOUND_NAMES[spec.protocol],
        "accounting_view": {
            "label": view,
            "view_model": spec.view_model,
            "mechanism": "plain-links",
        },
        "view_model": spec.view_model,
    }
    if eps > budget.epsilon:
        other = 1 if vertex == 0 else 0
        return PolicyDecision(
            False,
            f"over budget: projected certified loss toward node {other} (and every other node) "
            f"is ε={eps:.4g} at δ={delta:g} ({BOUND_NAMES[spec.protocol]}), this node's budget "
            f"is ε={budget.epsilon:g}",
            row,
            delta,
            "certified",
            details,
        )
    return PolicyDecision(
        True,
        f"within budget (certified ε={eps:.4g} toward every other node; "
        f"{BOUND_NAMES[spec.protocol]})",
        row,
        delta,
        "certified",
        details,
    )


# ---- the papers' values (labelled "paper", never charged) -----------------------------------------

PAPER_LABELS = {
    RING_SUM: "paper: P-AD Thm 1 as printed (per-visit (ε, δ) from the classic Gaussian calibration, advanced "
    "composition over K visits, δ split evenly); for comparison — the certified column is what is charged",
    RING_HISTOGRAM: "paper: P-AD Thm 2 with the corrected γ (Erlingsson shuffling of each batch, needs n ≥ 1000); "
    "not charged",
    COMPLETE_SUM: "paper: P-AD Thm 3 (App. D) — assumes a hidden sender and receiver, which plain gRPC does not "
    "give; not a guarantee here",
    COMPLETE_HISTOGRAM: "paper: P-AD Thm 6 (App. E) — assumes a hidden sender and receiver, which plain gRPC "
    "does not give; not a guarantee here",
}


def _gaussian_eps(spec: RunSpec, delta0: float) -> float:
    """Per-contribution ε of N(0, σ_loc²) by the classic calibration σ = Δ√(2 ln(1.25/δ))/ε (needs ε < 1)."""
    eps = public_sensitivity(spec) * math.sqrt(2.0 * math.log(1.25 / delta0)) / spec.sigma
    if not eps < 1.0:
        raise ValidityError(
            f"σ_loc={spec.sigma:g} gives a per-contribution ε={eps:.3g} ≥ 1 (outside the theorems)"
        )
    gaussian_sigma_local(
        eps, delta0, public_sensitivity(spec)
    )  # same validity checks as the accountant
    return eps


def paper_value(spec: RunSpec, n: int) -> float | None:
    """The P-AD theorem's ε for this run at the spec's total δ, or None outside its conditions."""
    delta = spec.budget.delta
    try:
        if spec.protocol == RING_SUM:
            K = int(spec.rounds or 0)
            d0 = delta / (K + 1)
            return ring_sum_guarantee(K, n, _gaussian_eps(spec, d0), d0, d0).epsilon
        if spec.protocol == RING_HISTOGRAM:
            K = int(spec.rounds or 0)
            d0 = delta / (K + 1)
            e = erlingsson_shuffle_eps(public_eps0(spec), d0, n)
            return advanced_composition(e, d0, K, d0)[0]
        n_u, _ = contributions_bound(int(spec.steps), float(n), delta / 4.0)
        d0 = delta / (2.0 * max(n_u, 1.0))
        if spec.protocol == COMPLETE_SUM:
            return complete_sum_guarantee(
                n, int(spec.steps), _gaussian_eps(spec, d0), d0, delta / 4, delta / 4
            ).epsilon
        return complete_histogram_guarantee(
            n, int(spec.steps), public_eps0(spec), d0, delta / 4, delta / 4
        ).epsilon
    except (ValidityError, ValueError):
        return None


def pad_paper_bound(spec: RunSpec, vertex: int, W=None) -> tuple[np.ndarray, str] | None:
    n = spec.n if W is None else int(W.shape[0])
    eps = paper_value(spec, n)
    if eps is None:
        return None
    row = np.full(n, float(eps))
    row[vertex] = 0.0
    return row, PAPER_LABELS[spec.protocol]
