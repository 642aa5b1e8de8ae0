"""Public schedules of a gossip run, derived from the spec and the public graph alone: the resolved
parameters (rounds, γ, per-step K), the schedule where every node is up every round, fresh
Erdős–Rényi step graphs, randomized Muffliato's activation schedule and the rounds of each noise
injection.  The projection and the settlement account these (no secrets, no accounting here).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
import scipy.sparse as sp

from hushnet.families.gossip.params import MUFFLIATO, MUFFLIATO_GD, gossip_params
from hushnet.families.gossip.realised import RealisedSchedule
from hushnet.runs.spec import RunSpec


def resolved(spec: RunSpec, W, sensitivity: float = 1.0) -> dict[str, Any]:
    """The concrete public parameters (rounds, γ, per-step K) every node and the simulator derive alike."""
    from hushnet.families.gossip.build import resolve_params

    return resolve_params(spec.protocol, gossip_params(spec), W, W.shape[0], sensitivity)


# ---- schedules and the exact accountant ---------------------------------------------------------


def public_schedule(W, rounds: int) -> RealisedSchedule:
    """The schedule of a run where every node is up every round: ``W_t = W``, every edge carries a value.
    ``W`` may be a list of per-round matrices (fresh Erdős–Rényi graphs per step)."""
    Ws = (
        [sp.csr_matrix(Wt, dtype=float) for Wt in W]
        if isinstance(W, (list, tuple))
        else [sp.csr_matrix(W, dtype=float)] * rounds
    )
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
    return RealisedSchedule(
        n,
        Ws,
        sent,
        np.ones((rounds, n), bool),
        np.ones((rounds, n), bool),
        np.zeros(rounds, dtype=np.int64),
    )


def fresh_er(spec: RunSpec) -> bool:
    """Does the spec ask for a fresh public Erdős–Rényi graph per gradient step ([M] Fig. 1c)?"""
    return (
        spec.protocol == MUFFLIATO_GD
        and spec.protocol_params.get("graph", "fixed") == "er-per-step"
    )


def topology(spec: RunSpec, W):
    """The round topology the machines use: the network's links, or the step's ER graph (a subgraph of a
    complete network) — who a node may have sent its value to in round t."""
    from hushnet.families.gossip.machines import ERPerStep, FixedTopology

    if fresh_er(spec):
        p = resolved(spec, W)
        n = W.shape[0]
        return ERPerStep(
            n,
            float(p.get("q", math.log(n) / n)),
            int(p.get("graph_seed", 0)),
            [int(k) for k in p["ks"]],
        )
    return FixedTopology(W)


def round_matrices(spec: RunSpec, W) -> Any:
    """Public ``W_t`` of every round: ``W`` itself, or the Metropolis–Hastings matrix of each step's ER graph
    (what both ends of a round rebuild from the announced degrees when nobody drops out)."""
    if not fresh_er(spec):
        return W
    from hushnet.families.gossip.build import mh_matrix

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
            rec[t] = {
                int(a): {"partner": int(b), "used": True, "sent": True},
                int(b): {"partner": int(a), "used": True, "sent": True},
            }
    return rec


def realised_activations(
    spec: RunSpec, records: Mapping[int, list[dict[str, Any]]], W
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
        mine = [
            (int(t), int(sched[t, 1] if sched[t, 0] == v else sched[t, 0]))
            for t in np.flatnonzero((sched[:, 0] == v) | (sched[:, 1] == v))
        ]
        if len(recs) > len(mine):
            raise ValueError(
                f"node {v} recorded {len(recs)} activations, the public schedule gives it {len(mine)}"
            )
        for (t, p), r in zip(mine, sorted(recs, key=lambda r: int(r["round"]))):
            if int(r["round"]) != t or int(r["partner"]) != p:
                raise ValueError(
                    f"node {v}'s records are not a prefix of its public activations "
                    f"(activation {t} is with node {p}, recorded {r['round']} with {r['partner']})"
                )
            rec.setdefault(t, {})[v] = {
                "partner": p,
                "used": bool(r["used"]),
                "sent": bool(r["sent"]),
            }
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


def round_plan(spec: RunSpec, W) -> tuple[list[list[int]], list[np.ndarray]]:
    """Rounds of each noise injection and their γ per round: one phase for averaging, one per step for GD."""
    p = resolved(spec, W)
    if spec.protocol == MUFFLIATO:
        T = int(p["rounds"])
        return [list(range(T))], [np.full(T, float(p.get("gamma", 1.0)))]
    if spec.protocol == MUFFLIATO_GD:
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
