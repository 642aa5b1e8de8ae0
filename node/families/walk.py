"""The random walk: RW DP-SGD on the graph's public W, P-AD's complete-graph token SGD, and the
local-DP baseline walk (random-walk paper, Alg. 1; P-AD Alg. 4)."""

from __future__ import annotations

from typing import Any

from hushnet.families.base import Family


class WalkFamily(Family):
    name = "walk"
    protocols = {
        "rw-dpsgd": "RW DP-SGD on the graph's public transition matrix (random-walk paper, Alg. 1)",
        "pad-complete-sgd": "P-AD Alg. 4: token SGD on the complete graph, uniform next holder (W = J/n)",
        "local-dp-sgd": "baseline: local-DP SGD (walk, LDP-calibrated noise, over-cap visits add nothing)",
    }
    #: protocols charged with the random-walk bound (∧ local DP); the local-DP baseline is not
    walk_accounted = ("rw-dpsgd", "pad-complete-sgd")

    def task_kind(self, protocol: str) -> str:
        return "gradient"

    def graph_kind(self, protocol: str) -> str | None:
        return "complete" if protocol == "pad-complete-sgd" else None

    def machine_params(self, spec) -> dict[str, Any]:
        return {
            "steps": spec.steps,
            "step_size": spec.step_size,
            "sigma": spec.sigma,
            "cap": spec.cap,
            "start": spec.start,
        }

    def needs_transition_matrix(self, protocol: str) -> bool:
        return protocol in ("rw-dpsgd", "local-dp-sgd")

    def make_machine(self, protocol, ctx, task, params, *, W, options, run_seed):
        from hushnet.protocols.hops import TransitionRow, UniformHop
        from hushnet.protocols.rw_dpsgd import RWDPSGD, RWParams
        from hushnet.tasks.base import GradientTask, TaskError

        if not isinstance(task, GradientTask):
            raise TaskError(f"{protocol} needs a gradient task (got {type(task).__name__})")
        p = dict(params)
        if (
            protocol == "local-dp-sgd"
        ):  # "contribute then nothing" is what makes it the local-DP baseline
            if p.setdefault("over_cap", "nothing") != "nothing":
                raise ValueError(
                    "local-dp-sgd adds nothing on over-cap visits (over_cap='nothing')"
                )
        rp = RWParams(**p)
        if protocol == "pad-complete-sgd" or (protocol == "local-dp-sgd" and W is None):
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

    def project(self, spec, vertex, local, W):
        if (
            spec.protocol in self.walk_accounted
        ):  # plain links: only the sender-known view is accountable
            from hushnet.runs.anonymity import project_walk

            return project_walk(spec, vertex, local, W)
        return super().project(spec, vertex, local, W)

    def cost(self, spec, vertex, ids, W, orders):
        if spec.protocol in self.walk_accounted:
            from hushnet.runs.accounting import walk_cost

            return walk_cost(spec, vertex, ids, W, orders)
        return super().cost(spec, vertex, ids, W, orders)

    def paper_bound(self, spec, vertex, contributions, W):
        if spec.protocol not in self.walk_accounted:
            return None
        from hushnet.runs.accounting import RW_PAPER_LABEL, paper_row

        return paper_row(spec, vertex, contributions, W), RW_PAPER_LABEL


FAMILY = WalkFamily()
