"""Bad round messages are refused with a typed error before any state change; nothing hangs."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from helpers.gossip import gossip_matrix, value_tasks

from hushnet.engine.actions import Fault, LedgerEntry, Send, SetTimer
from hushnet.engine.errors import (
    MalformedMessage,
    ReplayedMessage,
    UnexpectedSender,
    WrongDimension,
)
from hushnet.engine.events import MessageArrived, RunStarted, TimerFired
from hushnet.families.gossip.build import build_gossip_machines
from hushnet.families.gossip.machines import FutureRound, StaleRound
from hushnet.families.gossip.wire import (
    KIND_AVAIL,
    KIND_HEARTBEAT,
    KIND_SKIP,
    KIND_VALUE,
    encode_round,
)

W = gossip_matrix("er:12:0.4:3")
NB = sorted(int(j) for j in sp.csr_matrix(W)[0].indices if j != 0)
NON = next(j for j in range(1, 12) if j not in NB)


def fresh():
    tasks, _ = value_tasks(12)
    ms = build_gossip_machines(
        "muffliato", tasks, run_seed=5, params=dict(rounds=6, sigma=1.0), W=W
    )
    m = ms[0]
    acts = m.handle(RunStarted())
    return m, acts


def snapshot(m):
    return (
        m.t,
        m.phase,
        dict(m._heard),
        {k: v[0] for k, v in m._replies.items()},
        sorted(m._buf),
        sorted(m._seen),
        None if m.x is None else m.x.copy(),
    )


def assert_refused(m, src, payload, err):
    before = snapshot(m)
    acts = m.handle(MessageArrived(src, payload))
    assert len(acts) == 1 and isinstance(acts[0], Fault) and isinstance(acts[0].error, err), acts
    after = snapshot(m)
    assert before[:6] == after[:6] and np.array_equal(before[6], after[6])
    return acts[0].error


def test_start_announces_and_arms_a_timer():
    m, acts = fresh()
    sends = [a for a in acts if isinstance(a, Send)]
    assert sorted(a.dst for a in sends) == NB and all(a.payload[0] == KIND_AVAIL for a in sends)
    assert any(isinstance(a, SetTimer) for a in acts)
    assert sum(isinstance(a, LedgerEntry) and a.kind == "value" for a in acts) == 1


def test_non_neighbour_refused():
    m, _ = fresh()
    e = assert_refused(m, NON, encode_round(KIND_AVAIL, 0, 1), UnexpectedSender)
    assert "not a neighbour" in str(e)


def test_wrong_dimension_and_malformed_refused():
    m, _ = fresh()
    assert_refused(m, NB[0], encode_round(KIND_VALUE, 0, 2, np.zeros(5)), WrongDimension)
    assert_refused(m, NB[0], b"\x11\x00", MalformedMessage)
    assert_refused(m, NB[0], bytes([99]) + bytes(16), MalformedMessage)
    assert_refused(
        m, NB[0], encode_round(KIND_VALUE, 0, 2, np.array([np.nan, 0.0])), MalformedMessage
    )
    assert_refused(m, NB[0], encode_round(KIND_VALUE, 0, 2, np.zeros(2))[:-3], MalformedMessage)
    assert_refused(m, NB[0], encode_round(KIND_AVAIL, 0, 7), MalformedMessage)
    assert_refused(
        m, NB[0], encode_round(KIND_AVAIL, 6, 1), MalformedMessage
    )  # round outside the run


def test_far_future_refused_near_future_buffered():
    m, _ = fresh()
    assert_refused(m, NB[0], encode_round(KIND_AVAIL, 5, 1), FutureRound)
    assert m.handle(MessageArrived(NB[0], encode_round(KIND_AVAIL, 1, 1))) == []
    assert (1, 0, NB[0]) in m._buf


def test_replay_refused_and_past_round_refused():
    m, _ = fresh()
    msg = encode_round(KIND_AVAIL, 0, 1)
    assert m.handle(MessageArrived(NB[0], msg)) == []
    e = assert_refused(m, NB[0], msg, ReplayedMessage)
    assert "duplicate" in str(e)
    assert "conflicting" in str(
        assert_refused(m, NB[0], encode_round(KIND_AVAIL, 0, 0), ReplayedMessage)
    )
    # close round 0: everybody available, then everybody's value
    for j in NB[1:]:
        m.handle(MessageArrived(j, encode_round(KIND_AVAIL, 0, 1)))
    assert m.phase == 1
    for j in NB:
        m.handle(MessageArrived(j, encode_round(KIND_VALUE, 0, len(NB), np.ones(2))))
    assert m.t == 1 and m.phase == 0
    assert_refused(m, NB[0], encode_round(KIND_SKIP, 0, 0), (StaleRound, ReplayedMessage))
    late = [j for j in NB][0]
    # a past round's message never changes the state and is never used
    assert_refused(
        m, late, encode_round(KIND_VALUE, 0, 3, np.full(2, 100.0)), (StaleRound, ReplayedMessage)
    )


def test_heartbeats_keep_a_slow_neighbour_alive_and_silence_drops_it():
    """Waiting for a round-0 value: a neighbour still in phase A (stage 0) is slow, not gone; one that
    says it is past that stage (its value was lost or refused) stops counting as alive — no livelock."""
    m, _ = fresh()
    for j in NB:
        m.handle(MessageArrived(j, encode_round(KIND_AVAIL, 0, 1)))
    assert m.phase == 1
    slow, rest = NB[0], NB[1:]
    for j in rest:
        m.handle(MessageArrived(j, encode_round(KIND_VALUE, 0, len(NB), np.ones(2))))
    ticks = m.opt.ticks
    for _ in range(3 * ticks):
        m.handle(
            MessageArrived(slow, encode_round(KIND_HEARTBEAT, 0, 0))
        )  # stage 0: still in phase A
        acts = m.handle(TimerFired("B0"))
        assert m.phase == 1 and m.t == 0
        assert any(isinstance(a, Send) and a.payload[0] == KIND_HEARTBEAT for a in acts)
    for _ in range(
        ticks
    ):  # now it claims stage 1 (value already sent): silence counts, the round closes
        m.handle(MessageArrived(slow, encode_round(KIND_HEARTBEAT, 0, 1)))
        m.handle(TimerFired("B0"))
    assert m.t == 1
    assert slow not in m.schedule[0]["row"] and slow in m.schedule[0]["missing"]


def test_a_node_whose_neighbours_never_answer_still_finishes():
    """All neighbours silent: each phase ends after the silence timeout, the node keeps its value."""
    m, _ = fresh()
    x0 = m.x.copy()
    for _ in range(1000):
        name = f"{'AB'[m.phase]}{m.t}"
        m.handle(TimerFired(name))
        if m.finished:
            break
    assert m.finished and np.array_equal(m.x, x0)
    assert m.gone == set(NB)  # declared gone after give_up_after rounds
    rows = [e for e in m.schedule]
    assert len(rows) == 6 and all(r["row"] == {} and r["self"] == 1.0 for r in rows)
    # messages from a neighbour declared gone are refused, not used
    assert isinstance(m.handle(MessageArrived(NB[0], encode_round(KIND_AVAIL, 5, 1)))[0], Fault)


def test_randomized_bad_input():
    from hushnet.families.gossip.randomized import RandomizedMuffliato

    tasks, _ = value_tasks(12)
    ms = build_gossip_machines(
        "muffliato-randomized",
        tasks,
        run_seed=5,
        params=dict(rounds=100, sigma=1.0, schedule_seed=1),
        W=W,
    )
    m = ms[0]
    assert isinstance(m, RandomizedMuffliato)
    m.handle(RunStarted())
    t0, p0 = m.acts[0]
    other = next(t for t, (a, b) in enumerate(m.sched) if 0 not in (a, b) and a >= 0)
    a, b = m.sched[other]
    r = m.handle(MessageArrived(int(a), encode_round(KIND_VALUE, other, 1, np.zeros(2))))
    assert isinstance(r[0], Fault) and isinstance(r[0].error, UnexpectedSender)
    r = m.handle(MessageArrived(p0, encode_round(KIND_VALUE, t0, 1, np.zeros(3))))
    assert isinstance(r[0].error, WrongDimension)
    good = encode_round(KIND_VALUE, t0, 1, np.ones(2))
    m.handle(MessageArrived(p0, good))
    r = m.handle(MessageArrived(p0, good))
    assert isinstance(r[0].error, (ReplayedMessage, StaleRound))
