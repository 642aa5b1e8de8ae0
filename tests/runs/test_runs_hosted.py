"""A hosted network: 64 complete peers in 2 OS processes (``hushnet up --per-process 32``), real mutual
TLS on 127.0.0.1:port, comes up healthy and runs a private random walk to completion through the client,
with every node's ledger charged for exactly the contributions it made; a host process killed with
SIGKILL takes its 32 nodes down, is restarted, and they rejoin with the same identities."""

from __future__ import annotations

import json  # noqa: E402
import os  # noqa: E402
import pathlib
import signal  # noqa: E402

import pytest
from helpers.net import UpProcess, cli, pid_alive, wait_for  # noqa: E402
from helpers.runs import synthetic_shards, write_node_data  # noqa: E402

from hushnet.client import Client  # noqa: E402
from hushnet.runs.spec import Budget, RunSpec  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

N, GRAPH, PER_PROCESS = 64, "hypercube:6", 32


def test_64_hosted_nodes_in_two_processes_run_a_walk(tmp_path: pathlib.Path) -> None:
    state = tmp_path / "net"
    shards, _ = synthetic_shards(N, per_node=10, d=4, seed=3)
    write_node_data(state, shards, epsilon=1e6, delta=1e-5)
    up = UpProcess(state, N, GRAPH, extra=("--per-process", str(PER_PROCESS), "--timeout", "150"))
    try:
        up.wait_up(timeout=180)
        doc = up.cluster()
        pids = {n["pid"] for n in doc["nodes"]}
        assert len(doc["nodes"]) == N and len(pids) == N // PER_PROCESS == len(doc["processes"])
        assert len({n["address"] for n in doc["nodes"]}) == N
        assert all(n["address"].startswith("127.0.0.1:") for n in doc["nodes"])

        client = Client(state)
        try:
            spec = RunSpec(
                protocol="rw-dpsgd",
                task="logreg",
                graph=GRAPH,
                steps=120,
                seed=5,
                budget=Budget(1e6, 1e-5),
                sigma=1.0,
                clip=1.0,
                step_size=0.1,
                cap=None,
            ).with_run_id()
            run_id = client.start_run(spec)
            out = client.watch(run_id, progress=False, timeout=150)
            assert out.state == "finished", out
            assert out.step == spec.steps
            rep = client.report(run_id)
            ids = [f"n{i}" for i in range(N)]
            counts = [rep.per_node[i]["contributions"] for i in ids]
            assert sum(counts) == spec.steps and sum(c > 0 for c in counts) > N // 4
            ledgers = client.ledgers()
            for i, count in zip(
                ids, counts
            ):  # a node's ledger is charged exactly when it contributed
                led = ledgers[i]
                assert (led["entries"] > 0) == (count > 0), (i, count, led)
                if count:
                    assert max(v["epsilon"] for v in led["spent"].values()) > 0
            s = rep.summary()
            assert s["worst_pair_epsilon"] >= s["mean_pair_epsilon"] > 0
        finally:
            client.close()

        # what a process crash takes with it: all its nodes; up restarts it and they rejoin as themselves
        victim = doc["processes"][1]
        certs = {i: (state / "nodes" / f"n{i}" / "identity.json").read_text() for i in (32, 63)}
        os.kill(victim["pid"], signal.SIGKILL)
        wait_for(
            lambda: (lambda p: p["pid"] != victim["pid"] and pid_alive(p["pid"]))(
                up.cluster()["processes"][1]
            ),
            60,
            what="host process restarted",
        )

        def healthy():
            p = cli("status", "--state-dir", str(state), "--json", "--timeout", "5")
            if p.returncode != 0:
                return None
            st = json.loads(p.stdout)
            return (
                st
                if len(st["nodes"]) == N and all(n["all_neighbors_connected"] for n in st["nodes"])
                else None
            )

        wait_for(healthy, 120, what="all 64 nodes healthy again")
        assert {n["pid"] for n in up.cluster()["nodes"][32:]} == {
            up.cluster()["processes"][1]["pid"]
        }
        for i, before in certs.items():  # same node id, vertex and key after the rejoin
            a, b = (
                json.loads(before),
                json.loads((state / "nodes" / f"n{i}" / "identity.json").read_text()),
            )
            assert (a["node_id"], a["vertex"], a["key_sha256"]) == (
                b["node_id"],
                b["vertex"],
                b["key_sha256"],
            )
    finally:
        up.close()
