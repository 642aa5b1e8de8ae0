"""A ``secagg-dpsgd`` node SIGKILLed mid-run and restarted rejoins the run, which finishes (issue 14).

Real node processes (a :class:`~hushnet.net.cluster.LocalCluster`, complete:5, mutual TLS).  Node 3 is
killed as soon as its ledger holds its charge for round 4 (its masked input is leaving; node 4 leads
that round) — or for round 3, which it leads itself — while the others go on without it (it is a
dropout of the rounds it misses; the run stalls at the first round it leads), then restarted on its
state directory.  Before the fix the restarted node answered "no run" and the others waited for its
round's outcome forever.  Now it restores its model and round from its checkpoint, is a dropout of
the round in flight (never a second masked input; as that round's leader it aborts it), catches up
the outcomes it missed from their leaders, leads its rounds again, and every node finishes with the
same model.

Checked independently of the nodes' own counters:

* the ledger holds one charge per contribution: each node's number of ledger entries for the run
  equals the number of rounds whose masked input left it (``contributed``), and every survivor of a
  released round, as the round's *leader* recorded it, is among the contributors of that round;
* the final model equals the update rule written out (:func:`helpers.ddp.reference_model`) on the
  realised schedule — the leaders' survivor sets and each node's noise draws in its contributed
  rounds — to the fixed-point error.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal
import sqlite3
import time

import numpy as np
import pytest
from helpers.ddp import reference_model, shards

from hushnet.client.core import AsyncClient, ClientError
from hushnet.crypto.masks import FixedPoint
from hushnet.net.cluster import LocalCluster
from hushnet.privacy.ledger import Ledger
from hushnet.privacy.secure_sum import share_std
from hushnet.runs.local_net import write_policy
from hushnet.runs.service import LEDGER_FILE
from hushnet.runs.spec import Budget, RunSpec
from hushnet.tasks import LogisticRegressionTask

pytestmark = [pytest.mark.integration]

N, ROUNDS, T, SIGMA, CLIP, STEP, VICTIM = 5, 14, 4, 1.5, 0.5, 0.5, 3


def _charges(path: pathlib.Path, run_id: str) -> int:
    if not path.exists():
        return 0
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return int(
            db.execute("SELECT COUNT(*) FROM entries WHERE run_id = ?", (run_id,)).fetchone()[0]
        )
    except sqlite3.OperationalError:
        return 0
    finally:
        db.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "kill_after",
    # charged round 4 (led by node 4: a member's dropout), or round 3 (its own: the leader restarts)
    [5, 4],
    ids=["member", "leader"],
)
def test_secagg_dpsgd_node_killed_mid_run_rejoins_and_the_run_finishes(
    tmp_path: pathlib.Path, kill_after: int
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
        sigma=SIGMA,
        clip=CLIP,
        step_size=STEP,
        noise="public-seed",
        protocol_params={
            "threshold": T,
            "collusion": 1,
            "round_timeout": 1.0,
            # the killed node comes back: its round waits for it (a leader that never does: test_ddp_leader_lost)
            "leader_timeout": 600.0,
        },
    ).with_run_id()
    ids = [f"n{i}" for i in range(N)]
    cl = LocalCluster(tmp_path, N, f"complete:{N}", restart=False)
    try:
        cl.start(timeout=90)
        cl.wait_healthy(timeout=120)

        async def go():
            client = await AsyncClient.connect(tmp_path)
            try:
                victim = cl.nodes[VICTIM]
                ledger = tmp_path / "nodes" / ids[VICTIM] / LEDGER_FILE
                run_id = sp.run_id
                task = asyncio.create_task(client.start_run(sp))
                end = time.monotonic() + 90
                while _charges(ledger, run_id) < kill_after:
                    assert time.monotonic() < end, (
                        f"node {VICTIM} never charged round {kill_after - 1}"
                    )
                    await asyncio.sleep(0.005)
                os.kill(victim.pid, signal.SIGKILL)
                victim.proc.wait(timeout=10)
                await task
                await asyncio.sleep(2.0)  # the others go on without it for a while
                victim.spawn()
                st, end = {}, time.monotonic() + 180
                while not (
                    len(st) == N
                    and all(
                        isinstance(s, dict) and s.get("state") == "finished" for s in st.values()
                    )
                ):
                    assert time.monotonic() < end, f"the run did not finish at every node: {st}"
                    await asyncio.sleep(0.5)
                    try:
                        await client.refresh()
                        st = await client.statuses(run_id)
                    except ClientError:
                        st = {}
                rep = await client.report(run_id)
                models = {i: await client.result(run_id, node=i) for i in ids}
                return run_id, st, rep, models
            finally:
                await client.close()

        run_id, st, rep, models = asyncio.run(go())
    finally:
        cl.stop(timeout=10)

    assert st[ids[VICTIM]]["restored"] >= 1, st[ids[VICTIM]]
    res = {i: rep.per_node[i]["result"] for i in ids}
    # every node holds the same final model
    m0 = np.asarray(models[ids[0]].values)
    for i in ids:
        assert np.array_equal(np.asarray(models[i].values), m0), i
    # the realised schedule: survivors as the leaders recorded them, contributions as the nodes made them
    survivors: list[list[int] | None] = [None] * ROUNDS
    for v, i in enumerate(ids):
        for r, u in res[i]["led"].items():
            assert int(r) % N == v
            survivors[int(r)] = None if u is None else [int(x) for x in u]
    contributed = {v: {int(r) for r in res[ids[v]]["contributed"]} for v in range(N)}
    for r, u in enumerate(survivors):
        if u is not None:
            assert set(u) <= {v for v in range(N) if r in contributed[v]}, (r, u)
    # the victim was a dropout of the round in flight when it was killed
    assert any(
        d["reason"] == "restarted-mid-round" for d in rep.per_node[ids[VICTIM]]["deviations_list"]
    ), rep.per_node[ids[VICTIM]]["deviations_list"]
    # the ledger: one charge per contribution, at every node
    for v, i in enumerate(ids):
        with Ledger(tmp_path / "nodes" / i / LEDGER_FILE) as lg:
            assert len(lg.entries(run_id)) == len(contributed[v]), (i, contributed[v])
    # the model: the update rule written out on the realised schedule
    tasks = [LogisticRegressionTask(X, y, clip=CLIP) for X, y in sh]
    s = share_std(SIGMA, 2 * CLIP, T, 1, dim=tasks[0].dim, frac_bits=24)
    released = [r for r in range(ROUNDS) if survivors[r]]
    ref = reference_model(
        tasks,
        sp.seed,
        ROUNDS,
        STEP,
        s,
        [survivors[r] or [] for r in range(ROUNDS)],
        drew=[sorted(v for v in range(N) if r in contributed[v]) for r in range(ROUNDS)],
    )
    assert (
        np.max(np.abs(m0 - ref)) <= len(released) * STEP * FixedPoint().error_bound(2 * N) + 1e-12
    )
