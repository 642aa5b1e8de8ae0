"""Build gossip machines from public run parameters, and run a whole gossip run in the simulator.

:func:`make_gossip_machine` is what the protocol registry calls for one node (the node driver and
the simulator share it).  Derived public numbers — the number of rounds from the spec's rule, the
Chebyshev γ from the spectral gap, per-step K on fresh Erdős–Rényi graphs, the randomized
activation schedule — are computed from public inputs only and cached, so n machines of one
simulated run do not repeat an eigendecomposition.

Every gossip node finishes, not one token holder: :func:`run_gossip` runs the simulator with
``finish="all"`` (the run is over when every node that is still alive has finished) and stacks the
nodes' final models.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from hushnet.engine.protocol import NodeContext, Protocol
from hushnet.engine.rng import node_generators
from hushnet.families.gossip.machines import (
    ERPerStep,
    FixedTopology,
    MuffliatoAveraging,
    MuffliatoGD,
    StreamingGossip,
    connected_er,
    t_stop,
)
from hushnet.families.gossip.params import (
    GOSSIP_STREAM,
    LABELS,
    MUFFLIATO,
    MUFFLIATO_GD,
    MUFFLIATO_RANDOMIZED,
    GossipOptions,
)
from hushnet.families.gossip.randomized import RandomizedMuffliato
from hushnet.privacy.graphs import chebyshev_gamma
from hushnet.privacy.muffliato import randomized_schedule
from hushnet.sim import SimResult, Simulator
from hushnet.tasks.base import Task

__all__ = [
    "GOSSIP_PROTOCOLS",
    "code_gap",
    "mh_matrix",
    "resolve_params",
    "make_gossip_machine",
    "build_gossip_machines",
    "GossipRun",
    "run_gossip",
]

#: the gossip family's protocols (their one list is :mod:`hushnet.families.gossip.params`)
GOSSIP_PROTOCOLS: dict[str, str] = dict(LABELS)

_OPTION_KEYS = (
    "timeout",
    "max_ahead",
    "give_up_after",
    "dropout",
    "record_states",
    "ticks",
    "record_steps",
)


def code_gap(W) -> float:
    """``1 − λ₂(W)`` (the reference code's gap), sparse Lanczos for large n."""
    n = W.shape[0]
    if n <= 1500:
        lam = np.linalg.eigvalsh(W.toarray() if sp.issparse(W) else np.asarray(W, dtype=float))
        return float(1.0 - lam[-2])
    lam = spla.eigsh(
        sp.csr_matrix(W, dtype=float), k=2, which="LA", return_eigenvectors=False, tol=1e-10
    )
    return float(1.0 - np.sort(lam)[0])


def mh_matrix(adjacency) -> sp.csr_matrix:
    """Metropolis–Hastings ("hamilton") weights of an adjacency: ``1/(1 + max(d_u, d_v))``, self-loop the rest."""
    A = sp.csr_matrix(adjacency, dtype=float)
    A.setdiag(0.0)
    A.eliminate_zeros()
    A.data[:] = 1.0
    d = np.asarray(A.sum(axis=1)).ravel()
    C = A.tocoo()
    w = 1.0 / (1.0 + np.maximum(d[C.row], d[C.col]))
    off = sp.csr_matrix((w, (C.row, C.col)), shape=A.shape)
    return (off + sp.diags(1.0 - np.asarray(off.sum(axis=1)).ravel())).tocsr()


_CACHE: dict[str, dict[str, Any]] = {}


def _key(protocol: str, params: dict[str, Any], W, n: int, sens: float) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(protocol.encode())
    h.update(json.dumps(params, sort_keys=True, default=str).encode())
    h.update(f"{n}:{sens}".encode())
    if W is not None:
        Wc = sp.csr_matrix(W)
        for arr in (Wc.indptr, Wc.indices, Wc.data):
            h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


def resolve_params(
    protocol: str, params: dict[str, Any], W, n: int, sensitivity: float = 1.0
) -> dict[str, Any]:
    """Concrete public parameters: ``rounds="auto"`` → the spec's T_stop, ``chebyshev`` → γ, ``K="auto"``
    → per-step ``⌈ln(n/σ²·max(σ², ¼))/√λ_t⌉`` on each step's graph, the randomized schedule.  Cached."""
    key = _key(protocol, params, W, n, sensitivity)
    if key in _CACHE:
        return _CACHE[key]
    p = dict(params)
    sigma_abs = float(p.get("noise_std", p.get("sigma", 0.0) * sensitivity))
    if protocol == MUFFLIATO:
        if p.get("graph", "fixed") == "er-per-round" and (
            p.get("rounds", "auto") == "auto" or p.get("chebyshev")
        ):
            raise ValueError(
                "muffliato on fresh per-round graphs needs explicit rounds and plain gossip"
            )
        if p.get("rounds", "auto") == "auto":
            p["rounds"] = t_stop(n, code_gap(W), max(sigma_abs, 1e-12))
        if p.get("chebyshev", False) and "gamma" not in p:
            p["gamma"] = chebyshev_gamma(gap=code_gap(W))
    elif protocol == MUFFLIATO_GD:
        steps = int(p["steps"])
        per_step = p.get("graph", "fixed") == "er-per-step"
        if per_step:
            q = float(p.get("q", math.log(n) / n))
            Ws = [
                mh_matrix(connected_er(n, q, int(p.get("graph_seed", 0)) * 1_000_003 + r))
                for r in range(steps)
            ]
        else:
            Ws = [W] * steps
        gaps = None
        if p.get("K", "auto") == "auto":
            gaps = [code_gap(Wr) for Wr in (Ws if per_step else Ws[:1])] * (
                1 if per_step else steps
            )
            s2 = max(sigma_abs, 1e-12) ** 2
            p["ks"] = [
                max(1, int(math.ceil(math.log(n / s2 * max(0.25, s2)) / math.sqrt(g))))
                for g in gaps
            ]
        else:
            p["ks"] = [int(p["K"])] * steps
        if p.get("chebyshev", True) and "gammas" not in p:
            if gaps is None:
                gaps = [code_gap(Wr) for Wr in (Ws if per_step else Ws[:1])] * (
                    1 if per_step else steps
                )
            p["gammas"] = [chebyshev_gamma(gap=g) for g in gaps]
    elif protocol == MUFFLIATO_RANDOMIZED:
        p["schedule"] = randomized_schedule(W, int(p["rounds"]), int(p.get("schedule_seed", 0)))
    _CACHE[key] = p
    if len(_CACHE) > 32:
        _CACHE.pop(next(iter(_CACHE)))
    return p


def _options(params: dict[str, Any], options: Any) -> GossipOptions:
    if isinstance(options, GossipOptions):
        return options
    kw = {k: params[k] for k in _OPTION_KEYS if k in params}
    if params.get("graph") == "er-per-round" and "max_ahead" not in kw:
        # with a fresh graph every round, a node is in lockstep only with this round's neighbours:
        # a node isolated for a few rounds legitimately runs ahead, so its early messages are buffered
        kw["max_ahead"] = max(2, int(params.get("rounds", 2)))
    return GossipOptions(**kw)


def make_gossip_machine(
    protocol: str, ctx: NodeContext, task: Task, params: dict[str, Any], W, options: Any = None
) -> Protocol:
    """One node's gossip machine.  ``W`` is the public gossip matrix (its support is the graph)."""
    if protocol not in GOSSIP_PROTOCOLS:
        raise ValueError(f"{protocol!r} is not a gossip protocol")
    if W is None and params.get("graph") not in ("er-per-step", "er-per-round"):
        raise ValueError(f"{protocol} needs the public gossip matrix W")
    n = ctx.n
    params = dict(params)
    share_key, share_dir = params.pop("share_key", None), params.pop("share_directory", None)
    p = resolve_params(protocol, params, W, n, float(task.sensitivity()))
    opt = _options(p, options)
    if p.get("secure_summation"):
        m = _make_plain(protocol, ctx, task, p, W, opt)
        if not hasattr(m, "secure"):
            raise ValueError(
                f"{protocol} has no synchronous rounds: secure neighbourhood summation needs them"
            )
        if (
            share_key is None or share_dir is None
        ):  # simulator: keys from the public run seed (never deployed)
            from hushnet.crypto.keys import simulation_directory, simulation_keypairs

            pairs = simulation_keypairs(int(p.get("key_seed", 0)), n, "share")
            share_key, share_dir = pairs[ctx.node], simulation_directory(pairs)
        from hushnet.families.gossip.secure import attach_secure

        return attach_secure(m, share_key, share_dir, frac_bits=int(p.get("frac_bits", 24)))
    return _make_plain(protocol, ctx, task, p, W, opt)


def _make_plain(
    protocol: str, ctx: NodeContext, task: Task, p: dict[str, Any], W, opt: GossipOptions
) -> Protocol:
    n = ctx.n
    if protocol == MUFFLIATO:
        if (
            p.get("graph", "fixed") == "er-per-round"
        ):  # [M] App. H.6: a fresh G(n, q) every round, as drawn
            topo = ERPerStep(
                n,
                float(p["q"]),
                int(p.get("graph_seed", 0)),
                [1] * int(p["rounds"]),
                connected=False,
            )
        else:
            topo = FixedTopology(W)
        return MuffliatoAveraging(
            ctx,
            topo,
            task,
            int(p["rounds"]),
            float(p["sigma"]),
            gamma=float(p.get("gamma", 1.0)),
            options=opt,
        )  # type: ignore[arg-type]
    if protocol == MUFFLIATO_RANDOMIZED:
        return RandomizedMuffliato(ctx, task, p["schedule"], float(p["sigma"]), options=opt)  # type: ignore[arg-type]
    if protocol == GOSSIP_STREAM:
        return StreamingGossip(
            ctx,
            FixedTopology(W),
            task,
            int(p["rounds"]),
            float(p["sigma"]),
            step_size=float(p.get("step_size", 1.0)),
            x0=p.get("x0"),
            options=opt,
        )
    ks = p["ks"]
    if p.get("graph", "fixed") == "er-per-step":
        topo = ERPerStep(n, float(p.get("q", math.log(n) / n)), int(p.get("graph_seed", 0)), ks)
    else:
        topo = FixedTopology(W)
    return MuffliatoGD(
        ctx,
        topo,
        task,
        ks,
        float(p["step_size"]),
        float(p.get("sigma", 0.0)),  # type: ignore[arg-type]
        gammas=p.get("gammas"),
        noise_std=p.get("noise_std"),
        clip_after_noise=bool(p.get("clip_after_noise", False)),
        x0=p.get("x0"),
        options=opt,
    )


def build_gossip_machines(
    protocol: str,
    tasks: Sequence[Task],
    *,
    run_seed: int,
    run_id: str = "sim",
    params: dict[str, Any],
    W=None,
    view_model: str = "sender-known",
    options: GossipOptions | None = None,
) -> list[Protocol]:
    """All n machines, node v with generator ``SeedSequence(run_seed).spawn(n)[v]`` (the parity guarantee)."""
    n = len(tasks)
    rngs = node_generators(run_seed, n)
    return [
        make_gossip_machine(
            protocol, NodeContext(v, n, run_id, rngs[v], view_model), tasks[v], params, W, options
        )
        for v in range(n)
    ]


# ---- running a whole gossip run in the engine's simulator ---------------------------------------


@dataclass
class GossipRun:
    """A simulated gossip run: the simulator's result, every node's final model (NaN rows for nodes
    that never finished), and their Finish results."""

    sim: SimResult
    models: np.ndarray
    results: dict[int, dict[str, Any]]
    machines: list[Protocol]

    @property
    def status(self) -> str:
        return self.sim.status


def run_gossip(
    machines: Sequence[Protocol],
    *,
    latency: float = 1e-3,
    kill: Sequence[tuple[int, float]] = (),
    until: float = float("inf"),
    max_events: int = 50_000_000,
) -> GossipRun:
    """Run gossip machines in the engine's :class:`~hushnet.sim.Simulator` until every live node finished
    (``finish="all"``; a node in ``kill`` is down for good from its time on and is not waited for)."""
    n = len(machines)
    sim = Simulator(
        machines, latency=latency, protocol=machines[0].name, run_id=machines[0].ctx.run_id
    )
    for v, at in kill:
        sim.kill(v, at)
    res = sim.run(until=until, max_events=max_events, finish="all")
    dim = next(
        (f.model.shape[0] for f in res.finishes.values() if f.model is not None),
        getattr(machines[0], "dim", 0),
    )
    models = np.full((n, dim), np.nan)
    for v, f in res.finishes.items():
        if f.model is not None:
            models[v] = f.model
    return GossipRun(res, models, {v: f.result for v, f in res.finishes.items()}, list(machines))
