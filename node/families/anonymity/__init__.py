"""Source anonymity for random walks: onion-relayed RW DP-SGD (anonymous-sender view) and the
source-anonymous walk of Egger et al. (sealed token, Mode A / Mode B).  See ``docs/anonymity.md``.

The package: :mod:`.params` (names, spec → machine parameters), :mod:`.onion` (onion relaying around
any machine, relay plans), :mod:`.anonymous_walk` and :mod:`.onion_walk` (the sealed walk, Mode A /
Mode B), :mod:`.machines` (building them by name), :mod:`.wire` (message kinds, hop acks),
:mod:`.accounting` (projections, the relay plan's view), :mod:`.node` (machines with the node's keys)
and :mod:`.operator` (the walk's iterations from the nodes' event streams).  This module stays light:
the family list is imported by every node process, so the parts are imported inside the methods."""

from __future__ import annotations

from typing import Any

from hushnet.families.anonymity.params import ANON_WALK_SGD, RW_DPSGD_ONION
from hushnet.families.base import Family


class AnonymityFamily(Family):
    name = "anonymity"
    protocols = {
        RW_DPSGD_ONION: "RW DP-SGD with onion relaying along graph edges (anonymous-sender view)",
        ANON_WALK_SGD: "source-anonymous random-walk SGD (Egger et al.): model sealed to a p*-sampled destination; "
        "mode 'A' walks the sealed token, mode 'B' sends it as an onion along a source-sampled walk",
    }

    def machine_params(self, spec) -> dict[str, Any]:
        from hushnet.families.anonymity.params import anon_walk_params, onion_params

        return onion_params(spec) if spec.protocol == RW_DPSGD_ONION else anon_walk_params(spec)

    def make_machine(self, protocol, ctx, task, params, *, W, options, run_seed):
        from hushnet.families.anonymity.machines import make_anonymity_machine

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

    def prepare_submit(self, spec, directory):
        """An onion run on a network that rotates onion keys uses **one** key epoch at every node, fixed
        here in the signed spec: a node taking the epoch current at its own acceptance would, when the
        acceptances straddle a boundary, build layers under two epochs — and the epoch travels in the
        clear, splitting the run's senders into two groups.  The run gets a new id (the hash of what is
        signed); :meth:`Client.start_run` returns it."""
        import time
        from dataclasses import replace

        period = float(getattr(directory, "onion_epoch_seconds", 0.0) or 0.0)
        if spec.protocol != RW_DPSGD_ONION or period <= 0 or "epoch" in spec.protocol_params:
            return spec
        epoch = int(time.time() // period)
        # the run id is the hash of the signed contents: a new parameter makes a new id
        pp = {**spec.protocol_params, "epoch": epoch}
        return replace(spec, protocol_params=pp, run_id="").with_run_id()

    def node_machine(self, node, spec, vertex, ids, task, W, options):
        from hushnet.families.anonymity.node import build_anon_walk, build_onion

        build = build_onion if spec.protocol == RW_DPSGD_ONION else build_anon_walk
        return build(node, spec, vertex, ids, task, W, options)

    def project(self, spec, vertex, local, W):
        from hushnet.families.anonymity.accounting import project_anon_walk, project_onion

        project = project_onion if spec.protocol == RW_DPSGD_ONION else project_anon_walk
        return project(spec, vertex, local, W)

    # cost: the default (local DP per contribution) for both protocols — onion relays see the walk's
    # trajectory (VIEWS["onion-relay"]); the anonymous walk's updates are attributable

    def paper_bound(self, spec, vertex, contributions, W):
        if spec.protocol != RW_DPSGD_ONION:
            return None
        from hushnet.families.anonymity.accounting import sender_known
        from hushnet.families.walk.accounting import RW_PAPER_LABEL, paper_row

        known = sender_known(spec, W)
        return paper_row(spec, vertex, contributions, W, sender_known=known), RW_PAPER_LABEL


FAMILY = AnonymityFamily()
