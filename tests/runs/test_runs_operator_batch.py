"""Watch, status, report, models and ledgers of a run over hosted nodes: one call per host process.

``hushnet up --nodes 17 --per-process 8`` (three real processes: 8, 8 and 1 node; mutual TLS on
127.0.0.1) runs a private walk; the operator's client watches it with ``host.batch`` long polls (no
per-node ``run.events`` call), and every per-node answer the batch returns — run statuses, the privacy
report's rows, models, ledgers, the run list — equals what the per-node calls return, with three calls
where the per-node path makes seventeen.  A host process killed (``--no-restart``) leaves its nodes
reported unreachable, the others answering through their hosts.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal

import numpy as np
import pytest
from helpers.net import UpProcess  # noqa: E402
from helpers.runs import synthetic_shards, write_node_data  # noqa: E402

from hushnet.client.core import AsyncClient, ClientError  # noqa: E402
from hushnet.runs.spec import Budget, RunSpec  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

N, GRAPH, PER_PROCESS = 17, "ring:17", 8


def test_batched_operator_commands_equal_per_node_ones(tmp_path: pathlib.Path) -> None:
    state = tmp_path / "net"
    shards, _ = synthetic_shards(N, per_node=10, d=4, seed=3)
    write_node_data(state, shards, epsilon=1e6, delta=1e-5)
    up = UpProcess(
        state,
        N,
        GRAPH,
        extra=("--per-process", str(PER_PROCESS), "--timeout", "150", "--no-restart"),
    )
    try:
        up.wait_up(timeout=180)
        doc = up.cluster()
        assert sorted(
            len([n for n in doc["nodes"] if n["pid"] == p["pid"]]) for p in doc["processes"]
        ) == [1, 8, 8]

        async def go() -> None:
            batch = await AsyncClient.connect(state)
            per_node = await AsyncClient.connect(state, batch=False)
            try:
                spec = RunSpec(
                    protocol="rw-dpsgd",
                    task="logreg",
                    graph=GRAPH,
                    steps=40,
                    seed=5,
                    budget=Budget(1e6, 1e-5),
                    sigma=1.0,
                    clip=1.0,
                    step_size=0.1,
                    cap=None,
                ).with_run_id()
                run_id = await batch.start_run(spec)
                before = dict(batch.op.calls)
                out = await batch.watch(run_id, progress=False, timeout=150)
                assert out.state == "finished" and out.step == spec.steps, out
                watched = {k: v - before.get(k, 0) for k, v in batch.op.calls.items()}
                # the watch: batches only (three hosts a sweep), then the close — no per-node event call
                assert watched.get("run.events", 0) == 0, watched
                assert watched["host.batch"] > 0

                fast = await batch.statuses(run_id)
                assert batch.last_calls == 3, batch.last_calls  # one call per host process
                slow = await per_node.statuses(run_id)
                assert per_node.last_calls == N
                assert fast == slow and {s["state"] for s in fast.values()} <= {
                    "finished",
                    "closed",
                }

                # the batch asks the packed form (float64 rows), the per-node client the old plain JSON: equal
                per_node.packed_reports = False
                rep_fast, rep_slow = await batch.report(run_id), await per_node.report(run_id)
                assert rep_fast.per_node == rep_slow.per_node
                assert all(
                    "certified" in r and "packed_rows" not in r for r in rep_fast.per_node.values()
                )
                assert sum(r["contributions"] for r in rep_fast.per_node.values()) == spec.steps

                led_fast, led_slow = await batch.ledgers(), await per_node.ledgers()
                assert led_fast == led_slow and set(led_fast) == {f"n{i}" for i in range(N)}

                m_fast, m_slow = await batch.models(run_id), await per_node.models(run_id)
                assert m_fast.keys() == m_slow.keys() and len(m_fast) == 1
                for k in m_fast:
                    assert np.array_equal(m_fast[k], m_slow[k])
                assert await batch.list_runs() == await per_node.list_runs()

                # a watch's brief sweep (issue 12): events and the status without what a visit changes,
                # with its digest; asked again with the digests, a node with nothing new answers
                # nothing (named by its host, unsigned) — a node with events still answers in full
                ids = sorted(fast)

                def events(c, digests=None, after=None):
                    return c._all(  # noqa: SLF001
                        "run.events",
                        nodes=ids,
                        per_node={
                            i: {
                                "run_id": run_id,
                                "after": (after or {}).get(i, 10**6),
                                "brief": True,
                                **({"seen": digests[i]} if digests else {}),
                            }
                            for i in ids
                        },
                    )

                first = await events(batch)
                assert all(
                    r["events"] == [] and "token" not in r["status"] and "digest" in r
                    for r in first.values()
                ), first
                digests = {i: r["digest"] for i, r in first.items()}
                assert await events(per_node) == first  # the same bytes per node
                again = await events(batch, digests)
                assert again == dict.fromkeys(ids) and batch.hosts.same == N
                assert batch.last_calls == 3
                assert await events(per_node, digests) == dict.fromkeys(ids)
                news = await events(batch, digests, after={"n0": 0})
                assert news["n0"]["events"] and news["n0"]["status"] == first["n0"]["status"]
                assert [i for i, r in news.items() if r is not None] == ["n0"]
                stale = await events(batch, {**digests, "n1": "0" * 32})
                assert stale["n1"] == first["n1"]

                # an unknown run: each node's own error, as per node
                nope_fast = await batch.statuses("no-such-run")
                nope_slow = await per_node.statuses("no-such-run")
                assert {i: str(e) for i, e in nope_fast.items()} == {
                    i: str(e) for i, e in nope_slow.items()
                }
                assert all(isinstance(e, ClientError) for e in nope_fast.values())

                # a host process dies: its nodes are unreachable, the others still answer by host
                sizes = {
                    p["pid"]: sum(n["pid"] == p["pid"] for n in doc["nodes"])
                    for p in doc["processes"]
                }
                victim = next(pid for pid, k in sizes.items() if k == PER_PROCESS)
                gone = {n["id"] for n in doc["nodes"] if n["pid"] == victim}
                os.kill(victim, signal.SIGKILL)
                await asyncio.sleep(0.5)
                res = await batch.statuses(run_id)
                for i, r in res.items():
                    if i in gone:
                        assert isinstance(r, ClientError) and "unreachable" in str(r), r
                    else:
                        assert r["state"] == fast[i]["state"], (i, r)
            finally:
                await batch.close()
                await per_node.close()

        asyncio.run(go())
    finally:
        up.close()
