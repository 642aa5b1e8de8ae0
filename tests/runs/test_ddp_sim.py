"""secagg-dpsgd in the simulator: the update rule against an independent re-implementation, dropouts handled
by the secure sum (before and after a member's masked input left), aborts below the threshold, ledgers, and
bad input."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.ddp import reference_model, shards, tasks_of

from hushnet.crypto.masks import FixedPoint
from hushnet.engine.actions import Fault
from hushnet.families.secagg.wire import OUTCOME, ROUND
from hushnet.privacy.secure_sum import share_std
from hushnet.protocols.registry import build_machines
from hushnet.sim import Simulator

N, SEED, ROUNDS, STEP, SIGMA, T, C = 8, 11, 4, 0.3, 1.2, 6, 2


def _machines(tasks, **kw):
    params = dict(
        rounds=ROUNDS, step_size=STEP, sigma=SIGMA, threshold=T, collusion=C, round_timeout=0.05
    )
    params.update(kw)
    return build_machines("secagg-dpsgd", tasks, run_seed=SEED, params=params)


def _bound(rounds: int) -> float:
    # fixed point: ≤ 2n·2^-(f+1) per entry of each round's sum (data and noise rounded apart), times η/|U|
    return rounds * STEP * FixedPoint().error_bound(2 * N) + 1e-12


def test_update_rule_matches_an_independent_reimplementation() -> None:
    tasks = tasks_of(shards(N))
    res = Simulator(_machines(tasks)).run()
    assert res.status == "finished" and not res.faults
    s = share_std(SIGMA, tasks[0].sensitivity(), T, C, dim=tasks[0].dim, frac_bits=24)
    ref = reference_model(tasks, SEED, ROUNDS, STEP, s, [list(range(N))] * ROUNDS)
    assert np.max(np.abs(res.model - ref)) <= _bound(ROUNDS)
    assert res.finish.result["survivors"] == [N] * ROUNDS
    # every node charged its own ledger once per round, with the share it really added and the certified σ
    for v in range(N):
        led = res.ledgers[v]
        assert [e.step for e in led] == list(range(ROUNDS)) and all(e.node == v for e in led)
        assert all(
            e.noise_std == pytest.approx(s)
            and e.sigma == pytest.approx(SIGMA)
            and e.view_model == "aggregate"
            and e.detail["collusion"] == C
            for e in led
        )
    # the leaders' release records are metrics, one per contributor and round
    assert sum(1 for m in res.metrics if m.name == "ddp-release") == N * ROUNDS


def test_every_node_applies_the_same_updates() -> None:
    tasks = tasks_of(shards(N))
    ms = _machines(tasks)
    sim = Simulator(ms)
    res = sim.run()
    assert res.status == "finished"
    # nodes still finishing the last round hold the model of the round before it; all earlier rounds agree
    xs = [m.x for m in ms if m.finished]
    assert len(xs) >= 1 and all(np.array_equal(x, xs[0]) for x in xs)


def test_dropouts_before_and_after_the_masked_input_left() -> None:
    """Node 5 sends its masked input of round 0 and dies before the unmask request (its self-mask is rebuilt
    from the others' shares: its input is in the sum); rounds 1–3 it is gone (its pairwise masks with the
    survivors are removed).  Leaders are 0..3: the run finishes, every released sum is exact."""
    tasks = tasks_of(shards(N))
    sim = Simulator(_machines(tasks))
    sim.kill(
        5, at=0.0015
    )  # masked input out at t = 0 (arrives at 0.001); the unmask request comes at ≈ 0.002
    res = sim.run()
    assert res.status == "finished", res.status
    assert res.finish.result["survivors"] == [8, 7, 7, 7]
    s = share_std(SIGMA, tasks[0].sensitivity(), T, C, dim=tasks[0].dim, frac_bits=24)
    alive = [v for v in range(N) if v != 5]
    ref = reference_model(tasks, SEED, ROUNDS, STEP, s, [list(range(N))] + [alive] * 3)
    assert np.max(np.abs(res.model - ref)) <= _bound(ROUNDS)
    assert [e.step for e in res.ledgers[5]] == [0]  # charged for the one input that left


def test_below_threshold_nothing_is_released_and_the_model_stays() -> None:
    tasks = tasks_of(shards(N))
    sim = Simulator(_machines(tasks, threshold=8, collusion=1))
    sim.kill(5, at=0.0)  # not a leader of rounds 0..3
    res = sim.run()
    assert res.status == "finished"
    assert res.finish.result["released"] == 0 and res.finish.result["aborted"] == ROUNDS
    assert np.array_equal(res.model, np.zeros(tasks[0].dim))
    # the inputs left, so the members' charges stand (conservative; nothing was released)
    assert all(len(res.ledgers[v]) == ROUNDS for v in range(N) if v != 5) and 5 not in res.ledgers


def test_sampled_members_and_plain_aggregation() -> None:
    from hushnet.families.secagg.dpsgd import round_members

    tasks = tasks_of(shards(N))
    res = Simulator(_machines(tasks, sample=6, threshold=5, collusion=2)).run()
    assert res.status == "finished" and res.finish.result["survivors"] == [6] * ROUNDS
    mem = [round_members(N, 6, SEED, r) for r in range(ROUNDS)]
    s = share_std(SIGMA, tasks[0].sensitivity(), 5, 2, dim=tasks[0].dim, frac_bits=24)
    ref = reference_model(tasks, SEED, ROUNDS, STEP, s, mem)
    assert np.max(np.abs(res.model - ref)) <= _bound(ROUNDS)
    for v in range(N):
        assert [e.step for e in res.ledgers.get(v, [])] == [r for r in range(ROUNDS) if v in mem[r]]
    plain = Simulator(_machines(tasks, aggregation="plain")).run()
    ref = reference_model(
        tasks,
        SEED,
        ROUNDS,
        STEP,
        share_std(
            SIGMA, tasks[0].sensitivity(), T, C, dim=tasks[0].dim, frac_bits=None
        ),  # float shares
        [list(range(N))] * ROUNDS,
    )
    assert plain.status == "finished" and np.max(np.abs(plain.model - ref)) <= 1e-12
    assert all(e.view_model == "plain" for e in plain.ledgers[0])


def test_a_dead_leader_ends_the_run_explained() -> None:
    """The secure sum handles member dropouts, not a dead leader: once its round's ``leader_timeout``
    (default 10 round timeouts, at least 30 s) has passed, every node ends the run ``leader-lost`` naming it, without
    a model; its rounds as a member were dropouts.  Its round's nonce came with round 1's outcome (no
    announcement trip), so every member's masked input of round 2 left toward the dead leader: charged
    (conservatively: nothing of round 2 was released), and nothing after it."""
    tasks = tasks_of(shards(N))
    sim = Simulator(_machines(tasks))
    sim.kill(2, at=0.0)
    res = sim.run()
    assert res.status == "finished" and res.finish.model is None
    out = res.finish.result
    assert out["ended"] == "leader-lost" and (out["lost_leader"], out["lost_round"]) == (2, 2)
    assert out["released"] == 2 and out["survivors"] == [N - 1, N - 1]
    assert all([e.step for e in res.ledgers[v]] == [0, 1, 2] for v in range(N) if v != 2)


def test_bad_input_is_a_typed_fault_and_changes_nothing() -> None:
    import struct

    tasks = tasks_of(shards(N))
    ms = _machines(tasks)
    sim = Simulator(ms)
    from hushnet.engine.events import RunStarted

    ms[2].handle(RunStarted())
    x0 = ms[2].x.copy()
    outcome = (
        struct.pack(">BI", OUTCOME, 0)
        + struct.pack(">BII", 1, N, tasks[0].dim)
        + bytes(8 * tasks[0].dim)
    )
    for src, payload, what in [
        (4, outcome, "leader is 0"),
        (0, b"\x70", "shorter than its header"),
        (0, struct.pack(">BI", 0x55, 0), "unknown"),
        (0, struct.pack(">BI", ROUND, 99), "the run has"),
        (0, outcome[:-8], "payload bytes"),
        (0, struct.pack(">BI", OUTCOME, 3), "leader is 3"),
    ]:
        acts = sim.deliver(2, src, payload)
        assert len(acts) == 1 and isinstance(acts[0], Fault) and what in str(acts[0].error), (
            what,
            acts,
        )
    assert np.array_equal(ms[2].x, x0) and ms[2].round == 0


def test_collusion_at_the_tolerance_is_refused_at_build() -> None:
    tasks = tasks_of(shards(N))
    with pytest.raises(ValueError, match="collusion tolerance"):
        _machines(tasks, threshold=6, collusion=5)
    with pytest.raises(ValueError, match="unknown secagg-dpsgd parameter"):
        _machines(tasks, colusion=2)


def _record_sends(ms) -> list[tuple[int, int, int, bytes]]:
    """(sender, receiver, round, payload) of every Send the machines emit (their ``handle`` wrapped)."""
    import struct

    from hushnet.engine.actions import Send

    log: list[tuple[int, int, int, bytes]] = []
    for m in ms:
        inner = m.handle

        def handle(ev, _inner=inner, _v=m.ctx.node):
            acts = _inner(ev)
            for a in acts:
                if isinstance(a, Send):
                    log.append((_v, a.dst, struct.unpack_from(">BI", a.payload)[1], a.payload))
            return acts

        m.handle = handle
    return log


def test_later_rounds_take_their_nonce_from_the_previous_outcome() -> None:
    """Round 0's leader announces its nonce (ANNOUNCE); every later round's nonce rides on the previous
    round's outcome, drawn by that round's leader: no ANNOUNCE trip, the same context at every node, fresh
    per round and per execution of the same spec."""
    from hushnet.families.secagg import wire as sa

    def run():
        tasks = tasks_of(shards(N))
        ms = _machines(tasks)
        log = _record_sends(ms)
        contexts: dict[int, set[bytes]] = {}
        for m in ms:  # the context each node's secure sum of each round ran under
            begin = m._begin

            def spy(r, _m=m, _begin=begin):
                acts = _begin(r)
                if _m.inner is not None:
                    contexts.setdefault(r, set()).add(_m.inner.context)
                return acts

            m._begin = spy
        res = Simulator(ms).run()
        assert res.status == "finished" and res.finish.result["released"] == ROUNDS
        return log, contexts

    log, ctx = run()
    announces = {
        r: sum(1 for _, _, rr, p in log if rr == r and p[0] == ROUND and p[5] == sa.ANNOUNCE)
        for r in range(ROUNDS)
    }
    assert announces == {0: N - 1, **{r: 0 for r in range(1, ROUNDS)}}
    for r in range(1, ROUNDS):
        outs = {p[-sa.NONCE_LEN :] for s, _, rr, p in log if rr == r - 1 and p[0] == OUTCOME}
        assert len(outs) == 1 and all(
            s == r - 1 for s, _, rr, p in log if rr == r - 1 and p[0] == OUTCOME
        )
        assert len(ctx[r]) == 1  # every node (leader and members) under the same context
        assert next(iter(ctx[r])).endswith(b"|" + outs.pop())
    assert len({next(iter(ctx[r])) for r in range(ROUNDS)}) == ROUNDS
    _, again = run()  # the same spec run again: every round's context (hence every seed) is new
    assert all(again[r] != ctx[r] for r in range(ROUNDS))
    # the last round's outcome carries no nonce (there is no next round)
    last = [p for s, _, rr, p in log if rr == ROUNDS - 1 and p[0] == OUTCOME]
    dim = tasks_of(shards(N))[0].dim
    assert len(last) == N - 1 and all(len(p) == 5 + 9 + 8 * dim for p in last)


def test_an_outcome_with_another_nonce_makes_the_next_round_abort_not_leak() -> None:
    """Round 0's leader (or a forger) hands one member a different nonce for round 1: that member's seeds,
    share envelopes and signature are under another context, so round 1 aborts below the threshold — no
    release, no revealed share of anyone's seeds — and round 2 (fresh nonce from round 1's outcome) runs."""
    import struct

    from hushnet.families.secagg import wire as sa

    tasks = tasks_of(shards(N))
    ms = _machines(tasks, threshold=N - 1, collusion=1)
    victim = ms[5]
    inner = victim.handle

    def handle(ev, _inner=inner):
        from hushnet.engine.events import MessageArrived

        if isinstance(ev, MessageArrived) and ev.payload[0] == OUTCOME:
            if struct.unpack_from(">BI", ev.payload)[1] == 0:
                ev = MessageArrived(ev.src, ev.payload[: -sa.NONCE_LEN] + bytes(sa.NONCE_LEN))
        return _inner(ev)

    victim.handle = handle
    log = _record_sends(ms)
    res = Simulator(ms).run()
    assert res.status == "finished"
    assert res.finish.result["aborted"] == 1 and res.finish.result["released"] == ROUNDS - 1
    # nobody revealed shares in round 1: the unmask answers need the survivor set signed under one context
    unmask = [p for s, _, rr, p in log if rr == 1 and p[0] == ROUND and p[5] == sa.UNMASK]
    assert not unmask
    # the victim's signature fails at the leader, its share envelopes at every other member
    errs = {str(f.error) for f in res.faults}
    assert "signature of node 5 does not verify" in errs and any("does not open" in e for e in errs)
