"""The source-anonymous walk recovers from a failed handoff by its own retransmission (issue 12, "Left").

``anon-walk-sgd`` (:class:`~hushnet.families.anonymity.anonymous_walk.AnonymousWalk`) acknowledges every
handoff and retransmits an unacknowledged one after its ack timeout (the hop id marks a retransmission,
so a lost ack never duplicates the walk), so it needs no driver re-send (it has no ``redeliver_for``).

Over 12 real nodes (mutual TLS on 127.0.0.x), every neighbour of the start node *refuses* the start
node's envelopes (``UNAVAILABLE`` from its server, :mod:`helpers.faults`) until the start node recorded a
failed delivery — its first token handoff fails, whichever neighbour it drew.  The walk ends, with no
fault and no deviation, no driver re-send, and one attributable charge per update on the updater's ledger.
"""

from __future__ import annotations

import pathlib

import pytest
import uvloop
from helpers.faults import (
    REFUSED,
    cut,
    failed_to,
    mend,
    short_deadlines,
)

from hushnet.runs import local_net
from hushnet.runs.spec import Budget, RunSpec
from hushnet.runs.synthetic import planted_logistic_shards

pytestmark = [pytest.mark.integration]

GRAPH, N, START = "regular:12:3:1", 12, 0


@pytest.mark.timeout(180)
def test_anonymous_walk_recovers_from_a_refused_handoff(tmp_path: pathlib.Path) -> None:
    async def go():
        shards = planted_logistic_shards(N, m=10, d=4, seed=1)
        async with local_net.network(tmp_path, GRAPH, N, shards=shards, base_ip=150) as net:
            spec = RunSpec(
                protocol="anon-walk-sgd",
                task="logreg",
                graph=GRAPH,
                steps=1,
                seed=4,
                budget=Budget(1e6, 1e-5),
                sigma=2.0,
                step_size=0.05,
                start=START,
                protocol_params={"updates_per_node": 1, "ell1": 2, "ell2": 5, "cell_body": 4096},
            ).with_run_id()
            ids = [nd.node_id for nd in net.ordered]
            short_deadlines(net)
            near = sorted(net.vertex_of[i] for i in net.ordered[START].neighbors)
            for v in near:
                cut(net, v, START)
            run_id = await net.client.start_run(spec)
            d0 = net.driver(START, run_id)
            await net.wait(lambda: d0.send_failures >= 1, 60, what="the first handoff to fail")
            for v in near:
                mend(net, v, START)
            drivers = {v: net.driver(v, run_id) for v in range(N)}
            await net.wait(
                lambda: any(d.state == "finished" for d in drivers.values()),
                90,
                what="the walk to end",
            )
            outcome = await net.client.watch(run_id, progress=False, timeout=30)
            charges = {v: len(net.svc_by_vertex[v].ledger.entries(run_id)) for v in range(N)}
            return ids, near, drivers, outcome, charges

    ids, near, drivers, outcome, charges = uvloop.run(go())
    assert any(failed_to(drivers[START], ids[v], *REFUSED) for v in near), drivers[START].events
    assert outcome.state == "finished", outcome
    assert [d.faults for d in drivers.values()] == [[]] * N
    assert [d.deviations for d in drivers.values()] == [[]] * N
    assert all(d.redeliveries == 0 for d in drivers.values())  # the machine retransmitted
    assert sum(d.machine.updates for d in drivers.values()) >= 1
    for v, d in drivers.items():
        assert charges[v] == d.machine.updates == d.contributions, v
