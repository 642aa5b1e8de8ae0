"""A gossip round message whose delivery failed is sent again (issue 12: Muffliato-GD at n = 2048).

Measured (session 23, 2048 nodes over 5 hosts): ``run.start`` reached the nodes over 82 s and many
round-0 sends failed with ``DEADLINE_EXCEEDED`` while the receivers' hosts were busy starting.  The
synchronous gossip machine sends each ``AVAIL(t)`` / ``VALUE`` once and its timer only heartbeats, so
the neighbour waited the whole round timeout and dropped the sender: 1 728 of 2 048 nodes had an
``availability-timeout`` deviation in round 0 and the run lost its parity with the simulator.

Here, over a real in-process network of 8 nodes (mutual TLS on 127.0.0.x), two round-0 deliveries
fail the two ways a busy or unreachable receiver makes them fail (:mod:`helpers.faults`):

* node 0 is *busy*: it takes node 1's first envelope and answers only after node 1's deadline
  (``DEADLINE_EXCEEDED`` at the sender, yet delivered) — sending it again must not deliver it twice;
* node 2 *refuses* node 3's envelopes (``UNAVAILABLE`` from its server, one way) until node 3 has
  recorded a failed delivery — not delivered, so only a second delivery brings it.

The run finishes with no deviation and no fault anywhere, every model equals the simulator's to
1e-12 and every recorded schedule is the simulator's (the public one).
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
    until_finished_or_deviated,
)
from helpers.gossipnet import sim_records, spec  # noqa: E402
from test_gossipnet_gd_stream import GRAPH, N, _shards, _simulate  # noqa: E402

from hushnet.families.gossip.node import schedule_records  # noqa: E402
from hushnet.runs import local_net  # noqa: E402

pytestmark = [pytest.mark.integration]


@pytest.mark.timeout(240)
def test_failed_round_deliveries_are_sent_again(tmp_path: pathlib.Path) -> None:
    shards = _shards(4)
    # a round timeout far above the injected failures (a failure the run absorbs must not be a timeout)
    sp = spec("muffliato-gd", GRAPH, 3, 41, sigma=2.0, task="logreg", K=2, timeout=30.0)

    async def go():
        async with local_net.network(tmp_path, GRAPH, N, shards=shards, base_ip=200) as net:
            ids = [nd.node_id for nd in net.ordered]
            short_deadlines(net)
            busy = hold_first(net, 0, 1)
            cut(net, 2, 3)  # node 2 answers node 3 UNAVAILABLE until node 3 saw a failure
            run_id = await net.client.start_run(sp)
            d3 = net.driver(3, run_id)
            # both pairs are round-0 neighbours (vertices 0–1 and 2–3 of the cube differ in one bit)
            assert 1 in net.driver(0, run_id).machine.topo.neighbour_set(0, 0)
            assert 2 in d3.machine.topo.neighbour_set(3, 0)
            await mend_after_failure(net, run_id, 2, 3)
            await until_finished_or_deviated(net, run_id, N)
            return ids, busy, [net.driver(v, run_id) for v in range(N)]

    ids, busy, drivers = asyncio.run(go())
    assert busy["held"] == 1
    assert failed_to(drivers[1], ids[0], "DEADLINE_EXCEEDED"), drivers[1].events
    assert failed_to(drivers[3], ids[2], *REFUSED), drivers[3].events
    assert drivers[1].redeliveries >= 1 and drivers[3].redeliveries >= 1
    assert [d.deviations for d in drivers] == [[]] * N
    # the busy receiver's second copy was the transport's duplicate, never a second round message
    assert [d.faults for d in drivers] == [[]] * N
    assert all(d.state == "finished" for d in drivers), [d.state for d in drivers]
    d1, d3 = drivers[1], drivers[3]
    assert d1.redeliveries >= 1 and d3.redeliveries >= 1, (d1.redeliveries, d3.redeliveries)
    res, ms = _simulate(sp, shards)
    assert res.status == "finished"
    np.testing.assert_allclose(np.stack([d.model for d in drivers]), res.models, rtol=0, atol=1e-12)
    srec = sim_records(ms)
    for v, d in enumerate(drivers):
        assert schedule_records(d.engine_entries) == srec[v], v
