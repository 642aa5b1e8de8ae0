"""Secure-summation gossip (``view = "aggregate"``) checkpoints and restores (issue 14), sans IO.

:func:`helpers.crash.run_with_crash` crashes one node of a ``grid:3x3`` Muffliato run with secure
neighbourhood sums (checkpoint before any message of a batch leaves; down, it handles nothing and
messages to it are lost) and restores it from its last checkpoint, at several points of the run —
leader and member of sums in flight, between rounds, or draining its last memberships.  Checked:

* every node finishes, each with exactly one schedule record per round;
* the restarted node never sends a second masked input to the same sum (one ``MASKED`` per
  (round, leader));
* every node's final value is the replay of the *recorded* rows on the noisy inputs (fixed-point
  error), so the accountant's aggregate view of every round is what happened;
* the restarted node's value was charged once (one data entry, as before the crash).
"""

from __future__ import annotations

import struct
from collections import Counter

import numpy as np
import pytest
from helpers.crash import run_with_crash
from helpers.gossip import gossip_matrix, noisy_inputs, value_tasks

from hushnet.crypto.masks import FixedPoint
from hushnet.families.gossip.build import build_gossip_machines
from hushnet.families.gossip.realised import replay_averaging, schedule_from_ledgers
from hushnet.families.gossip.wire import KIND_SECAGG
from hushnet.families.secagg.wire import MASKED

N, T, F = 9, 30, 24
HDR = struct.Struct("<BQII")


def _machines(tasks, W):
    params = dict(
        rounds=T, sigma=0.5, secure_summation=True, timeout=0.05, give_up_after=1000, max_ahead=2
    )
    return build_gossip_machines("muffliato", tasks, run_seed=5, params=params, W=W)


@pytest.mark.parametrize(
    "victim,crash_after,down,expect,lose_sends",
    # the centre (4, a member of four sums) crashed while its own sum was in flight (it aborts it),
    # between rounds (it fast-forwards: rounds closed unheard), while draining its last memberships,
    # and between a checkpoint and its sends (none left: the others time out on them)
    [
        (4, 40, 0.3, "aborted", False),
        (4, 600, 0.2, "skipped", False),
        (4, 780, 0.2, None, False),
        (4, 300, 0.2, "aborted", True),
    ],
    ids=["own-sum-in-flight", "fast-forward", "draining", "sends-lost"],
)
def test_restarted_secure_gossip_node_rejoins_without_a_second_masked_input(
    victim: int, crash_after: int, down: float, expect: str | None, lose_sends: bool
) -> None:
    W = gossip_matrix("grid:3x3")
    tasks, vals = value_tasks(N, d=3)
    out = run_with_crash(
        _machines(tasks, W),
        lambda v: _machines(tasks, W)[v],
        victim,
        crash_after,
        down,
        lose_sends=lose_sends,
    )
    assert out.crashed_at >= 0, "the victim never reached the crash point"
    assert sorted(out.finishes) == list(range(N)), sorted(out.finishes)
    for v in range(N):
        rounds = [e.step for e in out.ledgers[v] if e.kind == "schedule"]
        assert sorted(rounds) == list(range(T)), (v, rounds)
    masked = Counter(
        (HDR.unpack_from(p)[1], HDR.unpack_from(p)[2])
        for src, _, p in out.sent
        if src == victim and p[0] == KIND_SECAGG and p[HDR.size] == MASKED
    )
    assert masked and max(masked.values()) == 1, masked
    status = [e.detail["secure"]["status"] for e in out.ledgers[victim] if e.kind == "schedule"]
    if expect is None:  # crashed after its last round closed: finished at once on restore
        assert set(status) == {"released"}, status
    else:
        assert expect in status and status[-1] == "released", status
    sched = schedule_from_ledgers(out.ledgers, N, T)
    x0 = noisy_inputs(vals, tasks, 5, 0.5)
    models = np.array([np.asarray(out.finishes[v].model) for v in range(N)])
    assert np.abs(replay_averaging(sched, x0) - models).max() <= T * 5 * FixedPoint(F).error_bound(
        1
    )
    assert sum(e.uses_data for e in out.ledgers[victim]) == 1
