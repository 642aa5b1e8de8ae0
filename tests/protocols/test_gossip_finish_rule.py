"""When a simulated run is over is the simulator's ``finish`` parameter: the first Finish, or every live node."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.gossip import gossip_matrix, value_tasks

from hushnet.families.gossip.build import build_gossip_machines, run_gossip
from hushnet.sim import Simulator

N = 12


def _machines(rounds: int = 8):
    tasks, _ = value_tasks(N)
    return build_gossip_machines(
        "muffliato",
        tasks,
        run_seed=5,
        params=dict(rounds=rounds, sigma=0.5),
        W=gossip_matrix("er:12:0.4:3"),
    )


def test_first_stops_at_one_node_and_all_waits_for_every_node():
    first = Simulator(_machines()).run(finish="first")
    every = Simulator(_machines()).run(finish="all")
    assert first.status == every.status == "finished"
    assert len(first.finishes) == 1 and set(every.finishes) == set(range(N))
    ((v, f),) = first.finishes.items()
    assert first.finish is f and first.model is f.model
    # the same machines, the same events up to that Finish: that node's model is bit-identical
    assert every.finishes[v].model.tobytes() == f.model.tobytes()
    assert every.model is None and every.finish is not None  # each node holds its own model
    assert every.events > first.events and every.virtual_time >= first.virtual_time


def test_run_gossip_is_the_all_rule():
    r = run_gossip(_machines())
    sim = Simulator(_machines()).run(finish="all")
    assert r.status == "finished" and not np.isnan(r.models).any()
    np.testing.assert_array_equal(r.models, np.stack([sim.finishes[v].model for v in range(N)]))
    assert set(r.results) == set(sim.finishes) and all(
        r.results[v].keys() == sim.finishes[v].result.keys() for v in r.results
    )
    assert r.sim.messages == sim.messages and r.sim.events == sim.events


def test_a_node_down_for_good_is_not_awaited_but_one_that_comes_back_is():
    gone = Simulator(_machines(rounds=10))
    gone.kill(3, 0.0)
    res = gone.run(finish="all")
    assert res.status == "finished" and 3 not in res.finishes and len(res.finishes) == N - 1

    back = Simulator(_machines(rounds=10))
    back.kill(
        3, 0.0, until=0.004
    )  # misses its start, so never finishes; but it is live: the run waits for it
    res = back.run(finish="all")
    assert res.status == "stalled" and 3 not in res.finishes and len(res.finishes) == N - 1


def test_an_unknown_finish_rule_is_refused():
    with pytest.raises(ValueError, match=r"finish must be one of \('first', 'all'\), got 'last'"):
        Simulator(_machines()).run(finish="last")
