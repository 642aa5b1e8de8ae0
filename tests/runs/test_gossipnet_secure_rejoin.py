"""A *secure-summation* gossip node (``view = "aggregate"``) SIGKILLed mid-run and restarted on its state
directory rejoins the run (issue 14).

Real node processes (a :class:`~hushnet.net.cluster.LocalCluster`, mutual TLS on 127.0.0.x).  Node 2 of
``ring:3`` is killed with SIGKILL after a few rounds, in the middle of its neighbourhood sums; its
neighbours go on without it (their sums over the two of them).  Before the fix the restarted node
answered "no run" (secure gossip kept no checkpoint) and its neighbours dropped it.  Now it restores
its round machine and its memberships — never a SecAgg session: it is a dropout of the sums in
flight (a sum it led is aborted, the members told), is never invited twice to a sum (no second
masked input) — moves to its neighbours' round and finishes with them: every node ends
``finished``, the restarted node's schedule records cover every round exactly once, its own sums
are released again after the restart, the value was charged once, and the settled ledgers hold at
least the certified loss of the realised schedule (the neighbourhood view, as for every secure run).
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal
import time

import numpy as np
import pytest
from helpers.gossipnet import spec  # noqa: E402
from test_gossipnet_durable import _ledger_curves, _stored_rounds, _wait  # noqa: E402

from hushnet.client.core import AsyncClient, ClientError  # noqa: E402
from hushnet.families.gossip.accounting import realised_curves  # noqa: E402
from hushnet.families.gossip.operator import settle_run  # noqa: E402
from hushnet.net.cluster import LocalCluster  # noqa: E402
from hushnet.privacy.ledger import Ledger  # noqa: E402
from hushnet.protocols.registry import transition_matrix  # noqa: E402
from hushnet.runs.local_net import write_policy  # noqa: E402
from hushnet.runs.service import LEDGER_FILE  # noqa: E402

pytestmark = [pytest.mark.integration]

N = 3
GRAPH = "ring:3"
ROUNDS = 30
VICTIM = 2


@pytest.mark.timeout(300)
def test_sigkilled_secure_gossip_node_rejoins_and_finishes(tmp_path: pathlib.Path) -> None:
    rng = np.random.default_rng(5)
    values = [rng.random(2) for _ in range(N)]
    for i in range(N):
        write_policy(tmp_path / "nodes" / f"n{i}", values[i], None, 1e6, 1e-5)
    cl = LocalCluster(tmp_path, N, GRAPH, restart=False)
    # neighbours wait for a silent node round after round (never declare it gone within the test)
    sp = spec("muffliato", GRAPH, ROUNDS, 23, timeout=1.0, give_up_after=1000, view="aggregate")
    ids = [f"n{i}" for i in range(N)]
    try:
        cl.start(timeout=90)
        cl.wait_healthy(timeout=120)

        async def go():
            client = await AsyncClient.connect(tmp_path)
            try:
                run_id = await client.start_run(sp)
                await asyncio.to_thread(
                    _wait,
                    lambda: _stored_rounds(tmp_path, run_id) >= 3,
                    60,
                    "node 2 to record 3 rounds",
                )
                victim = cl.nodes[VICTIM]
                os.kill(victim.pid, signal.SIGKILL)
                victim.proc.wait(timeout=10)
                killed_at = _stored_rounds(tmp_path, run_id)
                assert killed_at < ROUNDS - 5, f"node 2 recorded {killed_at} rounds before the kill"
                await asyncio.sleep(2.5)  # the others go on without it for a round or two
                victim.spawn()

                async def all_finished():
                    try:
                        await client.refresh()
                        st = await client.statuses(run_id)
                    except ClientError:
                        return False
                    return all(
                        isinstance(st.get(i), dict) and st[i].get("state") == "finished"
                        for i in ids
                    )

                end = time.monotonic() + 180
                while not await all_finished():
                    assert time.monotonic() < end, (
                        "the run did not finish at every node after the restart"
                    )
                    await asyncio.sleep(0.3)
                st = await client.statuses(run_id)
                settled = await settle_run(client, run_id, ids)
                recs = {}
                for nid in ids:
                    d = await client._control(nid, "run.schedule", {"run_id": run_id})  # noqa: SLF001
                    recs[int(d["vertex"])] = d["records"]
                rep = await client.report(run_id)
                return run_id, killed_at, st, settled, recs, rep
            finally:
                await client.close()

        run_id, killed_at, st, settled, recs, rep = asyncio.run(go())
    finally:
        cl.stop(timeout=10)

    assert st[ids[VICTIM]]["restored"] >= 1, st[ids[VICTIM]]
    mine = recs[VICTIM]
    assert [r["round"] for r in mine] == list(range(ROUNDS)), "every round recorded exactly once"
    # back in step after the restart: its last sums are released over the neighbours again
    assert mine[-1]["row"] and mine[-1]["sent_value"], mine[-1]
    assert mine[-1]["secure"]["status"] == "released", mine[-1]
    assert all("secure" in r for r in mine)
    vr = rep.per_node[ids[VICTIM]]
    assert any(d["reason"] == "rejoined" for d in vr["deviations_list"]) or any(
        r["row"] == {} for r in mine[killed_at:]
    ), "the missed rounds show as rounds nobody heard"
    for nid in ids:
        assert "error" not in settled[nid], (nid, settled[nid])
        assert settled[nid]["records_from"] == list(range(N))
    W = transition_matrix(sp.graph, sp.weights)
    for v in range(N):
        led = _ledger_curves(tmp_path, v, run_id, ids)
        with Ledger(tmp_path / "nodes" / ids[v] / LEDGER_FILE) as lg:
            orders = lg.orders
        real = realised_curves(sp, v, ids, recs, orders, W)
        assert np.all(led >= real * (1 - 1e-9) - 1e-12), v
    # the value was charged once at the restarted node, not again at the restart
    with Ledger(tmp_path / "nodes" / ids[VICTIM] / LEDGER_FILE) as lg:
        data = [e for e in lg.entries(run_id) if not e["note"].startswith("gossip settlement")]
    assert len(data) == 1, data
