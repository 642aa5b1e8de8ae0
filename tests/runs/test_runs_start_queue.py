"""``run.start`` answers before the first round runs; the first rounds run afterwards, one per loop turn
(issue 12: ``run.start`` at n = 2048 spread over 82 s).

Measured (session 23, Muffliato-GD, 2048 nodes in 5 host processes of 410): after the run was accepted,
the operator's batched ``run.start`` reached the nodes over ~80 s, because each node's start ran its
first round inline (gradient, noise, the ledger charge toward every node, a checkpoint, the first
messages) before the host took the next node's start: its early nodes waited for its late ones.

Now a start only marks the run started (state ``running``, the ``started`` event) and queues the first
round on the host's :class:`~hushnet.runs.service.StartQueue`.  Over a real in-process network of 8
nodes (mutual TLS on 127.0.0.x, one event loop: one host) the starts are given the way a host's
``host.batch`` gives them — each node's ``run.start`` command, one after the other — and

* every answer says ``running`` and none of the first rounds has run: no charge, no message sent, the
  machine not started (before the fix each answer came after its node's first round);
* the queue then runs the first rounds in the order of the starts, one per turn of the event loop;
* the run finishes and every model equals the simulator's (same seeds) to 1e-12.

Driver rules of the window between the two (no network): an envelope that arrives there is buffered
and replayed at the first round; a run cancelled there never starts its machine; its checkpoint holds
no machine, so a restart starts the machine again.
"""

from __future__ import annotations

import asyncio
import json
import pathlib

import numpy as np
import pytest
from helpers.gossipnet import spec  # noqa: E402
from test_gossipnet_gd_stream import GRAPH, N, _shards, _simulate  # noqa: E402
from test_runs_driver import _drivers, _pump, _spec  # noqa: E402

from hushnet.runs import local_net  # noqa: E402
from hushnet.runs import service as run_service  # noqa: E402


@pytest.mark.integration
@pytest.mark.timeout(200)
def test_run_start_answers_before_first_rounds_which_run_one_per_loop_turn(
    tmp_path: pathlib.Path,
) -> None:
    shards = _shards(6)
    sp = spec("muffliato-gd", GRAPH, 2, 43, sigma=2.0, task="logreg", K=2, timeout=30.0)

    async def go():
        async with local_net.network(tmp_path, GRAPH, N, shards=shards, base_ip=100) as net:
            _, decisions = await net.client.submit(sp)
            assert all(d.get("accept") for d in decisions.values()), decisions
            drivers = [net.driver(v, sp.run_id) for v in range(N)]
            turns = [0]  # turns of the event loop, counted by a task that yields every turn
            begun_at: list[tuple[int, int]] = []  # (vertex, turn) of each first round

            async def ticker() -> None:
                while True:
                    turns[0] += 1
                    await asyncio.sleep(0)

            for d in drivers:
                inner = d.begin

                def begin(d=d, inner=inner) -> None:
                    if not d.begun:
                        begun_at.append((d.vertex, turns[0]))
                    inner()

                d.begin = begin
            tick = asyncio.create_task(ticker())
            try:
                # what a host's batched run.start does: each hosted node's command, one after the other
                payload = json.dumps({"run_id": sp.run_id}).encode()
                answers = [
                    json.loads(await nd.controls.run("run.start", payload)) for nd in net.ordered
                ]
                # every start is answered and marked, and no first round has run yet
                assert [a["state"] for a in answers] == ["running"] * N
                for d in drivers:
                    assert d.state == "running" and d.timings.started is not None
                    assert d.messages_out == 0 and d.engine_entries == [] and d.contributions == 0
                    assert d.ledger.entries(sp.run_id) == []
                    assert not d.begun and d.timings.begun is None
                assert [a["begun"] for a in answers] == [False] * N
                queue = run_service.start_queue()
                assert len(queue) == N
                await queue.idle()
                assert queue.begun == N and len(queue) == 0
            finally:
                tick.cancel()
            # the first rounds ran in the order of the starts, each in its own turn of the loop
            assert [v for v, _ in begun_at] == list(range(N))
            at = [t for _, t in begun_at]
            assert all(b > a for a, b in zip(at, at[1:])), at
            assert all(d.begun and d.timings.begun >= d.timings.started for d in drivers)
            await net.wait(
                lambda: all(d.state == "finished" for d in drivers), 120, what="the run to finish"
            )
            return np.stack([d.model for d in drivers]), [d.deviations for d in drivers]

    models, deviations = asyncio.run(go())
    assert deviations == [[]] * N
    res, _ = _simulate(sp, shards)
    assert res.status == "finished"
    np.testing.assert_allclose(models, res.models, rtol=0, atol=1e-12)


def test_envelope_between_start_and_first_round_is_buffered_then_replayed(tmp_path) -> None:
    async def go():
        sp = _spec(steps=30)
        drivers, outbox = _drivers(tmp_path, sp)
        for d in drivers:
            assert d.mark_started() and not d.mark_started()  # once
        drivers[0].begin()  # the start node's first round: the token leaves for a neighbour
        await asyncio.sleep(0.05)
        assert outbox and all(d.begun == (d is drivers[0]) for d in drivers)
        for src, dst, data in list(outbox):
            by = {d.node_id: d for d in drivers}
            by[dst].on_message(src, data)  # marked started, first round not run: buffered
        outbox.clear()
        held = [d for d in drivers[1:] if d.status()["early_buffered"]]
        assert held and all(d.contributions == 0 and d.messages_in == 0 for d in held)
        for d in drivers[1:]:
            d.begin()
        await _pump(drivers, outbox)
        assert sum(d.state == "finished" for d in drivers) == 1
        assert sum(d.contributions for d in drivers) == sp.steps
        for d in drivers:
            assert len(d.ledger.entries(sp.run_id)) == d.contributions
            d.shutdown()

    asyncio.run(go())


def test_run_cancelled_before_its_first_round_never_starts_its_machine(tmp_path) -> None:
    async def go():
        sp = _spec(steps=10)
        drivers, outbox = _drivers(tmp_path, sp)
        start = drivers[sp.start]
        assert start.mark_started()
        start.cancel("cancelled before its first round")
        start.begin()
        await asyncio.sleep(0.05)
        assert start.state == "cancelled" and not start.begun
        assert outbox == [] and start.contributions == 0
        assert start.ledger.entries(sp.run_id) == []
        # start() on a run that is over does nothing either
        start.start()
        assert not start.begun and outbox == []

    asyncio.run(go())


def test_start_completes_a_queued_first_round_at_once(tmp_path) -> None:
    """``RunDriver.start`` (the central family's ``run.gradient`` on a run not begun) runs the first round
    a start left queued, once."""

    async def go():
        sp = _spec(steps=10)
        drivers, outbox = _drivers(tmp_path, sp)
        start = drivers[sp.start]
        assert start.mark_started()
        start.start()
        assert start.begun
        await asyncio.sleep(0.05)
        sent, made = len(outbox), start.contributions
        assert sent and made
        start.begin()  # the queue's turn comes later: nothing again
        await asyncio.sleep(0.05)
        assert len(outbox) == sent and start.contributions == made
        for d in drivers:
            d.shutdown()

    asyncio.run(go())


def test_net_experiments_reports_both_start_spreads() -> None:
    from hushnet.runs.net_experiments import start_spreads

    per_node = {
        "n0": {"timings": {"started": 10.0, "begun": 10.5}},
        "n1": {"timings": {"started": 10.25, "begun": 12.0}},
        "n2": {"timings": {"started": 11.0}},  # a report of an older node: no first-round time
        "n3": {"error": "unreachable"},
    }
    assert start_spreads(per_node) == {
        "start_spread_seconds": 1.0,
        "first_round_spread_seconds": 1.5,
    }


def test_a_durable_start_is_on_disk_before_its_answer_and_a_restart_runs_the_first_round(
    tmp_path,
) -> None:
    """The start is answered before the first round's checkpoint, so it is recorded itself: a node that
    dies in between restarts the machine (it is not left ``accepted`` while the operator thinks it started)."""
    from hushnet.runs.run_store import RunStore

    async def go():
        sp = _spec(steps=10)
        drivers, _ = _drivers(tmp_path, sp)
        d = drivers[sp.start]
        store = RunStore(tmp_path / "runs.sqlite")
        store.accept(sp.run_id, b"signed", d.vertex, {})
        d.store = store  # a durable walk (the service gives it its node's store)
        assert d.mark_started()
        (row,) = store.runs()
        assert row["state"] == "running" and row["machine"] is None and not d.begun
        # the node dies here; the restarted node's driver, from that record, starts the machine
        (tmp_path / "again").mkdir()
        again, outbox = _drivers(tmp_path / "again", sp)
        fresh = again[sp.start]
        fresh.store = store
        fresh.restore(row["driver"], row["machine"], row["state"], row["reason"], 0)
        await asyncio.sleep(0.05)
        assert fresh.begun and fresh.state == "running" and fresh.contributions and outbox
        (row,) = store.runs()
        assert row["machine"] is not None  # the first round's own checkpoint
        for x in drivers + again:
            x.shutdown()
        store.close()

    asyncio.run(go())
