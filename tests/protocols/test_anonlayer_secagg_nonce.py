"""Issue 11 finding 6: secure-sum masks must not repeat when the same signed spec runs again.

The pairwise seeds used to depend only on (run id, round, leader): a re-run of the same spec after a
restart (accepted runs are kept in memory only) derived the very same seeds — and a leader that
learned ``s_uv`` in one execution (v dropped) and ``b_u`` in the next (u survived) opens u's input.
Now the leader announces a fresh nonce that every seed is bound to, and a member with a (persistent)
nonce cache refuses a nonce it already masked under."""

import numpy as np
import pytest

from hushnet.crypto.keys import simulation_keypairs
from hushnet.crypto.masks import pairwise_seed
from hushnet.crypto.replay import ReplayCache
from hushnet.engine.actions import Fault, Send
from hushnet.engine.events import MessageArrived, RunStarted
from hushnet.families.secagg import wire as sa
from hushnet.families.secagg.machines import SecAggMachine, build_round
from hushnet.families.secagg.params import SecAggParams
from hushnet.sim.simulator import Simulator

M, DIM = 5, 8


def _execution(fresh_nonce: bool):
    """One execution of the same spec (same run id, round, leader, keys) from scratch, as after a restart."""
    vecs = {v: np.full(DIM, float(v)) for v in range(M)}
    p = SecAggParams(
        members=tuple(range(M)), leader=M, threshold=3, dim=DIM, fresh_nonce=fresh_nonce
    )
    ms, keys = build_round(vecs, p, M + 1, run_seed=7, run_id="same-signed-spec")
    res = Simulator(ms).run()
    assert res.finish.result["status"] == "released"
    assert np.abs(res.model - sum(vecs.values())).max() <= p.fixed_point.error_bound(M)
    m0 = ms[0]
    return m0.context, pairwise_seed(keys[0], keys[1].public, 0, 1, m0.context)


def test_without_the_nonce_a_rerun_repeats_the_pairwise_seeds():
    """The finding, reproduced on the old derivation (fresh_nonce=False): identical seeds across runs."""
    assert _execution(False) == _execution(False)


def test_rerun_of_the_same_spec_derives_fresh_pairwise_seeds():
    (ctx1, s1), (ctx2, s2) = _execution(True), _execution(True)
    assert ctx1 != ctx2 and s1 != s2
    assert len(ctx1) == len(ctx2) == len(b"same-signed-spec|") + 8 + 4 + 1 + sa.NONCE_LEN


def test_member_refuses_a_replayed_nonce_across_restarts():
    """A leader replaying its announcement (same nonce) to a member restarted with its persistent nonce
    cache: refused, nothing masked, nothing sent."""
    keys = simulation_keypairs(7, M + 1, "share")
    cache = ReplayCache(
        {0}
    )  # stands for the node's persistent cache (the same object after the restart)

    def machines():
        vecs = {v: np.ones(DIM) for v in range(M)}
        p = SecAggParams(members=tuple(range(M)), leader=M, threshold=3, dim=DIM)
        ms, _ = build_round(vecs, p, M + 1, run_seed=7, run_id="r", keys=keys)
        ms[0].nonce_cache = cache
        return ms

    ms = machines()
    ann = next(a for a in ms[M].handle(RunStarted()) if isinstance(a, Send) and a.dst == 0).payload
    assert ann[0] == sa.ANNOUNCE
    first = ms[0].handle(MessageArrived(M, ann))
    assert [a.payload[0] for a in first if isinstance(a, Send)] == [sa.MASKED]
    again = machines()[0].handle(MessageArrived(M, ann))  # restarted member, same cache
    assert [a.error.code for a in again if isinstance(a, Fault)] == ["replay"]
    assert not [a for a in again if isinstance(a, Send)]
    fresh = machines()
    ann2 = next(
        a for a in fresh[M].handle(RunStarted()) if isinstance(a, Send) and a.dst == 0
    ).payload
    assert ann2 != ann and [
        a.payload[0] for a in fresh[0].handle(MessageArrived(M, ann2)) if isinstance(a, Send)
    ] == [sa.MASKED]


def test_announcement_is_refused_twice_and_malformed():
    vecs = {v: np.ones(DIM) for v in range(M)}
    ms, _ = build_round(
        vecs,
        SecAggParams(members=tuple(range(M)), leader=M, threshold=3, dim=DIM),
        M + 1,
        run_seed=1,
    )
    ann = next(a for a in ms[M].handle(RunStarted()) if isinstance(a, Send) and a.dst == 1).payload
    assert [
        a.error.code for a in ms[1].handle(MessageArrived(M, ann[:-1])) if isinstance(a, Fault)
    ] == ["malformed"]
    assert [a.payload[0] for a in ms[1].handle(MessageArrived(M, ann)) if isinstance(a, Send)] == [
        sa.MASKED
    ]
    assert [a.error.code for a in ms[1].handle(MessageArrived(M, ann)) if isinstance(a, Fault)] == [
        "replay"
    ]
    assert [a.error.code for a in ms[2].handle(MessageArrived(3, ann)) if isinstance(a, Fault)] == [
        "unexpected-sender"
    ]


def _preset(nonce: bytes, cache, leader_member: bool):
    """One execution whose nonce was announced ahead (``nonce=``), member 0 (and the leader, when it is a
    member) with the given cache."""
    keys = simulation_keypairs(7, M + 1, "share")
    members = tuple(range(M + 1)) if leader_member else tuple(range(M))
    vecs = {v: np.ones(DIM) for v in members}
    p = SecAggParams(members=members, leader=M, threshold=3, dim=DIM)
    ms, _ = build_round(vecs, p, M + 1, run_seed=7, run_id="r", keys=keys)
    out = []
    for v, m in enumerate(ms):
        m.preset_nonce = nonce  # as built with nonce= (build_round has no such argument)
        if v in (0, M):
            m.nonce_cache = cache
        out.append(m)
    return out


def test_a_nonce_announced_ahead_skips_the_announcement_and_is_checked_like_one():
    """secagg-dpsgd hands round r+1's nonce out with round r's outcome: no ANNOUNCE, members mask at start
    under it, and a member (the leader's own member part too) refuses it the second time."""
    nonce = bytes(range(sa.NONCE_LEN))
    cache = ReplayCache({0})
    ms = _preset(nonce, cache, leader_member=True)
    res = Simulator(ms).run()
    assert res.finish.result["status"] == "released"
    assert all(m.context.endswith(b"|" + nonce) for m in ms)
    again = _preset(nonce, cache, leader_member=True)  # restarted members, same persistent cache
    first = again[0].handle(RunStarted())
    assert [a.error.code for a in first if isinstance(a, Fault)] == ["replay"]
    assert not [a for a in first if isinstance(a, Send)]
    lead = again[M].handle(
        RunStarted()
    )  # the leader collects under the nonce but does not mask twice
    assert [a.error.code for a in lead if isinstance(a, Fault)] == ["replay"]
    assert [type(a).__name__ for a in lead if not isinstance(a, Fault)] == ["SetTimer"]
    assert again[M].context.endswith(b"|" + nonce) and again[M].phase == "idle"
    # an ANNOUNCE for a round whose nonce came ahead is refused
    m1 = _preset(bytes(sa.NONCE_LEN), None, leader_member=False)[1]
    m1.handle(RunStarted())
    got = m1.handle(MessageArrived(M, bytes([sa.ANNOUNCE]) + bytes(sa.NONCE_LEN)))
    assert [a.error.code for a in got if isinstance(a, Fault)] == ["replay"]


def test_a_nonce_announced_ahead_must_be_a_fresh_nonce_of_the_right_length():
    from hushnet.crypto.signing import signer_directory, simulation_signers
    from hushnet.engine.protocol import NodeContext
    from hushnet.engine.rng import node_generators

    keys = simulation_keypairs(7, M + 1, "share")
    sig = simulation_signers(7, M + 1)
    from hushnet.crypto.keys import simulation_directory

    ctx = NodeContext(0, M + 1, "r", node_generators(7, M + 1)[0])
    for p, nonce in [
        (SecAggParams(members=tuple(range(M)), leader=M, threshold=3, dim=DIM), b"short"),
        (
            SecAggParams(
                members=tuple(range(M)), leader=M, threshold=3, dim=DIM, fresh_nonce=False
            ),
            bytes(sa.NONCE_LEN),
        ),
    ]:
        with pytest.raises(ValueError, match="pre-announced round nonce"):
            SecAggMachine(
                ctx,
                p,
                np.ones(DIM),
                keys[0],
                simulation_directory(keys),
                sig[0],
                signer_directory(sig),
                nonce=nonce,
            )
