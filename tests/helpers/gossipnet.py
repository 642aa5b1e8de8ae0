"""Shared helpers for the networked gossip tests: specs, the simulator twin, ledger curves."""

from __future__ import annotations

from typing import Any

import numpy as np

from hushnet.engine.rng import node_generators
from hushnet.families.gossip.accounting import realised_curves
from hushnet.families.gossip.build import build_gossip_machines, run_gossip
from hushnet.families.gossip.node import schedule_records
from hushnet.families.gossip.params import gossip_params
from hushnet.protocols.registry import transition_matrix
from hushnet.runs.spec import Budget, RunSpec
from hushnet.tasks.registry import make_task


def spec(
    protocol: str,
    graph: str,
    steps: int,
    seed: int,
    *,
    sigma: float = 1.0,
    epsilon: float = 1e6,
    task: str = "mean",
    **pp: Any,
) -> RunSpec:
    kw: dict[str, Any] = {}
    if (
        "noise" in RunSpec.__dataclass_fields__
    ):  # reproducible noise: the simulator twin must draw the same
        kw["noise"] = "public-seed"
    return RunSpec(
        protocol=protocol,
        task=task,
        graph=graph,
        steps=steps,
        seed=seed,
        budget=Budget(epsilon, 1e-5),
        sigma=sigma,
        protocol_params=dict(pp),
        **kw,
    ).with_run_id()


def value_tasks(values):
    return [make_task("mean", {"values": np.asarray(v, dtype=float)}, {}) for v in values]


def simulate(sp: RunSpec, values, kill=()):
    """The same run in the engine's simulator (same seeds, same public parameters)."""
    W = transition_matrix(sp.graph, sp.weights)
    ms = build_gossip_machines(
        sp.protocol,
        value_tasks(values),
        run_seed=sp.seed,
        run_id=sp.run_id,
        params=gossip_params(sp),
        W=W,
        view_model=sp.view_model,
    )
    return run_gossip(ms, kill=kill), ms


def sim_records(machines) -> dict[int, list[dict]]:
    from hushnet.engine.actions import LedgerEntry

    return {
        m.ctx.node: schedule_records(
            [
                LedgerEntry(
                    m.ctx.node, r["round"], "schedule", "sender-known", 0, 0, 0, "gossip", "", r
                )
                for r in m.schedule
            ]
        )
        for m in machines
    }


def noisy_inputs(sp: RunSpec, values) -> np.ndarray:
    tasks = value_tasks(values)
    rngs = node_generators(sp.seed, len(tasks))
    return np.array(
        [
            tasks[i].value(0)
            + rngs[i].standard_normal(tasks[i].dim) * sp.sigma * tasks[i].sensitivity()
            for i in range(len(tasks))
        ]
    )


def ledger_curves(svc, ids: list[str], vertex: int) -> np.ndarray:
    """(targets, orders) the node's persistent ledger holds toward every other node."""
    return np.stack([svc.ledger.rdp(ids[v]) for v in range(len(ids)) if v != vertex])


def replay_curves(sp: RunSpec, vertex: int, ids: list[str], records, orders) -> np.ndarray:
    return realised_curves(sp, vertex, ids, records, np.asarray(orders))
