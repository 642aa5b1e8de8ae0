"""Which machines ask their node's driver to send a failed delivery again, and for how long (issue 12).

The network behaviour is tested family by family over real nodes (``tests/runs/*redeliver*.py``,
docs/runs.md "A failed delivery, family by family"); here, without a network, the windows each machine
declares: as long as the receiver may still use the message, and no window at all for the machines
that retransmit on their own (a driver re-send would double their sends).
"""

from __future__ import annotations

import numpy as np

from hushnet.families.gossip.build import build_gossip_machines
from hushnet.families.gossip.params import gossip_params
from hushnet.families.secagg.dpsgd import leader_timeout
from hushnet.families.secagg.node import NetworkSecAgg
from hushnet.protocols.registry import build_from_spec, transition_matrix
from hushnet.runs.spec import Budget, RunSpec
from hushnet.runs.synthetic import planted_logistic_shards
from hushnet.tasks import LogisticRegressionTask
from hushnet.tasks.registry import make_task

N = 4


def _spec(protocol: str, task: str, **kw) -> RunSpec:
    base: dict = dict(
        protocol=protocol,
        task=task,
        graph=f"complete:{N}",
        steps=3,
        seed=2,
        budget=Budget(1e6, 1e-5),
        sigma=1.0,
    )
    base.update(kw)
    return RunSpec(**base).with_run_id()


def _values():
    return [make_task("sum", {"values": np.array([0.5])}, {}) for _ in range(N)]


def _logreg():
    return [
        LogisticRegressionTask(X, y, clip=0.5)
        for X, y in planted_logistic_shards(N, m=6, d=3, seed=1)
    ]


def test_round_machines_ask_for_a_resend_while_the_receiver_can_use_it() -> None:
    sp = _spec("muffliato-randomized", "mean", protocol_params={"timeout": 7.0})
    tasks = [make_task("mean", {"values": np.array([0.5])}, {}) for _ in range(N)]
    ms = build_gossip_machines(
        sp.protocol,
        tasks,
        run_seed=sp.seed,
        run_id=sp.run_id,
        params=gossip_params(sp),
        W=transition_matrix(sp.graph, sp.weights),
    )
    assert all(m.redeliver_for == 14.0 for m in ms)

    sp = _spec("secagg-sum", "sum", steps=1, protocol_params={"round_timeout": 3.0})
    ms = build_from_spec(sp, _values())
    assert all(m.redeliver_for == 6.0 for m in ms)
    # the networked wrapper is what the driver holds: it forwards the window
    assert NetworkSecAgg(ms[1]).redeliver_for == 6.0

    sp = _spec(
        "secagg-dpsgd", "logreg", clip=0.25, protocol_params={"round_timeout": 2.0, "threshold": 4}
    )
    ms = build_from_spec(sp, _logreg())
    assert all(m.redeliver_for == leader_timeout(m.p) == 30.0 for m in ms)


def test_machines_that_retransmit_themselves_ask_for_nothing() -> None:
    sp = _spec("pad-complete-sum", "sum", steps=6, noise="public-seed")
    for m in build_from_spec(sp, _values()):
        assert not getattr(m, "redeliver_for", 0.0)
    sp = _spec("rw-dpsgd", "logreg", clip=0.25)
    for m in build_from_spec(sp, _logreg()):
        assert not getattr(m, "redeliver_for", 0.0)


def test_the_central_aggregator_asks_again_and_its_nodes_do_not() -> None:
    """The operator's loop (``run_central``) asks a failed request again for the aggregator's window;
    the nodes only answer requests (a repeat of the last one gets the same reply, uncharged)."""
    sp = _spec("central-dpsgd", "logreg", clip=0.25, noise="public-seed")
    *clients, agg = build_from_spec(sp, _logreg())
    assert agg.redeliver_for == 120.0
    assert all(not getattr(m, "redeliver_for", 0.0) for m in clients)
