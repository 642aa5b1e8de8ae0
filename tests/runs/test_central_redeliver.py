"""Central DP-SGD's gradient requests whose call failed are asked again (issue 12, "Left").

The operator's aggregator (:func:`hushnet.families.central.operator.run_central`) asks one node per step
for its clipped gradient over the control channel (``run.gradient``).  One failed call stopped the whole
run: nothing asked again, and a node that had answered a call whose answer was lost (it charged its
ledger and advanced) refused the same request again as a replay.

Over a real in-process network of 4 nodes (mutual TLS on 127.0.0.x), two calls fail the two ways a busy
or unreachable node makes them fail, on the nodes' real control path:

* the first ``run.gradient`` call is answered after the operator's deadline (``DEADLINE_EXCEEDED``) — the
  node computed, charged and answered; asking again must give the same gradient with no second charge;
* the second call is refused ``UNAVAILABLE`` (the node's answer for a service that cannot serve) — not
  served, so only a second call brings the gradient.

The run finishes, the model equals the simulator's exactly and every node's ledger holds one charge per
step it served (the simulator's counts).
"""

from __future__ import annotations

import asyncio
import pathlib

import numpy as np
import pytest

from hushnet.families.central.operator import run_central
from hushnet.families.central.wire import GRADIENT_COMMAND
from hushnet.net.errors import NodeStopping
from hushnet.protocols.registry import build_from_spec
from hushnet.runs import local_net
from hushnet.runs.policy import NodePolicy, load_task
from hushnet.runs.spec import Budget, RunSpec
from hushnet.runs.synthetic import planted_logistic_shards
from hushnet.sim import Simulator

pytestmark = [pytest.mark.integration]

N = 4
#: the operator's request deadline here (the default is 30 s): short, so a failure comes fast
DEADLINE_S = 1.5


@pytest.mark.timeout(240)
def test_failed_gradient_requests_are_asked_again(tmp_path: pathlib.Path) -> None:
    spec = RunSpec(
        protocol="central-dpsgd",
        task="logreg",
        graph=f"complete:{N}",
        steps=12,
        seed=7,
        budget=Budget(1e4, 1e-5),
        sigma=0.05,
        clip=1.0,
        step_size=0.5,
        noise="public-seed",
    ).with_run_id()
    calls = {"n": 0, "late": 0, "refused": 0}

    def inject(nd) -> None:
        inner = nd.controls._commands[GRADIENT_COMMAND]  # noqa: SLF001 - the node's real command

        async def gradient(payload: bytes) -> bytes:
            calls["n"] += 1
            if calls["n"] == 2:  # refused before it is served
                calls["refused"] += 1
                raise NodeStopping("refusing run.gradient (fault injection)")
            out = await inner(payload)  # served: charged, computed ...
            if calls["n"] == 1:  # ... and answered after the operator's deadline
                calls["late"] += 1
                await asyncio.sleep(3 * DEADLINE_S)
            return out

        nd.register_control(GRADIENT_COMMAND, gradient, replace=True)

    async def go():
        shards = planted_logistic_shards(N, m=8, d=4, seed=2)
        async with local_net.network(
            tmp_path, f"complete:{N}", N, shards=shards, base_ip=170
        ) as net:
            ids = [nd.node_id for nd in net.ordered]
            for nd in net.nodes:
                inject(nd)
            out = await run_central(net.client, spec, progress=False, request_timeout=DEADLINE_S)
            entries = [len(net.svc_by_vertex[v].ledger.entries(spec.run_id)) for v in range(N)]
            return ids, out, entries

    ids, out, entries = asyncio.run(go())
    assert out.state == "finished" and out.step == spec.steps, out
    assert calls["late"] == 1 and calls["refused"] == 1
    assert out.redeliveries >= 2, out
    tasks = [load_task(spec, NodePolicy(None, tmp_path / f"n{i}" / "data.npz")) for i in range(N)]
    sim = Simulator(build_from_spec(spec, tasks)).run()
    assert sim.status == "finished"
    np.testing.assert_allclose(out.model, sim.model, rtol=0, atol=1e-12)
    counts = [sum(e.kind == "gradient" for e in sim.ledgers[v]) for v in range(N)]
    assert entries == counts, (entries, counts)  # one charge per step served, none for a repeat
    assert [out.requests[i] for i in ids] == counts, out.requests


def test_a_repeated_request_gets_the_same_reply_and_no_second_charge() -> None:
    """The node's machine (sans-IO): the same request bytes again → the same reply, no ledger entry; a
    different request for a step already answered → refused as a replay (never a second gradient)."""
    from hushnet.engine.actions import Fault, LedgerEntry, Send
    from hushnet.engine.errors import ReplayedMessage
    from hushnet.engine.events import MessageArrived
    from hushnet.engine.protocol import NodeContext
    from hushnet.families.central.machines import CentralClient
    from hushnet.families.central.wire import encode_request
    from hushnet.tasks import LogisticRegressionTask

    X, y = planted_logistic_shards(1, m=8, d=4, seed=3)[0]
    task = LogisticRegressionTask(X, y, clip=1.0)
    d = task.dim
    m = CentralClient(NodeContext(0, 2, "run-x", np.random.default_rng(0)), task, aggregator=1)
    req = encode_request(0, 5, 0, np.zeros(d))
    first = m.handle(MessageArrived(1, req))
    assert [type(a) for a in first] == [LedgerEntry, Send]
    again = m.handle(MessageArrived(1, req))
    assert again == [first[1]]  # the same reply bytes, nothing charged
    (fault,) = m.handle(MessageArrived(1, encode_request(0, 5, 0, np.ones(d))))
    assert isinstance(fault, Fault) and isinstance(fault.error, ReplayedMessage), fault
    assert [type(a) for a in m.handle(MessageArrived(1, encode_request(1, 5, 0, np.ones(d))))] == [
        LedgerEntry,
        Send,
    ]
