"""Host event-loop load of an idle hosted network: what each host process spends per second once healthy.

Why (issue 12): at n = 1024 the host processes' event loops stalled 0.6–9 s under load and live links were
dropped on probe deadlines; a loop that is busy when nothing runs has less left for a run's rounds.  For
each n (``HUSHNET_BENCH_HOST_LOAD_N``, default 256; 1024 is the issue's size) a hypercube network is
started as ``hushnet up`` would host it, left idle ``HUSHNET_BENCH_HOST_LOAD_IDLE_S`` seconds (default
60) after healthy, and measured over that window:

* CPU seconds per second of the host processes, split into event loops / gRPC event-engine threads /
  the rest (from /proc), and of the bootstrap;
* event-loop lag (max and mean lateness of a 0.25 s sleep) and RPCs per second by kind (probe RPCs out,
  Health / Control / Status served, lease renewals, directory reads, probes skipped because the link
  carried traffic), from the hosts' ``host_load`` log lines (``HUSHNET_HOST_LOAD_S``).

Reported, never asserted (a shared 2-core machine: quote the load average beside the numbers).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import tempfile
import time

from benchmarks.bench_hosting import _cpu_s
from hushnet.net.load import cpu_split, host_load_lines


def _ns() -> tuple[int, ...]:
    raw = os.environ.get("HUSHNET_BENCH_HOST_LOAD_N")
    return tuple(int(x) for x in raw.split(",")) if raw else (256,)


def _one(n: int, idle_s: float, period_s: float) -> dict:
    from hushnet.net.cluster import LocalCluster
    from hushnet.net.host import default_per_process

    d = int(math.log2(n))
    assert 2**d == n, "n must be a power of two (hypercube)"
    per_process = default_per_process(n)
    if per_process == 1:
        per_process = math.ceil(n / (os.cpu_count() or 1))
    os.environ["HUSHNET_HOST_LOAD_S"] = str(period_s)  # the hosts inherit it
    with tempfile.TemporaryDirectory(prefix="hushnet-bench-load-") as tmp:
        cluster = LocalCluster(
            pathlib.Path(tmp), n, f"hypercube:{d}", restart=False, per_process=per_process
        )
        t0 = time.perf_counter()
        try:
            cluster.start(timeout=120)
            cluster.wait_healthy(timeout=max(120.0, n * 0.5))
            healthy_s = time.perf_counter() - t0
            pids = [p.pid for p in cluster.processes]
            skip = [
                len(host_load_lines(p.log_path.read_text(errors="replace")))
                for p in cluster.processes
            ]
            split0 = [cpu_split(pid) for pid in pids]
            boot0 = _cpu_s(cluster.bootstrap.pid)
            w0 = time.perf_counter()
            time.sleep(idle_s)
            span = time.perf_counter() - w0
            split1 = [cpu_split(pid) for pid in pids]
            boot1 = _cpu_s(cluster.bootstrap.pid)
            load = [round(x, 2) for x in os.getloadavg()]
            lines = []
            for p, k in zip(cluster.processes, skip):
                lines.extend(host_load_lines(p.log_path.read_text(errors="replace"))[k + 1 :])
        finally:
            cluster.stop(timeout=30)
    cpu = {k: round(sum(b[k] - a[k] for a, b in zip(split0, split1)) / span, 3) for k in split0[0]}
    rates: dict[str, float] = {}
    for line in lines:  # each host's rates, summed over hosts and averaged over their windows
        for k, v in line["rates"].items():
            rates[k] = rates.get(k, 0.0) + v * line["span_s"]
    covered = sum(line["span_s"] for line in lines) / max(len(pids), 1)
    return {
        "n": n,
        "processes": len(pids),
        "per_process": per_process,
        "healthy_s": round(healthy_s, 1),
        "idle_window_s": round(span, 1),
        "cpu_per_s_hosts": cpu,
        "cpu_per_s_hosts_total": round(sum(cpu.values()), 3),
        "cpu_per_s_bootstrap": round((boot1 - boot0) / span, 3),
        "lag_max_s": max((line["lag_max_s"] for line in lines), default=None),
        "lag_mean_s": round(sum(line["lag_mean_s"] for line in lines) / len(lines), 4)
        if lines
        else None,
        "rpc_per_s_all_hosts": {k: round(v / covered, 1) for k, v in sorted(rates.items())}
        if covered
        else {},
        "host_load_lines": len(lines),
        "load_average": load,
    }


def main(out_dir: pathlib.Path) -> dict:
    idle_s = float(os.environ.get("HUSHNET_BENCH_HOST_LOAD_IDLE_S", "60"))
    period_s = max(5.0, idle_s / 4)
    rows = []
    for n in _ns():
        row = _one(n, idle_s, period_s)
        rows.append(row)
        print(
            f"   n={n:5d} ({row['processes']} × {row['per_process']}), idle {row['idle_window_s']:.0f} s "
            f"after healthy ({row['healthy_s']:.0f} s): hosts {row['cpu_per_s_hosts_total']:.3f} CPU-s/s "
            f"{row['cpu_per_s_hosts']}, bootstrap {row['cpu_per_s_bootstrap']:.3f}; loop lag max "
            f"{row['lag_max_s']} s mean {row['lag_mean_s']} s; RPCs/s {row['rpc_per_s_all_hosts']} "
            f"(load {row['load_average'][0]:.1f})",
            flush=True,
        )
    return {"benchmark": "host_load", "load_average": os.getloadavg(), "rows": rows}


if __name__ == "__main__":
    import sys

    print(
        json.dumps(
            main(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/out")), indent=2
        )
    )
