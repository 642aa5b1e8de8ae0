"""Node hosting: start-to-healthy time and memory per node of a hosted network (issue 12).

For each n (16, 256 and 1024; ``HUSHNET_BENCH_HOSTING_N=16,256`` to choose) a bootstrap and n nodes on a
hypercube are started with ``LocalCluster(per_process=K)``, K = n / P with P = the machine's cores (one
event loop per core) or smaller where one process's open-file limit does not allow that many
(``default_per_process``), as ``hushnet up --nodes n`` chooses for large n. Measured:

* start-to-healthy: from spawning the bootstrap until every node is a member, healthy and connected to
  every neighbour (the same check as ``hushnet up``), including the supervisor's status sweeps;
* RSS: the host processes' resident memory summed, per node, and the marginal cost of a hosted node
  (slope between the two largest n, so the interpreter and imports shared by a process cancel out);
* descriptors per host process and per node (from /proc).

Reported against the issue's goals (≤ 6 MB marginal per hosted node; 2048 nodes healthy in ≤ 60 s),
never asserted.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import tempfile
import time

DEFAULT_NS = (16, 256, 1024)
GOAL_MB = 6.0


def _ns() -> tuple[int, ...]:
    raw = os.environ.get("HUSHNET_BENCH_HOSTING_N")
    return tuple(int(x) for x in raw.split(",")) if raw else DEFAULT_NS


def _one(n: int, procs: int) -> dict:
    from hushnet.net.cluster import LocalCluster
    from hushnet.net.host import rss_mb

    d = int(math.log2(n))
    assert 2**d == n, "n must be a power of two (hypercube)"
    from hushnet.net.host import default_per_process

    # hosted even when small (that is what is measured); else what `hushnet up` would choose
    per_process = default_per_process(n)
    if per_process == 1:
        per_process = math.ceil(n / procs)
    with tempfile.TemporaryDirectory(prefix="hushnet-bench-host-") as tmp:
        cluster = LocalCluster(
            pathlib.Path(tmp), n, f"hypercube:{d}", restart=False, per_process=per_process
        )
        t0 = time.perf_counter()
        try:
            cluster.start(timeout=120)
            try:
                cluster.wait_healthy(timeout=max(120.0, n * 0.25))
            except TimeoutError as exc:  # reported, so the other sizes still count
                serving = sum(
                    p.log_path.read_text(errors="replace").count(" serving on ")
                    for p in cluster.processes
                )
                return {
                    "n": n,
                    "processes": len(cluster.processes),
                    "per_process": per_process,
                    "healthy": False,
                    "waited_s": round(time.perf_counter() - t0, 1),
                    "nodes_serving": serving,
                    "error": str(exc)[:300],
                }
            healthy_s = time.perf_counter() - t0
            time.sleep(2.0)  # let connections settle before reading memory
            pids = [p.pid for p in cluster.processes]
            rss = [rss_mb(pid) for pid in pids]
            fds = [len(os.listdir(f"/proc/{pid}/fd")) for pid in pids]
            boot_rss = rss_mb(cluster.bootstrap.pid)
        finally:
            cluster.stop(timeout=30)
    return {
        "n": n,
        "processes": len(pids),
        "per_process": per_process,
        "healthy": True,
        "start_to_healthy_s": round(healthy_s, 2),
        "rss_total_mb": round(sum(rss), 1),
        "rss_per_node_mb": round(sum(rss) / n, 2),
        "rss_per_process_mb": [round(r, 1) for r in rss],
        "fds_per_process": fds,
        "fds_per_node": round(sum(fds) / n, 2),
        "bootstrap_rss_mb": round(boot_rss, 1),
    }


def main(out_dir: pathlib.Path) -> dict:
    procs = os.cpu_count() or 1
    rows = []
    for n in _ns():
        row = _one(n, procs)
        rows.append(row)
        if not row["healthy"]:
            print(
                f"   n={n:5d}: NOT healthy after {row['waited_s']:.0f} s ({row['nodes_serving']} nodes serving)",
                flush=True,
            )
            continue
        print(
            f"   n={n:5d}: {row['processes']} processes × {row['per_process']} nodes, healthy in "
            f"{row['start_to_healthy_s']:.1f} s, {row['rss_per_node_mb']:.2f} MB and {row['fds_per_node']:.1f} "
            "descriptors per node",
            flush=True,
        )
    out = {
        "benchmark": "hosting",
        "cores": procs,
        "load_average": os.getloadavg(),
        "rows": rows,
        "goal_marginal_mb": GOAL_MB,
    }
    ok = [r for r in rows if r["healthy"]]
    if len(ok) >= 2:
        a, b = ok[-2], ok[-1]
        marginal = (b["rss_total_mb"] - a["rss_total_mb"]) / (b["n"] - a["n"])
        out["marginal_rss_mb_per_node"] = round(marginal, 3)
        out["marginal_between"] = [a["n"], b["n"]]
        print(
            f"   marginal memory per hosted node (n={a['n']}→{b['n']}): {marginal:.2f} MB (goal ≤ {GOAL_MB})",
            flush=True,
        )
    return out  # the runner writes it to benchmarks/out/bench_hosting.json


if __name__ == "__main__":
    import sys

    print(
        json.dumps(
            main(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/out")), indent=2
        )
    )
