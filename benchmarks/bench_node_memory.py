"""What a hosted node holds during a Muffliato-GD run at network size n, in process (issue 12).

At n = 1024 over the network a host's resident memory grew ~13 MB per hosted node during the run
(idle: ~2.7 MB a node), so n = 2048 did not fit this machine.  Most of that is per node *and* grows
with n — a node's certified row is (n − 1 targets × 159 Rényi orders) floats, 1.3 MB at n = 1024 —
so a small network cannot show it and a large one is a heavy run.  This benchmark builds, for K of
the n vertices, what a hosted node builds when it accepts and runs the spec — its privacy ledger,
run store (checkpointed after each step, as the durable driver does) and gossip schedule store on
disk, its :class:`GossipCost` (the projection computed once per process, as on a host), a
:class:`RunDriver` charging the run's gradient steps — and reports the
memory per node: Python objects (``tracemalloc``), SQLite's heap (``sqlite3_memory_used``) and the
process's resident set (meaningful for the first size of a run only: later sizes reuse the memory
the earlier ones freed).  No network: transport buffers are not in these numbers.

Measured (16 nodes per size, load 7–17), Python + SQLite heap per node, main before this series →
after it (SQLite page cache 2 000 → 256 KiB a connection; no bound copy of the last ledger block or
checkpoint buffer kept by SQLite; the cost keeps sensitivities, not curves; one shared run row):
n = 256 3.31 → 1.49 MB, n = 1024 11.37 → 3.59 MB, n = 2048 19.66 → 6.39 MB.  What is left grows with
n: the ledger's running totals and the run's charged row, (n − 1) × 159 floats each.

Session 22 (the ledger's sums are the sealed charged row until something else is added; cost rows are
built when asked, kept in a bounded per-process cache; a walk's charged row is a replay log; one public
W per process): Muffliato-GD n = 256 1.49 → 1.18, 1024 3.59 → 2.32, 2048 6.39 → 3.84 MB; and the walk
(:func:`measure_walk`, 32 hosted nodes, acceptance then two visits each), after its second visit
n = 256 1.75 → 1.07, 1024 4.97 → 2.21, 2048 9.29 → 3.73 MB a node (after acceptance, 2048: 1.12 →
0.66 MB).  docs/runs.md has the table.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import json
import pathlib
import sqlite3
import tempfile
import time
import tracemalloc


def _rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _sqlite_used():
    """``sqlite3_memory_used`` of the library the sqlite3 module uses (None: not readable here)."""
    name = ctypes.util.find_library("sqlite3")
    if name is None:
        return None
    lib = ctypes.CDLL(name)
    lib.sqlite3_memory_used.restype = ctypes.c_int64
    lib.sqlite3_libversion.restype = ctypes.c_char_p
    if lib.sqlite3_libversion().decode() != sqlite3.sqlite_version:
        return None
    return lib.sqlite3_memory_used


def measure(n: int, nodes: int, state: pathlib.Path) -> dict:
    """Build ``nodes`` nodes' run-time state of one Muffliato-GD run at size ``n``; memory per node."""
    from hushnet.engine.actions import LedgerEntry as EngineEntry
    from hushnet.families.gossip.accounting import gossip_cost
    from hushnet.families.gossip.store import ScheduleStore
    from hushnet.privacy.ledger import Ledger
    from hushnet.protocols.registry import transition_matrix
    from hushnet.runs.driver import RunDriver
    from hushnet.runs.net_experiments import prepare
    from hushnet.runs.run_store import RunStore

    spec, _ = prepare("muffliato-gd", n)
    ids = [f"n{i}" for i in range(n)]
    W = transition_matrix(spec.graph, spec.weights)
    sq = _sqlite_used()
    vertices = [(k * n) // nodes for k in range(nodes)]
    gossip_cost(spec, vertices[0], ids, W)  # the process's shared projection: not a node's cost
    gc.collect()
    tracemalloc.start()
    t0, py0, sq0, rss0 = time.perf_counter(), tracemalloc.get_traced_memory()[0], 0, _rss_mb()
    sq0 = sq() if sq else 0
    held = []
    for v in vertices:
        d = state / f"n{v}"
        d.mkdir(parents=True, exist_ok=True)
        ledger = Ledger(d / "privacy_ledger.sqlite", node_id=ids[v])
        runs = RunStore(d / "runs.sqlite")
        runs.accept(spec.run_id, json.dumps(spec.to_dict()).encode(), v, {"accept": True})
        sched = ScheduleStore(d / "gossip_schedule.sqlite")
        sched.open_run(spec, v, ids)
        cost = gossip_cost(spec, v, ids, W)
        drv = RunDriver(spec, v, ids, None, None, ledger=ledger, cost=cost, W=W)
        for step in range(int(spec.steps)):
            ev = EngineEntry(
                v, step, "gradient", spec.view_model, 2.0, 2.0 * spec.sigma, spec.sigma,
                spec.protocol, spec.run_id,
            )  # fmt: skip
            if not drv._charge(ev):  # noqa: SLF001 - the node's charge path itself
                raise SystemExit(f"bench_node_memory: vertex {v} refused step {step}: {drv.reason}")
            # what a durable driver writes after each step (the run row among its buffers)
            runs.checkpoint(spec.run_id, drv.state, "", drv.durable_state(), None)
        held.append((ledger, runs, sched, cost, drv))
    gc.collect()
    py1 = tracemalloc.get_traced_memory()[0]
    sq1 = sq() if sq else 0
    rss1 = _rss_mb()
    tracemalloc.stop()
    per = {
        "python_mb": (py1 - py0) / 2**20 / nodes,
        "sqlite_mb": (sq1 - sq0) / 2**20 / nodes if sq else None,
        "rss_mb": (rss1 - rss0) / nodes,
    }
    for ledger, runs, sched, _, _ in held:
        ledger.close()
        runs.close()
        sched.close()
    return {
        "n": n,
        "nodes": nodes,
        "orders": int(held[0][3].orders.size),
        "per_node": {k: (None if v is None else round(v, 3)) for k, v in per.items()},
        "seconds": round(time.perf_counter() - t0, 1),
    }


def measure_walk(n: int, nodes: int, state: pathlib.Path, visits: int = 2) -> dict:
    """What ``nodes`` hosted nodes of a walk at size ``n`` hold per node after accepting the run (the
    service's acceptance: projection, cost, lifetime budget check, run store record) and after each of
    their first ``visits`` visits (the charge and the checkpoint a durable driver writes), with the
    cost rows the process keeps for all of them (``HUSHNET_COST_ROWS_MB``) counted in.  The walk
    machine and its data are not built (a few kB a node): the (n − 1) × 159 arrays are the point.
    The process's cache of cost rows is held to one node's rows while measuring (``HUSHNET_COST_ROWS_MB=0``),
    so the numbers are a node's own: a host adds at most the cache's bound (64 MB by default) in all."""
    import os

    old_env = os.environ.get("HUSHNET_COST_ROWS_MB")
    os.environ["HUSHNET_COST_ROWS_MB"] = "0"
    try:
        return _measure_walk(n, nodes, state, visits)
    finally:
        if old_env is None:
            os.environ.pop("HUSHNET_COST_ROWS_MB", None)
        else:
            os.environ["HUSHNET_COST_ROWS_MB"] = old_env


def _measure_walk(n: int, nodes: int, state: pathlib.Path, visits: int) -> dict:
    import numpy as np

    from hushnet.engine.actions import LedgerEntry as EngineEntry
    from hushnet.families import family_of
    from hushnet.privacy.ledger import Ledger, LedgerBudget, PrivacyEntry
    from hushnet.protocols.registry import transition_matrix
    from hushnet.runs.accounting import contribution_cost, rows_held
    from hushnet.runs.driver import RunDriver
    from hushnet.runs.net_experiments import prepare
    from hushnet.runs.run_store import RunStore

    spec, _ = prepare(
        "rw-dpsgd", n, steps=23 * n
    )  # the amplified walk's length at 2048 (docs/runs.md)
    ids = [f"n{i}" for i in range(n)]
    fam = family_of(spec.protocol)
    W0 = transition_matrix(spec.graph, spec.weights)
    fam.project(spec, 0, None, W0)  # the process's shared all-pairs matrices: not a node's memory
    contribution_cost(spec, 0, ids, W0)
    sq = _sqlite_used()
    vertices = [(k * n) // nodes for k in range(nodes)]
    gc.collect()
    tracemalloc.start()
    t0 = time.perf_counter()
    marks = [(tracemalloc.get_traced_memory()[0], sq() if sq else 0, _rss_mb())]
    held = []
    for v in vertices:  # acceptance, as NodeRunService._decide and the durable record
        d = state / f"n{v}"
        d.mkdir(parents=True, exist_ok=True)
        ledger = Ledger(d / "privacy_ledger.sqlite", node_id=ids[v])
        ledger.set_budget(LedgerBudget(spec.budget.epsilon, spec.budget.delta))
        runs = RunStore(d / "runs.sqlite")
        W = transition_matrix(spec.graph, spec.weights)
        dec = fam.project(spec, v, None, W)
        row = {ids[u]: float(dec.epsilon_row[u]) for u in range(n) if u != v}
        cost = contribution_cost(spec, v, ids, W, ledger.orders)
        proj = PrivacyEntry.from_row(
            spec.run_id, spec.protocol, spec.view_model, "certified", cost.targets,
            cost.curves(spec.sigma) * float(np.ceil(dec.details["N_u"])),
        )  # fmt: skip
        if ledger.would_exceed(proj):
            raise SystemExit(f"bench_node_memory: vertex {v} would refuse the walk")
        out = {"node": ids[v], "accept": True, "row": row}
        runs.accept(spec.run_id, json.dumps(spec.to_dict()).encode(), v, out)
        drv = RunDriver(spec, v, ids, None, None, ledger=ledger, cost=cost, W=W, decision=out)
        held.append((ledger, runs, drv))
        del dec, proj
    gc.collect()
    marks.append((tracemalloc.get_traced_memory()[0], sq() if sq else 0, _rss_mb()))
    for visit in range(visits):  # each node visited in turn, as a walk does
        for ledger, runs, drv in held:
            ev = EngineEntry(
                drv.vertex, visit, "gradient", spec.view_model, 2.0, 2.0 * spec.sigma, spec.sigma,
                spec.protocol, spec.run_id,
            )  # fmt: skip
            if not drv._charge(ev):  # noqa: SLF001 - the node's charge path itself
                raise SystemExit(f"bench_node_memory: vertex {drv.vertex} refused: {drv.reason}")
            runs.checkpoint(spec.run_id, "running", "", drv.durable_state(), None)
        gc.collect()
        marks.append((tracemalloc.get_traced_memory()[0], sq() if sq else 0, _rss_mb()))
    tracemalloc.stop()
    cache = rows_held()

    def per(a, b) -> dict:
        return {
            "python_mb": round((b[0] - a[0]) / 2**20 / nodes, 3),
            "sqlite_mb": round((b[1] - a[1]) / 2**20 / nodes, 3) if sq else None,
            "rss_mb": round((b[2] - a[2]) / nodes, 3),
        }

    doc = {
        "n": n,
        "nodes": nodes,
        "row_mb": round((n - 1) * 159 * 8 / 2**20, 3),
        "accepted": per(marks[0], marks[1]),
        "visits": {str(i + 1): per(marks[0], marks[i + 2]) for i in range(visits)},
        "rows_cache": {"entries": cache[0], "mb": round(cache[1] / 2**20, 1)},
        "seconds": round(time.perf_counter() - t0, 1),
    }
    for ledger, runs, _ in held:
        ledger.close()
        runs.close()
    return doc


SIZES = (256, 1024, 2048)


def main(out_dir: pathlib.Path | None = None, sizes=SIZES, nodes: int = 16) -> dict:
    """``make bench``: the memory per node at each size (one fresh state directory per size and protocol)."""
    out = {"sizes": {}, "walk": {}}
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="hushnet-nodemem-") as tmp:
            doc = measure(n, min(nodes, n), pathlib.Path(tmp))
        print(f"   muffliato-gd n = {n}: {doc['per_node']} per node", flush=True)
        out["sizes"][str(n)] = doc
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="hushnet-nodemem-") as tmp:
            doc = measure_walk(n, min(2 * nodes, n), pathlib.Path(tmp))
        print(
            f"   rw-dpsgd n = {n}: accepted {doc['accepted']}, visited {doc['visits']} per node "
            f"(rows cache {doc['rows_cache']})",
            flush=True,
        )
        out["walk"][str(n)] = doc
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, action="append", help="network size (a power of two; repeat)")
    ap.add_argument("--nodes", type=int, default=16, help="nodes built (of the n vertices)")
    args = ap.parse_args()
    print(json.dumps(main(None, tuple(args.n or SIZES), args.nodes)))
