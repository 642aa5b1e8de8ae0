"""Turn a machine's ledger actions into charges on the node's persistent privacy ledger.

A walk machine emits one :class:`~hushnet.engine.actions.LedgerEntry` per visit that used the node's
data.  The certified random-walk bound (random-walk paper, Thm 3, exact horizon, with the spec's
noise condition) is *linear in the number of contributions*: ``ε_{u→v}(α) = N_u · α · s_{uv}/σ²``.
So charging every contribution with the per-contribution row ``α·s_{u,:}/σ²`` composes on the
ledger to exactly the run-level value the node projected when it accepted the run — the ledger is
exact contribution by contribution, and a stopped run has charged exactly what it used.

Per order the charge is ``min(walk bound, α/(2σ²))``: the second is the Gaussian RDP of the noisy
contribution seen in the clear (post-processing), valid at every order and for every walk, so it
also covers orders above the noise condition's α_max.  Everything here is "certified"; the paper's
Theorem 3 values are computed separately by :func:`paper_row` and labelled "paper".
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from hushnet.engine.actions import LedgerEntry as EngineEntry
from hushnet.privacy.conversions import DEFAULT_ORDERS, rdp_to_dp
from hushnet.privacy.ledger import LedgerEntry as PrivacyEntry
from hushnet.runs.spec import WALK_SGD, RunSpec

#: protocols whose contributions are charged with the walk bound; others use the local-DP bound
WALK_ACCOUNTED = ("rw-dpsgd", "pad-complete-sgd", "rw-dpsgd-onion")


@dataclass
class ContributionCost:
    """Per-contribution certified RDP curves of one node toward every other node (rows = targets).

    ``curves[j]`` is the curve toward ``targets[j]`` on ``orders``, for a contribution with noise
    multiplier ``sigma``; :meth:`curve_for` rescales it for another multiplier.
    """

    targets: list[str]
    orders: np.ndarray
    walk_slope: np.ndarray | None  # s_{u,v}: RDP per unit α at σ = 1 (None: local-DP accounting only)
    alpha_max: float
    bound_name: str

    def curves(self, sigma: float) -> np.ndarray:
        """(targets, orders) certified RDP of one contribution with noise multiplier ``sigma``."""
        if not sigma > 0 or not math.isfinite(sigma):
            raise ValueError(f"cannot account a contribution with noise multiplier {sigma}")
        ldp = np.broadcast_to(self.orders / (2.0 * sigma**2), (len(self.targets), self.orders.size))
        if self.walk_slope is None:
            return np.array(ldp)
        walk = self.walk_slope[:, None] * self.orders[None, :] / sigma**2
        walk = np.where(self.orders[None, :] <= self.alpha_max, walk, np.inf)
        return np.minimum(walk, ldp)

    def entry(self, ev: EngineEntry, run_id: str, node_id: str) -> PrivacyEntry:
        rdp = self.curves(ev.sigma)
        return PrivacyEntry.from_row(run_id, ev.protocol, ev.view_model, "certified", self.targets, rdp,
                                     note=f"{ev.kind} contribution at step {ev.step} ({self.bound_name})")


def contribution_cost(spec: RunSpec, vertex: int, ids: list[str], W=None, orders=None) -> ContributionCost:
    """The certified per-contribution cost of node ``vertex`` in ``spec``'s run; ``ids[v]`` names vertex v."""
    from hushnet.privacy.randomwalk import alpha_max, rw_single_loss_matrix
    from hushnet.protocols.registry import transition_matrix

    if spec.protocol in COST_BUILDERS:  # protocols that charge their own certified cost (gossip)
        return COST_BUILDERS[spec.protocol](spec, vertex, ids, W, orders)
    o = np.asarray(DEFAULT_ORDERS if orders is None else orders, dtype=float)
    targets = [ids[v] for v in range(len(ids)) if v != vertex]
    if spec.protocol in WALK_ACCOUNTED:
        if W is None:
            W = transition_matrix(spec.graph, spec.weights)
        S = rw_single_loss_matrix(W, spec.steps, 1.0, 1.0, horizon="exact",
                                  sender_known=spec.view_model == "sender-known")
        row = np.delete(S[vertex], vertex)
        amax = alpha_max(spec.sigma, spec.constraint)
        name = f"random-walk bound ({spec.view_model}, exact horizon, {spec.constraint} noise condition) ∧ local-DP"
        return ContributionCost(targets, o, row, amax, name)
    return ContributionCost(targets, o, None, math.inf, "local-DP Gaussian bound (contribution seen in the clear)")


def dp_from_rdp(orders: np.ndarray, rdp: np.ndarray, delta: float) -> float:
    """The ledger's conversion (hushnet's one RDP → (ε, δ) rule, dp-accounting's improved one), 0 for an empty curve."""
    if not np.any(rdp > 0):
        return 0.0
    return float(rdp_to_dp(orders, rdp, delta)[0])


def paper_row(spec: RunSpec, vertex: int, contributions: float, W=None) -> np.ndarray | None:
    """Theorem 3 as printed (ln T horizon, no σ condition), best order — labelled "paper"; None if n/a."""
    from hushnet.privacy.randomwalk import rw_single_loss_matrix
    from hushnet.protocols.registry import transition_matrix

    if spec.protocol not in WALK_ACCOUNTED:
        return None
    if W is None:
        W = transition_matrix(spec.graph, spec.weights)
    S = rw_single_loss_matrix(W, spec.steps, 1.0, spec.sigma, horizon="lnT",
                              sender_known=spec.view_model == "sender-known")
    slope = np.maximum(S[vertex] * contributions, 0.0)
    L = math.log(1.0 / spec.budget.delta)
    a = 1.0 + np.sqrt(L / np.maximum(slope, 1e-300))
    eps = a * slope + L / (a - 1.0)
    eps[vertex] = 0.0
    return eps


#: what the random-walk report's "paper" column is
RW_PAPER_LABEL = ("paper: random-walk paper Thm 3 as printed (ln T horizon, no noise condition); "
                  "not a guarantee")

#: protocol → ``fn(spec, vertex, W) -> (ε row, label) | None``: the published bound of a protocol that is
#: not a walk (the gossip family registers [M] Thm 1 / Thm 6 and [K] Thm 15), shown labelled "paper"
PAPER_BOUNDS: dict[str, Callable[..., Any]] = {}


def register_paper_bound(protocol: str, fn: Callable[..., Any]) -> None:
    PAPER_BOUNDS[protocol] = fn


def paper_bound(spec: RunSpec, vertex: int, contributions: float, W=None) -> tuple[np.ndarray, str] | None:
    """The paper's value of this node's row, best order, and the label that says which bound it is
    ("paper": a labelled reproduction, never a guarantee); None when the protocol has none."""
    fn = PAPER_BOUNDS.get(spec.protocol)
    if fn is not None:
        return fn(spec, vertex, W)
    row = paper_row(spec, vertex, contributions, W)
    return None if row is None else (row, RW_PAPER_LABEL)


#: protocol → ``fn(spec, vertex, local_budget, W) -> PolicyDecision``: how a node projects its loss
#: before accepting a run.  Walk protocols use :func:`hushnet.runs.spec.evaluate_policy` (the default);
#: the gossip / anonymity owners register theirs here, and until then the node refuses those runs
#: with the reason "cannot project this node's privacy loss".
PROJECTORS: dict[str, Callable[..., Any]] = {}


def register_projector(protocol: str, fn: Callable[..., Any]) -> None:
    PROJECTORS[protocol] = fn


#: protocol → ``fn(node, spec, vertex, ids, task, W, options) -> Protocol``: builds the machine of a
#: protocol that needs node-local material (e.g. the node's own long-term X25519 key and the
#: directory's public keys for the anonymity layer); other protocols use ``make_machine``.
MACHINE_BUILDERS: dict[str, Callable[..., Any]] = {}


def register_machine_builder(protocol: str, fn: Callable[..., Any]) -> None:
    MACHINE_BUILDERS[protocol] = fn


#: protocol → ``fn(spec, vertex, ids, W, orders) -> cost``: what the driver charges per data action, for
#: protocols whose certified charge is not the walk / local-DP contribution cost (the gossip family:
#: :mod:`hushnet.runs.gossip_runs`).  The cost duck-types :class:`ContributionCost`.
COST_BUILDERS: dict[str, Callable[..., Any]] = {}


def register_cost(protocol: str, fn: Callable[..., Any]) -> None:
    COST_BUILDERS[protocol] = fn


#: extra operator commands of the run service: name → ``async fn(service, payload) -> bytes``
#: (e.g. the gossip settlement, ``run.schedule`` / ``run.settle``)
COMMANDS: dict[str, Callable[..., Any]] = {}


def register_command(name: str, fn: Callable[..., Any]) -> None:
    COMMANDS[name] = fn


#: protocol → ``fn(service, spec, vertex, ids) -> journal``: a durable journal of the run's engine ledger
#: entries.  The driver calls ``journal(entry)`` for every entry *before* the actions after it (so a
#: gossip round's schedule record is on disk before the next round's value leaves); if it raises, the run
#: stops there.  Gossip registers one (:mod:`hushnet.runs.gossip_store`); other protocols have none.
JOURNALS: dict[str, Callable[..., Any]] = {}


def register_journal(protocol: str, fn: Callable[..., Any]) -> None:
    JOURNALS[protocol] = fn


__all__ = ["COST_BUILDERS", "register_cost", "COMMANDS", "register_command", "JOURNALS", "register_journal", "PAPER_BOUNDS",
           "register_paper_bound", "paper_bound", "RW_PAPER_LABEL", "ContributionCost", "contribution_cost", "dp_from_rdp", "paper_row", "register_projector", "PROJECTORS",
           "register_machine_builder", "MACHINE_BUILDERS",
           "WALK_ACCOUNTED", "WALK_SGD"]
