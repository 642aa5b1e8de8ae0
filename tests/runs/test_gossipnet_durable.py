"""A gossip node process SIGKILLed mid-run and restarted: its schedule records survive, settlement succeeds.

Real node processes (``hushnet node serve`` children of a :class:`~hushnet.net.cluster.LocalCluster`,
mutual TLS on 127.0.0.x).  Node 2 is killed with SIGKILL once it has closed a few rounds, then
restarted on the same state directory.  Checks: the restarted node answers ``run.schedule`` from its
durable store (a prefix of the run's rounds), the live nodes finish around the hole, every node —
the restarted one included, which no longer holds the run in memory — settles, and every persistent
ledger holds at least the certified loss on the realised schedule, whose unrecorded rounds of the
crashed node are completed in the safe direction (never smaller than the replay without completion).
Settling the restarted node again tops nothing up (what it was charged is read from its ledger).

The nodes run with ``HUSHNET_RUNS_DURABLE=0`` (no run checkpoints): the restarted node does not take the
run up again — the case of a node that never rejoins.  With checkpoints it rejoins and finishes the run
(``test_gossipnet_rejoin.py``).
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
from helpers.gossipnet import spec  # noqa: E402

from hushnet.client.core import AsyncClient, ClientError  # noqa: E402
from hushnet.families.gossip.accounting import (  # noqa: E402
    certified_sensitivities,
    rdp_curves,
    realised_curves,
    realised_schedule,
)
from hushnet.families.gossip.operator import settle_run  # noqa: E402
from hushnet.families.gossip.store import STORE_FILE  # noqa: E402
from hushnet.net.cluster import LocalCluster  # noqa: E402
from hushnet.privacy.ledger import Ledger  # noqa: E402
from hushnet.protocols.registry import transition_matrix  # noqa: E402
from hushnet.runs.local_net import write_policy  # noqa: E402
from hushnet.runs.service import LEDGER_FILE  # noqa: E402

pytestmark = [pytest.mark.integration]

N = 3
GRAPH = "ring:3"
ROUNDS = 40
VICTIM = 2


def _stored_rounds(state: pathlib.Path, run_id: str) -> int:
    path = state / "nodes" / f"n{VICTIM}" / STORE_FILE
    if not path.exists():
        return 0
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return int(
            db.execute("SELECT COUNT(*) FROM records WHERE run_id = ?", (run_id,)).fetchone()[0]
        )
    except sqlite3.OperationalError:
        return 0
    finally:
        db.close()


def _ledger_curves(state: pathlib.Path, v: int, run_id: str, ids: list[str]) -> np.ndarray:
    led = Ledger(state / "nodes" / ids[v] / LEDGER_FILE)
    try:
        out = np.zeros((N - 1, led.orders.size))
        targets = [ids[u] for u in range(N) if u != v]
        for e in led.entries(run_id):
            for t, c in e["rdp"].items():
                out[targets.index(t)] += c
        return out
    finally:
        led.close()


def _wait(pred, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.mark.timeout(240)
def test_sigkilled_gossip_node_restarts_and_settles(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HUSHNET_RUNS_DURABLE", "0")  # the node processes inherit it
    rng = np.random.default_rng(3)
    values = [rng.random(2) for _ in range(N)]
    for i in range(N):
        write_policy(tmp_path / "nodes" / f"n{i}", values[i], None, 1e6, 1e-5)
    cl = LocalCluster(tmp_path, N, GRAPH, restart=False)
    sp = spec("muffliato", GRAPH, ROUNDS, 21, timeout=1.0, give_up_after=2)
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
                assert 3 <= killed_at < ROUNDS, (
                    f"node 2 recorded {killed_at} rounds: not killed mid-run"
                )
                victim.spawn()  # same state directory: same identity, same ledger, same schedule store

                async def live_finished():
                    st = await client.statuses(run_id)
                    return all(
                        isinstance(st.get(i), dict) and st[i].get("state") == "finished"
                        for i in ids
                        if i != ids[VICTIM]
                    )

                end = time.monotonic() + 120
                while not await live_finished():
                    assert time.monotonic() < end, (
                        "the live nodes did not finish around the killed node"
                    )
                    await asyncio.sleep(0.2)
                doc, end = None, time.monotonic() + 120
                while (
                    doc is None
                ):  # the restarted process serves again (same address, same identity)
                    try:
                        await client.refresh()
                        doc = await client._control(ids[VICTIM], "run.schedule", {"run_id": run_id})  # noqa: SLF001
                    except ClientError:
                        assert time.monotonic() < end, (
                            "the restarted node did not answer run.schedule"
                        )
                        await asyncio.sleep(0.3)
                await asyncio.to_thread(cl.wait_healthy, 120)
                settled = await settle_run(client, run_id, ids)
                recs = {}
                for nid in ids:
                    d = await client._control(nid, "run.schedule", {"run_id": run_id})  # noqa: SLF001
                    recs[int(d["vertex"])] = d["records"]
                again = await client._control(
                    ids[VICTIM],
                    "run.settle",  # noqa: SLF001
                    {"run_id": run_id, "records": recs},
                    timeout=60.0,
                )
                rep = await client.report(run_id)
                return run_id, killed_at, doc, settled, again, recs, rep
            finally:
                await client.close()

        run_id, killed_at, doc, settled, again, recs, rep = asyncio.run(go())
    finally:
        cl.stop(timeout=10)

    # the live nodes declared the killed node gone (a deviation each) and finished without it; the
    # restarted node does not hold the run any more (its report is an error, not a fresh run)
    for nid in ids[:VICTIM] + ids[VICTIM + 1 :]:
        r = rep.per_node[nid]
        assert VICTIM in r["result"]["gone"], r["result"]
        assert any(
            d["reason"] == "neighbour-gone" and d["detail"]["neighbour"] == VICTIM
            for d in r["deviations_list"]
        )
    assert "error" in rep.per_node[ids[VICTIM]]
    # the restarted node answered from its durable store: the prefix it wrote before the SIGKILL
    assert doc["state"] == "lost" and doc["durable"] and doc["vertex"] == VICTIM
    assert [r["round"] for r in doc["records"]] == list(range(len(doc["records"])))
    assert killed_at <= len(doc["records"]) < ROUNDS
    c = len(doc["records"])
    for nid, s in settled.items():
        assert "error" not in s, (nid, s)
        assert s["records_from"] == list(range(N))
        assert s["completed"] == {str(VICTIM): c}, s  # the crash is completed, and said so
        assert s["bound"] == "certified"
    assert settled[ids[VICTIM]].get("recovered") is True
    assert "error" not in again and again["topped_up"] is False, again  # idempotent after a restart

    W = transition_matrix(sp.graph, sp.weights)
    for v in range(N):
        led = _ledger_curves(tmp_path, v, run_id, ids)
        with Ledger(tmp_path / "nodes" / ids[v] / LEDGER_FILE) as lg:
            orders = lg.orders
        real = realised_curves(sp, v, ids, recs, orders, W)
        # the ledger holds at least the certified loss on the (safely completed) realised schedule
        assert np.all(led >= real * (1 - 1e-9) - 1e-12), v
        # completion never decreases a loss: compare with the replay of the bare records
        bare = realised_schedule(recs, N, ROUNDS)
        sens = certified_sensitivities(sp, v, W, bare).sum(axis=0)
        bare_curves = rdp_curves(sens[[u for u in range(N) if u != v]], sp.sigma, orders)
        assert np.all(real >= bare_curves * (1 - 1e-9) - 1e-12), v
    assert _ledger_curves(tmp_path, VICTIM, run_id, ids).any(), "the killed node's charge was lost"
