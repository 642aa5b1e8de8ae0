"""Gossip averaging and optimisation with local noise: Muffliato (averaging, randomized, GD) and
streaming gossip DP-GD (Koskela–Kulkarni).  Certified views: ``docs/design/spec/gossip.md``."""

from __future__ import annotations

from typing import Any

from hushnet.families.base import Family


class GossipFamily(Family):
    name = "gossip"
    protocols = {
        "muffliato": "Muffliato averaging ([M] Alg. 1): noise once, synchronous gossip rounds, optional Chebyshev",
        "muffliato-randomized": "randomized Muffliato ([M] Alg. 2): pairwise averaging on a seeded public activation schedule",
        "muffliato-gd": "Muffliato-GD ([M] Alg. 3): noisy local gradient step then K gossip rounds (optional fresh ER graph per step)",
        "gossip-stream": "streaming gossip DP-GD (Koskela-Kulkarni §5): fresh noise every round, theta <- W(theta + x + u)",
    }

    def machine_params(self, spec) -> dict[str, Any]:
        from hushnet.runs.gossip.params import gossip_params

        return gossip_params(spec)

    def make_machine(self, protocol, ctx, task, params, *, W, options, run_seed):
        from hushnet.protocols.gossip_sim import make_gossip_machine

        return make_gossip_machine(protocol, ctx, task, params, W, options)

    def node_machine(self, node, spec, vertex, ids, task, W, options):
        from hushnet.runs.gossip.node import build_gossip

        return build_gossip(node, spec, vertex, ids, task, W, options)

    def project(self, spec, vertex, local, W):
        from hushnet.runs.gossip.accountant import project_gossip

        return project_gossip(spec, vertex, local, W)

    def cost(self, spec, vertex, ids, W, orders):
        from hushnet.runs.gossip.accountant import gossip_cost

        return gossip_cost(spec, vertex, ids, W, orders)

    def paper_bound(self, spec, vertex, contributions, W):
        from hushnet.runs.gossip.accountant import paper_gossip

        return paper_gossip(spec, vertex, W)

    def journal(self, service, spec, vertex, ids):
        from hushnet.runs.gossip.node import gossip_journal

        return gossip_journal(service, spec, vertex, ids)

    def commands(self):
        from hushnet.runs.gossip.node import c_schedule, c_settle

        return {"run.schedule": c_schedule, "run.settle": c_settle}


FAMILY = GossipFamily()
