"""Secure summation with pairwise masks (Bonawitz et al.): Shamir dropout recovery, a threshold, and
a leader that sees only the sum — alone (``secagg-sum``) or as the aggregation step of distributed-DP
SGD (``secagg-dpsgd``, rotating leader).  Accounting: :mod:`hushnet.privacy.secure_sum`; threat model:
``docs/anonymity.md``.

The package: :mod:`.params` (names, ``SecAggParams`` / ``DDPParams``, spec → machine parameters),
:mod:`.machines` (the secure-sum machine, also the sub-machine of the gossip family's secure
neighbourhood summation), :mod:`.dpsgd` (``secagg-dpsgd``'s rounds), :mod:`.wire` (both message
formats), :mod:`.accounting` (projection, ledger cost) and :mod:`.node` (the node's machine with its
keys, the ledger wrapper :class:`~hushnet.families.secagg.node.NetworkSecAgg`).  This module stays
light: the family list is imported by every node process, so the parts are imported inside the
methods."""

from __future__ import annotations

from typing import Any

from hushnet.families.base import Family
from hushnet.families.secagg.params import LABELS, SECAGG_DPSGD


class SecAggFamily(Family):
    name = "secagg"
    protocols = LABELS

    def task_kind(self, protocol: str) -> str | None:
        return "gradient" if protocol == SECAGG_DPSGD else None

    def graph_kind(self, protocol: str) -> str | None:
        return "complete" if protocol == SECAGG_DPSGD else None

    def machine_params(self, spec) -> dict[str, Any]:
        if spec.protocol == SECAGG_DPSGD:
            from hushnet.families.secagg.params import ddp_params

            return ddp_params(spec)
        from hushnet.families.secagg.params import sum_params

        return sum_params(spec)

    def make_machine(self, protocol, ctx, task, params, *, W, options, run_seed):
        if protocol == SECAGG_DPSGD:
            from hushnet.families.secagg.dpsgd import make_ddp_machine

            return make_ddp_machine(ctx, task, params, run_seed=run_seed)
        from hushnet.families.secagg.machines import make_sum_machine

        return make_sum_machine(ctx, task, params, run_seed=run_seed)

    def node_machine(self, node, spec, vertex, ids, task, W, options):
        if spec.protocol == SECAGG_DPSGD:
            from hushnet.families.secagg.node import build_ddp

            return build_ddp(node, spec, vertex, ids, task, W, options)
        from hushnet.families.secagg.node import build_secagg

        return build_secagg(node, spec, vertex, ids, task, W, options)

    def project(self, spec, vertex, local, W):
        if spec.protocol == SECAGG_DPSGD:
            from hushnet.families.secagg.accounting import project_ddp

            return project_ddp(spec, vertex, local, W)
        from hushnet.families.secagg.accounting import project_secagg

        return project_secagg(spec, vertex, local, W)

    def cost(self, spec, vertex, ids, W, orders):
        """The secure sum's Gaussian view toward any coalition of ≤ c members when the spec calibrates the
        noise for it (``protocol_params.collusion``), else the input seen in the clear (local DP)."""
        if spec.protocol == SECAGG_DPSGD:
            from hushnet.families.secagg.accounting import ddp_cost

            return ddp_cost(spec, vertex, ids, W, orders)
        from hushnet.families.secagg.accounting import secagg_sum_cost

        return secagg_sum_cost(spec, vertex, ids, W, orders)


FAMILY = SecAggFamily()
