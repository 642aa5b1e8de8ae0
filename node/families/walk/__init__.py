"""The random walk: RW DP-SGD on the graph's public W, P-AD's complete-graph token SGD, and the
local-DP baseline walk (random-walk paper, Alg. 1; P-AD Alg. 4).

The package: :mod:`.params` (names, typed :class:`~.params.RWParams`), :mod:`.walker` (the token
machinery every token-passing machine shares: validation, acknowledged handoff, a peer that stays
down), :mod:`.hops` (next-holder rules), :mod:`.machines` (RW DP-SGD), :mod:`.wire` (the token and
acknowledgement format) and :mod:`.accounting` (projection, ledger cost, the paper's Theorem 3 row).
This module stays light: the family list is imported by every node process, so the parts are
imported inside the methods."""

from __future__ import annotations

from typing import Any

from hushnet.families.base import Family
from hushnet.families.walk.params import (
    LOCAL_DP_SGD,
    NEEDS_W,
    PAD_COMPLETE_SGD,
    RW_DPSGD,
    WALK_ACCOUNTED,
)


class WalkFamily(Family):
    name = "walk"
    protocols = {
        RW_DPSGD: "RW DP-SGD on the graph's public transition matrix (random-walk paper, Alg. 1)",
        PAD_COMPLETE_SGD: "P-AD Alg. 4: token SGD on the complete graph, uniform next holder (W = J/n)",
        LOCAL_DP_SGD: "baseline: local-DP SGD (walk, LDP-calibrated noise, over-cap visits add nothing)",
    }
    #: protocols charged with the random-walk bound (∧ local DP); the local-DP baseline is not
    walk_accounted = WALK_ACCOUNTED

    def task_kind(self, protocol: str) -> str:
        return "gradient"

    def graph_kind(self, protocol: str) -> str | None:
        return "complete" if protocol == PAD_COMPLETE_SGD else None

    def machine_params(self, spec) -> dict[str, Any]:
        return {
            "steps": spec.steps,
            "step_size": spec.step_size,
            "sigma": spec.sigma,
            "cap": spec.cap,
            "start": spec.start,
        }

    def needs_transition_matrix(self, protocol: str) -> bool:
        return protocol in NEEDS_W

    def make_machine(self, protocol, ctx, task, params, *, W, options, run_seed):
        from hushnet.families.walk.hops import TransitionRow, UniformHop
        from hushnet.families.walk.machines import RWDPSGD
        from hushnet.families.walk.params import RWParams
        from hushnet.tasks.base import GradientTask, TaskError

        if not isinstance(task, GradientTask):
            raise TaskError(f"{protocol} needs a gradient task (got {type(task).__name__})")
        p = dict(params)
        if protocol == LOCAL_DP_SGD:  # "contribute then nothing" makes it the local-DP baseline
            if p.setdefault("over_cap", "nothing") != "nothing":
                raise ValueError(
                    "local-dp-sgd adds nothing on over-cap visits (over_cap='nothing')"
                )
        rp = RWParams(**p)
        if protocol == PAD_COMPLETE_SGD or (protocol == LOCAL_DP_SGD and W is None):
            hop = UniformHop(
                ctx.node, ctx.n
            )  # W = J/n (the local-DP baseline walks the complete graph unless told)
        else:
            if W is None:
                raise ValueError(f"{protocol} needs the public transition matrix W")
            hop = TransitionRow.from_matrix(W, ctx.node)
        m = RWDPSGD(ctx, hop, task, rp, options)
        m.name = protocol  # type: ignore[misc]
        return m

    def node_machine(self, node, spec, vertex, ids, task, W, options):
        """The simulator's machine with link receipts on: the node's ``Deliver`` answers after the
        receiving machine accepted the token (and its checkpoint is written), so that answer is the
        handoff's ack and the receiver sends no ack message — one RPC per hop instead of two (see
        :meth:`hushnet.families.walk.walker.WalkMachine.on_delivered`)."""
        from dataclasses import replace

        from hushnet.families.walk.walker import WalkOptions

        if isinstance(options, WalkOptions) and options.reliable:
            options = replace(options, link_receipts=True)
        return super().node_machine(node, spec, vertex, ids, task, W, options)

    def project(self, spec, vertex, local, W):
        if (
            spec.protocol in self.walk_accounted
        ):  # plain links: only the sender-known view is accountable
            from hushnet.families.walk.accounting import project_walk

            return project_walk(spec, vertex, local, W)
        from hushnet.families.walk.accounting import evaluate_policy

        return evaluate_policy(spec, vertex, local, W)

    def cost(self, spec, vertex, ids, W, orders):
        if spec.protocol in self.walk_accounted:
            from hushnet.families.walk.accounting import walk_cost

            return walk_cost(spec, vertex, ids, W, orders)
        return super().cost(spec, vertex, ids, W, orders)

    def paper_bound(self, spec, vertex, contributions, W):
        if spec.protocol not in self.walk_accounted:
            return None
        from hushnet.families.walk.accounting import RW_PAPER_LABEL, paper_row

        return paper_row(spec, vertex, contributions, W), RW_PAPER_LABEL


FAMILY = WalkFamily()
