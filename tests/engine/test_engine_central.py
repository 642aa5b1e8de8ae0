"""Central DP-SGD baseline (trusted aggregator): runs as machines, labelled, and refuses stray gradients."""

import numpy as np
from helpers.engine import synthetic_tasks

from hushnet.engine import MessageArrived, UnexpectedSender
from hushnet.engine.actions import Fault
from hushnet.families.central.wire import KIND_GRADIENT_REPLY
from hushnet.families.walk.wire import encode_token
from hushnet.protocols.registry import build_machines
from hushnet.sim import Simulator


def test_central_baseline_runs_and_is_labelled():
    tasks = synthetic_tasks(6, d=3, clip=0.5)
    params = dict(steps=120, step_size=0.1, noise_std=0.2)
    ms = build_machines("central-dpsgd", tasks, run_seed=4, params=params)
    assert len(ms) == 7  # six data nodes + the aggregator
    res = Simulator(ms).run()
    assert res.status == "finished" and res.finish.node == 6
    assert "trusted aggregator" in res.finish.result["baseline"]
    entries = [e for led in res.ledgers.values() for e in led]
    assert len(entries) == 120 and {e.view_model for e in entries} == {"trusted-aggregator"}
    again = Simulator(build_machines("central-dpsgd", tasks, run_seed=4, params=params)).run()
    assert again.model.tobytes() == res.model.tobytes()


def test_aggregator_refuses_gradient_from_a_node_it_did_not_ask():
    tasks = synthetic_tasks(4, d=3)
    ms = build_machines(
        "central-dpsgd", tasks, run_seed=1, params=dict(steps=10, step_size=0.1, noise_std=0.1)
    )
    agg = ms[-1]
    acts = agg.on_start()
    asked = acts[0].dst
    stranger = (asked + 1) % 4
    out = agg.handle(
        MessageArrived(stranger, encode_token(0, 10, 0, 4, np.zeros(4), kind=KIND_GRADIENT_REPLY))
    )
    assert isinstance(out[0], Fault) and isinstance(out[0].error, UnexpectedSender)
    assert agg.step == 0 and np.array_equal(agg.x, np.zeros(4))
