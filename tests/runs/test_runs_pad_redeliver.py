"""P-AD recovers from failed token deliveries by its own retransmission (issue 12, "Left").

The P-AD machines are token walks (:class:`~hushnet.families.walk.walker.WalkMachine`): every handoff
waits for the receiver's ack and is retransmitted after ``ack_timeout`` (2 s on the network,
:func:`hushnet.runs.service.network_walk_options`), up to ``max_retries``, then paused and retried every
``pause_retry`` (``WalkMachine.on_timer``).  A receiver recognises a retransmission (same step, same
bytes) and acknowledges it again with no side effect (``WalkMachine.on_message``).  So the family needs
no driver re-send (it has no ``redeliver_for``: a second sender would double its sends).

Checked over a real in-process network of 6 nodes (directed ring, mutual TLS on 127.0.0.x), with
``pad-ring-sum`` (:mod:`helpers.faults`):

* node 1 *refuses* node 0's first token (``UNAVAILABLE``) until node 0 recorded a failed delivery;
* node 3 is *busy* with node 2's first token: it takes it and answers after node 2's deadline
  (``DEADLINE_EXCEEDED``, yet delivered).

The run finishes with no fault and no deviation, the retransmissions were sent by the machines
(``handoff`` retries, no driver re-send) and the sum equals the simulator's exactly.
"""

from __future__ import annotations

import asyncio
import pathlib

import numpy as np
import pytest
from helpers.faults import (
    REFUSED,
    cut,
    failed_to,
    hold_first,
    mend_after_failure,
    short_deadlines,
)

from hushnet.families.walk.wire import KIND_TOKEN
from hushnet.protocols.registry import build_from_spec
from hushnet.runs import local_net
from hushnet.runs.policy import NodePolicy, load_task
from hushnet.runs.spec import Budget, RunSpec
from hushnet.sim import Simulator

pytestmark = [pytest.mark.integration]

N = 6
VALUES = [0.0, 3.0, 1.0, 2.0, 2.0, 1.0]


@pytest.mark.timeout(240)
def test_pad_token_recovers_from_failed_deliveries(tmp_path: pathlib.Path) -> None:
    spec = RunSpec(
        protocol="pad-ring-sum",
        task="sum",
        task_params={"lo": 0.0, "hi": 4.0},
        graph=f"ring:{N}",
        rounds=3,
        steps=0,
        seed=5,
        budget=Budget(1e4, 1e-5),
        sigma=1.5,
        noise="public-seed",
    ).with_run_id()

    async def go():
        async with local_net.network(
            tmp_path, f"ring:{N}", N, values=[np.array([v]) for v in VALUES], base_ip=250
        ) as net:
            ids = [nd.node_id for nd in net.ordered]
            short_deadlines(net)
            busy = hold_first(net, 3, 2, kind=KIND_TOKEN)
            cut(net, 1, 0, prefix=bytes([KIND_TOKEN]))
            run_id = await net.client.start_run(spec)
            await mend_after_failure(net, run_id, 1, 0)
            await net.wait(
                lambda: any(net.driver(v, run_id).state == "finished" for v in range(N)),
                120,
                what="the token to finish its rounds",
            )
            return ids, busy, [net.driver(v, run_id) for v in range(N)]

    ids, busy, drivers = asyncio.run(go())
    assert busy["held"] == 1
    assert failed_to(drivers[0], ids[1], *REFUSED), drivers[0].events
    assert failed_to(drivers[2], ids[3], "DEADLINE_EXCEEDED"), drivers[2].events
    assert [d.faults for d in drivers] == [[]] * N
    assert [d.deviations for d in drivers] == [[]] * N
    # the machine retransmitted; the driver never did (the walk has no redeliver_for)
    assert all(d.redeliveries == 0 for d in drivers)
    assert not hasattr(drivers[0].machine, "redeliver_for")
    holder = next(d for d in drivers if d.state == "finished")
    tasks = [load_task(spec, NodePolicy(None, tmp_path / f"n{i}" / "data.npz")) for i in range(N)]
    sim = Simulator(build_from_spec(spec, tasks)).run()
    assert sim.status == "finished"
    assert holder.vertex == sim.finish.node
    np.testing.assert_allclose(holder.model, sim.model, rtol=0, atol=1e-12)
