"""Gossip machines checkpoint and restore (issue 14): a restored machine continues the same run, moves to
the round its neighbours are in, and neighbours that had declared it gone take it back."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from helpers.gossip import gossip_matrix, value_tasks

from hushnet.engine.actions import Deviation, Fault, LedgerEntry, Send, SetTimer
from hushnet.engine.events import MessageArrived, RunStarted, TimerFired
from hushnet.families.gossip.build import build_gossip_machines
from hushnet.families.gossip.wire import (
    KIND_AVAIL,
    KIND_HEARTBEAT,
    KIND_VALUE,
    decode_round,
    encode_round,
)
from hushnet.runs.run_store import pack, unpack

W = gossip_matrix("er:12:0.4:3")
NB = sorted(int(j) for j in sp.csr_matrix(W)[0].indices if j != 0)


def machines(protocol: str = "muffliato", rounds: int = 6, give_up_after: int = 3):
    tasks, _ = value_tasks(12)
    return build_gossip_machines(
        protocol,
        tasks,
        run_seed=5,
        params=dict(rounds=rounds, sigma=1.0, give_up_after=give_up_after),
        W=W,
    )


def test_checkpoint_round_trip_continues_identically():
    for protocol in ("muffliato", "gossip-stream"):
        a, b = machines(protocol)[0], machines(protocol)[0]
        a.handle(RunStarted())
        b.handle(RunStarted())
        for j in NB:  # round 0: everybody up, half the values in
            a.handle(MessageArrived(j, encode_round(KIND_AVAIL, 0, 1)))
        for j in NB[: len(NB) // 2]:
            a.handle(MessageArrived(j, encode_round(KIND_VALUE, 0, 3, np.full(2, float(j)))))
        assert a.durable
        acts = b.restore(unpack(pack(a.checkpoint())))
        assert acts == [SetTimer("B0", a.opt.timeout / a.opt.ticks)]
        rest = [
            MessageArrived(j, encode_round(KIND_VALUE, 0, 3, np.full(2, float(j))))
            for j in NB[len(NB) // 2 :]
        ]
        rest.append(MessageArrived(NB[0], encode_round(KIND_AVAIL, 1, 1)))
        for ev in rest:
            ra, rb = a.handle(ev), b.handle(ev)
            assert [type(x) for x in ra] == [type(x) for x in rb]
        assert a.t == b.t == 1 and a.schedule == b.schedule
        assert np.array_equal(a.final_model()[0], b.final_model()[0])
        # the same generator state: the next noise drawn is the same
        assert a.ctx.rng.standard_normal() == b.ctx.rng.standard_normal()


def test_restored_machine_fast_forwards_to_its_neighbours_round():
    a, b = machines(rounds=10)[0], machines(rounds=10)[0]
    a.handle(RunStarted())
    b.restore(unpack(pack(a.checkpoint())))  # crashed in round 0, phase A
    acts = b.handle(
        MessageArrived(NB[0], encode_round(KIND_AVAIL, 4, 1))
    )  # the neighbours are in round 4
    assert b.t == 4 and b.phase == 0
    assert [r["round"] for r in b.schedule] == [0, 1, 2, 3]
    assert all(r["row"] == {} and r["self"] == 1.0 and r["sent_value"] == [] for r in b.schedule)
    sched = [a for a in acts if isinstance(a, LedgerEntry) and a.kind == "schedule"]
    assert [e.step for e in sched] == [0, 1, 2, 3]  # journaled like any round
    avail = [decode_round(x.payload, 2) for x in acts if isinstance(x, Send)]
    assert {k for k, r, _, _ in avail} == {KIND_AVAIL} and {r for _, r, _, _ in avail} == {4}
    assert any(isinstance(x, Deviation) and x.reason == "rejoined" for x in acts)
    assert not b.gone  # the skipped rounds' silence does not declare anybody gone
    assert NB[0] in b._heard  # the message that told it the round is used


def test_neighbour_declared_gone_is_readmitted_when_it_speaks_again():
    m = machines(rounds=12, give_up_after=2)[0]
    m.handle(RunStarted())
    dead, live = NB[0], NB[1:]
    while dead not in m.gone:  # the others take part in every round; `dead` stays silent
        t = m.t
        for j in live:
            m.handle(MessageArrived(j, encode_round(KIND_AVAIL, t, 1)))
        while m.phase == 0 and m.t == t:
            m.handle(TimerFired(f"A{t}"))
        for j in live:
            m.handle(MessageArrived(j, encode_round(KIND_VALUE, t, len(NB), np.ones(2))))
        while m.t == t:
            m.handle(TimerFired(f"{'AB'[m.phase]}{t}"))
    assert m.gone == {dead} and not m.finished
    acts = m.handle(
        MessageArrived(dead, encode_round(KIND_HEARTBEAT, 0, 0))
    )  # a stale heartbeat: it restarted
    assert not any(isinstance(a, Fault) for a in acts)
    assert not m.gone
    t = m.t
    acts = []
    for j in live:
        acts += m.handle(MessageArrived(j, encode_round(KIND_AVAIL, t, 1)))
    while m.phase == 0 and m.t == t:
        acts += m.handle(TimerFired(f"A{t}"))
    # the next round's announcement goes to it again
    assert any(isinstance(a, Send) and a.dst == dead and a.payload[0] == KIND_AVAIL for a in acts)
