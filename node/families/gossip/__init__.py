"""Gossip averaging and optimisation with local noise: Muffliato (averaging, randomized, GD) and
streaming gossip DP-GD (Koskela–Kulkarni).  Certified views: ``docs/design/spec/gossip.md``.

The package: :mod:`.params` (names, network defaults, spec → machine parameters), :mod:`.machines`
(the synchronous round machine and Muffliato / Muffliato-GD / streaming gossip), :mod:`.randomized`
(randomized Muffliato), :mod:`.secure` (secure neighbourhood summation inside the rounds), :mod:`.wire`
(round and secure-summation messages), :mod:`.build` (machines by name, simulator runs),
:mod:`.batch` (a whole run as array operations, for the papers' sizes), :mod:`.schedule` (public
schedules), :mod:`.realised` (exact accounting of a recorded schedule), :mod:`.allpairs` (Muffliato-GD's
certified rows on the public schedule, computed once per process and shared by the nodes it hosts),
:mod:`.accounting`
(projection, ledger cost, the papers' values), :mod:`.store` (durable schedule records), :mod:`.node`
(machine builder, journal, settlement on the node) and :mod:`.operator` (the operator's settlement
call).  This module stays light: the family list is imported by every node process, so the parts are
imported inside the methods.

The sans-IO gossip machines (:mod:`.machines`) run the two-phase round (availability, then values),
buffer early messages, time out silent neighbours and record every round's realised row of ``W_t``
as a ``schedule`` ledger action.  The family plugs them into a node's run service:

* **machine parameters** (:func:`gossip_params`) from the spec's public fields and
  ``[run.protocol_params]``, with *network* round timeouts (seconds, not the simulator's 50 ms);
* a **machine builder** (:func:`build_gossip`) that hands the machine the
  public gossip matrix of the spec's graph;
* a **projector** (:func:`project_gossip`): before accepting, the node
  computes its certified row with the *exact* accountant of the recorded-schedule module
  (:mod:`hushnet.families.gossip.realised`) on the public schedule (every node up every round);
* a **cost** (:func:`gossip_cost`): what the node's persistent ledger is
  charged when its noisy data first leaves (the projected certified curves — the whole run for
  averaging and streaming, one step at a time for Muffliato-GD);
* a **settlement** (``run.settle``): dropouts change ``W_t``, and the certified loss on the
  realised schedule can exceed the projection (less mixing before a neighbour sees a value).  After
  the run the operator gathers every node's recorded rows (``run.schedule``) and sends them back;
  each node checks its own rows against its own records, replays the accountant on the realised
  schedule and tops its ledger up to ``max(projected, realised)`` per target and order.  Nothing is
  ever refunded, so the ledger always holds at least the exact loss of what really happened, and
  exactly that when nothing dropped.  Like the walk's deviation top-up, a settlement is recorded
  even over budget: the data was already used, hiding the spending would be worse.

**Which view.**  ``protocol_params.view`` is ``"neighbourhood"`` (default, plain gossip: every round
value travels in the clear over the node's TLS links, so an observer sees every message of its
closed neighbourhood) or ``"aggregate"``: the rounds then run **secure neighbourhood summation**
(:mod:`hushnet.families.gossip.secure`: each node leads one SecAgg sum per round over the neighbours
it heard, keyed with the nodes' long-term X25519 keys from the directory, and learns only
``Σ_j W_t[i,j] m_j``).  The view is one switch: it turns the mechanism on, and a run can never be
accounted with less than the neighbourhood view while its values travel in the clear.  The *certified*
values of a secure-summation run (projection, ledger cost, settlement) still use the **neighbourhood
view**: each member hands in its fixed-point rounded term ``R(W_t[i,j]·m_j)`` (data and noise mixed,
weights not dyadic), so a released sum is a function of the individual messages, not of the exact sum
the aggregate view ``S = e_iᵀ`` assumes (:mod:`hushnet.families.gossip.secure`, "The rounding and the
certified view").  The aggregate view's value is reported only as the decision's uncertified
``aggregate_real_arithmetic`` figure.  The decision and the run report carry ``accounting_view``
(``gossip_view`` = the mechanism, ``certified_view`` = ``"neighbourhood"``, ``label`` =
``"secure neighbourhood summation, certified with the neighbourhood view"`` or
``"neighbourhood (plain gossip)"``).  A neighbourhood sum that falls below SecAgg's threshold
releases nothing: that node keeps its own value for the round and its schedule record says
``secure.status = "aborted"``; the settlement replays the recorded rows like any dropout.
Fixed-point error of a released sum of k terms: ``k·2^-(f+1)`` per entry (``f = frac_bits``,
default 24), at most ``T·max k·2^-(f+1)`` on a final model after T rounds.

**Randomized Muffliato** ([M] Alg. 2, ``muffliato-randomized``): the spec's graph is the network's
topology, and the activations are a seeded *public* schedule of its edges
(:func:`hushnet.privacy.muffliato.randomized_schedule` on the public W, ``p_e = 2W_e/n``, seed
``protocol_params.schedule_seed``, default the run seed), so every node knows when each of its links is
active.  An activation of {i, j} is one pairwise exchange over that link; a node handles its
activations in schedule order, buffers values for later ones, and skips an activation whose partner
stays silent past the timeout (recorded on its end as not used; after ``give_up_after`` misses the
partner is gone).  Projection and cost: the certified pairwise accountant
(:func:`~hushnet.families.gossip.realised.pairwise_sensitivities`, exact projection of each observer's
received values) on the public schedule, charged at the noisy input; settlement on the realised
activations, with the same safe completion as the rounds (a node whose records stop is assumed to have
sent at its next activation; a value a partner used was sent).  Only the neighbourhood view: a pair
exchange has no neighbourhood sum to secure.  Waiting nodes heartbeat to their remaining partners, so
a live partner held up by a dead node is slow, not silent (a crash does not cascade into skips).

**Fresh Erdős–Rényi graph per step** (Muffliato-GD, ``protocol_params.graph = "er-per-step"``, ``q``,
``graph_seed`` default the run seed; [M] Fig. 1c): every ER edge must be a network link, so it is
allowed exactly on a complete topology (``complete:N``) and refused otherwise.  Each node draws the same
public step graphs; the rounds of step r run on graph r; the projection is the exact joint-view
accountant on the per-round Metropolis–Hastings matrices of the step graphs, and a crashed node is
completed toward its neighbours of that step's graph.  Other per-round graphs (``er-per-round``) stay
simulator-only.
"""

from __future__ import annotations

from typing import Any

from hushnet.families.base import Family
from hushnet.families.gossip.params import LABELS


class GossipFamily(Family):
    name = "gossip"
    protocols = dict(LABELS)

    def machine_params(self, spec) -> dict[str, Any]:
        from hushnet.families.gossip.params import gossip_params

        return gossip_params(spec)

    def make_machine(self, protocol, ctx, task, params, *, W, options, run_seed):
        from hushnet.families.gossip.build import make_gossip_machine

        return make_gossip_machine(protocol, ctx, task, params, W, options)

    def node_machine(self, node, spec, vertex, ids, task, W, options):
        from hushnet.families.gossip.node import build_gossip

        return build_gossip(node, spec, vertex, ids, task, W, options)

    def project(self, spec, vertex, local, W):
        from hushnet.families.gossip.accounting import project_gossip

        return project_gossip(spec, vertex, local, W)

    def cost(self, spec, vertex, ids, W, orders):
        from hushnet.families.gossip.accounting import gossip_cost

        return gossip_cost(spec, vertex, ids, W, orders)

    def paper_bound(self, spec, vertex, contributions, W):
        from hushnet.families.gossip.accounting import paper_gossip

        return paper_gossip(spec, vertex, W)

    def journal(self, service, spec, vertex, ids):
        from hushnet.families.gossip.node import gossip_journal

        return gossip_journal(service, spec, vertex, ids)

    def commands(self):
        # the handlers import the family's node and accounting modules (scipy) when first called, not when
        # every node's run service registers them at start-up (~0.25 s of a host process before its first run)
        async def c_schedule(service, payload: bytes) -> bytes:
            from hushnet.families.gossip.node import c_schedule as command

            return await command(service, payload)

        async def c_settle(service, payload: bytes) -> bytes:
            from hushnet.families.gossip.node import c_settle as command

            return await command(service, payload)

        return {"run.schedule": c_schedule, "run.settle": c_settle}


FAMILY = GossipFamily()
