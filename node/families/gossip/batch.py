"""Batch drivers: a whole gossip run as array operations, equal to the per-node machines.

The per-node machines (:mod:`hushnet.families.gossip.machines`) are what a networked node runs, and the event
simulator runs them faithfully — with envelopes, availability rounds, timers and every node's own
bookkeeping.  That costs about a millisecond per node per round, so a Muffliato run at the papers'
sizes (n = 2048–4000, hundreds of rounds) takes minutes in the simulator where the authors' numpy
code (``X ← W X``) takes a second.

This module runs the *same* computation as one matrix product per round, for the case the papers
study: a fixed public graph and every node up every round.  Parity is by construction and tested:

* every node draws its noise from its own generator (``node_generators(run_seed, n)[v]``), in the
  order its machine does (Muffliato: once; Muffliato-GD: once per gradient step; streaming gossip:
  once per round), so the noise is bit-identical;
* the mixing matrix is the one the machines realise from their neighbours' announced degrees
  (Metropolis–Hastings weights ``1/(1 + max(d_u, d_v))`` on the support of ``W``), so the rounds
  differ from the machines' only in floating-point summation order (≤ 1e-12 in the tests);
* the data-use ledger entries are the machines' (same kind, step, sensitivity, noise).

What it does not do: dropouts, timeouts, per-round fresh graphs, the randomized (pairwise) variant
and secure summation — use the event simulator for those.  No schedule records are emitted: with
every node up every round the realised schedule is the public one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import scipy.sparse as sp

from hushnet.engine.actions import LedgerEntry
from hushnet.engine.rng import node_generators
from hushnet.families.gossip.params import GOSSIP_STREAM, MUFFLIATO, MUFFLIATO_GD
from hushnet.tasks.base import GradientTask, Task, ValueTask

#: protocols the batch driver runs (fixed graph, every node up)
BATCH_PROTOCOLS = (MUFFLIATO, MUFFLIATO_GD, GOSSIP_STREAM)


class BatchUnsupported(ValueError):
    """The run needs something only the event simulator does (dropouts, fresh graphs, secure sums)."""


@dataclass
class BatchRun:
    """Every node's final model (rows) and its data-use ledger entries, as the machines would emit them."""

    protocol: str
    models: np.ndarray
    rounds: int
    entries: list[list[LedgerEntry]] = field(default_factory=list)


def _mixing(W: Any) -> sp.csr_matrix:
    from hushnet.families.gossip.build import mh_matrix

    if W is None:
        raise BatchUnsupported("the batch driver needs the public gossip matrix W (a fixed graph)")
    return mh_matrix(W)


def _check(protocol: str, p: dict[str, Any]) -> None:
    if protocol not in BATCH_PROTOCOLS:
        raise BatchUnsupported(
            f"{protocol!r} has no batch driver (available: {', '.join(BATCH_PROTOCOLS)}); "
            "run it in the event simulator"
        )
    if p.get("graph", "fixed") != "fixed":
        raise BatchUnsupported(
            f"graph={p['graph']!r}: fresh per-step/per-round graphs need the event simulator"
        )
    if p.get("secure_summation"):
        raise BatchUnsupported("secure summation needs the event simulator")
    if float(p.get("dropout", 0.0)) > 0:
        raise BatchUnsupported("dropouts need the event simulator")


def run_gossip_batch(
    protocol: str,
    tasks: Sequence[Task],
    *,
    run_seed: int,
    params: dict[str, Any],
    W: Any,
    run_id: str = "sim",
    view_model: str = "sender-known",
) -> BatchRun:
    """Run ``protocol`` on ``tasks`` (node v holds ``tasks[v]``) as array operations.

    ``params`` are the protocol's public parameters as for the machines (``rounds="auto"``, ``K="auto"``
    and ``chebyshev`` are resolved the same way, by :func:`hushnet.families.gossip.build.resolve_params`).
    """
    from hushnet.families.gossip.build import resolve_params

    n = len(tasks)
    if n == 0:
        raise ValueError("no tasks")
    if W is not None and W.shape != (n, n):
        raise ValueError(f"W is {W.shape}, but there are {n} tasks")
    raw = dict(params)
    _check(protocol, raw)
    sens = np.array([float(t.sensitivity()) for t in tasks])
    p = resolve_params(protocol, raw, W, n, float(tasks[0].sensitivity()))
    M = _mixing(W)
    gens = node_generators(run_seed, n)
    dim = int(tasks[0].dim)
    if any(int(t.dim) != dim for t in tasks):
        raise ValueError("every node's task must have the same dimension")

    def entry(v: int, step: int, kind: str, std: float, **detail: Any) -> LedgerEntry:
        s = float(sens[v])
        sigma = std / s if s > 0 else float("inf")
        return LedgerEntry(v, step, kind, view_model, s, std, sigma, protocol, run_id, detail)

    def draws(std: np.ndarray) -> np.ndarray:
        return np.stack([gens[v].standard_normal(dim) for v in range(n)]) * std[:, None]

    entries: list[list[LedgerEntry]] = [[] for _ in range(n)]
    if protocol == MUFFLIATO:
        if not all(isinstance(t, ValueTask) for t in tasks):
            raise BatchUnsupported("muffliato averages values: every node needs a value task")
        rounds, gamma, sigma = int(p["rounds"]), float(p.get("gamma", 1.0)), float(p["sigma"])
        std = sigma * sens
        X = np.stack([np.asarray(t.value(0), dtype=np.float64) for t in tasks]) + draws(std)
        for v in range(n):
            entries[v].append(entry(v, 0, "value", float(std[v]), gamma=gamma, rounds=rounds))
        prev = None
        for r in range(rounds):
            mixed = M @ X
            nxt = mixed if (r == 0 or gamma == 1.0) else gamma * mixed + (1.0 - gamma) * prev
            prev, X = X, nxt
        return BatchRun(protocol, X, rounds, entries)

    if protocol == GOSSIP_STREAM:
        rounds, sigma, eta = int(p["rounds"]), float(p["sigma"]), float(p.get("step_size", 1.0))
        grad = all(isinstance(t, GradientTask) for t in tasks)
        if not grad and not all(isinstance(t, ValueTask) for t in tasks):
            raise BatchUnsupported(
                "gossip-stream needs value tasks or gradient tasks on every node"
            )
        theta = (
            np.zeros((n, dim))
            if p.get("x0") is None
            else np.tile(np.asarray(p["x0"], dtype=np.float64), (n, 1))
        )
        std = sigma * sens
        kind = "gradient" if grad else "value"
        for r in range(rounds):
            noise = draws(std)
            if grad:
                G = np.stack([tasks[v].gradient(theta[v]) for v in range(n)])
                msg = theta - eta * (G + noise)
            else:
                msg = (
                    theta
                    + np.stack([np.asarray(t.value(r), dtype=np.float64) for t in tasks])
                    + noise
                )
            for v in range(n):
                entries[v].append(entry(v, r, kind, float(std[v]), step_size=eta))
            theta = M @ msg
        return BatchRun(protocol, theta, rounds, entries)

    # muffliato-gd
    if not all(isinstance(t, GradientTask) for t in tasks):
        raise BatchUnsupported("muffliato-gd needs a gradient task on every node")
    ks = [int(k) for k in p["ks"]]
    gammas = [1.0] * len(ks) if p.get("gammas") is None else [float(g) for g in p["gammas"]]
    nu = float(p["step_size"])
    noise_std = p.get("noise_std")
    std = (
        np.full(n, float(noise_std)) if noise_std is not None else float(p.get("sigma", 0.0)) * sens
    )
    clip_after = bool(p.get("clip_after_noise", False))
    theta = (
        np.zeros((n, dim))
        if p.get("x0") is None
        else np.tile(np.asarray(p["x0"], dtype=np.float64), (n, 1))
    )
    for r, (k, g) in enumerate(zip(ks, gammas)):
        xi = draws(std)
        if clip_after:
            G = np.stack([tasks[v].raw_gradient(theta[v]) for v in range(n)]) + xi
            clips = np.array([float(getattr(t, "clip", np.inf)) for t in tasks])
            norms = np.sqrt(np.einsum("ij,ij->i", G, G))
            scale = np.where(norms > clips, clips / np.where(norms > 0, norms, 1.0), 1.0)
            G = G * scale[:, None]
        else:
            G = np.stack([tasks[v].gradient(theta[v]) for v in range(n)]) + xi
        X = theta - nu * G
        for v in range(n):
            entries[v].append(
                entry(
                    v, r, "gradient", float(std[v]), rounds=k, gamma=g, clip_after_noise=clip_after
                )
            )
        prev = None
        for j in range(k):
            mixed = M @ X
            nxt = mixed if (j == 0 or g == 1.0) else g * mixed + (1.0 - g) * prev
            prev, X = X, nxt
        theta = X
    return BatchRun(protocol, theta, sum(ks), entries)


__all__ = ["BATCH_PROTOCOLS", "BatchRun", "BatchUnsupported", "run_gossip_batch"]
