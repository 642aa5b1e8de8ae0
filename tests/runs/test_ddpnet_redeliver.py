"""``secagg-dpsgd``'s messages whose delivery failed are sent again (issue 12, "Left").

:class:`~hushnet.families.secagg.dpsgd.SecAggDPSGD` sends each message once: the secure sum's trips
inside a round and the leader's ``OUTCOME`` to every node.  Nothing asks again (``SYNC`` is only for a
restarted node), so a lost announcement makes the member a dropout of the round (the model is no longer
the simulator's), and a lost ``OUTCOME`` leaves a node waiting for its leader until ``leader_timeout``,
when it ends the whole run ``leader-lost`` (and tells every node to).

Over a real in-process network of 8 nodes (complete graph, mutual TLS on 127.0.0.x), three deliveries
fail (:mod:`helpers.faults`):

* node E *refuses* round 0's leader's envelopes (``UNAVAILABLE``) until the leader recorded a failed
  delivery — the first is the round's announcement, without which E never masks;
* node F *refuses* round 1's ``OUTCOME`` from its leader until that leader recorded a failed delivery;
* round 0's leader is *busy* with member C's masked input: it takes it and answers after C's deadline
  (``DEADLINE_EXCEEDED``, yet delivered) — the copy sent again must not reach the machine.

Every node finishes with no deviation and no fault, every model equals the simulator's to 1e-12, and
every ledger holds one charge per round.
"""

from __future__ import annotations

import asyncio
import pathlib

import numpy as np
import pytest
from helpers.ddp import shards
from helpers.faults import (
    REFUSED,
    cut,
    failed_to,
    hold_first,
    mend_after_failure,
    short_deadlines,
)

from hushnet.families.secagg.wire import DDP_HEAD, OUTCOME, ROUND
from hushnet.protocols.registry import build_from_spec
from hushnet.runs.local_net import network
from hushnet.runs.spec import Budget, RunSpec
from hushnet.sim import Simulator
from hushnet.tasks import LogisticRegressionTask

pytestmark = [pytest.mark.integration]

N, ROUNDS = 8, 3
C, E, F = (
    5,
    6,
    3,
)  # busy at round 0's leader (node 0); refuses node 0; refuses round 1's outcome (node 1)


@pytest.mark.timeout(240)
def test_failed_ddp_deliveries_are_sent_again(tmp_path: pathlib.Path) -> None:
    sh = shards(N, seed=6)
    # timeouts far above the injected failures: a failure the run absorbs must not be a dropout or a loss
    spec = RunSpec(
        protocol="secagg-dpsgd",
        task="logreg",
        graph=f"complete:{N}",
        steps=ROUNDS,
        seed=23,
        budget=Budget(1e3, 1e-5),
        sigma=1.5,
        clip=0.5,
        step_size=0.5,
        noise="public-seed",
        protocol_params={
            "threshold": 6,
            "collusion": 2,
            "round_timeout": 20.0,
            "leader_timeout": 40.0,
        },
    ).with_run_id()
    tasks = [LogisticRegressionTask(X, y, **spec.task_kwargs()) for X, y in sh]
    sim = Simulator(build_from_spec(spec, tasks)).run()
    assert sim.status == "finished"

    async def go():
        async with network(tmp_path, f"complete:{N}", N, shards=sh, base_ip=230) as net:
            ids = [nd.node_id for nd in net.ordered]
            short_deadlines(net)
            busy = hold_first(net, 0, C, kind=ROUND)
            cut(net, E, 0)
            cut(net, F, 1, prefix=DDP_HEAD.pack(OUTCOME, 1))
            run_id = await net.client.start_run(spec)
            await asyncio.gather(
                mend_after_failure(net, run_id, E, 0), mend_after_failure(net, run_id, F, 1)
            )
            await net.wait(
                lambda: all(net.driver(v, run_id).state == "finished" for v in range(N)),
                120,
                what="every node to finish",
            )
            charges = [len(net.svc_by_vertex[v].ledger.entries(run_id)) for v in range(N)]
            return ids, busy, [net.driver(v, run_id) for v in range(N)], charges

    ids, busy, drivers, charges = asyncio.run(go())
    assert busy["held"] == 1
    assert failed_to(drivers[0], ids[E], *REFUSED), drivers[0].events
    assert failed_to(drivers[1], ids[F], *REFUSED), drivers[1].events
    assert failed_to(drivers[C], ids[0], "DEADLINE_EXCEEDED"), drivers[C].events
    assert [d.deviations for d in drivers] == [[]] * N
    assert [d.faults for d in drivers] == [[]] * N
    assert all(d.redeliveries >= 1 for d in (drivers[0], drivers[1], drivers[C]))
    for v, d in enumerate(drivers):
        assert d.finish_result.get("status", "finished") != "leader-lost", (v, d.finish_result)
        assert np.max(np.abs(d.model - sim.model)) <= 1e-12, v
    assert charges == [ROUNDS] * N, charges
