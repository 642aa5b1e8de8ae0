"""The concurrent loopback driver: the same finish rules as the simulator, and a bug ends the run loudly."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from hushnet.engine.actions import Action
from hushnet.engine.protocol import NodeContext, Protocol
from hushnet.engine.rng import node_generators
from hushnet.families.gossip.build import build_gossip_machines
from hushnet.privacy.graphs import metropolis_hastings, parse_graph
from hushnet.sim import Simulator
from hushnet.sim.loopback import LoopbackNetwork
from hushnet.tasks import SumTask

N = 8


def _gossip():
    vals = np.random.default_rng(0).random((N, 3))
    return build_gossip_machines(
        "muffliato",
        [SumTask(vals[i]) for i in range(N)],
        run_seed=5,
        params=dict(rounds=6, sigma=0.5),
        W=metropolis_hastings(parse_graph("er:8:0.5:2")),
    )


def test_all_rule_every_node_finishes_and_matches_the_simulator():
    """Gossip over real concurrency with reordering: every node's final model = the simulator's (1e-12)."""
    sim = Simulator(_gossip()).run(finish="all")
    net = asyncio.run(
        LoopbackNetwork(_gossip(), delay=(0.0, 1.5e-3), seed=3).run(timeout=30, finish="all")
    )
    assert sim.status == net.status == "finished" and net.model is None
    assert set(net.finishes) == set(sim.finishes) == set(range(N))
    for v in range(N):
        np.testing.assert_allclose(net.finishes[v].model, sim.finishes[v].model, rtol=0, atol=1e-12)
    assert not net.faults


def test_first_rule_ends_at_one_node():
    net = asyncio.run(LoopbackNetwork(_gossip(), delay=(0.0, 1e-3), seed=3).run(timeout=30))
    assert net.status == "finished" and len(net.finishes) == 1
    assert net.model is next(iter(net.finishes.values())).model


class _Rogue(Protocol):
    """Returns something that is not an engine action once the run starts."""

    def on_start(self) -> list[Action]:
        return ["not an action"]  # type: ignore[list-item]

    def on_message(self, src: int, payload: bytes) -> list[Action]:
        return []


def test_an_unknown_action_ends_the_run_with_a_clear_error_not_a_timeout():
    rngs = node_generators(0, 2)
    ms = [_Rogue(NodeContext(v, 2, "r", rngs[v])) for v in range(2)]
    with pytest.raises(TypeError, match="not an engine action"):
        asyncio.run(asyncio.wait_for(LoopbackNetwork(ms).run(timeout=60), 10))
    with pytest.raises(TypeError, match="not an engine action"):
        Simulator([_Rogue(NodeContext(v, 2, "r", rngs[v])) for v in range(2)]).run()


def test_an_unknown_finish_rule_is_refused():
    with pytest.raises(ValueError, match="finish must be one of"):
        asyncio.run(LoopbackNetwork(_gossip()).run(finish="any"))
