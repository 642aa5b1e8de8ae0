"""The operator's commands over a hosted network: node by node against one ``host.batch`` call per host.

Why (issue 12): the client asked every node on its own — at n = 1024 in 3 host processes a watch sweep,
a status or a report was 1024 mutual-TLS Control RPCs served on the hosts' event loops, and the loops
stalled 2–10 s while 1024 reports were collected.  For each n (``HUSHNET_BENCH_OPERATOR_N``, default
128) a hypercube network is started in 3 host processes (``HUSHNET_BENCH_OPERATOR_PER_PROCESS``: that many
nodes per process instead), a private walk of n steps is run and watched
(once per path), then ``statuses``, ``report``, ``report_plain`` (the report's rows as plain JSON, the
form before the packed one: the same numbers), ``sweep`` (the status sweep of ``hushnet status`` /
``hushnet up``: each node's ``Status`` through its host's batch, against one ``Status`` call per node),
``models`` and ``ledgers`` are asked through each path, interleaved, ``HUSHNET_BENCH_OPERATOR_REPEAT``
times (default 2); ``HUSHNET_BENCH_OPERATOR_WATCH`` and ``HUSHNET_BENCH_OPERATOR_COMMANDS`` (comma lists)
pick the watches and commands.  Per command and path: wall time, Control RPCs the client made, the
hosts' event-loop lag (max over the command, from the hosts' ``host_load`` lines written every second)
and, for batches, the seconds the hosts' loops spent in the commands and in signing (``host_work_s``).
At the end the network is stopped and the bootstrap's log says how its nodes left: in ``LeaveHost``
batches (``leave``: calls, nodes) or one ``Leave`` each; the rest were removed by lease expiry.
Reported, never asserted (a shared 2-core machine: quote the load average beside the numbers); ratios
batch / per node are of the same run.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import pathlib
import re
import tempfile
import time

from hushnet.net.load import host_load_lines


def _ns() -> tuple[int, ...]:
    raw = os.environ.get("HUSHNET_BENCH_OPERATOR_N")
    return tuple(int(x) for x in raw.split(",")) if raw else (128,)


def _lines(cluster) -> list[int]:
    return [len(host_load_lines(p.log_path.read_text(errors="replace"))) for p in cluster.processes]


def _lag_since(cluster, mark: list[int]) -> float:
    """The largest loop lag (s) the hosts logged after ``mark`` (waits for the next line of each)."""
    time.sleep(1.3)  # the window that holds the command's end is logged a second later
    worst = 0.0
    for p, k in zip(cluster.processes, mark):
        for line in host_load_lines(p.log_path.read_text(errors="replace"))[k:]:
            worst = max(worst, line["lag_max_s"])
    return worst


async def _measure(cluster, n: int, repeat: int) -> dict:
    from hushnet.client.core import AsyncClient
    from hushnet.runs.spec import Budget, RunSpec

    state = cluster.state_dir
    clients = {
        "per_node": await AsyncClient.connect(state, batch=False, timeout=60.0),
        "batch": await AsyncClient.connect(state, timeout=60.0),
    }
    out: dict = {"watch": {}, "commands": {}}
    try:
        runs = {}
        watched = os.environ.get("HUSHNET_BENCH_OPERATOR_WATCH", "per_node,batch").split(",")
        for path, client in clients.items():
            if path not in watched:
                continue
            spec = RunSpec(
                protocol="rw-dpsgd",
                task="logreg",
                graph=f"hypercube:{int(math.log2(n))}",
                steps=n,
                seed=5,
                budget=Budget(1e6, 1e-5),
                sigma=1.0,
                clip=1.0,
                step_size=0.1,
                cap=None,
            ).with_run_id()
            t = time.perf_counter()
            run_id = await client.start_run(spec)
            accepted = time.perf_counter() - t
            mark, calls = await asyncio.to_thread(_lines, cluster), dict(client.op.calls)
            t = time.perf_counter()
            o = await client.watch(run_id, progress=False, timeout=600)
            span = time.perf_counter() - t
            made = {
                k: v - calls.get(k, 0) for k, v in client.op.calls.items() if v - calls.get(k, 0)
            }
            out["watch"][path] = {
                "state": o.state,
                "steps": o.step,
                "accept_s": round(accepted, 1),
                "watch_s": round(span, 1),
                "calls": made,
                "calls_per_s": round(sum(made.values()) / span, 1),
                "lag_max_s": await asyncio.to_thread(_lag_since, cluster, mark),
            }
            runs[path] = run_id
            print(f"     watch {path:8s} {out['watch'][path]}", flush=True)
        run_id = next(iter(runs.values()))
        commands = os.environ.get(
            "HUSHNET_BENCH_OPERATOR_COMMANDS", "statuses,report,report_plain,sweep,models,ledgers"
        )
        for cmd in commands.split(","):
            rows: dict[str, list] = {p: [] for p in clients}
            for _ in range(repeat):
                for path, client in clients.items():
                    mark, calls = await asyncio.to_thread(_lines, cluster), dict(client.op.calls)
                    status_calls = _count_status(client.op)
                    client.host_work_s = {}
                    t = time.perf_counter()
                    if cmd == "ledgers":
                        res = await client.ledgers()
                    elif cmd == "sweep":  # hushnet status: batched, or one Status call per node
                        client.op.hosts.reset()
                        doc = await client.op.network_status(
                            timeout=max(3.0, n / 200), batch=path == "batch"
                        )
                        client.host_work_s = dict(client.op.hosts.host_work_s)
                        res = {e["id"]: e for e in doc["nodes"]}
                    elif cmd == "report_plain":
                        client.packed_reports = False
                        try:
                            res = await client.report(run_id)
                        finally:
                            client.packed_reports = True
                    else:
                        res = await getattr(client, cmd)(run_id)
                    span = time.perf_counter() - t
                    per = res.per_node if cmd.startswith("report") else res
                    errors = sum(
                        1 for v in per.values() if not isinstance(v, dict) and cmd != "models"
                    )
                    if cmd.startswith("report"):
                        errors = sum(1 for v in per.values() if "error" in v)
                    if cmd == "sweep":
                        errors = sum(1 for v in per.values() if not v.get("serving"))
                    rows[path].append(
                        {
                            "s": round(span, 2),
                            "calls": sum(client.op.calls.values())
                            - sum(calls.values())
                            + _count_status(client.op)
                            - status_calls,
                            "answers": len(per),
                            "errors": errors,
                            "lag_max_s": await asyncio.to_thread(_lag_since, cluster, mark),
                            # the batch path: seconds the hosts' loops spent in the commands and signing
                            "host_work_s": {k: round(v, 3) for k, v in client.host_work_s.items()},
                        }
                    )
                    print(f"     {cmd:8s} {path:8s} {rows[path][-1]}", flush=True)
            out["commands"][cmd] = rows
    finally:
        for c in clients.values():
            await c.close()
    return out


def _count_status(op) -> int:
    """``Status`` RPCs this operator made (counted by :func:`_counting_status`)."""
    return getattr(op, "status_calls", 0)


def _counting_status() -> None:
    """Count each operator's per-node ``Status`` calls (the sweep's per-node path)."""
    from hushnet.net.operator import Operator

    real = Operator.status
    if getattr(real, "counted", False):
        return

    async def status(self, node_id, address, timeout=3.0):
        self.status_calls = getattr(self, "status_calls", 0) + 1
        return await real(self, node_id, address, timeout=timeout)

    status.counted = True
    Operator.status = status


def _leaves(cluster) -> dict:
    """How the nodes left, from the bootstrap's log: ``LeaveHost`` batches and single ``Leave`` calls;
    from the hosts' logs: the leaves whose call failed (with why) or that the bootstrap refused."""
    text = cluster.bootstrap.log_path.read_text(errors="replace")
    batches = [int(k) for k in re.findall(r"(\d+) nodes left together", text)]
    single = len(re.findall(r"\bnode \S+ left\b", text))
    failed: dict[str, int] = {}
    refused = 0
    for p in cluster.processes:
        host = p.log_path.read_text(errors="replace")
        for k, why in re.findall(r"leaving failed for (\d+) nodes \((\w+)\)", host):
            failed[why] = failed.get(why, 0) + int(k)
        refused += len(re.findall(r"the bootstrap refused the leave of", host))
    return {
        "batches": len(batches),
        "left_in_batches": sum(batches),
        "left_alone": single,
        "failed": failed,
        "refused": refused,
    }


def _one(n: int, repeat: int) -> dict:
    import numpy as np

    from hushnet.net.cluster import LocalCluster
    from hushnet.runs.policy import NodePolicy
    from hushnet.runs.synthetic import planted_logistic_shards

    # 3 host processes, or HUSHNET_BENCH_OPERATOR_PER_PROCESS nodes each (2048: 410, 5 hosts, as bench_hosting)
    per_process = int(os.environ.get("HUSHNET_BENCH_OPERATOR_PER_PROCESS", 0)) or math.ceil(n / 3)
    os.environ["HUSHNET_HOST_LOAD_S"] = "1"  # the hosts inherit it: one lag line a second
    with tempfile.TemporaryDirectory(prefix="hushnet-bench-operator-") as tmp:
        state = pathlib.Path(tmp)
        for i, (X, y) in enumerate(planted_logistic_shards(n, m=10, d=4, seed=3)):
            d = state / "nodes" / f"n{i}"
            d.mkdir(parents=True, exist_ok=True)
            np.savez(d / "data.npz", X=X, y=y)
            NodePolicy.write(d, epsilon=1e6, delta=1e-5, data_path="data.npz")
        cluster = LocalCluster(
            state, n, f"hypercube:{int(math.log2(n))}", restart=False, per_process=per_process
        )
        t0 = time.perf_counter()
        try:
            cluster.start(timeout=120)
            cluster.wait_healthy(timeout=max(120.0, n * 0.5))
            healthy_s = time.perf_counter() - t0
            print(f"   n={n}: healthy after {healthy_s:.1f} s, load {os.getloadavg()}", flush=True)
            _counting_status()
            row = asyncio.run(_measure(cluster, n, repeat))
        finally:
            t = time.perf_counter()
            cluster.stop(timeout=30)
            stop_s = time.perf_counter() - t
        leave = {**_leaves(cluster), "stop_s": round(stop_s, 1)}
        print(f"   n={n}: stopped in {stop_s:.1f} s, leaves {leave}", flush=True)
    return {
        "n": n,
        "processes": len(cluster.processes),
        "per_process": per_process,
        "healthy_s": round(healthy_s, 1),
        **row,
        "leave": leave,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def main(out_dir: pathlib.Path) -> dict:
    repeat = int(os.environ.get("HUSHNET_BENCH_OPERATOR_REPEAT", "2"))
    rows = []
    for n in _ns():
        row = _one(n, repeat)
        rows.append(row)
        print(
            f"   n={n} ({row['processes']} hosts, healthy {row['healthy_s']} s), "
            f"load {row['load_average']}",
            flush=True,
        )
    return {"benchmark": "operator", "load_average": os.getloadavg(), "rows": rows}


if __name__ == "__main__":
    import sys

    out = main(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/out"))
    print(json.dumps(out, indent=2))
