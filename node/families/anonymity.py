"""Source anonymity for random walks: onion-relayed RW DP-SGD (anonymous-sender view) and the
source-anonymous walk of Egger et al. (sealed token, Mode A / Mode B).  See ``docs/anonymity.md``."""

from __future__ import annotations

from typing import Any

from hushnet.families.base import Family


class AnonymityFamily(Family):
    name = "anonymity"
    protocols = {
        "rw-dpsgd-onion": "RW DP-SGD with onion relaying along graph edges (anonymous-sender view)",
        "anon-walk-sgd": "source-anonymous random-walk SGD (Egger et al.): model sealed to a p*-sampled destination; "
        "mode 'A' walks the sealed token, mode 'B' sends it as an onion along a source-sampled walk",
    }

    def machine_params(self, spec) -> dict[str, Any]:
        from hushnet.runs.anonymity import _anon_walk_params, _onion_params

        return _onion_params(spec) if spec.protocol == "rw-dpsgd-onion" else _anon_walk_params(spec)

    def make_machine(self, protocol, ctx, task, params, *, W, options, run_seed):
        from hushnet.protocols.onion import make_anonymity_machine

        return make_anonymity_machine(
            protocol,
            ctx.node,
            ctx.n,
            task,
            run_seed=run_seed,
            run_id=ctx.run_id,
            params=params,
            W=W,
            view_model=ctx.view_model,
            options=options,
            rng=ctx.rng,
        )

    def node_machine(self, node, spec, vertex, ids, task, W, options):
        from hushnet.runs.anonymity import build_anon_walk, build_onion

        build = build_onion if spec.protocol == "rw-dpsgd-onion" else build_anon_walk
        return build(node, spec, vertex, ids, task, W, options)

    def project(self, spec, vertex, local, W):
        from hushnet.runs.anonymity import project_anon_walk, project_onion

        project = project_onion if spec.protocol == "rw-dpsgd-onion" else project_anon_walk
        return project(spec, vertex, local, W)

    # cost: the default (local DP per contribution) for both protocols — onion relays see the walk's
    # trajectory (VIEWS["onion-relay"]); the anonymous walk's updates are attributable

    def paper_bound(self, spec, vertex, contributions, W):
        if spec.protocol != "rw-dpsgd-onion":
            return None
        from hushnet.families.walk.accounting import RW_PAPER_LABEL, paper_row
        from hushnet.runs.accounting import sender_known

        known = sender_known(spec, W)
        return paper_row(spec, vertex, contributions, W, sender_known=known), RW_PAPER_LABEL


FAMILY = AnonymityFamily()
