"""Randomized Muffliato's activation values whose delivery failed are sent again (issue 12, "Left").

:class:`~hushnet.families.gossip.randomized.RandomizedMuffliato` sends its value for an activation once and
its timer only heartbeats, like the synchronous rounds before their re-send: a partner whose copy was
lost waits the whole timeout and skips the activation (an ``activation-timeout`` deviation).

Over a real in-process network of 8 nodes (mutual TLS on 127.0.0.x), two deliveries fail at the start
(:mod:`helpers.faults`):

* node A's partner in A's first activation *refuses* A's envelopes (``UNAVAILABLE``) until A recorded a
  failed delivery — A's first message to it is that activation's value, which only a second delivery
  brings;
* another node's partner is *busy*: it takes that node's first envelope and answers after its deadline
  (``DEADLINE_EXCEEDED``, yet delivered) — the copy sent again must not reach the machine (it would
  refuse a second value for the activation as a replay: a fault).

The run finishes with no deviation and no fault anywhere; every estimate equals the simulator's to
1e-12 and every recorded activation is the simulator's (the public schedule, all used and sent).
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
from helpers.gossipnet import simulate, spec  # noqa: E402

from hushnet.families.gossip.node import schedule_records  # noqa: E402
from hushnet.families.gossip.schedule import activation_schedule  # noqa: E402
from hushnet.protocols.registry import transition_matrix  # noqa: E402
from hushnet.runs import local_net  # noqa: E402

pytestmark = [pytest.mark.integration]

N = 8
GRAPH = "hypercube:3"
D = 2


def _first_partner(sched: np.ndarray, v: int) -> int:
    """The partner of ``v``'s first activation (its first message goes there, at the start)."""
    for a, b in sched:
        if v in (a, b):
            return int(b if a == v else a)
    raise AssertionError(f"node {v} has no activation")


@pytest.mark.timeout(240)
def test_failed_activation_values_are_sent_again(tmp_path: pathlib.Path) -> None:
    rng = np.random.default_rng(5)
    values = [rng.random(D) for _ in range(N)]
    # a timeout far above the injected failures: a failure the run absorbs must not be a timeout
    sp = spec("muffliato-randomized", GRAPH, 40, 31, timeout=30.0)
    sched = activation_schedule(sp, transition_matrix(GRAPH, "hamilton"))
    a = 3
    b = _first_partner(sched, a)
    c = next(v for v in range(N) if v not in (a, b) and _first_partner(sched, v) not in (a, b))
    d = _first_partner(sched, c)

    async def go():
        async with local_net.network(tmp_path, GRAPH, N, values=values, base_ip=210) as net:
            ids = [nd.node_id for nd in net.ordered]
            short_deadlines(net)
            busy = hold_first(net, d, c)
            cut(net, b, a)
            run_id = await net.client.start_run(sp)
            await mend_after_failure(net, run_id, b, a)
            await until_finished_or_deviated(net, run_id, N)
            return ids, busy, [net.driver(v, run_id) for v in range(N)]

    ids, busy, drivers = asyncio.run(go())
    assert busy["held"] == 1
    assert failed_to(drivers[a], ids[b], *REFUSED), drivers[a].events
    assert failed_to(drivers[c], ids[d], "DEADLINE_EXCEEDED"), drivers[c].events
    assert [d.deviations for d in drivers] == [[]] * N
    # the busy receiver's second copy was the transport's duplicate, never a second activation value
    assert [d.faults for d in drivers] == [[]] * N
    assert all(d.state == "finished" for d in drivers), [d.state for d in drivers]
    assert drivers[a].redeliveries >= 1 and drivers[c].redeliveries >= 1
    res, _ = simulate(sp, values)
    assert res.status == "finished"
    np.testing.assert_allclose(np.stack([d.model for d in drivers]), res.models, rtol=0, atol=1e-12)
    for v, dv in enumerate(drivers):
        mine = schedule_records(dv.engine_entries)
        assert mine == schedule_records(res.sim.ledgers[v]), v
        assert mine and all(r["used"] and r["sent"] for r in mine), v
