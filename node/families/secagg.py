"""Secure summation with pairwise masks (Bonawitz et al.): Shamir dropout recovery, a threshold, and
a leader that sees only the sum.  See ``docs/anonymity.md``."""
from __future__ import annotations

from typing import Any

from hushnet.families.base import Family


class SecAggFamily(Family):
    name = "secagg"
    protocols = {
        "secagg-sum": "secure summation with pairwise masks, Shamir dropout recovery and a threshold (aggregate view)",
    }

    def machine_params(self, spec) -> dict[str, Any]:
        from hushnet.runs.anonymity import _secagg_params

        return _secagg_params(spec)

    def make_machine(self, protocol, ctx, task, params, *, W, options, run_seed):
        from hushnet.protocols.onion import make_anonymity_machine

        return make_anonymity_machine(protocol, ctx.node, ctx.n, task, run_seed=run_seed, run_id=ctx.run_id,
                                      params=params, W=W, view_model=ctx.view_model, options=options, rng=ctx.rng)

    def node_machine(self, node, spec, vertex, ids, task, W, options):
        from hushnet.runs.anonymity import build_secagg

        return build_secagg(node, spec, vertex, ids, task, W, options)

    def project(self, spec, vertex, local, W):
        from hushnet.runs.anonymity import project_secagg

        return project_secagg(spec, vertex, local, W)


FAMILY = SecAggFamily()
