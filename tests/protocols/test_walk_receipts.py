"""Walk handoffs acknowledged by the transport's receipt (``WalkOptions.link_receipts``).

A networked RW DP-SGD hop was two RPCs: the token's ``Deliver`` and a separate ack message back.
The node's ``Deliver`` answers only after the receiving driver ran its machine on the token (and, in
a durable run, wrote its checkpoint), so that answer is the ack: the driver feeds it back as
``Delivered``.  What must not change: a missing receipt is retried with the same receipt, then
paused or deviated; a duplicate token is answered without side effect; a checkpoint restores and
re-sends the pending handoff; and the walk — models, ledger entries — is bit for bit the one with
ack messages, with half the messages.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from hushnet.engine.actions import (
    CancelTimer,
    Deviation,
    Fault,
    Finish,
    LedgerEntry,
    Metric,
    Paused,
    Send,
)
from hushnet.engine.errors import ReplayedMessage
from hushnet.engine.events import Delivered, MessageArrived, RunStarted, TimerFired
from hushnet.families.walk import FAMILY
from hushnet.families.walk.walker import WalkOptions
from hushnet.families.walk.wire import KIND_ACK, KIND_TOKEN, own_token
from hushnet.protocols.registry import make_machine, transition_matrix
from hushnet.runs.spec import Budget, RunSpec
from hushnet.runs.synthetic import ZeroGradientTask

N, GRAPH, SIZE, STEPS = 4, "hypercube:2", 50, 300
HANDOFF = "handoff"


def spec(on_peer_down: str = "pause") -> RunSpec:
    return RunSpec(
        protocol="rw-dpsgd",
        task="hushnet.runs.synthetic:ZeroGradientTask",
        graph=GRAPH,
        steps=STEPS,
        seed=5,
        budget=Budget(1e9, 1e-5),
        sigma=1.0,
        step_size=0.01,
        task_params={"size": SIZE},
        on_peer_down=on_peer_down,
    ).with_run_id()


def machines(s: RunSpec, receipts: bool, on_peer_down: str = "pause") -> list:
    opt = WalkOptions(ack_timeout=2.0, on_peer_down=on_peer_down, link_receipts=receipts)
    return [
        make_machine(
            s.protocol,
            v,
            N,
            ZeroGradientTask(size=SIZE),
            run_seed=s.seed,
            run_id=s.run_id,
            params=s.machine_params(),
            W=transition_matrix(s.graph, s.weights),
            view_model=s.view_model,
            options=opt,
        )
        for v in range(N)
    ]


def sends(acts: list) -> list[Send]:
    return [a for a in acts if isinstance(a, Send)]


def first_handoff(ms: list) -> Send:
    (tok,) = sends(ms[0].handle(RunStarted()))
    return tok


def test_delivered_is_the_ack_and_no_ack_message_is_sent():
    ms = machines(spec(), receipts=True)
    tok = first_handoff(ms)
    step = own_token(tok.payload)[0]
    assert tok.payload[0] == KIND_TOKEN and tok.receipt == str(step)  # named by the step
    out = ms[tok.dst].handle(MessageArrived(0, tok.payload))
    assert not [a for a in out if isinstance(a, Fault)]
    # the receiver sends the token on (or finishes), never an ack message back
    assert all(s.payload[0] == KIND_TOKEN for s in sends(out))
    assert ms[0].whereabouts()["pending_to"] == tok.dst
    # a receipt from another neighbour, for another step, or not a step at all: nothing
    other = next(v for v in range(1, N) if v != tok.dst)
    assert ms[0].handle(Delivered(other, tok.receipt)) == []
    assert ms[0].handle(Delivered(tok.dst, str(step + 1))) == []
    assert ms[0].handle(Delivered(tok.dst, "onion-key")) == []
    assert ms[0].handle(Delivered(tok.dst, tok.receipt)) == [CancelTimer(HANDOFF)]
    w = ms[0].whereabouts()  # the copy moved: the resume point is the acknowledged handoff
    assert "pending_to" not in w and (w["passed_to"], w["passed_step"]) == (tok.dst, step)
    assert ms[0].handle(TimerFired(HANDOFF)) == []  # acknowledged: no retransmission
    assert ms[0].handle(Delivered(tok.dst, tok.receipt)) == []  # a second receipt: harmless


def test_missing_receipt_is_retried_with_the_same_receipt_then_paused_and_resumed():
    ms = machines(spec(), receipts=True)
    tok = first_handoff(ms)
    opt = ms[0].opt
    paused = []
    for _ in range(opt.max_retries + 1):
        acts = ms[0].handle(TimerFired(HANDOFF))
        (again,) = sends(acts)
        assert (again.dst, again.payload, again.receipt) == (tok.dst, tok.payload, tok.receipt)
        paused += [a for a in acts if isinstance(a, Paused)]
    assert len(paused) == 1 and ms[0].checkpoint()["paused"]
    acts = ms[0].handle(Delivered(tok.dst, tok.receipt))
    assert acts[0] == CancelTimer(HANDOFF)
    assert [a.name for a in acts if isinstance(a, Metric)] == ["resumed"]
    assert not ms[0].checkpoint()["paused"]


def test_missing_receipt_deviates_and_a_late_receipt_from_the_dead_neighbour_does_nothing():
    s = spec("deviate")
    ms = machines(s, receipts=True, on_peer_down="deviate")
    tok = first_handoff(ms)
    for _ in range(ms[0].opt.max_retries):
        ms[0].handle(TimerFired(HANDOFF))
    acts = ms[0].handle(TimerFired(HANDOFF))
    (dev,) = [a for a in acts if isinstance(a, Deviation)]
    assert dev.detail["dead"] == tok.dst
    (new,) = sends(acts)  # to another neighbour (after updates of its own, if it drew a self-loop)
    assert new.dst != tok.dst and new.receipt == str(own_token(new.payload)[0])
    assert ms[0].handle(Delivered(tok.dst, tok.receipt)) == []  # the old holder answered late
    assert ms[0].whereabouts()["pending_to"] == new.dst
    assert ms[0].handle(Delivered(new.dst, new.receipt)) == [CancelTimer(HANDOFF)]


def test_duplicate_token_is_answered_with_no_side_effect():
    ms = machines(spec(), receipts=True)
    tok = first_handoff(ms)
    rx = ms[tok.dst]
    first = rx.handle(MessageArrived(0, tok.payload))
    assert any(isinstance(a, LedgerEntry) for a in first)
    before = (rx.visits, rx.contributions, rx.last_step, rx.ctx.rng.bit_generator.state)
    # the sender's retransmission (its receipt was lost): accepted again, nothing happens
    assert rx.handle(MessageArrived(0, tok.payload)) == []
    assert (rx.visits, rx.contributions, rx.last_step, rx.ctx.rng.bit_generator.state) == before
    # the same step with other contents is still a replay: refused (Deliver fails, no receipt)
    forged = tok.payload[:-8] + np.float64(1.0).tobytes()
    (fault,) = rx.handle(MessageArrived(0, forged))
    assert isinstance(fault, Fault) and isinstance(fault.error, ReplayedMessage)


def test_ack_messages_unchanged_without_link_receipts():
    ms = machines(spec(), receipts=False)
    tok = first_handoff(ms)
    assert tok.receipt == ""
    out = ms[tok.dst].handle(MessageArrived(0, tok.payload))
    assert sends(out)[0].dst == 0 and sends(out)[0].payload[0] == KIND_ACK
    assert ms[tok.dst].handle(MessageArrived(0, tok.payload))[0].payload[0] == KIND_ACK
    # a receipt means nothing to a machine whose driver was not told to give them
    assert ms[0].handle(Delivered(tok.dst, str(own_token(tok.payload)[0]))) == []
    assert "pending_to" in ms[0].whereabouts()


def test_restored_machine_resends_its_pending_handoff_with_its_receipt():
    s = spec()
    ms = machines(s, receipts=True)
    tok = first_handoff(ms)
    state = ms[0].checkpoint()
    fresh = machines(s, receipts=True)[0]
    again = fresh.restore(state)
    assert again[0] == Send(tok.dst, tok.payload, tok.receipt)
    assert fresh.handle(Delivered(tok.dst, tok.receipt)) == [CancelTimer(HANDOFF)]


def walk(receipts: bool, lose_every: int = 0) -> tuple[np.ndarray, list[list], int]:
    """The whole walk in process over a transport that gives receipts (``receipts``) or carries ack
    messages.  ``lose_every``: every that many deliveries the answer is lost (the receiver processed
    the token, the sender hears nothing and its handoff timer fires before anything else happens)."""
    ms = machines(spec(), receipts)
    ledger: list[list] = [[] for _ in range(N)]
    final: list[np.ndarray] = []
    queue: deque[tuple[int, Send]] = deque()
    delivered = 0

    def run(v: int, acts: list) -> None:
        for a in acts:
            if isinstance(a, LedgerEntry):
                ledger[v].append((a.step, a.kind, a.noise_std))
            elif isinstance(a, Finish):
                final.append(np.asarray(a.model))
            elif isinstance(a, Send):
                queue.append((v, a))
            assert not isinstance(a, Fault), a

    for v in range(N):
        run(v, ms[v].handle(RunStarted()))
    messages = 0
    while queue:
        src, a = queue.popleft()
        messages += 1
        run(a.dst, ms[a.dst].handle(MessageArrived(src, a.payload)))
        delivered += 1
        if not a.receipt:
            continue
        if lose_every and delivered % lose_every == 0:
            run(src, ms[src].handle(TimerFired(HANDOFF)))  # the answer is lost: retransmit
        else:
            run(src, ms[src].handle(Delivered(a.dst, a.receipt)))
    assert len(final) == 1 and all(m._pending is None for m in ms)
    return final[0], ledger, messages


@pytest.mark.parametrize("lose_every", [0, 7])
def test_walk_with_receipts_is_the_walk_with_ack_messages(lose_every):
    ref, ref_ledger, ref_messages = walk(receipts=False)
    got, got_ledger, messages = walk(receipts=True, lose_every=lose_every)
    assert np.array_equal(ref.view(np.uint64), got.view(np.uint64))
    assert got_ledger == ref_ledger and sum(map(len, got_ledger)) == STEPS
    hops = ref_messages // 2  # every hop was a token and its ack
    retransmitted = (
        messages - hops
    )  # a lost answer costs one retransmission, answered by its receipt
    assert ref_messages % 2 == 0
    assert retransmitted == 0 if not lose_every else 0 < retransmitted <= hops


def test_networked_walk_machines_use_receipts_and_simulated_ones_do_not():
    s = spec()
    from hushnet.runs.service import network_walk_options

    opt = network_walk_options(s)
    assert not opt.link_receipts  # other families' walks (P-AD) keep their ack messages
    m = FAMILY.node_machine(
        None,
        s,
        1,
        [f"n{v}" for v in range(N)],
        ZeroGradientTask(size=SIZE),
        transition_matrix(s.graph, s.weights),
        opt,
    )
    assert m.opt.link_receipts and m.opt.prefetch_noise
    assert not machines(s, receipts=False)[0].opt.link_receipts
