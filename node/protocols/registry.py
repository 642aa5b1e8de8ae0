"""Build protocol machines by name — one per node — from public run parameters and local tasks.

A networked node calls :func:`make_machine` for itself only; the simulator calls
:func:`build_machines` for all n nodes.  Both go through the same constructor with the same
per-node generator (``SeedSequence(run_seed).spawn(n)[v]``), which is the parity guarantee.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import scipy.sparse as sp

from hushnet.engine.protocol import NodeContext, Protocol
from hushnet.engine.rng import node_generator, node_generators
from hushnet.privacy.graphs import metropolis_hastings, parse_graph
from hushnet.protocols.central import CentralAggregator, CentralClient, CentralParams
from hushnet.protocols.gossip_sim import GOSSIP_PROTOCOLS, make_gossip_machine
from hushnet.protocols.hops import TransitionRow, UniformHop
from hushnet.protocols.onion import ANONYMITY_PROTOCOLS, make_anonymity_machine
from hushnet.protocols.pad import CompleteHistogram, CompleteSum, RingHistogram, RingSum
from hushnet.protocols.rw_dpsgd import RWDPSGD, RWParams
from hushnet.protocols.secagg_dpsgd import DDP_PROTOCOLS, make_ddp_machine
from hushnet.protocols.walk import WalkOptions
from hushnet.tasks.base import GradientTask, Task, TaskError

#: protocol name -> what it is (shown by CLIs; the node driver refuses any other name)
PROTOCOLS: dict[str, str] = {
    "rw-dpsgd": "RW DP-SGD on the graph's public transition matrix (random-walk paper, Alg. 1)",
    "pad-complete-sgd": "P-AD Alg. 4: token SGD on the complete graph, uniform next holder (W = J/n)",
    "local-dp-sgd": "baseline: local-DP SGD (walk, LDP-calibrated noise, over-cap visits add nothing)",
    "central-dpsgd": "baseline: central DP-SGD with a trusted aggregator (NOT decentralized)",
    "pad-ring-sum": "P-AD Alg. 1: private real summation on the directed ring",
    "pad-ring-histogram": "P-AD Alg. 2: private histogram on the directed ring (corrected γ and debiasing)",
    "pad-complete-sum": "P-AD Alg. 3: private real summation on the complete graph",
    "pad-complete-histogram": "P-AD Alg. 5: private histogram on the complete graph",
}
PROTOCOLS.update(GOSSIP_PROTOCOLS)  # gossip family (node/protocols/gossip*.py)
PROTOCOLS.update(ANONYMITY_PROTOCOLS)  # anonymity layer (node/protocols/onion.py, anonymous_walk.py, secagg.py)
PROTOCOLS.update(DDP_PROTOCOLS)  # distributed DP by secure summation (node/protocols/secagg_dpsgd.py)


class UnknownProtocol(ValueError):
    """The run names a protocol hushnet does not implement."""


def transition_matrix(graph: str, weights: str = "hamilton") -> sp.csr_matrix:
    """The public W of a graph spec (``complete:N`` with Hamilton weights is exactly J/n)."""
    return metropolis_hastings(parse_graph(graph), variant=weights)


def make_machine(
    protocol: str,
    node: int,
    n: int,
    task: Task | None,
    *,
    run_seed: int,
    run_id: str,
    params: dict[str, Any],
    W: sp.csr_matrix | np.ndarray | None = None,
    view_model: str = "sender-known",
    options: WalkOptions | None = None,
    rng: np.random.Generator | None = None,
) -> Protocol:
    """The machine of one node.  ``params`` are the protocol's public parameters:

    * walk SGD (``rw-dpsgd``, ``pad-complete-sgd``, ``local-dp-sgd``): ``steps, step_size, sigma``
      (noise multiplier), optional ``cap, start, x0, clip_after_noise, record_view``;
    * ``central-dpsgd``: ``steps, step_size, noise_std`` (+ ``clip_after_noise, clip``); node n is the aggregator;
    * ``pad-ring-sum``: ``rounds, sigma_loc`` (+ ``distributed_noise``); ``pad-complete-sum``: ``steps, sigma_loc``;
    * ``pad-ring-histogram``: ``rounds, gamma``; ``pad-complete-histogram``: ``steps, gamma``.
    """
    if protocol not in PROTOCOLS:
        raise UnknownProtocol(f"unknown protocol {protocol!r}; available: {sorted(PROTOCOLS)}")
    n_ctx = n + 1 if protocol == "central-dpsgd" else n
    if rng is None:
        rng = node_generator(run_seed, n_ctx, node)
    ctx = NodeContext(node, n_ctx, run_id, rng, view_model)
    p = dict(params)
    if protocol in GOSSIP_PROTOCOLS:
        return make_gossip_machine(protocol, ctx, task, p, W, options)  # type: ignore[arg-type]
    if protocol in DDP_PROTOCOLS:
        return make_ddp_machine(ctx, task, p, run_seed=run_seed)
    if protocol in ANONYMITY_PROTOCOLS:
        return make_anonymity_machine(protocol, node, n, task, run_seed=run_seed, run_id=run_id, params=p, W=W,
                                      view_model=view_model, options=options, rng=rng)
    if protocol in ("rw-dpsgd", "pad-complete-sgd", "local-dp-sgd"):
        if not isinstance(task, GradientTask):
            raise TaskError(f"{protocol} needs a gradient task (got {type(task).__name__})")
        if protocol == "local-dp-sgd":  # "contribute then nothing" is what makes it the local-DP baseline
            if p.setdefault("over_cap", "nothing") != "nothing":
                raise ValueError("local-dp-sgd adds nothing on over-cap visits (over_cap='nothing')")
        rp = RWParams(**p)
        if protocol == "pad-complete-sgd" or (protocol == "local-dp-sgd" and W is None):
            hop = UniformHop(node, n)  # W = J/n (the local-DP baseline walks the complete graph unless told otherwise)
        else:
            if W is None:
                raise ValueError(f"{protocol} needs the public transition matrix W")
            hop = TransitionRow.from_matrix(W, node)
        m = RWDPSGD(ctx, hop, task, rp, options)
        m.name = protocol  # type: ignore[misc]
        return m
    if protocol == "central-dpsgd":
        cp = CentralParams(**p)
        if node == n:
            if task is None:
                raise ValueError("the aggregator needs the model dimension: pass any node's task")
            return CentralAggregator(ctx, n, task.dim, cp)
        return CentralClient(ctx, task, aggregator=n, clip_after_noise=cp.clip_after_noise)  # type: ignore[arg-type]
    if protocol == "pad-ring-sum":
        return RingSum(ctx, task, int(p["rounds"]), float(p["sigma_loc"]),  # type: ignore[arg-type]
                       distributed_noise=bool(p.get("distributed_noise", False)), options=options)
    if protocol == "pad-complete-sum":
        return CompleteSum(ctx, task, int(p["steps"]), float(p["sigma_loc"]), start=int(p.get("start", 0)), options=options)  # type: ignore[arg-type]
    if protocol == "pad-ring-histogram":
        return RingHistogram(ctx, task, int(p["rounds"]), float(p["gamma"]), options=options)  # type: ignore[arg-type]
    return CompleteHistogram(ctx, task, int(p["steps"]), float(p["gamma"]), start=int(p.get("start", 0)), options=options)  # type: ignore[arg-type]


def build_machines(
    protocol: str,
    tasks: Sequence[Task],
    *,
    run_seed: int,
    run_id: str = "sim",
    params: dict[str, Any],
    W: sp.csr_matrix | np.ndarray | None = None,
    view_model: str = "sender-known",
    options: WalkOptions | None = None,
) -> list[Protocol]:
    """All n machines of a run (n+1 for ``central-dpsgd``: the aggregator is last)."""
    n = len(tasks)
    if W is not None and W.shape != (n, n):
        raise ValueError(f"W is {W.shape}, but there are {n} tasks")
    n_ctx = n + 1 if protocol == "central-dpsgd" else n
    rngs = node_generators(run_seed, n_ctx)
    ms = [
        make_machine(protocol, v, n, tasks[v], run_seed=run_seed, run_id=run_id, params=params, W=W,
                     view_model=view_model, options=options, rng=rngs[v])
        for v in range(n)
    ]
    if protocol == "central-dpsgd":
        ms.append(make_machine(protocol, n, n, tasks[0], run_seed=run_seed, run_id=run_id, params=params,
                               view_model=view_model, options=options, rng=rngs[n]))
    return ms


def options_for_spec(spec: Any, *, reliable: bool = True, progress_every: int = 0) -> WalkOptions:
    """Walk transport options from a :class:`~hushnet.runs.spec.RunSpec` (its ``on_peer_down`` run option)."""
    return WalkOptions(reliable=reliable, on_peer_down=spec.on_peer_down, progress_every=progress_every)


def machine_for_spec(spec: Any, node: int, task: Task | None, *, W: Any = None, reliable: bool = True,
                     progress_every: int = 0) -> Protocol:
    """What a networked node runs for a verified spec: its own machine, its own generator."""
    n = transition_matrix(spec.graph, spec.weights).shape[0] if W is None else W.shape[0]
    if W is None and spec.protocol in ("rw-dpsgd", "local-dp-sgd"):
        W = transition_matrix(spec.graph, spec.weights)
    return make_machine(spec.protocol, node, n, task, run_seed=spec.seed, run_id=spec.run_id, params=spec.machine_params(),
                        W=W, view_model=spec.view_model, options=options_for_spec(spec, reliable=reliable,
                                                                                     progress_every=progress_every))


def build_from_spec(spec: Any, tasks: Sequence[Task], *, reliable: bool = True, progress_every: int = 0) -> list[Protocol]:
    """All machines of a spec's run (simulator side of the parity with :func:`machine_for_spec`)."""
    W = transition_matrix(spec.graph, spec.weights) if spec.protocol in ("rw-dpsgd", "local-dp-sgd") else None
    if W is not None and W.shape[0] != len(tasks):
        raise ValueError(f"the spec's graph has {W.shape[0]} nodes, {len(tasks)} tasks were given")
    return build_machines(spec.protocol, tasks, run_seed=spec.seed, run_id=spec.run_id, params=spec.machine_params(), W=W,
                          view_model=spec.view_model, options=options_for_spec(spec, reliable=reliable,
                                                                               progress_every=progress_every))
