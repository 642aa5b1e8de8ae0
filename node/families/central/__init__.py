"""The central DP-SGD baseline: a trusted aggregator (the operator) — NOT decentralized; shown beside
the decentralized protocols so their utility and privacy can be compared with it.

The package: :mod:`.params` (name, typed parameters), :mod:`.machines` (the aggregator and the
data-holding client), :mod:`.wire` (request / reply format, the ``run.gradient`` command name),
:mod:`.accounting` (projection, ledger cost), :mod:`.node` (the node's ``run.gradient`` command) and
:mod:`.operator` (the operator-side aggregator loop, ``run_central``).  This module stays light: the
family list is imported by every node process, so the parts are imported inside the methods."""

from __future__ import annotations

from typing import Any

from hushnet.families.base import Family
from hushnet.families.central.params import LABEL, PROTOCOL


class CentralFamily(Family):
    name = "central"
    protocols = {PROTOCOL: LABEL}
    operator_driven = True  # the operator's run_central aggregates (.operator)

    def task_kind(self, protocol: str) -> str:
        return "gradient"

    def machine_params(self, spec) -> dict[str, Any]:
        return {
            "steps": spec.steps,
            "step_size": spec.step_size,
            "noise_std": 2.0 * spec.clip * spec.sigma,
        }

    def contexts(self, protocol: str, n: int) -> int:
        return n + 1  # machine n is the aggregator

    def make_machine(self, protocol, ctx, task, params, *, W, options, run_seed):
        from hushnet.families.central.machines import CentralAggregator, CentralClient
        from hushnet.families.central.params import CentralParams

        cp = CentralParams(**params)
        n = ctx.n - 1
        if ctx.node == n:
            if task is None:
                raise ValueError("the aggregator needs the model dimension: pass any node's task")
            return CentralAggregator(ctx, n, task.dim, cp)
        return CentralClient(ctx, task, aggregator=n, clip_after_noise=cp.clip_after_noise)

    def project(self, spec, vertex, local, W):
        from hushnet.families.central.accounting import central_projector

        return central_projector(spec, vertex, local, W)

    def cost(self, spec, vertex, ids, W, orders):
        from hushnet.families.central.accounting import central_cost

        return central_cost(spec, vertex, ids, W, orders)

    def commands(self):
        from hushnet.families.central.node import c_gradient
        from hushnet.families.central.wire import GRADIENT_COMMAND

        return {GRADIENT_COMMAND: c_gradient}


FAMILY = CentralFamily()
