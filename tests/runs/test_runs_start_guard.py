"""Only the operator's ``run.start`` starts a run at a node (issue 14, point 3).

Before the fix, a node that had accepted a spec treated *any* envelope of that run from a
neighbour — even random bytes — as the start: the walk's start node charged its ledger and sent
its contribution.  Now envelopes that arrive before ``run.start`` are buffered (a bounded number
per run) and replayed in order when the operator starts the run; beyond the bound they are
dropped, counted and logged once.  Real machines, a real SQLite ledger, delivery by hand.
"""

from __future__ import annotations

import asyncio
import logging
import os

from test_runs_driver import _drivers, _pump, _spec

from hushnet.runs.driver import MAX_EARLY_MESSAGES, RunRefused


def test_random_bytes_from_a_neighbour_do_not_start_the_run(tmp_path) -> None:
    async def go():
        spec = _spec(steps=20)
        drivers, outbox = _drivers(tmp_path, spec)
        start_node = drivers[
            spec.start
        ]  # RunStarted here charges the first contribution and sends the token
        start_node.on_message("n1", os.urandom(64))  # n1 is a ring neighbour of n0
        await asyncio.sleep(0.05)
        assert start_node.state == "accepted"
        assert start_node.ledger.entries(spec.run_id) == [] and start_node.contributions == 0
        assert outbox == [] and start_node.messages_out == 0
        assert start_node.status()["early_buffered"] == 1
        # the operator's start: the buffered junk is replayed (a recorded fault), the walk proceeds
        for d in drivers:
            d.start()
        await _pump(drivers, outbox)
        assert [f["code"] for f in start_node.faults] and start_node.status()["early_buffered"] == 0
        assert sum(d.state == "finished" for d in drivers) == 1
        assert sum(d.contributions for d in drivers) == spec.steps
        for d in drivers:
            assert len(d.ledger.entries(spec.run_id)) == d.contributions
            d.shutdown()

    asyncio.run(go())


def test_a_token_that_races_ahead_of_the_start_is_replayed_not_lost(tmp_path) -> None:
    async def go():
        spec = _spec(steps=30)
        drivers, outbox = _drivers(tmp_path, spec)
        drivers[
            0
        ].start()  # the start node got run.start first; its token reaches n1 before n1's run.start
        await asyncio.sleep(0.05)
        early = [x for x in outbox if x[1] in ("n1", "n3")]
        assert early, outbox
        for src, dst, data in list(outbox):
            by = {d.node_id: d for d in drivers}
            by[dst].on_message(src, data)
        outbox.clear()
        held = [d for d in drivers[1:] if d.status()["early_buffered"]]
        assert held and all(d.state == "accepted" and d.contributions == 0 for d in held)
        for d in drivers[1:]:
            d.start()
        await _pump(drivers, outbox)
        assert sum(d.state == "finished" for d in drivers) == 1
        assert sum(d.contributions for d in drivers) == spec.steps
        for d in drivers:
            assert len(d.ledger.entries(spec.run_id)) == d.contributions
            d.shutdown()

    asyncio.run(go())


def test_early_buffer_is_bounded_dropped_counted_and_logged_once(tmp_path, caplog) -> None:
    async def go():
        spec = _spec(steps=10)
        drivers, outbox = _drivers(tmp_path, spec)
        d = drivers[2]
        extra = 25
        refused = 0
        with caplog.at_level(logging.WARNING, logger="hushnet.runs"):
            for _ in range(MAX_EARLY_MESSAGES + extra):
                try:
                    d.on_message("n1", os.urandom(32))
                except RunRefused as exc:
                    assert exc.code == "not-started"
                    refused += 1
        assert refused == extra
        st = d.status()
        assert (
            st["state"] == "accepted"
            and st["early_buffered"] == MAX_EARLY_MESSAGES
            and st["early_dropped"] == extra
        )
        lines = [r for r in caplog.records if "before it was started" in r.getMessage()]
        assert len(lines) == 1
        for x in drivers:
            x.shutdown()

    asyncio.run(go())
