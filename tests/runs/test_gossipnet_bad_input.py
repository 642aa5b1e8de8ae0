"""Bad gossip input over the wire (real TLS, in-process nodes), and what a node refuses to accept.

The network is the complete graph on 4 nodes, the run's gossip graph the ring: node 2 is a network
peer of node 0 but not its gossip neighbour.  Node 2 never answers (its run handler swallows every
message: it hears nobody and only ever sends SKIP), so the ring's rounds wait on it for the timeout — a window
in which crafted messages reach node 0 from a real peer: a non-neighbour's round message, a
far-future round, a past (closed) round, a value of the wrong dimension and a replayed message are
each refused with a typed error the sender sees, counted as a fault, and never used: node 0's final
estimate equals the exact replay of the recorded schedule on the nodes' noisy inputs.  Aggregate
view (secure summation not wired in) and over-budget runs are refused at submit with a reason.
"""

from __future__ import annotations

import asyncio
import pathlib

import numpy as np
import pytest
from helpers.gossipnet import noisy_inputs, spec  # noqa: E402

from hushnet.client.core import RunRefusedError  # noqa: E402
from hushnet.families.gossip.accounting import realised_schedule  # noqa: E402
from hushnet.families.gossip.node import schedule_records  # noqa: E402
from hushnet.families.gossip.realised import replay_averaging  # noqa: E402
from hushnet.families.gossip.wire import (  # noqa: E402
    KIND_AVAIL,
    KIND_HEARTBEAT,
    KIND_SKIP,
    KIND_VALUE,
    encode_round,
)
from hushnet.net.node import DeliveryError  # noqa: E402
from hushnet.runs import local_net  # noqa: E402
from hushnet.runs.service import RUN_PROTOCOL  # noqa: E402

pytestmark = [pytest.mark.integration]

N = 4
D = 2


@pytest.mark.timeout(150)
def test_bad_round_messages_refused_and_never_used(tmp_path: pathlib.Path) -> None:
    rng = np.random.default_rng(1)
    values = [rng.random(D) for _ in range(N)]
    silent = 2

    def observe(nd, svc):
        seen: list[tuple[str, str, bytes]] = []
        inner = svc.handle

        def handle(envelope):
            seen.append((envelope.run_id, envelope.sender, bytes(envelope.payload)))
            if nd.node_id == f"n{silent}":
                return None  # never answers, never starts
            return inner(envelope)

        svc.handle = handle
        return seen

    async def go():
        async with local_net.network(
            tmp_path, f"complete:{N}", N, values=values, base_ip=160, observe=observe
        ) as net:
            ids = [nd.node_id for nd in net.ordered]
            by_v = {nd.identity.vertex: nd for nd in net.nodes}

            # ---- refused at submit, with the reason ---------------------------------------------------
            with pytest.raises(RunRefusedError) as agg:
                await net.client.start_run(
                    spec("muffliato", f"ring:{N}", 4, 1, view="aggregate", frac_bits=60)
                )
            reasons = " ".join(d["reason"] for d in agg.value.decisions.values())
            assert "frac_bits" in reasons
            with pytest.raises(RunRefusedError) as over:
                await net.client.start_run(spec("muffliato", f"ring:{N}", 4, 2, sigma=1e-4))
            assert all("over budget" in d["reason"] for d in over.value.decisions.values()), (
                over.value.decisions
            )

            # ---- a run with a silent neighbour: crafted messages during the wait ----------------------
            sp = spec("muffliato", f"ring:{N}", 12, 3, timeout=2.0, give_up_after=50, max_ahead=2)
            run_id = await net.client.start_run(sp)
            d0 = net.driver(0, run_id)
            await net.wait(lambda: d0.machine.t >= 5, 60, what="node 0 to reach round 5")
            m0 = d0.machine
            faults0 = len(d0.faults)
            n1, n2 = by_v[1], by_v[2]

            async def refused(sender, payload):
                with pytest.raises(DeliveryError) as ei:
                    await sender.send(
                        ids[0], payload, protocol=RUN_PROTOCOL, run_id=run_id, timeout=10
                    )
                return ei.value.details

            t = m0.t
            genuine = [
                p
                for r, s, p in net.observers[
                    0
                ]  # before any crafted one; heartbeats carry nothing to replay
                if r == run_id and s == ids[1] and p[0] != KIND_HEARTBEAT
            ]
            msgs = [
                (
                    n2,
                    encode_round(KIND_AVAIL, t, 1),
                    "unexpected-sender",
                ),  # not a gossip neighbour of 0
                (n1, encode_round(KIND_AVAIL, min(t + 4, sp.steps - 1), 1), "future-round"),
                (n1, encode_round(KIND_SKIP, 0, 0), "stale-round"),  # round 0 closed long ago
                (n1, encode_round(KIND_VALUE, t + 1, 1, np.ones(D + 3)), "wrong-dimension"),
            ]
            for sender, payload, code in msgs:
                details = await refused(sender, payload)
                assert code in details, (code, details)
            # a replay of what node 1 really sent to node 0 for the round node 0 is in (or just closed)
            details = await refused(n1, genuine[-1])
            assert "replay" in details or "stale-round" in details, details
            codes = [f["code"] for f in d0.faults[faults0:]]
            assert codes[:4] == [
                "unexpected-sender",
                "future-round",
                "stale-round",
                "wrong-dimension",
            ], codes
            assert len(codes) == 5

            # ---- the run ends (node 2 dropped every round), bad input never used -----------------------
            live = [0, 1, 3]
            await net.wait(
                lambda: all(net.driver(v, run_id).state == "finished" for v in live),
                90,
                what="the live nodes to finish",
            )
            recs = {v: schedule_records(net.driver(v, run_id).engine_entries) for v in live}
            assert all(len(r) == sp.steps for r in recs.values())
            # node 2 hears nobody, so it only ever sends SKIP: its neighbours never mix its value (their
            # VALUEs to it are delivered to its transport, hence still in their sent-value records)
            assert all(str(silent) not in r["row"] for v in (1, 3) for r in recs[v])
            sched = realised_schedule(recs, N, sp.steps)
            assert sched.asymmetries() == []
            x0 = noisy_inputs(sp, values)
            final = replay_averaging(sched, x0)
            for v in live:
                np.testing.assert_allclose(
                    net.driver(v, run_id).model, final[v], rtol=0, atol=1e-12
                )
            # every data release is on the ledger (one charge per live node, nothing from the bad input)
            for v in live:
                assert len(net.svc_by_vertex[v].ledger.entries(run_id)) == 1

    asyncio.run(go())
