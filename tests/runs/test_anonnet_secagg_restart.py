"""A secure-sum member SIGKILLed during its round and restarted keeps its membership (issue 14).

Real node processes (a :class:`~hushnet.net.cluster.LocalCluster`).  Member 3 of a ``secagg-sum`` over
complete:5 is killed as soon as its charge is on its ledger (its masked input is leaving), then
restarted on its state directory.  Before issue 14 the restarted node answered "no run" and its
report was lost; now it restores the run: either the round had already ended there (its result
stays) or it is a dropout of the round — never a second masked input, never a second charge.  The
leader's round ends (released over the survivors or aborted, with its reason).
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

from hushnet.client.core import AsyncClient, ClientError
from hushnet.net.cluster import LocalCluster
from hushnet.privacy.ledger import Ledger
from hushnet.runs.local_net import write_policy
from hushnet.runs.service import LEDGER_FILE
from hushnet.runs.spec import Budget, RunSpec

pytestmark = [pytest.mark.integration]

N, D, VICTIM = 5, 4, 3


def _charged(path: pathlib.Path, run_id: str) -> bool:
    if not path.exists():
        return False
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return (
            db.execute("SELECT 1 FROM entries WHERE run_id = ?", (run_id,)).fetchone() is not None
        )
    except sqlite3.OperationalError:
        return False
    finally:
        db.close()


@pytest.mark.timeout(240)
def test_secure_sum_member_killed_mid_round_keeps_its_membership(tmp_path: pathlib.Path) -> None:
    rng = np.random.default_rng(7)
    for i in range(N):
        write_policy(tmp_path / "nodes" / f"n{i}", rng.random(D), None, 1e6, 1e-5)
    sp = RunSpec(
        protocol="secagg-sum",
        task="sum",
        graph=f"complete:{N}",
        steps=1,
        seed=4,
        budget=Budget(1e6, 1e-5),
        sigma=0.5,
        noise="public-seed",
        protocol_params={"round_timeout": 4.0, "threshold": 3},
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
                end = time.monotonic() + 60
                while not _charged(ledger, run_id):
                    assert time.monotonic() < end, "member 3 never charged its input"
                    await asyncio.sleep(0.005)
                os.kill(victim.pid, signal.SIGKILL)
                victim.proc.wait(timeout=10)
                await task
                victim.spawn()
                st, end = {}, time.monotonic() + 120
                while not (
                    isinstance(st.get(ids[VICTIM]), dict)
                    and isinstance(st.get(ids[0]), dict)
                    and st[ids[VICTIM]].get("state") == "finished"
                    and st[ids[0]].get("state") == "finished"
                ):
                    assert time.monotonic() < end, (
                        f"the run did not end at the leader and the restarted member: {st}"
                    )
                    await asyncio.sleep(0.3)
                    try:
                        await client.refresh()
                        st = await client.statuses(run_id)
                    except ClientError:
                        st = {}
                rep = await client.report(run_id)
                return run_id, st, rep
            finally:
                await client.close()

        run_id, st, rep = asyncio.run(go())
    finally:
        cl.stop(timeout=10)

    assert st[ids[VICTIM]]["restored"] >= 1, st[ids[VICTIM]]
    res = rep.per_node[ids[VICTIM]]["result"]
    assert res.get("status") in ("released", "dropped-out"), res
    if res["status"] == "dropped-out":
        assert "restarted mid-round" in res["reason"]
    lead = rep.per_node[ids[0]]["result"]
    assert lead.get("status") in ("released", "aborted"), lead
    with Ledger(tmp_path / "nodes" / ids[VICTIM] / LEDGER_FILE) as lg:
        assert (
            len(lg.entries(run_id)) == 1
        )  # charged once, when its masked input left; not again on restart
