"""Build protocol machines by name — one per node — from public run parameters and local tasks.

A networked node calls :func:`make_machine` for itself only; the simulator calls
:func:`build_machines` for all n nodes.  Both go through the same constructor with the same
per-node generator (``SeedSequence(run_seed).spawn(n)[v]``), which is the parity guarantee.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from hushnet.engine.protocol import NodeContext, Protocol
from hushnet.engine.rng import node_generator, node_generators
from hushnet.families import UnknownRunProtocol, family_of, protocols
from hushnet.families.walk.walker import WalkOptions
from hushnet.tasks.base import Task

if TYPE_CHECKING:
    import scipy.sparse as sp

#: protocol name -> what it is (shown by CLIs; the node driver refuses any other name)
PROTOCOLS: dict[str, str] = protocols()


def transition_matrix(graph: str, weights: str = "hamilton") -> sp.csr_matrix:
    """The public W of a graph spec (``complete:N`` with Hamilton weights is exactly J/n).

    The graph tools (scipy) are imported here, not with this module: every node process imports it
    with its run service, and a host starting hundreds of nodes needs no graph before its first run."""
    from hushnet.privacy.graphs import metropolis_hastings, parse_graph

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
    """The machine of one node, built by the protocol's family.  ``params`` are the protocol's public
    parameters (what :meth:`hushnet.runs.spec.RunSpec.machine_params` gives), for example:

    * walk SGD (``rw-dpsgd``, ``pad-complete-sgd``, ``local-dp-sgd``): ``steps, step_size, sigma``
      (noise multiplier), optional ``cap, start, x0, clip_after_noise, record_view``;
    * ``central-dpsgd``: ``steps, step_size, noise_std`` (+ ``clip_after_noise, clip``); node n is the aggregator;
    * ``pad-ring-sum``: ``rounds, sigma_loc`` (+ ``distributed_noise``); ``pad-complete-sum``: ``steps, sigma_loc``;
    * ``pad-ring-histogram``: ``rounds, gamma``; ``pad-complete-histogram``: ``steps, gamma``.
    """
    family = family_of(protocol)
    n_ctx = family.contexts(protocol, n)
    if rng is None:
        rng = node_generator(run_seed, n_ctx, node)
    ctx = NodeContext(node, n_ctx, run_id, rng, view_model)
    return family.make_machine(
        protocol, ctx, task, dict(params), W=W, options=options, run_seed=run_seed
    )


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
    n_ctx = family_of(protocol).contexts(protocol, n)
    rngs = node_generators(run_seed, n_ctx)
    ms = [
        make_machine(
            protocol,
            v,
            n,
            tasks[v],
            run_seed=run_seed,
            run_id=run_id,
            params=params,
            W=W,
            view_model=view_model,
            options=options,
            rng=rngs[v],
        )
        for v in range(n)
    ]
    for extra in range(n, n_ctx):  # machines that hold no data (the central baseline's aggregator)
        ms.append(
            make_machine(
                protocol,
                extra,
                n,
                tasks[0],
                run_seed=run_seed,
                run_id=run_id,
                params=params,
                view_model=view_model,
                options=options,
                rng=rngs[extra],
            )
        )
    return ms


def options_for_spec(spec: Any, *, reliable: bool = True, progress_every: int = 0) -> WalkOptions:
    """Walk transport options from a :class:`~hushnet.runs.spec.RunSpec` (its ``on_peer_down`` run option)."""
    return WalkOptions(
        reliable=reliable, on_peer_down=spec.on_peer_down, progress_every=progress_every
    )


def machine_for_spec(
    spec: Any,
    node: int,
    task: Task | None,
    *,
    W: Any = None,
    reliable: bool = True,
    progress_every: int = 0,
) -> Protocol:
    """What a networked node runs for a verified spec: its own machine, its own generator."""
    n = transition_matrix(spec.graph, spec.weights).shape[0] if W is None else W.shape[0]
    if W is None and family_of(spec.protocol).needs_transition_matrix(spec.protocol):
        W = transition_matrix(spec.graph, spec.weights)
    return make_machine(
        spec.protocol,
        node,
        n,
        task,
        run_seed=spec.seed,
        run_id=spec.run_id,
        params=spec.machine_params(),
        W=W,
        view_model=spec.view_model,
        options=options_for_spec(spec, reliable=reliable, progress_every=progress_every),
    )


def build_from_spec(
    spec: Any, tasks: Sequence[Task], *, reliable: bool = True, progress_every: int = 0
) -> list[Protocol]:
    """All machines of a spec's run (simulator side of the parity with :func:`machine_for_spec`)."""
    W = (
        transition_matrix(spec.graph, spec.weights)
        if family_of(spec.protocol).needs_transition_matrix(spec.protocol)
        else None
    )
    if W is not None and W.shape[0] != len(tasks):
        raise ValueError(f"the spec's graph has {W.shape[0]} nodes, {len(tasks)} tasks were given")
    return build_machines(
        spec.protocol,
        tasks,
        run_seed=spec.seed,
        run_id=spec.run_id,
        params=spec.machine_params(),
        W=W,
        view_model=spec.view_model,
        options=options_for_spec(spec, reliable=reliable, progress_every=progress_every),
    )


__all__ = [
    "PROTOCOLS",
    "UnknownRunProtocol",
    "transition_matrix",
    "make_machine",
    "build_machines",
    "options_for_spec",
    "machine_for_spec",
    "build_from_spec",
]
