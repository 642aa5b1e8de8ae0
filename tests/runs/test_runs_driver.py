"""The node driver on its own: bad tokens are refused with a reason and leave the ledger exact.

Drives real machines and a real SQLite privacy ledger through :class:`RunDriver` on an asyncio
loop; the "transport" is a list per node that the test delivers by hand, so it can play a
misbehaving peer (unexpected sender, replayed step, wrong dimension) at an exact moment.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import grpc
import numpy as np
import pytest

from hushnet.families.walk.wire import encode_token
from hushnet.net.errors import DeliveryError, handler_refusal
from hushnet.privacy.ledger import Ledger
from hushnet.protocols.registry import make_machine, transition_matrix
from hushnet.runs.accounting import contribution_cost
from hushnet.runs.driver import RunDriver, RunRefused
from hushnet.runs.service import RUN_PROTOCOL, network_walk_options
from hushnet.runs.spec import Budget, RunSpec
from hushnet.tasks import LogisticRegressionTask

N = 4
GRAPH = "ring:4"


def _drivers(tmp_path, spec, ledger_budget=None, options=None, send_fn=None):
    rng = np.random.default_rng(0)
    W = transition_matrix(spec.graph)
    ids = [f"n{i}" for i in range(N)]
    outbox: list[tuple[str, str, bytes]] = []
    drivers = []
    for v in range(N):
        X = rng.standard_normal((5, 3))
        y = np.where(rng.random(5) > 0.5, 1.0, -1.0)
        task = LogisticRegressionTask(X, y)
        m = make_machine(
            spec.protocol,
            v,
            N,
            task,
            run_seed=spec.seed,
            run_id=spec.run_id,
            params=spec.machine_params(),
            W=W,
            options=options or network_walk_options(spec, progress_every=1),
        )
        led = Ledger(tmp_path / f"l{v}.sqlite", node_id=ids[v])
        if ledger_budget is not None:
            from hushnet.privacy.ledger import LedgerBudget as LB

            led.set_budget(LB(ledger_budget, spec.budget.delta))

        async def send(dst, data, src=ids[v], **kw):
            if send_fn is not None:
                return await send_fn(src, dst, data)
            outbox.append((src, dst, data))

        drivers.append(
            RunDriver(
                spec, v, ids, m, send, ledger=led, cost=contribution_cost(spec, v, ids, W), W=W
            )
        )
    return drivers, outbox


def _spec(**kw):
    base = dict(
        protocol="rw-dpsgd",
        task="logreg",
        graph=GRAPH,
        steps=40,
        seed=5,
        budget=Budget(1e6, 1e-5),
        sigma=1.0,
        cap=None,
    )
    base.update(kw)
    return RunSpec(**base).with_run_id()


async def _pump(drivers, outbox, until_step=None, max_msgs=10_000):
    """Deliver queued messages in order until none are left (or the walk reached ``until_step``)."""
    by = {d.node_id: d for d in drivers}
    delivered = []
    for _ in range(max_msgs):
        await asyncio.sleep(0)
        if not outbox:
            await asyncio.sleep(0.01)
            if not outbox:
                return delivered
        src, dst, data = outbox.pop(0)
        by[dst].on_message(src, data)
        delivered.append((src, dst, data))
        if until_step is not None and max(d.last_step for d in drivers) >= until_step:
            return delivered
    return delivered


def test_bad_tokens_refused_ledger_exact(tmp_path):
    async def go():
        spec = _spec()
        drivers, outbox = _drivers(tmp_path, spec)
        for d in drivers:
            d.start()
        delivered = await _pump(drivers, outbox, until_step=10)
        tokens = [x for x in delivered if x[2][0] == 1]
        src, dst, data = tokens[-1]
        holder = {d.node_id: d for d in drivers}[dst]
        before = holder.ledger.entries()
        charged = holder.run_rdp.copy() if holder.run_rdp is not None else None
        # replay with other contents, same step
        step = int.from_bytes(data[1:9], "little")
        forged = encode_token(step, spec.steps, 0, int(dst[1:]), np.ones(4))
        with pytest.raises(RunRefused, match="replay"):
            holder.on_message(src, forged)
        # a sender that cannot hand this node the token under W (ring: only the two neighbours)
        far = f"n{(int(dst[1:]) + 2) % N}"
        with pytest.raises(RunRefused, match="unexpected-sender"):
            holder.on_message(far, encode_token(step + 1, spec.steps, 0, int(dst[1:]), np.zeros(4)))
        # model of the wrong dimension
        with pytest.raises(RunRefused, match="wrong-dimension"):
            holder.on_message(src, encode_token(step + 1, spec.steps, 0, int(dst[1:]), np.zeros(7)))
        # a peer outside the run's graph
        with pytest.raises(RunRefused, match="unknown-sender"):
            holder.on_message("intruder", data)
        assert [e["id"] for e in holder.ledger.entries()] == [e["id"] for e in before]
        if charged is not None:
            np.testing.assert_array_equal(holder.run_rdp, charged)
        assert [f["code"] for f in holder.faults] == [
            "replay",
            "unexpected-sender",
            "wrong-dimension",
        ]
        # the exact retransmission is harmless (acknowledged again, nothing charged)
        holder.on_message(src, data)
        assert len(holder.ledger.entries()) == len(before)
        # the walk still finishes, and the ledgers hold exactly one entry per contribution
        await _pump(drivers, outbox)
        assert sum(d.state == "finished" for d in drivers) == 1
        assert sum(d.contributions for d in drivers) == spec.steps
        for d in drivers:
            assert len(d.ledger.entries(spec.run_id)) == d.contributions
            d.shutdown()

    asyncio.run(go())


def test_budget_exhausted_mid_run_stops_before_the_contribution_leaves(tmp_path):
    async def go():
        spec = _spec(steps=400, sigma=1.0)
        drivers, outbox = _drivers(tmp_path, spec, ledger_budget=3.0)
        for d in drivers:
            d.start()
        await _pump(drivers, outbox)
        stopped = [d for d in drivers if d.state == "stopped"]
        assert stopped and "budget exhausted" in stopped[0].reason
        d = stopped[0]
        # the ledger never exceeds the node's budget, and it matches the contributions that left
        for t, s in d.ledger.spent(delta=spec.budget.delta).items():
            assert s.epsilon <= 3.0 * (1 + 1e-9)
        assert len(d.ledger.entries(spec.run_id)) == d.contributions
        for x in drivers:
            x.shutdown()

    asyncio.run(go())


def test_cancel_and_events(tmp_path):
    async def go():
        spec = _spec(steps=30)
        drivers, outbox = _drivers(tmp_path, spec)
        for d in drivers:
            d.start()
        evs = await drivers[0].wait_events(0, 0.1)
        assert evs[0]["type"] == "started"
        drivers[1].cancel("test")
        with pytest.raises(RunRefused, match="run-closed"):  # the operator's: the whole run is over
            drivers[1].on_message("n0", b"\x01")
        assert drivers[1].status()["state"] == "cancelled"
        for d in drivers:
            d.shutdown()

    asyncio.run(go())


class _FullDisk:
    """A run store whose every checkpoint fails (a full disk): the fault is the disk's, not the network's."""

    def checkpoint(self, *args, **kwargs):
        raise OSError("No space left on device")


def test_token_whose_checkpoint_fails_is_refused_so_no_receipt_leaves(tmp_path):
    """With link receipts the answer to a token's Deliver is its ack, so the driver must not answer
    "accepted" for a token whose batch it could not write: it stops the run (nothing of the batch is
    sent, as before) and refuses the message, and the sender keeps the token and retries."""

    async def go():
        spec = _spec()
        drivers, outbox = _drivers(tmp_path, spec)
        for d in drivers:
            d.start()
        await asyncio.sleep(0)
        src, dst, data = next(x for x in outbox if x[2][0] == 1)
        outbox.clear()
        holder = {d.node_id: d for d in drivers}[dst]
        holder.store = _FullDisk()
        with pytest.raises(RunRefused, match="not-durable.*checkpoint"):
            holder.on_message(src, data)
        await asyncio.sleep(0.01)
        assert holder.state == "stopped" and outbox == []

    asyncio.run(go())


def test_a_neighbour_that_says_the_run_is_closed_holds_the_walk(tmp_path):
    """A node that missed the operator's close (down or cut off then) still holds its run; its neighbour
    refuses the token as closed there.  It must hold — no retry, no deviation around the "dead"
    neighbour, no new step on its own data (that would spend and charge its data for a run that is
    over) — and ask for the close record at once.  Found as an extra ledger charge after a restart in
    test_runs_topup_auto.py under load; a neighbour that only *finished* or stopped still means
    "go around it" (``run-over``)."""

    async def go():
        spec = _spec(steps=400, on_peer_down="deviate")
        opts = replace(network_walk_options(spec, progress_every=1), ack_timeout=0.05)
        closed = False
        sends_after: list[tuple[str, str]] = []
        drivers: list[RunDriver] = []

        async def send(src, dst, data):
            if not closed:
                outbox.append((src, dst, data))
                return
            sends_after.append((src, dst))
            try:  # the receiving driver decides, and its server answers as a peer's server does
                drivers[int(dst[1:])].on_message(src, data)
            except RunRefused as exc:
                raise DeliveryError(
                    dst, grpc.StatusCode.INTERNAL, handler_refusal(RUN_PROTOCOL, exc)
                ) from None

        outbox: list = []
        built, _ = _drivers(tmp_path, spec, options=opts, send_fn=send)
        drivers.extend(built)
        asked: list[str] = []
        for d in drivers:
            d.on_peer_closed = asked.append
            d.start()
        await asyncio.sleep(0.01)
        holder = next(d for d in drivers if d.contributions)  # the walk's first holder
        charged = len(holder.ledger.entries(spec.run_id))
        for d in drivers:
            if d is not holder:
                d.cancel("closed by the operator while the holder was cut off")
        closed = True
        await asyncio.sleep(1.0)  # 20 ack timeouts: enough to retry 3 times and deviate twice
        assert holder.closed_by and asked == sorted(holder.closed_by)[:1], (asked, holder.closed_by)
        assert len(sends_after) == 1, sends_after  # the first retransmission only
        assert holder.deviations == [] and holder.state == "running"
        assert len(holder.ledger.entries(spec.run_id)) == charged  # no step on its data since
        assert holder.status()["closed_by"] == sorted(holder.closed_by)
        for d in drivers:
            d.shutdown()

    asyncio.run(go())
