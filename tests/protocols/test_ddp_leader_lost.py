"""A ``secagg-dpsgd`` node that never comes back (issue 14), sans IO: the run ends explained, not stalled.

:func:`helpers.crash.run_with_crash` kills one node and never restarts it.  The rounds it is only a
member of go on (it is a dropout); at the first round it leads, every other node waits
``leader_timeout`` for the outcome, then ends the run ``leader-lost`` naming it: no model (no
intermediate model is ever released), nothing of that round applied, every input that left stays
charged, and every other node is told (``LOST``) so that none waits for a leader that has ended.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from helpers.crash import run_with_crash
from helpers.ddp import shards

from hushnet.engine.actions import Fault, Finish, Send
from hushnet.engine.errors import UnexpectedSender
from hushnet.engine.events import MessageArrived, RunStarted
from hushnet.families.secagg.dpsgd import LEADER_LOST, round_leader
from hushnet.families.secagg.wire import LOST, SYNC
from hushnet.protocols.registry import build_from_spec
from hushnet.runs.spec import Budget, RunSpec
from hushnet.tasks import LogisticRegressionTask

N, ROUNDS, T = 5, 12, 4


def _spec(**extra) -> RunSpec:
    return RunSpec(
        protocol="secagg-dpsgd",
        task="logreg",
        graph=f"complete:{N}",
        steps=ROUNDS,
        seed=17,
        budget=Budget(1e6, 1e-5),
        sigma=1.5,
        clip=0.5,
        step_size=0.5,
        noise="public-seed",
        protocol_params={"threshold": T, "collusion": 1, "round_timeout": 1.0, **extra},
    ).with_run_id()


def _machines(spec: RunSpec):
    tasks = [LogisticRegressionTask(X, y, **spec.task_kwargs()) for X, y in shards(N, seed=3)]
    return list(build_from_spec(spec, tasks))


@pytest.mark.parametrize(
    "victim,crash_after,lose_sends,lost_round",
    [
        (3, 14, False, 3),  # leader of round 3, killed mid-round
        (3, 6, False, 3),  # a member of round 1, gone: a dropout of rounds 1-2, then its round 3
        (1, 17, True, 1),  # killed after checkpointing its round-1 outcome, before any of it left
        (0, 2, False, 0),  # the first round's leader
    ],
)
def test_a_leader_that_never_comes_back_ends_the_run_explained(
    victim: int, crash_after: int, lose_sends: bool, lost_round: int
) -> None:
    spec = _spec()
    out = run_with_crash(
        _machines(spec),
        lambda v: _machines(spec)[v],
        victim,
        crash_after,
        down=1e9,  # never back
        lose_sends=lose_sends,
    )
    others = [v for v in range(N) if v != victim]
    assert sorted(out.finishes) == others, sorted(out.finishes)
    assert round_leader(N, lost_round) == victim
    for v in others:
        fin = out.finishes[v]
        res = fin.result
        assert fin.model is None, v  # no intermediate model is released
        assert res["ended"] == LEADER_LOST and res["lost_leader"] == victim, res
        assert res["lost_round"] == lost_round, res
        assert f"node {victim}, the leader of round {lost_round}" in res["reason"]
        # every input that left was charged once, and the result says which
        charged = out.charged(v)
        assert len(set(charged)) == len(charged) and sorted(charged) == res["contributed"]
        assert max(charged) <= lost_round  # nothing after the lost round left this node
        # a round it led released only the inputs of that round's contributors
        for r, u in res["led"].items():
            assert r < lost_round and set(u or []) <= {w for w in range(N) if r in out.charged(w)}
    assert any(d.reason == LEADER_LOST and d.detail["dead"] == victim for d in out.deviations), (
        out.deviations
    )
    # nothing of the lost round reached anyone: no outcome for it was ever sent
    sent_outcomes = {
        struct.unpack(">BI", p[:5])[1] for s, _, p in out.sent if p[0] == 0x71 and s == victim
    }
    assert lost_round not in sent_outcomes


def test_nodes_past_the_lost_round_are_told_and_a_late_asker_too() -> None:
    """A node that already took round r's outcome (the leader died amid its sends) is at round r + 1,
    whose leader is alive: the ``LOST`` notice of a node that timed out ends it there too.  A node that
    ended so answers a restarted node's ``SYNC`` with the same notice.  A notice naming a node that does
    not lead that round is refused."""
    spec = _spec()
    ms = _machines(spec)
    a, b = ms[2], ms[4]
    a.handle(RunStarted())
    b.handle(RunStarted())
    a.round = 1  # took round 0's outcome, now at round 1 (led by node 1, alive)
    note = struct.pack(">BI", LOST, 0) + struct.pack(">I", 0)
    acts = a.handle(MessageArrived(4, note))
    fin = [x for x in acts if isinstance(x, Finish)]
    assert fin and fin[0].model is None and fin[0].result["lost_leader"] == 0
    assert fin[0].result["reported_by"] == 4 and a.finished
    assert not [x for x in acts if isinstance(x, Send)]  # a told node does not re-broadcast
    answer = a.handle(MessageArrived(3, struct.pack(">BI", SYNC, 1)))
    assert Send(3, note) in answer
    bad = b.handle(MessageArrived(2, struct.pack(">BI", LOST, 0) + struct.pack(">I", 3)))
    assert [type(x.error) for x in bad if isinstance(x, Fault)] == [UnexpectedSender]
    assert not b.finished


def test_leader_timeout_is_the_specs_and_checked() -> None:
    from hushnet.families.secagg.dpsgd import leader_timeout

    ms = _machines(_spec(leader_timeout=42.5))
    assert leader_timeout(ms[0].p) == 42.5
    assert leader_timeout(_machines(_spec())[0].p) == 30.0  # 10 round timeouts, at least 30 s
    assert leader_timeout(_machines(_spec(round_timeout=5.0))[0].p) == 50.0
    with pytest.raises(ValueError, match="leader_timeout"):
        _machines(_spec(leader_timeout=-1))
    assert np.isfinite(leader_timeout(ms[0].p))


def test_a_leader_back_after_the_run_ended_is_told_and_ends_too() -> None:
    """The leader of round 3 comes back only after the others ended the run ``leader-lost`` (down 100 s,
    ``leader_timeout`` 30 s): restored, it aborts its round and asks for the outcomes it missed (``SYNC``);
    the ended nodes answer ``LOST``, so it ends the same way instead of waiting — and it is charged
    nothing more (never a second input for a round)."""
    spec = _spec()
    out = run_with_crash(_machines(spec), lambda v: _machines(spec)[v], 3, 14, down=100.0)
    assert sorted(out.finishes) == list(range(N))
    for v in range(N):
        res = out.finishes[v].result
        assert out.finishes[v].model is None and res["ended"] == LEADER_LOST, (v, res)
        assert (res["lost_leader"], res["lost_round"]) == (3, 3), (v, res)
        charged = out.charged(v)
        assert len(set(charged)) == len(charged) and sorted(charged) == res["contributed"]
    assert out.finishes[3].result["reported_by"] is not None  # told, not timed out itself
