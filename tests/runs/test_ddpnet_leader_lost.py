"""A ``secagg-dpsgd`` round leader SIGKILLed and never restarted: the run ends explained (issue 14).

Real node processes (a :class:`~hushnet.net.cluster.LocalCluster`, complete:5, mutual TLS).  Node 3
is killed as soon as its ledger holds its charge for round 3, which it leads, and never comes back.
Before the fix nothing detected it: every other node waited for round 3's outcome forever and
``run watch`` saw no progress.  Now each node waits ``leader_timeout`` for the outcome, then ends the
run ``leader-lost`` — no model, nothing of that round applied, the inputs that left stay charged —
and tells the others; ``run watch`` ends in state ``leader-lost`` naming the node and its round, and
every node's status says the same.

Checked independently of the nodes' counters: each ledger holds one charge per round whose masked
input left (``contributed``), none after the lost round, and every survivor of a released round (as
its leader recorded it) is among that round's contributors.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal
import time

import pytest
from helpers.ddp import shards
from test_ddp_restart import _charges

from hushnet.client.core import AsyncClient
from hushnet.net.cluster import LocalCluster
from hushnet.privacy.ledger import Ledger
from hushnet.runs.local_net import write_policy
from hushnet.runs.service import LEDGER_FILE
from hushnet.runs.spec import Budget, RunSpec

pytestmark = [pytest.mark.integration]

N, ROUNDS, T, VICTIM, LEADER_TIMEOUT = 5, 14, 4, 3, 8.0


@pytest.mark.timeout(300)
def test_secagg_dpsgd_leader_killed_for_good_ends_the_run_leader_lost(
    tmp_path: pathlib.Path,
) -> None:
    sh = shards(N, seed=5)
    for i in range(N):
        write_policy(tmp_path / "nodes" / f"n{i}", None, sh[i], 1e6, 1e-5)
    sp = RunSpec(
        protocol="secagg-dpsgd",
        task="logreg",
        graph=f"complete:{N}",
        steps=ROUNDS,
        seed=31,
        budget=Budget(1e6, 1e-5),
        sigma=1.5,
        clip=0.5,
        step_size=0.5,
        noise="public-seed",
        protocol_params={
            "threshold": T,
            "collusion": 1,
            "round_timeout": 1.0,
            "leader_timeout": LEADER_TIMEOUT,
        },
    ).with_run_id()
    ids = [f"n{i}" for i in range(N)]
    run_id = sp.run_id
    cl = LocalCluster(tmp_path, N, f"complete:{N}", restart=False)
    try:
        cl.start(timeout=90)
        cl.wait_healthy(timeout=120)

        async def go():
            client = await AsyncClient.connect(tmp_path)
            try:
                victim = cl.nodes[VICTIM]
                ledger = tmp_path / "nodes" / ids[VICTIM] / LEDGER_FILE
                task = asyncio.create_task(client.start_run(sp))
                end = time.monotonic() + 90
                while _charges(ledger, run_id) < VICTIM + 1:  # its input for round 3 is leaving
                    assert time.monotonic() < end, f"node {VICTIM} never charged round {VICTIM}"
                    await asyncio.sleep(0.005)
                os.kill(victim.pid, signal.SIGKILL)
                victim.proc.wait(timeout=10)
                await task
                # never restarted; watch waits longer than a pause so the leader timeout decides
                out = await client.watch(run_id, progress=False, timeout=150, pause_timeout=150)
                st = await client.statuses(run_id)
                rep = await client.report(run_id)
                rows = [r for r in await client.list_runs() if r["run_id"] == run_id]
                return out, st, rep, rows
            finally:
                await client.close()

        out, st, rep, rows = asyncio.run(go())
    finally:
        cl.stop(timeout=10)

    others = [i for v, i in enumerate(ids) if v != VICTIM]
    assert out.state == "leader-lost", (out.state, out.reason)
    assert f"{ids[VICTIM]} (leader of round" in out.reason, out.reason
    for i in others:
        s = st[i]
        assert s["state"] == "finished" and not s["holds_model"], s
        assert s["ended"] == "leader-lost" and s["lost_node"] == ids[VICTIM], s
        assert int(s["lost_round"]) % N == VICTIM, s
    # run status (the list of runs) says the same
    assert rows and rows[0]["state"] == "leader-lost" and rows[0]["lost_node"] == ids[VICTIM], rows
    res = {i: rep.per_node[i]["result"] for i in others}
    lost_round = int(st[others[0]]["lost_round"])
    contributed = {i: {int(r) for r in res[i]["contributed"]} for i in others}
    for i in others:
        assert res[i]["lost_round"] == lost_round and res[i]["lost_leader"] == VICTIM
        assert max(contributed[i]) <= lost_round, (i, contributed[i])
        with Ledger(tmp_path / "nodes" / i / LEDGER_FILE) as lg:
            assert len(lg.entries(run_id)) == len(contributed[i]), (i, contributed[i])
        for r, u in res[i]["led"].items():
            assert int(r) < lost_round
            if u is not None:
                assert set(u) <= {
                    v for v, j in enumerate(ids) if j in others and int(r) in contributed[j]
                } | {VICTIM}
    assert any(
        d["reason"] == "leader-lost" for i in others for d in rep.per_node[i]["deviations_list"]
    )
