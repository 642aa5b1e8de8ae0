"""Gossip runs over the real network: machine parameters, projector, ledger charges, settlement.

The sans-IO gossip machines (:mod:`hushnet.protocols.gossip`) already run the two-phase round
(availability, then values), buffer early messages, time out silent neighbours and record every
round's realised row of ``W_t`` as a ``schedule`` ledger action.  This module plugs them into a
node's run service (``hushnet.runs.service`` imports it, which registers everything below):

* **machine parameters** (:data:`hushnet.runs.spec.MACHINE_PARAMS`) from the spec's public fields and
  ``[run.protocol_params]``, with *network* round timeouts (seconds, not the simulator's 50 ms);
* a **machine builder** (:data:`hushnet.runs.accounting.MACHINE_BUILDERS`) that hands the machine the
  public gossip matrix of the spec's graph;
* a **projector** (:func:`hushnet.runs.accounting.register_projector`): before accepting, the node
  computes its certified row with the *exact* accountant of the recorded-schedule module
  (:mod:`hushnet.protocols.gossip_accounting`) on the public schedule (every node up every round);
* a **cost** (:data:`hushnet.runs.accounting.COST_BUILDERS`): what the node's persistent ledger is
  charged when its noisy data first leaves (the projected certified curves — the whole run for
  averaging and streaming, one step at a time for Muffliato-GD);
* a **settlement** (``run.settle``): dropouts change ``W_t``, and the certified loss on the
  realised schedule can exceed the projection (less mixing before a neighbour sees a value).  After
  the run the operator gathers every node's recorded rows (``run.schedule``) and sends them back;
  each node checks its own rows against its own records, replays the accountant on the realised
  schedule and tops its ledger up to ``max(projected, realised)`` per target and order.  Nothing is
  ever refunded, so the ledger always holds at least the exact loss of what really happened, and
  exactly that when nothing dropped.  Like the walk's deviation top-up, a settlement is recorded
  even over budget: the data was already used, hiding the spending would be worse.

**Which view.**  ``protocol_params.view`` is ``"neighbourhood"`` (default, plain gossip: every round
value travels in the clear over the node's TLS links, so an observer sees every message of its
closed neighbourhood) or ``"aggregate"``: the rounds then run **secure neighbourhood summation**
(:mod:`hushnet.protocols.gossip_secure`: each node leads one SecAgg sum per round over the neighbours
it heard, keyed with the nodes' long-term X25519 keys from the directory, and learns only
``Σ_j W_t[i,j] m_j``), and — only then — the exact accountant uses the aggregate view ``S = e_iᵀ``
(the observer's own messages and the weighted sums it mixed).  The view is one switch: it turns the
mechanism on *and* selects the accountant's view, so a run can never be accounted with the
aggregate view while its values travel in the clear.  The decision and the run report carry
``accounting_view`` (``label`` = ``"aggregate (secure neighbourhood summation)"`` or
``"neighbourhood (plain gossip)"``).  A neighbourhood sum that falls below SecAgg's threshold
releases nothing: that node keeps its own value for the round and its schedule record says
``secure.status = "aborted"``; the settlement replays the recorded rows like any dropout.
Fixed-point error of a released sum of k terms: ``k·2^-(f+1)`` per entry (``f = frac_bits``,
default 24), at most ``T·max k·2^-(f+1)`` on a final model after T rounds.

**Randomized Muffliato** ([M] Alg. 2, ``muffliato-randomized``): the spec's graph is the network's
topology, and the activations are a seeded *public* schedule of its edges
(:func:`hushnet.privacy.muffliato.randomized_schedule` on the public W, ``p_e = 2W_e/n``, seed
``protocol_params.schedule_seed``, default the run seed), so every node knows when each of its links is
active.  An activation of {i, j} is one pairwise exchange over that link; a node handles its
activations in schedule order, buffers values for later ones, and skips an activation whose partner
stays silent past the timeout (recorded on its end as not used; after ``give_up_after`` misses the
partner is gone).  Projection and cost: the certified pairwise accountant
(:func:`~hushnet.protocols.gossip_accounting.pairwise_sensitivities`, exact projection of each observer's
received values) on the public schedule, charged at the noisy input; settlement on the realised
activations, with the same safe completion as the rounds (a node whose records stop is assumed to have
sent at its next activation; a value a partner used was sent).  Only the neighbourhood view: a pair
exchange has no neighbourhood sum to secure.  Waiting nodes heartbeat to their remaining partners, so
a live partner held up by a dead node is slow, not silent (a crash does not cascade into skips).

**Fresh Erdős–Rényi graph per step** (Muffliato-GD, ``protocol_params.graph = "er-per-step"``, ``q``,
``graph_seed`` default the run seed; [M] Fig. 1c): every ER edge must be a network link, so it is
allowed exactly on a complete topology (``complete:N``) and refused otherwise.  Each node draws the same
public step graphs; the rounds of step r run on graph r; the projection is the exact joint-view
accountant on the per-round Metropolis–Hastings matrices of the step graphs, and a crashed node is
completed toward its neighbours of that step's graph.  Other per-round graphs (``er-per-round``) stay
simulator-only.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np
import scipy.sparse as sp

from hushnet.engine.actions import LedgerEntry as EngineEntry
from hushnet.privacy.conversions import DEFAULT_ORDERS
from hushnet.privacy.ledger import BudgetExceeded
from hushnet.privacy.ledger import LedgerEntry as PrivacyEntry
from hushnet.protocols.gossip_accounting import (
    RealisedSchedule,
    averaging_sensitivities,
    complete_crashed,
    gd_sensitivity,
    schedule_from_ledgers,
    stream_sensitivity,
)
from hushnet.protocols.onion import VIEWS as ANON_VIEWS
from hushnet.runs.spec import MACHINE_PARAMS, Budget, PolicyDecision, RunSpec, _best_order_dp

#: gossip protocols a networked node runs
NET_GOSSIP = ("muffliato", "muffliato-gd", "gossip-stream", "muffliato-randomized")
#: the one protocol whose rounds are pairwise activations, not synchronous rounds of W
PAIRWISE = "muffliato-randomized"
#: network round defaults: a neighbour silent this long (seconds, heartbeats reset it) is dropped for the round
NET_TIMEOUT = 2.0
NET_GIVE_UP = 3
NET_MAX_AHEAD = 2
#: stream accounting is dense in (rounds × n): keep the node's projection cheap
STREAM_MAX_CELLS = 4096
#: settlement tolerance: a realised loss within this of what was charged is the same loss (float error)
SETTLE_RTOL, SETTLE_ATOL = 1e-9, 1e-12


# ---- machine parameters -------------------------------------------------------------------------


def gossip_params(spec: RunSpec) -> dict[str, Any]:
    """Public machine parameters of a gossip spec (the same dict the simulator gets: the parity input).

    ``steps`` is the number of rounds (averaging, streaming) or of gradient steps (Muffliato-GD, with
    ``protocol_params.K`` rounds per step); ``sigma`` the noise multiplier; ``protocol_params`` may set
    ``chebyshev``/``gamma``, ``K``, and the round options ``timeout``, ``max_ahead``,
    ``give_up_after``, ``ticks`` and ``dropout`` (simulated unavailability, seeded per node).
    """
    pp = dict(spec.protocol_params)
    out: dict[str, Any] = {"sigma": float(spec.sigma)}
    if spec.protocol == "muffliato-gd":
        out.update(steps=int(spec.steps), step_size=float(spec.step_size), K=int(pp.get("K", 1)),
                   chebyshev=bool(pp.get("chebyshev", False)))
        if pp.get("graph", "fixed") == "er-per-step":  # public: every node draws the same step graphs
            out.update(graph="er-per-step", graph_seed=int(pp.get("graph_seed", spec.seed)))
            if "q" in pp:
                out["q"] = float(pp["q"])
    elif spec.protocol == PAIRWISE:  # T ticks of the public activation schedule, seeded by the run
        out.update(rounds=int(pp.get("rounds", spec.steps)), schedule_seed=int(pp.get("schedule_seed", spec.seed)))
    else:
        out["rounds"] = int(pp.get("rounds", spec.steps))
        if spec.protocol == "gossip-stream":
            out["step_size"] = float(spec.step_size)
        elif pp.get("chebyshev"):
            out["chebyshev"] = True
    if "gamma" in pp:
        out["gamma" if spec.protocol != "muffliato-gd" else "gammas"] = (
            float(pp["gamma"]) if spec.protocol != "muffliato-gd" else [float(pp["gamma"])] * int(spec.steps))
    out["timeout"] = float(pp.get("timeout", NET_TIMEOUT))
    out["max_ahead"] = int(pp.get("max_ahead", NET_MAX_AHEAD))
    out["give_up_after"] = int(pp.get("give_up_after", NET_GIVE_UP))
    for k in ("ticks",):
        if k in pp:
            out[k] = int(pp[k])
    if "dropout" in pp:
        out["dropout"] = float(pp["dropout"])
    if view_of(spec) == "aggregate":  # the aggregate view is licensed only by the mechanism: both or neither
        out["secure_summation"] = True
        if "frac_bits" in pp:
            out["frac_bits"] = int(pp["frac_bits"])
    return out


def view_of(spec: RunSpec) -> str:
    return str(spec.protocol_params.get("view", "neighbourhood"))


def resolved(spec: RunSpec, W, sensitivity: float = 1.0) -> dict[str, Any]:
    """The concrete public parameters (rounds, γ, per-step K) every node and the simulator derive alike."""
    from hushnet.protocols.gossip_sim import resolve_params

    return resolve_params(spec.protocol, gossip_params(spec), W, W.shape[0], sensitivity)


# ---- schedules and the exact accountant ---------------------------------------------------------


def public_schedule(W, rounds: int) -> RealisedSchedule:
    """The schedule of a run where every node is up every round: ``W_t = W``, every edge carries a value.
    ``W`` may be a list of per-round matrices (fresh Erdős–Rényi graphs per step)."""
    Ws = [sp.csr_matrix(Wt, dtype=float) for Wt in W] if isinstance(W, (list, tuple)) else \
        [sp.csr_matrix(W, dtype=float)] * rounds
    if len(Ws) != rounds:
        raise ValueError(f"{len(Ws)} round matrices for {rounds} rounds")
    n = Ws[0].shape[0]
    sent = []
    for k, Wt in enumerate(Ws):
        if k and Wt is Ws[k - 1]:
            sent.append(sent[-1])
            continue
        A = Wt.tocoo()
        sent.append([(int(i), int(j)) for i, j in zip(A.row, A.col) if i != j])
    return RealisedSchedule(n, Ws, sent, np.ones((rounds, n), bool), np.ones((rounds, n), bool),
                            np.zeros(rounds, dtype=np.int64))


def fresh_er(spec: RunSpec) -> bool:
    """Does the spec ask for a fresh public Erdős–Rényi graph per gradient step ([M] Fig. 1c)?"""
    return spec.protocol == "muffliato-gd" and spec.protocol_params.get("graph", "fixed") == "er-per-step"


def topology(spec: RunSpec, W):
    """The round topology the machines use: the network's links, or the step's ER graph (a subgraph of a
    complete network) — who a node may have sent its value to in round t."""
    from hushnet.protocols.gossip import ERPerStep, FixedTopology

    if fresh_er(spec):
        p = resolved(spec, W)
        n = W.shape[0]
        return ERPerStep(n, float(p.get("q", math.log(n) / n)), int(p.get("graph_seed", 0)), [int(k) for k in p["ks"]])
    return FixedTopology(W)


def round_matrices(spec: RunSpec, W) -> Any:
    """Public ``W_t`` of every round: ``W`` itself, or the Metropolis–Hastings matrix of each step's ER graph
    (what both ends of a round rebuild from the announced degrees when nobody drops out)."""
    if not fresh_er(spec):
        return W
    from hushnet.protocols.gossip_sim import mh_matrix

    topo = topology(spec, W)
    per_step = [mh_matrix(topo.graph(r)) for r in range(len(topo.ks))]
    return [per_step[r] for r, k in enumerate(topo.ks) for _ in range(k)]


# ---- randomized Muffliato: the pairwise activation schedule -------------------------------------


def activation_schedule(spec: RunSpec, W) -> np.ndarray:
    """(T, 2) the public activations of the network's own edges (``[-1, -1]`` = idle tick)."""
    return np.asarray(resolved(spec, W)["schedule"], dtype=np.int64)


def public_activations(sched: np.ndarray) -> dict[int, dict[int, dict[str, Any]]]:
    """The records of a run where every activation happened on both ends (``rec[t][node]``)."""
    rec: dict[int, dict[int, dict[str, Any]]] = {}
    for t, (a, b) in enumerate(np.asarray(sched, dtype=np.int64)):
        if a >= 0:
            rec[t] = {int(a): {"partner": int(b), "used": True, "sent": True},
                      int(b): {"partner": int(a), "used": True, "sent": True}}
    return rec


def realised_activations(spec: RunSpec, records: Mapping[int, list[dict[str, Any]]], W
                         ) -> tuple[dict[int, dict[int, dict[str, Any]]], dict[int, int]]:
    """The activations the settlement accounts, from every node's records, completed in the SAFE direction.

    A node's durable records are a prefix of its activations (its value of activation t leaves before
    t's record, that of its next activation only after).  So a node whose records stop at its activation
    c may have sent its value at c (assumed sent) and sent nothing later; and a value the partner used
    was sent, whatever the sender's records say.  Extra messages only enlarge views: never under-counted.
    Returns ``rec[t][node]`` and ``{vertex: first unrecorded activation}`` of the completed nodes.
    """
    sched = activation_schedule(spec, W)
    T = len(sched)
    rec: dict[int, dict[int, dict[str, Any]]] = {}
    completed: dict[int, int] = {}
    for v, recs in records.items():
        v = int(v)
        mine = [(int(t), int(sched[t, 1] if sched[t, 0] == v else sched[t, 0]))
                for t in np.flatnonzero((sched[:, 0] == v) | (sched[:, 1] == v))]
        if len(recs) > len(mine):
            raise ValueError(f"node {v} recorded {len(recs)} activations, the public schedule gives it {len(mine)}")
        for (t, p), r in zip(mine, sorted(recs, key=lambda r: int(r["round"]))):
            if int(r["round"]) != t or int(r["partner"]) != p:
                raise ValueError(f"node {v}'s records are not a prefix of its public activations "
                                 f"(activation {t} is with node {p}, recorded {r['round']} with {r['partner']})")
            rec.setdefault(t, {})[v] = {"partner": p, "used": bool(r["used"]), "sent": bool(r["sent"])}
        if len(recs) < len(mine):
            t, p = mine[len(recs)]
            rec.setdefault(t, {})[v] = {"partner": p, "used": False, "sent": True}
            completed[v] = t
    for t, ends in rec.items():
        for v, r in list(ends.items()):
            if r["used"]:
                p = r["partner"]
                ends.setdefault(p, {"partner": v, "used": False, "sent": True})["sent"] = True
    for t in rec:
        if t >= T:
            raise ValueError(f"activation {t} outside 0..{T - 1}")
    return rec, completed


def pairwise_row(spec: RunSpec, vertex: int, W, rec=None) -> np.ndarray:
    """(1, n) certified ``Δ²(vertex → v)/Δ²`` of randomized Muffliato: the exact projection of observer
    v's view (every value it received, its own noise known) on the activations ``rec`` (default: public)."""
    from hushnet.protocols.gossip_accounting import pairwise_sensitivities

    sched = activation_schedule(spec, W)
    rec = public_activations(sched) if rec is None else rec
    row = pairwise_sensitivities(rec, len(sched), W.shape[0])[vertex].copy()
    row[vertex] = 0.0
    return row[None, :]


def round_plan(spec: RunSpec, W) -> tuple[list[list[int]], list[np.ndarray]]:
    """Rounds of each noise injection and their γ per round: one phase for averaging, one per step for GD."""
    p = resolved(spec, W)
    if spec.protocol == "muffliato":
        T = int(p["rounds"])
        return [list(range(T))], [np.full(T, float(p.get("gamma", 1.0)))]
    if spec.protocol == "muffliato-gd":
        ks = [int(k) for k in p["ks"]]
        gs = p.get("gammas") or [1.0] * len(ks)
        T = sum(ks)
        starts = np.cumsum([0] + ks)
        phases, gammas = [], []
        for r, k in enumerate(ks):
            g = np.ones(T)
            g[starts[r] : starts[r] + k] = float(gs[r])
            phases.append(list(range(int(starts[r]), int(starts[r]) + k)))
            gammas.append(g)
        return phases, gammas
    T = int(p["rounds"])
    return [list(range(T))], [np.ones(T)]


def certified_sensitivities(spec: RunSpec, vertex: int, W, sched: RealisedSchedule | dict | None = None) -> np.ndarray:
    """(phases, n): certified ``Δ²(vertex → v)/Δ²`` of each noise phase on ``sched`` (default: public).

    Averaging: exact projection of the observer's view (its own noise removed), [M] Alg. 1, one phase.
    Muffliato-GD and streaming gossip: the whole run as one linear-Gaussian view (the state carries
    earlier noise into later steps/rounds, so per-step values must NOT be composed) with [K] Thm 12's box
    sensitivity (per-step/round contributions bounded by Δ), ``min(spectral, 1ᵀ|M|1, SDP dual certificate)``
    unless M ≥ 0 — valid for vector models (the scalar vertex enumeration is not), one phase.  Fresh ER graphs per step:
    the same, on each round's step graph.  Randomized Muffliato: :func:`pairwise_row` (``sched`` is then
    the activation records ``rec[t][node]``).
    """
    if spec.protocol == PAIRWISE:
        return pairwise_row(spec, vertex, W, sched)
    view = view_of(spec)
    phases, gammas = round_plan(spec, W)
    T = max(max(ph) for ph in phases) + 1
    if sched is None:
        sched = public_schedule(round_matrices(spec, W), T)
    if sched.rounds != T:
        raise ValueError(f"the schedule has {sched.rounds} rounds, the run has {T}")
    n = sched.n
    if spec.protocol in ("gossip-stream", "muffliato-gd"):
        row = np.zeros(n)
        for v in range(n):
            if v != vertex:
                if spec.protocol == "gossip-stream":
                    res = stream_sensitivity(sched, vertex, v, view=view, exact_limit=0)
                else:
                    res = gd_sensitivity(sched, vertex, v, phases, gammas, view=view)
                row[v] = float(res["value"])
        return row[None, :]
    out = np.zeros((len(phases), n))
    for k, (ph, g) in enumerate(zip(phases, gammas)):
        S = averaging_sensitivities(sched, g, view=view, rounds=ph, source=vertex)
        out[k] = S[vertex]
    out[:, vertex] = 0.0
    return out


def rdp_curves(sens: np.ndarray, sigma: float, orders: np.ndarray) -> np.ndarray:
    """(targets…, orders): Gaussian RDP ``α Δ²/(2σ²)`` of each sensitivity (σ = noise multiplier)."""
    return np.asarray(sens, dtype=float)[..., None] * np.asarray(orders, dtype=float) / (2.0 * sigma**2)


# ---- the papers' values (labelled "paper", never charged) ----------------------------------------

#: the report's label of each protocol's paper value, with the spec's warning (gossip.md §1.3.9, §2.5)
PAPER_LABELS = {
    "muffliato": ("paper: [M] Theorem 1, eq. (6), t = 0..T-1, unclipped, on the public W — NOT a guarantee: every "
                  "message carries the same noise, and summing per-message divergences can be far below the exact "
                  "loss (spec gossip.md §1.3.9 errata; e.g. 9.5e-3 where the exact loss is LDP)"),
    "muffliato-gd": ("paper: [M] Theorem 6, eq. (13), K rounds per step composed over steps, on the public W — NOT a "
                     "guarantee: a step's K messages share its noise (spec gossip.md §1.3.9 errata, item 4)"),
    "gossip-stream": ("paper: [K] Theorem 15 (observer set = closed neighbourhood, observers' noise counted; the "
                      "spec's corrected form) — NOT a guarantee: the spec flags its explicit constants as not "
                      "following from the proof, and the observer does know its own noise (gossip.md §2.5)"),
}


def paper_sensitivities(spec: RunSpec, vertex: int, W) -> np.ndarray:
    """(n,) the paper's unit-free ``Δ²(vertex → v)/Δ²`` on the public schedule (0 toward itself).

    Muffliato: [M] Thm 1 (:func:`hushnet.privacy.muffliato.thm1_from_source`, T resolved rounds; acceleration
    does not change it).  Muffliato-GD: Thm 6 eq. (13), Thm 1 with K rounds per step (on the
    step's graph), summed over steps.  Streaming gossip: [K] Thm 15 with ``m = |N̄_v|`` (1 in the
    aggregate view), ``ρ = max(|λ₂|, |λ_n|)``:
    ``m T/n + 2/(1−ρ)² √(m T/n) + 2/(1−ρ)⁴`` (∞ if W is not primitive).
    """
    from hushnet.privacy.muffliato import thm1_from_source
    from hushnet.protocols.gossip_sim import mh_matrix

    Wc = sp.csr_matrix(W, dtype=float)
    n = Wc.shape[0]
    p = resolved(spec, Wc)
    if spec.protocol == "muffliato":
        out = thm1_from_source(Wc, vertex, int(p["rounds"]))
    elif spec.protocol == "muffliato-gd" and fresh_er(spec):  # Thm 1 on each step's own ER graph
        topo = topology(spec, Wc)
        out = sum(thm1_from_source(mh_matrix(topo.graph(r)), vertex, int(k)) for r, k in enumerate(p["ks"]))
    elif spec.protocol == "muffliato-gd":
        eig = np.linalg.eigh(Wc.toarray())
        out = sum(thm1_from_source(Wc, vertex, int(k), eig=eig) for k in p["ks"])
    elif spec.protocol == "gossip-stream":
        T = int(p["rounds"])
        lam = np.sort(np.abs(np.linalg.eigvalsh(Wc.toarray())))[::-1]
        rho = float(lam[1]) if n > 1 else 0.0
        m = np.diff(Wc.indptr) + (Wc.diagonal() == 0)  # closed neighbourhood (the diagonal is in W's support)
        if view_of(spec) == "aggregate":  # secure summation: one observer row, S = e_iᵀ (Thm 15 with m = 1)
            m = np.ones(n)
        if rho >= 1.0 - 1e-12:
            out = np.full(n, np.inf)
        else:
            x = m * T / n
            out = x + 2.0 / (1.0 - rho) ** 2 * np.sqrt(x) + 2.0 / (1.0 - rho) ** 4
    else:
        raise ValueError(f"no paper bound for {spec.protocol}")
    out = np.array(out, dtype=float)
    out[vertex] = 0.0
    return out


def paper_gossip(spec: RunSpec, vertex: int, W=None) -> tuple[np.ndarray, str] | None:
    """The run report's "paper" row: ε toward every node at the spec's δ (best order, Gaussian RDP of the
    paper's sensitivity, no order limit), and the label that says which theorem and why it is no guarantee."""
    from hushnet.protocols.registry import transition_matrix

    if spec.protocol not in PAPER_LABELS:
        return None
    W = transition_matrix(spec.graph, spec.weights) if W is None else W
    sens = paper_sensitivities(spec, vertex, W)
    row = _best_order_dp(sens / (2.0 * spec.sigma**2), math.inf, math.log(1.0 / spec.budget.delta))
    row[sens <= 0] = 0.0
    row[vertex] = 0.0
    label = PAPER_LABELS[spec.protocol]
    if fresh_er(spec):
        label += "; fresh Erdős–Rényi graph per step: Theorem 1 on each step's public graph"
    if view_of(spec) == "aggregate":
        label += ("; aggregate view: [K] Thm 15 with m = 1" if spec.protocol == "gossip-stream" else
                  "; aggregate view: [M] has no such view, its neighbourhood value is shown")
    return row, label


# ---- projector ----------------------------------------------------------------------------------


def _refuse(spec: RunSpec, reason: str) -> PolicyDecision:
    return PolicyDecision(False, f"cannot project this node's privacy loss: {reason}", None, spec.budget.delta, "certified")


def accounting_view(spec: RunSpec) -> dict[str, Any]:
    view = view_of(spec)
    v = ANON_VIEWS["secure-summation" if view == "aggregate" else "neighbourhood"].as_dict()
    label = "aggregate (secure neighbourhood summation)" if view == "aggregate" else "neighbourhood (plain gossip)"
    return {**v, "gossip_view": view, "label": label, "bound": "certified"}


def check_network_spec(spec: RunSpec) -> str | None:
    """Why this gossip spec cannot run (or be accounted) between nodes, or None."""
    pp = spec.protocol_params
    if spec.protocol not in NET_GOSSIP:
        return (f"{spec.protocol} is simulator-only (its activations or graphs are not the network's links); "
                f"networked gossip protocols: {', '.join(NET_GOSSIP)}")
    graph = pp.get("graph", "fixed")
    if graph != "fixed":
        if not fresh_er(spec):
            return (f"graph {graph!r} is simulator-only over the network: only Muffliato-GD may draw a fresh "
                    "Erdős–Rényi graph per step ('er-per-step'), on a complete network topology")
        from hushnet.protocols.registry import transition_matrix

        try:
            A = sp.csr_matrix(transition_matrix(spec.graph, spec.weights))
        except (ValueError, KeyError) as exc:
            return f"graph {spec.graph!r}: {exc}"
        n = A.shape[0]
        A.setdiag(0.0)
        A.eliminate_zeros()
        if A.nnz != n * (n - 1):
            return (f"fresh Erdős–Rényi graphs per step: needs a complete network topology (complete:{n}): ER edges "
                    f"outside the network's links ({spec.graph} has {A.nnz // 2} of {n * (n - 1) // 2} edges)")
    view = view_of(spec)
    if view not in ("neighbourhood", "aggregate"):
        return f"protocol_params.view must be 'neighbourhood' or 'aggregate', got {view!r}"
    if spec.protocol == PAIRWISE and ("dropout" in pp or pp.get("chebyshev")):
        return "randomized Muffliato has no simulated dropouts nor Chebyshev acceleration (options of the rounds)"
    if view == "aggregate" and spec.protocol == PAIRWISE:
        return ("randomized Muffliato exchanges single values between two nodes: there is no neighbourhood sum to "
                "secure, so only the 'neighbourhood' view applies")
    if view == "aggregate" and "frac_bits" in pp and not (isinstance(pp["frac_bits"], int)
                                                          and 8 <= pp["frac_bits"] <= 40):
        return "frac_bits (fixed-point fraction bits of the secure sums) must be an integer in 8..40"
    if spec.weights != "hamilton":
        return "gossip rounds rebuild Metropolis-Hastings weights 1/(1+max(d_u,d_v)) on both ends: weights must be 'hamilton'"
    if not (isinstance(spec.sigma, (int, float)) and math.isfinite(spec.sigma) and spec.sigma > 0):
        return f"{spec.protocol} needs sigma > 0 (noise multiplier): a run without noise is not private"
    if "noise_std" in pp or pp.get("clip_after_noise"):
        return "absolute noise and clipping after noise are reproduction options, not accountable by the node"
    return None


def project_gossip(spec: RunSpec, vertex: int, local: Budget | None = None, W: Any = None) -> PolicyDecision:
    """Accept iff the certified exact row on the public schedule fits the node's budget (best order per target)."""
    from hushnet.protocols.registry import transition_matrix

    budget = local or spec.budget
    if budget.delta < spec.budget.delta:
        return PolicyDecision(False, f"spec δ={spec.budget.delta:g} exceeds this node's δ={budget.delta:g}",
                              None, spec.budget.delta, "certified")
    why = check_network_spec(spec)
    if why:
        return _refuse(spec, why)
    W = transition_matrix(spec.graph, spec.weights) if W is None else W
    if spec.protocol in ("gossip-stream", "muffliato-gd", PAIRWISE):
        T = int(resolved(spec, W)["rounds"]) if spec.protocol != "muffliato-gd" else int(spec.steps)
        if spec.protocol == PAIRWISE:
            T //= 8  # the pairwise replay is (activations × n), a few rows per activation
        if T * W.shape[0] > STREAM_MAX_CELLS:
            return _refuse(spec, f"{spec.protocol} accounting is dense in {'rounds' if spec.protocol == 'gossip-stream' else 'steps'}"
                                 f"×nodes ({T}×{W.shape[0]} > {STREAM_MAX_CELLS})")
    try:
        sens = certified_sensitivities(spec, vertex, W)
    except (ValueError, np.linalg.LinAlgError) as exc:
        return _refuse(spec, str(exc))
    slope = sens.sum(axis=0) / (2.0 * spec.sigma**2)  # RDP per unit α, composed over phases
    row = _best_order_dp(slope, math.inf, math.log(1.0 / spec.budget.delta))
    row[vertex] = 0.0
    row[slope <= 0] = 0.0
    det = {"N_u": 1.0, "phases": int(sens.shape[0]), "sensitivity_sq": sens.sum(axis=0).tolist(),
           "accounting_view": accounting_view(spec),
           "notes": [f"certified exact loss on the public {'activation ' if spec.protocol == PAIRWISE else ''}"
                     "schedule (no dropouts); the ledger is settled on the realised schedule after the run "
                     "(top-up, never refund)"]}
    worst = int(np.argmax(row))
    if row[worst] > budget.epsilon:
        return PolicyDecision(False, f"over budget: projected certified loss toward node {worst} is ε={row[worst]:.4g} "
                                     f"at δ={spec.budget.delta:g}, this node's budget is ε={budget.epsilon:g}",
                              row, spec.budget.delta, "certified", det)
    return PolicyDecision(True, f"within budget (worst certified ε={row[worst]:.4g} toward node {worst}; "
                                f"{view_of(spec)} view)", row, spec.budget.delta, "certified", det)


# ---- the ledger cost ----------------------------------------------------------------------------


@dataclass
class GossipCost:
    """Duck-types :class:`hushnet.runs.accounting.ContributionCost` for the node driver.

    ``phase_curves[k]`` (targets × orders) is charged at the k-th data action of the run (averaging:
    the one noisy input; GD and streaming: the whole run at the first data action, nothing later — their
    joint-view bound is not additive per step, so a stopped run has charged its whole projection).  ``curves(σ)`` is what the service's
    lifetime check multiplies by ``N_u = 1``: the whole run.
    """

    spec: RunSpec
    vertex: int
    ids: list[str]
    targets: list[str]
    orders: np.ndarray
    phase_curves: np.ndarray
    walk_slope: None = None
    alpha_max: float = math.inf
    bound_name: str = "certified exact view divergence (Muffliato / Koskela), projected on the public schedule"
    used: int = 0
    charged: np.ndarray | None = None
    settled: dict[str, Any] = field(default_factory=dict)

    def curves(self, sigma: float) -> np.ndarray:
        return self.phase_curves.sum(axis=0)

    def entry(self, ev: EngineEntry, run_id: str, node_id: str) -> PrivacyEntry:
        if abs(float(ev.sigma) - float(self.spec.sigma)) > 1e-12 * max(1.0, self.spec.sigma):
            raise ValueError(f"noise multiplier {ev.sigma} differs from the spec's {self.spec.sigma}")
        k = self.used
        self.used += 1
        if self.spec.protocol in ("gossip-stream", "muffliato-gd"):
            rdp = self.phase_curves[0] if k == 0 else np.zeros_like(self.phase_curves[0])
        elif k < self.phase_curves.shape[0]:
            rdp = self.phase_curves[k]
        else:
            raise ValueError(f"data action {k + 1} of a run projected with {self.phase_curves.shape[0]}")
        self.charged = rdp.copy() if self.charged is None else self.charged + rdp
        return PrivacyEntry.from_row(run_id, ev.protocol, view_of(self.spec), "certified", self.targets, rdp,
                                     note=f"{ev.kind} at round {ev.step} ({self.bound_name}, {view_of(self.spec)} view)")


def gossip_cost(spec: RunSpec, vertex: int, ids: list[str], W=None, orders=None) -> GossipCost:
    from hushnet.protocols.registry import transition_matrix

    o = np.asarray(DEFAULT_ORDERS if orders is None else orders, dtype=float)
    W = transition_matrix(spec.graph, spec.weights) if W is None else W
    sens = certified_sensitivities(spec, vertex, W)
    keep = [v for v in range(len(ids)) if v != vertex]
    curves = rdp_curves(sens[:, keep], spec.sigma, o)  # (phases, targets, orders)
    return GossipCost(spec, vertex, list(ids), [ids[v] for v in keep], o, curves)


# ---- machine builder ----------------------------------------------------------------------------


def build_gossip(node, spec: RunSpec, vertex: int, ids: list[str], task, W, options):
    """This node's gossip machine, with the public gossip matrix (the network's links are its support)."""
    from hushnet.protocols.registry import make_machine, transition_matrix

    why = check_network_spec(spec)
    if why:
        raise ValueError(why)
    W = W if W is not None else transition_matrix(spec.graph, spec.weights)
    node_rng = getattr(spec, "node_rng", None)  # secret noise unless the spec asks for the public seed
    rng = node_rng(vertex, len(ids)) if node_rng is not None else None
    params = gossip_params(spec)
    if params.get("secure_summation"):  # the node's own long-term X25519 key and the directory's public keys
        from hushnet.runs.anonymity import node_keypair, node_key_directory

        kp, directory = node_keypair(node), node_key_directory(node)
        missing = [ids[v] for v in range(len(ids)) if v not in directory.keys]
        if missing:
            raise ValueError(f"secure summation: the directory has no X25519 key for {', '.join(missing[:5])}")
        params.update(share_key=kp, share_directory=directory)
    return make_machine(spec.protocol, vertex, len(ids), task, run_seed=spec.seed, run_id=spec.run_id,
                        params=params, W=W, view_model=spec.view_model, rng=rng)


# ---- schedule records and settlement ------------------------------------------------------------


def schedule_records(entries: Iterable[EngineEntry]) -> list[dict[str, Any]]:
    """The node's ``schedule`` records (JSON-able: row keys are strings on the wire)."""
    out = []
    for e in entries:
        if e.kind == "schedule" and "partner" in e.detail:  # randomized Muffliato: one pairwise activation
            d = dict(e.detail)
            out.append({"round": int(d["round"]), "partner": int(d["partner"]), "used": bool(d["used"]),
                        "sent": bool(d["sent"])})
        elif e.kind == "schedule":
            d = dict(e.detail)
            out.append({"round": int(d["round"]), "up": bool(d["up"]), "self": float(d["self"]),
                        "row": {str(k): float(v) for k, v in d["row"].items()},
                        "sent_value": [int(j) for j in d["sent_value"]], "missing": [int(j) for j in d["missing"]],
                        "step": int(d.get("step", 0)),
                        **({"secure": d["secure"]} if d.get("secure") is not None else {})})
    return out


def realised_schedule(records: Mapping[int, list[dict[str, Any]]], n: int, rounds: int) -> RealisedSchedule:
    """Rebuild the realised schedule from every node's records (vertex → list of records)."""
    ledgers = {int(v): [EngineEntry(int(v), int(r["round"]), "schedule", "sender-known", 0.0, 0.0, 0.0, "gossip", "",
                                    {**r, "row": {int(k): float(w) for k, w in r["row"].items()}})
                        for r in recs] for v, recs in records.items()}
    return schedule_from_ledgers(ledgers, n, rounds)


def settled_schedule(spec: RunSpec, records: Mapping[int, list[dict[str, Any]]], n: int,
                     W=None) -> tuple[RealisedSchedule, dict[int, int]]:
    """The schedule the settlement accounts: the recorded rounds, plus the SAFE completion of every node
    whose (durable) records stop early — a crashed node is assumed to have sent its value of the round
    it died in to all its neighbours (:func:`~hushnet.protocols.gossip_accounting.complete_crashed`).
    Returns the schedule and ``{vertex: first unrecorded round}`` of the completed nodes."""
    from hushnet.protocols.registry import transition_matrix

    W = transition_matrix(spec.graph, spec.weights) if W is None else W
    if spec.protocol == PAIRWISE:  # the activations instead of rounds (same contract)
        return realised_activations(spec, records, W)  # type: ignore[return-value]
    phases, _ = round_plan(spec, W)
    T = max(max(ph) for ph in phases) + 1
    sched = realised_schedule(records, n, T)
    topo = topology(spec, W)  # a crashed node may have sent to its neighbours of that round's graph
    completed = complete_crashed(sched, records.keys(), topo.neighbours)
    return sched, completed


def realised_curves(spec: RunSpec, vertex: int, ids: list[str], records: Mapping[int, list[dict[str, Any]]],
                    orders: np.ndarray, W=None) -> np.ndarray:
    """(targets, orders): the certified RDP of ``vertex`` on the realised schedule (the accountant's replay,
    crashed nodes' unrecorded rounds completed in the safe direction)."""
    from hushnet.protocols.registry import transition_matrix

    W = transition_matrix(spec.graph, spec.weights) if W is None else W
    sched, _ = settled_schedule(spec, records, len(ids), W)
    sens = certified_sensitivities(spec, vertex, W, sched).sum(axis=0)
    keep = [v for v in range(len(ids)) if v != vertex]
    return rdp_curves(sens[keep], spec.sigma, orders)


def _missing_records(recs: Mapping[int, list[dict[str, Any]]]) -> list[int]:
    """Vertices absent from the records that some recorded node heard from (used their value or saw them
    up).  A vertex present with fewer rounds (even none) gave its durable prefix: it is completed safely."""
    referenced: set[int] = set()
    for r in (r for rs in recs.values() for r in rs):
        if "partner" in r:  # an activation: the partner's value was used
            if r["used"]:
                referenced.add(int(r["partner"]))
            continue
        referenced.update(int(j) for j in r["row"])
        referenced.update(int(j) for j in r["sent_value"])
    return sorted(v for v in referenced if v not in recs)


def _same_records(given: list[dict[str, Any]] | None, mine: list[dict[str, Any]]) -> None:
    if given is not None and json.dumps(given, sort_keys=True) != json.dumps(mine, sort_keys=True):
        raise ValueError("the settlement's records for this node differ from what this node recorded")


def _settle_ledger(spec: RunSpec, vertex: int, ids: list[str], W, targets: list[str], orders: np.ndarray,
                   charged: np.ndarray, recs: Mapping[int, list[dict[str, Any]]], ledger, run_id: str, node_id: str,
                   real: np.ndarray | None) -> tuple[dict[str, Any], np.ndarray]:
    """The settlement itself: replay, top the ledger up to ``max(charged, realised)``, say what was done."""
    missing = _missing_records(recs)
    if missing:
        raise ValueError(f"records of vertices {missing} missing: other nodes used or announced values they sent, "
                         "so the replay would leave those values out of the views; settle with their records")
    _, completed = settled_schedule(spec, recs, len(ids), W)  # also refuses a record set with a gap
    if real is None:
        real = realised_curves(spec, vertex, ids, recs, orders, W)
    # differences within the accountant's own floating-point error (the projection's rank tolerance is
    # ~1e-12 relative) are not a change of schedule: only a real excess is topped up
    top = np.where(real > charged * (1.0 + SETTLE_RTOL) + SETTLE_ATOL, real - charged, 0.0)
    top[~np.isfinite(top)] = np.inf
    over = None
    if np.any(top > 0) and ledger is not None:
        entry = PrivacyEntry.from_row(run_id, spec.protocol, view_of(spec), "certified", targets, top,
                                      note="gossip settlement: top-up to the certified loss on the realised schedule")
        try:
            ledger.charge(entry)
        except BudgetExceeded as exc:
            over = str(exc)
            ledger.charge(entry, enforce_budget=False)  # the realised rounds already happened
    from hushnet.runs.accounting import dp_from_rdp

    delta = spec.budget.delta
    total = charged + top
    doc = {"run_id": run_id, "node": node_id, "view": view_of(spec),
           "records_from": sorted(int(v) for v in recs),
           "completed": {str(v): c for v, c in completed.items()},
           "realised": {t: dp_from_rdp(orders, real[j], delta) for j, t in enumerate(targets)},
           "charged": {t: dp_from_rdp(orders, total[j], delta) for j, t in enumerate(targets)},
           "topped_up": bool(np.any(top > 0)), "over_budget": over, "bound": "certified"}
    if completed:
        doc["notes"] = [f"vertices {sorted(completed)} stopped recording (crash): each is assumed to have sent its "
                        "value of the round it died in to every neighbour, which can only enlarge the views"]
    return doc, top


def settle(run, records: Mapping[int, list[dict[str, Any]]], real: np.ndarray | None = None) -> dict[str, Any]:
    """Top the node's ledger up to its certified loss on the realised schedule (never refund).

    ``run`` is the node's :class:`~hushnet.runs.driver.RunDriver`; ``records`` vertex → that node's
    schedule records.  The node's own records must equal what it recorded itself.
    """
    cost = run.cost
    if not isinstance(cost, GossipCost):
        raise ValueError(f"run {run.run_id} is not a networked gossip run")
    if cost.settled:
        return {**cost.settled, "again": True}
    mine = schedule_records(run.engine_entries)
    _same_records(records.get(run.vertex), mine)
    recs = {**{int(k): v for k, v in records.items()}, run.vertex: mine}
    charged = cost.charged if cost.charged is not None else np.zeros((len(cost.targets), cost.orders.size))
    doc, top = _settle_ledger(run.spec, run.vertex, run.ids, run.W, cost.targets, cost.orders, charged, recs,
                              run.ledger, run.run_id, run.node_id, real)
    if np.any(top > 0):
        run.run_rdp = top if run.run_rdp is None else run.run_rdp + top
        cost.charged = charged + top
    cost.settled = doc
    run._emit("settled", topped_up=cost.settled["topped_up"])  # noqa: SLF001 - the run's event stream
    return cost.settled


def _run_charged(ledger, run_id: str, targets: list[str]) -> np.ndarray:
    """(targets, orders) everything the persistent ledger holds for ``run_id`` (charges and top-ups)."""
    out = np.zeros((len(targets), ledger.orders.size))
    pos = {t: j for j, t in enumerate(targets)}
    for e in ledger.entries(run_id):
        for t, v in e["rdp"].items():
            if t in pos:
                out[pos[t]] += v
    return out


def settle_recovered(service, run_id: str, records: Mapping[int, list[dict[str, Any]]],
                     real: np.ndarray | None = None) -> dict[str, Any]:
    """Settle a run this node no longer holds in memory (its process restarted): the spec and the node's
    own records come from its durable store, what it was charged from its persistent ledger (so settling
    twice tops up nothing the second time)."""
    from hushnet.protocols.registry import transition_matrix
    from hushnet.runs.gossip_store import store_for

    st = store_for(service.state_dir)
    got = st.run(run_id)
    if got is None:
        raise KeyError(f"no run {run_id!r} at {service.node.node_id} (not in memory nor in its schedule store)")
    spec, vertex, ids = got
    W = transition_matrix(spec.graph, spec.weights)
    mine = st.records(run_id)
    _same_records(records.get(vertex), mine)
    recs = {**{int(k): v for k, v in records.items()}, vertex: mine}
    ledger = service.ledger
    targets = [ids[v] for v in range(len(ids)) if v != vertex]
    charged = _run_charged(ledger, run_id, targets)
    doc, _ = _settle_ledger(spec, vertex, ids, W, targets, ledger.orders, charged, recs, ledger, run_id,
                            service.node.node_id, real)
    return {**doc, "recovered": True}


def _stored_run(service, payload: bytes):
    """``(run_id, spec, vertex, ids)`` of a run only the node's durable store still knows, or None."""
    from hushnet.runs.gossip_store import store_for

    run_id = str(json.loads(payload or b"{}").get("run_id", ""))
    got = store_for(service.state_dir).run(run_id)
    return None if got is None else (run_id, *got)


async def c_schedule(service, payload: bytes) -> bytes:
    """``run.schedule``: this node's recorded gossip rows of a run (for the operator's settlement).  After a
    restart the run is gone from memory; its durable records answer (``state: "lost"``)."""
    from hushnet.runs.gossip_store import store_for

    try:
        run, _ = service._run(payload)  # noqa: SLF001
    except KeyError:
        got = _stored_run(service, payload)
        if got is None:
            raise
        run_id, _spec, vertex, _ids = got
        return json.dumps({"node": service.node.node_id, "vertex": vertex, "run_id": run_id, "state": "lost",
                           "records": store_for(service.state_dir).records(run_id), "durable": True}).encode()
    return json.dumps({"node": service.node.node_id, "vertex": run.vertex, "run_id": run.run_id, "state": run.state,
                       "records": schedule_records(run.engine_entries)}).encode()


async def c_settle(service, payload: bytes) -> bytes:
    """``run.settle``: ``{"run_id", "records": {vertex: [record…]}}`` → top-up on the realised schedule."""
    import asyncio

    loop = asyncio.get_running_loop()
    args = json.loads(payload or b"{}")
    recs = {int(k): v for k, v in dict(args.get("records") or {}).items()}
    try:
        run, _ = service._run(payload)  # noqa: SLF001
    except KeyError:
        if _stored_run(service, payload) is None:
            raise
        run_id = str(args.get("run_id", ""))
        try:  # the replay and the ledger charge run off the event loop
            out = await loop.run_in_executor(None, settle_recovered, service, run_id, recs)
        except ValueError as exc:
            return json.dumps({"node": service.node.node_id, "run_id": run_id, "error": str(exc)}).encode()
        return json.dumps(out, default=float).encode()
    mine = {**recs, run.vertex: schedule_records(run.engine_entries)}
    real = None
    if isinstance(run.cost, GossipCost) and not run.cost.settled and not _missing_records(mine):
        try:  # the replay runs off the event loop
            real = await loop.run_in_executor(None, realised_curves, run.spec, run.vertex, run.ids, mine,
                                              run.cost.orders, run.W)
        except ValueError:
            real = None  # settle() reports the reason
    try:
        out = settle(run, recs, real)
    except ValueError as exc:
        return json.dumps({"node": service.node.node_id, "run_id": run.run_id, "error": str(exc)}).encode()
    return json.dumps(out, default=float).encode()


async def settle_run(client, run_id: str, node_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Operator side (an :class:`~hushnet.client.core.AsyncClient`): gather every reachable node's records
    (``run.schedule``), then settle every reachable node (``run.settle``).  An unreachable node
    contributes no records: its rows stay identity and its sent values are missing from its neighbours'
    views — the settlement says which vertices' records it used (``records_from``)."""
    recs: dict[str, list] = {}
    for nid in node_ids:
        try:
            doc = await client._control(nid, "run.schedule", {"run_id": run_id})  # noqa: SLF001
        except Exception:  # noqa: BLE001 - unreachable: no records
            continue
        recs[str(doc["vertex"])] = doc["records"]
    out: dict[str, dict[str, Any]] = {}
    for nid in node_ids:
        try:
            out[nid] = await client._control(nid, "run.settle", {"run_id": run_id, "records": recs},  # noqa: SLF001
                                             timeout=60.0)
        except Exception as exc:  # noqa: BLE001
            out[nid] = {"error": str(exc)}
    return out


def gossip_journal(service, spec: RunSpec, vertex: int, ids: list[str]):
    """The driver's journal of a networked gossip run: its schedule records, durable in the node's state."""
    from hushnet.runs.gossip_store import store_for

    st = store_for(service.state_dir)
    st.open_run(spec, vertex, ids)
    return st.journal(spec.run_id)


# ---- registration -------------------------------------------------------------------------------


def _register() -> None:
    from hushnet.runs import accounting

    for proto in ("muffliato", "muffliato-gd", "gossip-stream", "muffliato-randomized"):
        MACHINE_PARAMS[proto] = gossip_params
        accounting.register_projector(proto, project_gossip)
        accounting.register_machine_builder(proto, build_gossip)
        accounting.register_cost(proto, gossip_cost)
    for proto in NET_GOSSIP:
        accounting.register_paper_bound(proto, paper_gossip)
    for proto in NET_GOSSIP:
        accounting.register_journal(proto, gossip_journal)
    accounting.register_command("run.schedule", c_schedule)
    accounting.register_command("run.settle", c_settle)


_register()

__all__ = ["NET_GOSSIP", "PAIRWISE", "fresh_er", "topology", "round_matrices", "activation_schedule",
           "public_activations", "realised_activations", "pairwise_row", "gossip_params", "view_of", "public_schedule", "round_plan", "certified_sensitivities",
           "rdp_curves", "project_gossip", "accounting_view", "check_network_spec", "GossipCost", "gossip_cost",
           "build_gossip", "schedule_records", "realised_schedule", "settled_schedule", "realised_curves", "settle",
           "settle_recovered", "settle_run", "gossip_journal", "PAPER_LABELS", "paper_sensitivities", "paper_gossip",
           "c_schedule", "c_settle"]
