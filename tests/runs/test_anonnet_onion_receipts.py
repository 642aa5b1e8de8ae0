"""``rw-dpsgd-onion`` over real nodes sends one RPC per link hop: the hop ack is the ``Deliver`` answer.

Measured before: every link hop cost two RPCs (the packet, then a ``KIND_HOP_ACK`` envelope back),
1 885 RPCs for 200 steps, which made the onion step 3.95× the direct hop.  The node's ``Deliver``
answers only after the receiving machine accepted the packet (a refusal is an error), so the run
driver feeds that answer back to the layer as the hop ack.  Checked here over mutual TLS: no ack
envelope passes at all, every packet a sender's paths needed arrived exactly once as distinct bytes,
and the run finishes.
"""

from __future__ import annotations

import pathlib

import pytest
import uvloop
from helpers.anonnet import network

from hushnet.runs.spec import Budget, RunSpec
from hushnet.runs.synthetic import planted_logistic_shards

GRAPH, N = "regular:10:4:1", 10


@pytest.mark.timeout(120)
def test_onion_hops_cost_one_rpc_each(tmp_path: pathlib.Path) -> None:
    async def go():
        async with network(
            tmp_path, GRAPH, N, shards=planted_logistic_shards(N, m=8, d=4, seed=1), base_ip=236
        ) as net:
            spec = RunSpec(
                protocol="rw-dpsgd-onion",
                task="logreg",
                graph=GRAPH,
                steps=25,
                seed=4,
                budget=Budget(1e6, 1e-5),
                sigma=2.0,
                step_size=0.05,
                view_model="anonymous",
                protocol_params={"hops": 3},
            ).with_run_id()
            run_id = await net.client.start_run(spec)
            drivers = {v: net.driver(v, run_id) for v in range(N)}
            await net.wait(
                lambda: any(d.state == "finished" for d in drivers.values()),
                90,
                what="the walk to finish",
            )
            seen = [r for spy in net.spies.values() for r in spy.seen if r["run_id"] == run_id]
            assert not [r for r in seen if r["payload"][:1] == b"A"], (
                "hop acks still travel as their own RPCs"
            )
            packets = {(r["sender"], r["payload"]) for r in seen if r["payload"][:1] == b"O"}
            link_hops = sum(len(p) for d in drivers.values() for p in d.machine.paths)
            n_paths = sum(
                len(d.machine.paths) for d in drivers.values()
            )  # token handoffs (the walk may stay put)
            assert (
                n_paths >= 5 and link_hops >= 4 * n_paths
            )  # ≥ 3 relays + the recipient per handoff
            assert (
                len(packets) == link_hops
            )  # every hop's packet arrived (as distinct bytes: fresh layers)
            assert all(not d.faults for d in drivers.values()), [
                d.faults for d in drivers.values() if d.faults
            ]

    uvloop.run(go())
