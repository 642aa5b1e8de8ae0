"""``rw-dpsgd`` over real nodes sends one RPC per hop: the handoff's ack is the token's ``Deliver`` answer.

Measured before (issue 12, ``bench_runs``): a networked hop was two RPCs, the token and a separate
ack envelope back, and the hop rate was 0.19 of the bare envelope hop.  The node's ``Deliver``
answers only after the receiving driver ran its machine on the token and wrote its checkpoint (a
refusal is an error), so the walk family's node builder turns on ``link_receipts`` and the driver
feeds that answer back as the ack.  Checked here over mutual TLS: no ack envelope passes, every
handoff's token arrived, no step arrived with two contents, and the run finishes.
"""

from __future__ import annotations

import pathlib

import pytest
import uvloop
from helpers.anonnet import network

from hushnet.families.walk.wire import KIND_ACK, KIND_TOKEN
from hushnet.runs.spec import Budget, RunSpec
from hushnet.runs.synthetic import planted_logistic_shards

GRAPH, N, STEPS = "regular:8:3:1", 8, 60


@pytest.mark.timeout(120)
def test_walk_hops_cost_one_rpc_each(tmp_path: pathlib.Path) -> None:
    async def go():
        async with network(
            tmp_path, GRAPH, N, shards=planted_logistic_shards(N, m=8, d=4, seed=2), base_ip=245
        ) as net:
            spec = RunSpec(
                protocol="rw-dpsgd",
                task="logreg",
                graph=GRAPH,
                steps=STEPS,
                seed=6,
                budget=Budget(1e6, 1e-5),
                sigma=2.0,
                step_size=0.05,
            ).with_run_id()
            run_id = await net.client.start_run(spec)
            drivers = {v: net.driver(v, run_id) for v in range(N)}
            await net.wait(
                lambda: (
                    any(d.state == "finished" for d in drivers.values())
                    # the last handoff's receipt reaches its sender just after the receiver finished
                    and not any(d.machine._pending for d in drivers.values())
                ),
                90,
                what="the walk to finish and its last handoff to be acknowledged",
            )
            assert all(d.machine.opt.link_receipts for d in drivers.values())
            seen = [r for spy in net.spies.values() for r in spy.seen if r["run_id"] == run_id]
            assert not [r for r in seen if r["payload"][0] == KIND_ACK], (
                "handoff acks still travel as their own RPCs"
            )
            tokens = {(r["sender"], r["payload"]) for r in seen if r["payload"][0] == KIND_TOKEN}
            steps = [int.from_bytes(p[1:9], "little") for _, p in tokens]
            assert len(steps) == len(set(steps)) >= 10  # one token per handoff, each step once
            assert all(not d.faults for d in drivers.values()), [
                d.faults for d in drivers.values() if d.faults
            ]

    uvloop.run(go())
