"""Secure-summation gossip recovers from failed deliveries of its SecAgg envelopes (issue 12, "Left").

The secure neighbourhood sums (:mod:`hushnet.families.gossip.secure`) run inside the synchronous round
machine, so they have its re-send (:attr:`GossipMachine.redeliver_for`: the driver sends the same bytes
again under the same envelope number).  What is checked here is that this is safe and enough for the
SecAgg messages, which must never be taken twice (a second masked input or unmask answer).

Over a real in-process network of 6 nodes (2×3 grid, mutual TLS on 127.0.0.x), at the start
(:mod:`helpers.faults`):

* node 1 *refuses* node 0's SecAgg envelopes (``UNAVAILABLE``) until node 0 recorded a failed delivery
  (without a second delivery node 0 is a dropout of node 1's sum, or node 1 of node 0's);
* node 4 is *busy* with node 5's first SecAgg envelope: it takes it and answers after node 5's deadline
  (``DEADLINE_EXCEEDED``, yet delivered) — the copy sent again must be dropped by the replay cache.

Every sum is released, no fault or deviation anywhere, the recorded schedules are the simulator's and
the models equal the simulator's within the fixed-point bound.  (With the re-send off, node 0 is a
dropout of node 1's round-0 sum — recorded so, ``dropped: [0]`` — and node 0's model is off by 0.3.)
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
from helpers.gossipnet import sim_records, simulate, spec  # noqa: E402

from hushnet.crypto.masks import FixedPoint  # noqa: E402
from hushnet.families.gossip.node import schedule_records  # noqa: E402
from hushnet.families.gossip.wire import KIND_SECAGG  # noqa: E402
from hushnet.runs import local_net  # noqa: E402

pytestmark = [pytest.mark.integration]

N, GRAPH, D, T = 6, "grid:2x3", 4, 3


@pytest.mark.timeout(240)
def test_failed_secagg_envelopes_in_gossip_are_sent_again(tmp_path: pathlib.Path) -> None:
    rng = np.random.default_rng(22)
    values = [rng.random(D) for _ in range(N)]
    # a round timeout far above the injected failures: a failure the run absorbs must not be a dropout
    sp = spec("muffliato", GRAPH, T, 35, timeout=30.0, view="aggregate")

    async def go():
        async with local_net.network(tmp_path, GRAPH, N, values=values, base_ip=240) as net:
            ids = [nd.node_id for nd in net.ordered]
            short_deadlines(net)
            busy = hold_first(net, 4, 5, kind=KIND_SECAGG)
            cut(net, 1, 0, prefix=bytes([KIND_SECAGG]))
            run_id = await net.client.start_run(sp)
            topo = net.driver(0, run_id).machine.topo
            assert 1 in topo.neighbour_set(0, 0) and 4 in topo.neighbour_set(5, 0)
            await mend_after_failure(net, run_id, 1, 0)
            await until_finished_or_deviated(net, run_id, N)
            return ids, busy, [net.driver(v, run_id) for v in range(N)]

    ids, busy, drivers = asyncio.run(go())
    assert busy["held"] == 1
    assert failed_to(drivers[0], ids[1], *REFUSED), drivers[0].events
    assert failed_to(drivers[5], ids[4], "DEADLINE_EXCEEDED"), drivers[5].events
    assert [d.deviations for d in drivers] == [[]] * N
    # the busy receiver's second copy was the transport's duplicate, never a second SecAgg message
    assert [d.faults for d in drivers] == [[]] * N
    assert all(d.state == "finished" for d in drivers), [d.state for d in drivers]
    res, ms = simulate(sp, values)
    assert res.status == "finished"
    srec = sim_records(ms)
    bound = T * 4 * FixedPoint(24).error_bound(1)  # ≤ 4 terms per sum on a 2×3 grid
    for v, d in enumerate(drivers):
        recs = schedule_records(d.engine_entries)
        assert [(r["row"], r["self"]) for r in recs] == [(r["row"], r["self"]) for r in srec[v]]
        assert all(r["secure"]["status"] == "released" for r in recs), (v, recs)
        assert d.finish_result["secure"] == {"released": T, "aborted": 0, "view": "aggregate"}
        np.testing.assert_allclose(d.model, res.models[v], rtol=0, atol=bound, err_msg=str(v))
    assert drivers[0].redeliveries >= 1 and drivers[5].redeliveries >= 1
