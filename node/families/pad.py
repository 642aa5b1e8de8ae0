"""P-AD (privacy amplification by decentralization): private sums and histograms on the directed
ring and the complete graph (P-AD Alg. 1, 2, 3, 5).  Its token SGD (Alg. 4) is a walk."""

from __future__ import annotations

from typing import Any

from hushnet.families.base import Family


class PadFamily(Family):
    name = "pad"
    protocols = {
        "pad-ring-sum": "P-AD Alg. 1: private real summation on the directed ring",
        "pad-ring-histogram": "P-AD Alg. 2: private histogram on the directed ring (corrected γ and debiasing)",
        "pad-complete-sum": "P-AD Alg. 3: private real summation on the complete graph",
        "pad-complete-histogram": "P-AD Alg. 5: private histogram on the complete graph",
    }

    def task_kind(self, protocol: str) -> str:
        return "histogram" if protocol.endswith("-histogram") else "sum"

    def graph_kind(self, protocol: str) -> str:
        return "ring" if protocol.startswith("pad-ring-") else "complete"

    def rounds_per_node(self, protocol: str) -> bool:
        return protocol.startswith("pad-ring-")

    def machine_params(self, spec) -> dict[str, Any]:
        p = spec.protocol
        if p == "pad-ring-sum":
            return {"rounds": spec.rounds, "sigma_loc": spec.sigma}
        if p == "pad-complete-sum":
            return {"steps": spec.steps, "sigma_loc": spec.sigma, "start": spec.start}
        if p == "pad-ring-histogram":
            return {"rounds": spec.rounds, "gamma": spec.gamma}
        return {"steps": spec.steps, "gamma": spec.gamma, "start": spec.start}

    def make_machine(self, protocol, ctx, task, params, *, W, options, run_seed):
        from hushnet.protocols.pad import CompleteHistogram, CompleteSum, RingHistogram, RingSum

        p = params
        if protocol == "pad-ring-sum":
            return RingSum(
                ctx,
                task,
                int(p["rounds"]),
                float(p["sigma_loc"]),
                distributed_noise=bool(p.get("distributed_noise", False)),
                options=options,
            )
        if protocol == "pad-complete-sum":
            return CompleteSum(
                ctx,
                task,
                int(p["steps"]),
                float(p["sigma_loc"]),
                start=int(p.get("start", 0)),
                options=options,
            )
        if protocol == "pad-ring-histogram":
            return RingHistogram(ctx, task, int(p["rounds"]), float(p["gamma"]), options=options)
        return CompleteHistogram(
            ctx,
            task,
            int(p["steps"]),
            float(p["gamma"]),
            start=int(p.get("start", 0)),
            options=options,
        )

    def node_machine(self, node, spec, vertex, ids, task, W, options):
        from hushnet.runs.pad_runs import build_machine

        return build_machine(node, spec, vertex, ids, task, W, options)

    def project(self, spec, vertex, local, W):
        from hushnet.runs.pad_runs import pad_projector

        return pad_projector(spec, vertex, local, W)

    def cost(self, spec, vertex, ids, W, orders):
        from hushnet.runs.pad_runs import pad_cost

        return pad_cost(spec, vertex, ids, W, orders)

    def paper_bound(self, spec, vertex, contributions, W):
        from hushnet.runs.pad_runs import pad_paper_bound

        return pad_paper_bound(spec, vertex, W)


FAMILY = PadFamily()
