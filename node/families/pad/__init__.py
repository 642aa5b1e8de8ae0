"""P-AD (privacy amplification by decentralization): private sums and histograms on the directed
ring and the complete graph (P-AD Alg. 1, 2, 3, 5).  Its token SGD (Alg. 4) is a walk.

The package: :mod:`.params` (names, typed parameters), :mod:`.machines` (the four algorithms on the
walk's token machinery), :mod:`.wire` (what the token's fields mean here), :mod:`.accounting`
(projection, ledger cost, the papers' bounds) and :mod:`.node` (the node's machine with its input
checks).  This module stays light: the family list is imported by every node process, so the parts
are imported inside the methods."""

from __future__ import annotations

from typing import Any

from hushnet.families.base import Family
from hushnet.families.pad.params import (
    COMPLETE_HISTOGRAM,
    COMPLETE_SUM,
    HISTOGRAMS,
    RING,
    RING_HISTOGRAM,
    RING_SUM,
)


class PadFamily(Family):
    name = "pad"
    protocols = {
        RING_SUM: "P-AD Alg. 1: private real summation on the directed ring",
        RING_HISTOGRAM: "P-AD Alg. 2: private histogram on the directed ring (corrected γ and debiasing)",
        COMPLETE_SUM: "P-AD Alg. 3: private real summation on the complete graph",
        COMPLETE_HISTOGRAM: "P-AD Alg. 5: private histogram on the complete graph",
    }

    def task_kind(self, protocol: str) -> str:
        return "histogram" if protocol in HISTOGRAMS else "sum"

    def graph_kind(self, protocol: str) -> str:
        return "ring" if protocol in RING else "complete"

    def rounds_per_node(self, protocol: str) -> bool:
        return protocol in RING

    def machine_params(self, spec) -> dict[str, Any]:
        p = spec.protocol
        if p == RING_SUM:
            return {"rounds": spec.rounds, "sigma_loc": spec.sigma}
        if p == COMPLETE_SUM:
            return {"steps": spec.steps, "sigma_loc": spec.sigma, "start": spec.start}
        if p == RING_HISTOGRAM:
            return {"rounds": spec.rounds, "gamma": spec.gamma}
        return {"steps": spec.steps, "gamma": spec.gamma, "start": spec.start}

    def make_machine(self, protocol, ctx, task, params, *, W, options, run_seed):
        from hushnet.families.pad.machines import (
            CompleteHistogram,
            CompleteSum,
            RingHistogram,
            RingSum,
        )
        from hushnet.families.pad.params import parse_params

        p = parse_params(protocol, params)
        if protocol == RING_SUM:
            return RingSum(
                ctx,
                task,
                int(p.rounds),
                float(p.sigma_loc),
                distributed_noise=bool(p.distributed_noise),
                options=options,
            )
        if protocol == COMPLETE_SUM:
            return CompleteSum(
                ctx, task, int(p.steps), float(p.sigma_loc), start=int(p.start), options=options
            )
        if protocol == RING_HISTOGRAM:
            return RingHistogram(ctx, task, int(p.rounds), float(p.gamma), options=options)
        return CompleteHistogram(
            ctx, task, int(p.steps), float(p.gamma), start=int(p.start), options=options
        )

    def node_machine(self, node, spec, vertex, ids, task, W, options):
        from hushnet.families.pad.node import build_machine

        return build_machine(node, spec, vertex, ids, task, W, options)

    def project(self, spec, vertex, local, W):
        from hushnet.families.pad.accounting import pad_projector

        return pad_projector(spec, vertex, local, W)

    def cost(self, spec, vertex, ids, W, orders):
        from hushnet.families.pad.accounting import pad_cost

        return pad_cost(spec, vertex, ids, W, orders)

    def paper_bound(self, spec, vertex, contributions, W):
        from hushnet.families.pad.accounting import pad_paper_bound

        return pad_paper_bound(spec, vertex, W)


FAMILY = PadFamily()
