"""A secure sum's (``secagg-sum``) messages whose delivery failed are sent again (issue 12, "Left").

:class:`~hushnet.families.secagg.machines.SecAggMachine` sends each message of a round once: the
leader's announcement, a member's masked input with its shares, the confirmation and unmask trips.  The
leader's timer closes a phase, it never asks again, so one lost delivery makes a member a *dropout*: its
input is left out of the sum although it was charged (the charge precedes the send).

Over a real in-process network of 8 nodes (complete graph, mutual TLS on 127.0.0.x), three deliveries
fail at the start (:mod:`helpers.faults`):

* the leader *refuses* member A's envelopes (``UNAVAILABLE``) until A recorded a failed delivery — A's
  first message to it is its masked input;
* member E *refuses* the leader's envelopes until the leader recorded a failed delivery — the leader's
  first message to E is the round's announcement (its nonce), without which E never masks;
* the leader is *busy* with member C's masked input: it takes it and answers after C's deadline
  (``DEADLINE_EXCEEDED``, yet delivered) — the copy sent again must not reach the machine (it would
  refuse a second masked input as a replay: a fault).

The round releases the sum of all 8 members (no dropout), no fault anywhere, the sum equals the plain
sum of the members' noisy inputs to the fixed-point bound, and every node holds exactly one charge.
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

from hushnet.crypto.masks import FixedPoint
from hushnet.engine.rng import node_generator
from hushnet.families.secagg.wire import MASKED
from hushnet.privacy.secure_sum import effective_sensitivity
from hushnet.runs import local_net
from hushnet.runs.spec import Budget, RunSpec

pytestmark = [pytest.mark.integration]

N, D, SIGMA = 8, 6, 0.25
LEADER, A, C, E = 0, 3, 5, 6


@pytest.mark.timeout(240)
def test_failed_secure_sum_deliveries_are_sent_again(tmp_path: pathlib.Path) -> None:
    rng = np.random.default_rng(7)
    values = [rng.random(D) for _ in range(N)]
    # a round timeout far above the injected failures: a failure the round absorbs must not be a dropout
    spec = RunSpec(
        protocol="secagg-sum",
        task="sum",
        graph=f"complete:{N}",
        steps=1,
        seed=4,
        budget=Budget(1e6, 1e-5),
        sigma=SIGMA,
        noise="public-seed",
        protocol_params={"round_timeout": 20.0, "leader": LEADER},
    ).with_run_id()

    async def go():
        async with local_net.network(
            tmp_path, f"complete:{N}", N, values=values, base_ip=220
        ) as net:
            ids = [nd.node_id for nd in net.ordered]
            short_deadlines(net)
            busy = hold_first(net, LEADER, C, kind=MASKED)
            cut(net, LEADER, A)
            cut(net, E, LEADER)
            run_id = await net.client.start_run(spec)
            await asyncio.gather(
                mend_after_failure(net, run_id, LEADER, A),
                mend_after_failure(net, run_id, E, LEADER),
            )
            lead = net.driver(LEADER, run_id)
            await net.wait(lambda: lead.state == "finished", 90, what="the leader to end the round")
            await net.wait(
                lambda: all(net.driver(v, run_id).state == "finished" for v in range(N)),
                30,
                what="every member to receive the sum",
            )
            charges = [len(net.svc_by_vertex[v].ledger.entries(run_id)) for v in range(N)]
            return ids, busy, [net.driver(v, run_id) for v in range(N)], charges

    ids, busy, drivers, charges = asyncio.run(go())
    lead = drivers[LEADER]
    assert busy["held"] == 1
    assert failed_to(drivers[A], ids[LEADER], *REFUSED), drivers[A].events
    assert failed_to(lead, ids[E], *REFUSED), lead.events
    assert failed_to(drivers[C], ids[LEADER], "DEADLINE_EXCEEDED"), drivers[C].events
    res = lead.finish_result
    assert res["status"] == "released", res
    assert res["survivors"] == list(range(N)) and res["dropped"] == [], res
    # the busy leader's second copy was the transport's duplicate, never a second masked input
    assert [d.faults for d in drivers] == [[]] * N
    assert [d.deviations for d in drivers] == [[]] * N
    assert drivers[A].redeliveries >= 1 and drivers[C].redeliveries >= 1 and lead.redeliveries >= 1
    sens = np.sqrt(D)  # SumTask on [0, 1]: (hi − lo)·√d
    std = SIGMA * effective_sensitivity(sens, 1, dim=D, frac_bits=FixedPoint().frac_bits)
    plain = sum(
        values[u] + node_generator(spec.seed, N, u).standard_normal(D) * std for u in range(N)
    )
    bound = FixedPoint().error_bound(2 * N)
    assert np.max(np.abs(lead.model - plain)) <= bound + 1e-9 * np.max(np.abs(plain))
    assert charges == [1] * N, charges
