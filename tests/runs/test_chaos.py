"""Chaos test (issue 14): 33 nodes hosted in five OS processes (four of eight nodes, one single node) run
a durable walk, a gossip run and three secure sums while a seeded chaos driver SIGKILLs and restarts
host processes (the single-node process is a single node) and cuts links in both directions (each
end's own dialing: ``net.cut``, enabled by ``HUSHNET_FAULT_INJECTION=1``).

Checked afterwards:

* every run finishes or ends in a reported, explained state (the walk finishes or is ``holder-lost``
  naming its holder; the gossip run is finished at every node; each sum is released or aborted with
  its reason at its leader, and a member that restarted mid-round says it dropped out);
* no token is lost silently: the walk reaches its last step;
* every node's ledger equals an independent replay of the realised schedule — the walk's charges
  against the simulator's replay of the same seeded walk (public-seed noise: the walk is
  deterministic whatever the crashes), the gossip run's ledgers against the certified loss on the
  realised schedule rebuilt from every node's durable records (``max(charge at start, realised)``),
  each sum's charges against its release records (one charge per member whose input was released,
  none for non-members);
* no node's lifetime spending exceeds its budget.

The figures (runs, kills, cuts, recovered, seconds) are printed.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import random
import signal
import time
from dataclasses import replace

import numpy as np
import pytest
from helpers.runs import write_node_data  # noqa: E402

from hushnet.client.core import AsyncClient, ClientError, RunRefusedError  # noqa: E402
from hushnet.families.gossip.accounting import realised_curves  # noqa: E402
from hushnet.families.gossip.operator import settle_run  # noqa: E402
from hushnet.net.cluster import LocalCluster  # noqa: E402
from hushnet.privacy.graphs import parse_graph  # noqa: E402
from hushnet.privacy.ledger import Ledger  # noqa: E402
from hushnet.protocols.registry import build_from_spec, transition_matrix  # noqa: E402
from hushnet.runs.service import LEDGER_FILE  # noqa: E402
from hushnet.runs.spec import Budget, RunSpec  # noqa: E402
from hushnet.sim import Simulator  # noqa: E402
from hushnet.tasks import LogisticRegressionTask  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SEED = 1414
N, PER_PROCESS, GRAPH = 33, 8, "regular:33:4:3"
ROWS = 4  # data rows per node: one feature (logreg) = one value column (mean / sum tasks of dimension 4)
CHAOS_SECONDS = 25.0
BUDGET = Budget(1e6, 1e-5)


def _data(rng: np.random.Generator):
    shards = []
    for _ in range(N):
        X = rng.uniform(0.0, 1.0, size=(ROWS, 1))
        y = np.where(X[:, 0] + rng.normal(0, 0.2, ROWS) > 0.5, 1.0, -1.0)
        shards.append((X, y))
    return shards


def _specs(g):
    walk = RunSpec(
        protocol="rw-dpsgd",
        task="logreg",
        graph=GRAPH,
        steps=500,
        seed=SEED,
        budget=BUDGET,
        sigma=0.5,
        clip=1.0,
        step_size=0.05,
        cap=None,
        noise="public-seed",
        on_peer_down="pause",
    ).with_run_id()
    gossip = RunSpec(
        protocol="muffliato",
        task="mean",
        graph=GRAPH,
        steps=30,
        seed=SEED + 1,
        budget=BUDGET,
        sigma=1.0,
        noise="public-seed",
        protocol_params={"timeout": 1.0, "give_up_after": 3},
    ).with_run_id()
    sums = []
    for k, leader in enumerate((0, 11, 32)):
        members = sorted({leader, *(int(v) for v in g.neighbors(leader))})
        sums.append(
            RunSpec(
                protocol="secagg-sum",
                task="sum",
                graph=GRAPH,
                steps=1,
                seed=SEED + 2 + k,
                budget=BUDGET,
                sigma=0.5,
                noise="public-seed",
                protocol_params={
                    "round_timeout": 5.0,
                    "members": members,
                    "leader": leader,
                    "threshold": 3,
                    "round_id": k,
                },
            ).with_run_id()
        )
    return walk, gossip, sums


def _ledger(state: pathlib.Path, node: str) -> Ledger:
    return Ledger(state / "nodes" / node / LEDGER_FILE)


def test_chaos_33_hosted_nodes_walk_gossip_secure_sums(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t_start = time.monotonic()
    rng = random.Random(SEED)
    shards = _data(np.random.default_rng(SEED))
    write_node_data(tmp_path, shards, epsilon=BUDGET.epsilon, delta=BUDGET.delta)
    monkeypatch.setenv(
        "HUSHNET_FAULT_INJECTION", "1"
    )  # the node processes inherit it: net.cut is served
    g = parse_graph(GRAPH)
    edges = sorted({(min(a, b), max(a, b)) for a in range(N) for b in g.neighbors(a)})
    ids = [f"n{i}" for i in range(N)]
    walk, gossip, sums = _specs(g)
    figures = {
        "runs": 2 + len(sums),
        "kills": 0,
        "host_kills": 0,
        "single_node_kills": 0,
        "cuts": 0,
        "cut_refused": 0,
        "recovered": 0,
        "refused_submits": 0,
    }
    cl = LocalCluster(tmp_path, N, GRAPH, restart=False, per_process=PER_PROCESS)
    try:
        cl.start(timeout=120)
        cl.wait_healthy(timeout=150)
        t_up = time.monotonic()

        async def control(client, node, cmd, args):
            return await client._control(node, cmd, args, timeout=15.0)  # noqa: SLF001

        async def serving(client, nodes, timeout=90.0) -> bool:
            end = time.monotonic() + timeout
            while time.monotonic() < end:
                try:
                    await client.refresh()
                    await asyncio.gather(*(control(client, n, "status", {}) for n in nodes))
                    return True
                except Exception:  # noqa: BLE001 - still coming back
                    await asyncio.sleep(0.5)
            return False

        async def chaos(client):
            end = time.monotonic() + CHAOS_SECONDS
            while time.monotonic() < end:
                if rng.random() < 0.35:
                    k = rng.randrange(len(cl.processes))
                    proc = cl.processes[k]
                    hosted = [v.name for v in cl.nodes if v.log_path == proc.log_path]
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.proc.wait(timeout=10)
                    figures["kills"] += 1
                    figures["single_node_kills" if len(hosted) == 1 else "host_kills"] += 1
                    await asyncio.sleep(rng.uniform(0.3, 2.0))
                    proc.spawn()
                    cl._sync_views()  # noqa: SLF001
                    if await serving(client, hosted):
                        figures["recovered"] += 1
                else:
                    a, b = edges[rng.randrange(len(edges))]
                    try:
                        await control(client, ids[a], "net.cut", {"peers": [ids[b]], "cut": True})
                        await control(client, ids[b], "net.cut", {"peers": [ids[a]], "cut": True})
                        figures["cuts"] += 1
                    except ClientError:
                        figures["cut_refused"] += 1
                    await asyncio.sleep(rng.uniform(0.5, 3.0))
                    for x, y in ((a, b), (b, a)):
                        try:
                            await control(
                                client, ids[x], "net.cut", {"peers": [ids[y]], "cut": False}
                            )
                        except ClientError:
                            pass  # restarted meanwhile: its cuts are gone with its memory

        async def sums_over_time(client):
            started = []
            for k, sp in enumerate(sums):
                await asyncio.sleep(6.0 if k else 2.0)
                for attempt in range(20):
                    # a member may be down right now: the submit is refused, with the reasons, and the run
                    # cancelled wherever it was accepted; the operator tries again with a new round id
                    try_sp = replace(
                        sp,
                        run_id="",
                        protocol_params={**sp.protocol_params, "round_id": 100 * k + attempt},
                    ).with_run_id()
                    try:
                        await client.start_run(try_sp)
                        started.append(try_sp)
                        break
                    except RunRefusedError as exc:
                        figures["refused_submits"] += 1
                        assert exc.decisions and all(
                            d.get("accept") or d.get("reason") for d in exc.decisions.values()
                        )
                    except ClientError:
                        figures["refused_submits"] += 1
                    await asyncio.sleep(1.0)
                else:
                    raise AssertionError(f"secure sum {k} could not be started in 20 attempts")
            return started

        async def terminal(client, run_id, nodes, timeout):
            end, st = time.monotonic() + timeout, {}
            while time.monotonic() < end:
                try:
                    await client.refresh()
                    st = await client.statuses(run_id)
                except ClientError:
                    st = {}
                if all(
                    isinstance(st.get(n), dict)
                    and st[n].get("state") in ("finished", "closed", "stopped", "cancelled")
                    for n in nodes
                ):
                    return st
                await asyncio.sleep(0.5)
            raise AssertionError(f"run {run_id} did not end at {nodes} within {timeout} s: {st}")

        async def go():
            client = await AsyncClient.connect(
                tmp_path, timeout=150.0
            )  # a loaded box: submits take a while
            try:
                # the gossip run first: its acceptance (the certified projection at every node) is the
                # heaviest computation of the test and should not compete with the walk's traffic
                gossip_id = await client.start_run(gossip)
                walk_id = await client.start_run(walk)
                _, started = await asyncio.gather(chaos(client), sums_over_time(client))
                assert await serving(client, ids, 120), (
                    "not every node serves again after the chaos"
                )
                out = await client.watch(walk_id, progress=False, timeout=120, pause_timeout=60)
                g_st = await terminal(client, gossip_id, ids, 120)
                settled = await settle_run(client, gossip_id, ids)
                recs = {}
                for nid in ids:
                    d = await control(client, nid, "run.schedule", {"run_id": gossip_id})
                    recs[int(d["vertex"])] = d["records"]
                sum_docs = []
                for sp in started:
                    rid = sp.run_id
                    members = [ids[v] for v in sp.protocol_params["members"]]
                    st = await terminal(client, rid, members, 60)
                    rep = await client.report(rid)
                    sum_docs.append((sp, st, rep))
                ledgers = await client.ledgers()
                model = await client.model(walk_id) if out.state == "finished" else None
                return walk_id, out, model, gossip_id, g_st, settled, recs, sum_docs, ledgers
            finally:
                await client.close()

        walk_id, out, model, gossip_id, g_st, settled, recs, sum_docs, ledgers = asyncio.run(go())
    finally:
        cl.stop(timeout=15)
    t_end = time.monotonic()
    figures.update(
        up_seconds=round(t_up - t_start, 1),
        total_seconds=round(t_end - t_start, 1),
        gossip_nodes_restored=sum(
            1 for d in g_st.values() if isinstance(d, dict) and d.get("restored")
        ),
        walk_step=out.step,
        walk_state=out.state,
        sums=[
            (rep.per_node[ids[sp.protocol_params["leader"]]].get("result") or {}).get("status")
            for sp, _, rep in sum_docs
        ],
        sum_members_dropped_out=sum(
            1
            for sp, _, rep in sum_docs
            for v in sp.protocol_params["members"]
            if ((rep.per_node[ids[v]].get("result") or {}).get("status") == "dropped-out")
        ),
    )
    print(f"\nchaos figures: {figures}")

    # ---- the walk: finished (no token lost), charges = the simulator's replay of the same walk --------
    assert out.state == "finished" and out.step == walk.steps, (out, figures)
    tasks = [LogisticRegressionTask(X, y, clip=1.0) for X, y in shards]
    sim = Simulator(build_from_spec(walk, tasks)).run()
    np.testing.assert_allclose(model, sim.model, rtol=0, atol=1e-12)
    counts = sim.ledger_counts("gradient")
    for v in range(N):
        with _ledger(tmp_path, ids[v]) as led:
            got = sum(
                1 for e in led.entries(walk_id) if not e["note"].startswith("deviation top-up")
            )
        assert got == int(counts[v]), (ids[v], got, int(counts[v]))

    # ---- the gossip run: finished everywhere, every round recorded once, ledger = max(start, realised) --
    for nid in ids:
        assert g_st[nid]["state"] == "finished", (nid, g_st[nid])
        assert "error" not in settled[nid], (nid, settled[nid])
    for v in range(N):
        assert [r["round"] for r in recs[v]] == list(range(gossip.steps)), v
    W = transition_matrix(gossip.graph, gossip.weights)
    for v in range(N):
        with _ledger(tmp_path, ids[v]) as led:
            orders = led.orders
            targets = [ids[u] for u in range(N) if u != v]
            rows = []
            for e in led.entries(gossip_id):
                rows.append(
                    np.stack([np.asarray(e["rdp"].get(t, np.zeros(orders.size))) for t in targets])
                )
        real = realised_curves(gossip, v, ids, recs, orders, W)
        start, total = rows[0], np.sum(rows, axis=0)
        want = np.maximum(start, real)
        assert np.allclose(total, want, rtol=1e-6, atol=1e-9), (
            ids[v],
            float(np.max(np.abs(total - want))),
        )

    # ---- the secure sums: explained ends; charges = release records ---------------------------------
    for sp, st, rep in sum_docs:
        members = [ids[v] for v in sp.protocol_params["members"]]
        leader = ids[sp.protocol_params["leader"]]
        lres = rep.per_node[leader]["result"]
        assert lres.get("status") in ("released", "aborted", "dropped-out"), (
            sp.run_id,
            st[leader],
            lres,
        )
        if lres["status"] != "released":
            assert lres.get("reason"), lres
        released = {ids[int(v)] for v in lres.get("released_for", [])}
        for nid in ids:
            with _ledger(tmp_path, nid) as led:
                n = len(led.entries(sp.run_id))
            if nid not in members:
                assert n == 0, (sp.run_id, nid, n)
            elif nid in released:
                assert n == 1, (sp.run_id, nid, n)
            else:
                assert n <= 1, (sp.run_id, nid, n)
            res = rep.per_node[nid].get("result") or {} if nid in members else {}
            if res.get("status") == "dropped-out":
                assert "restarted mid-round" in res["reason"]

    # ---- budgets -------------------------------------------------------------------------------------
    for nid, doc in ledgers.items():
        assert isinstance(doc, dict), (nid, doc)
        for t, s in doc["spent"].items():
            assert s["epsilon"] <= doc["budget"]["epsilon"], (nid, t, s)
    assert (
        figures["kills"] >= 2 and figures["cuts"] >= 2 and figures["recovered"] == figures["kills"]
    ), figures
