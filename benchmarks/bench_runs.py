"""Runs over the real network: token hops per second (16 nodes, models of 10⁴ and 10⁶ float64) against
the bare envelope hop of the network layer, measured in the same run on the same cluster; the same
hop rate (10⁴ floats) at a large n on hosted nodes against n = 16, measured in the same run
(``HUSHNET_BENCH_RUNS_LARGE_N``, default 256; 0 skips it); and the simulator's RW DP-SGD steps per
second at n = 2048.

* token hop: one step of RW DP-SGD that leaves the node — the machine's update (fresh noise of the
  model's size), encoding, a mutual-TLS Deliver to the next holder, its validation, plus the ledger
  charge; the Deliver's answer is the handoff's ack (``WalkOptions.link_receipts``: one RPC per
  hop, the ack message it replaced was a second one); measured as hops / (finish − start) of a run,
  hops = the envelopes the nodes sent (one per hop; a retransmission would count too).
  Since issue 4 a networked node draws (and scales) its next noise while the token is away and
  hashes a received token for replay detection only after it has moved on, so neither is on the
  hop's critical path; the charge stays durable before the token leaves (one SQLite transaction
  per visit, as before).
* bare hop: the network's own ``ping_neighbors`` control command sending one envelope of the same
  size to one neighbour and waiting for its DeliveryAck (sequential, mean over repetitions).
* the same 10⁴-float comparison with the 16 nodes hosted two OS processes of eight (``hushnet up
  --per-process 8``, the layout node hosting runs a large network in): there the bare hop is
  ``ping_neighbors`` to each of n0's neighbours in turn, since a hop between two nodes of one process
  costs less than one between processes, and the walk takes both kinds in the proportions this does.

Ratios are reported, never asserted.
"""

from __future__ import annotations

import os
import pathlib
import statistics
import tempfile
import time

import numpy as np

N_NODES, GRAPH = 16, "hypercube:4"
SIZES = (10_000, 1_000_000)
#: the large network of the hop-rate-at-scale comparison (hosted nodes, ``hushnet up --per-process``)
LARGE_N = int(os.environ.get("HUSHNET_BENCH_RUNS_LARGE_N", "256"))
#: its walk: short enough for ``make bench`` while the per-hop ledger charge still grows with n
LARGE_STEPS = int(os.environ.get("HUSHNET_BENCH_RUNS_LARGE_STEPS", "300"))
LARGE_SIZE = 10_000


def _nodes(state: pathlib.Path, n: int) -> None:
    """``n`` nodes' folders: a one-row data file and a policy that accepts any benchmark run."""
    from hushnet.runs.policy import NodePolicy

    for i in range(n):
        d = state / "nodes" / f"n{i}"
        d.mkdir(parents=True)
        np.savez(d / "data.npz", X=np.zeros((1, 1)), y=np.ones(1))
        NodePolicy.write(d, epsilon=1e9, delta=1e-5, data_path="data.npz")


def _walk(c, graph: str, size: int, steps: int, seed: int) -> dict:
    """One RW DP-SGD run of ``steps`` on ``graph`` with a model of ``size`` floats: hops, seconds, rate."""
    from hushnet.runs.spec import Budget, RunSpec

    spec = RunSpec(
        protocol="rw-dpsgd",
        task="hushnet.runs.synthetic:ZeroGradientTask",
        graph=graph,
        steps=steps,
        seed=seed,
        budget=Budget(1e9, 1e-5),
        sigma=1.0,
        step_size=0.01,
        task_params={"size": size},
    )
    run_id = c.start_run(spec)
    o = c.watch(run_id, progress=False, timeout=600)
    rep = c.report(run_id)
    hops = sum(r["messages"]["out"] for r in rep.per_node.values() if "messages" in r)
    secs = rep.summary()["run_seconds"]
    return {
        "state": o.state,
        "steps": steps,
        "hops": hops,
        "run_seconds": secs,
        "token_hops_per_s": hops / secs,
    }


def _bare(c, to: list[str], size: int, reps: int) -> list[float]:
    """Round trips (s) of ``reps`` envelopes of ``8 * size`` bytes from n0, to ``to``'s nodes in turn.

    With several targets each is sent one envelope first, not counted: a receiver's first ``net.ping``
    creates its inbox record (≈ 2 ms more, docs/runs.md), which a run's envelope never does."""
    if len(to) > 1:
        for dst in to:
            c._call(
                c.aio._control("n0", "ping_neighbors", {"size": 8 * size, "to": [dst]}, timeout=60)
            )
    rtts = []
    for i in range(reps):
        dst = to[i % len(to)]
        r = c._call(
            c.aio._control("n0", "ping_neighbors", {"size": 8 * size, "to": [dst]}, timeout=60)
        )
        rtts.append(r["sent"][dst]["rtt_ms"] / 1000)
    return rtts


def _network(out: dict, per_process: int = 1) -> None:
    """Token against bare hops on 16 nodes: one process each (every model size), or hosted
    ``per_process`` to a process (10⁴ floats, row ``hosted_size_10000``)."""
    from hushnet.client import Client
    from hushnet.net.cluster import LocalCluster
    from hushnet.privacy.graphs import parse_graph

    hosted = per_process > 1
    with tempfile.TemporaryDirectory(prefix="hushnet-bench-runs-") as tmp:
        state = pathlib.Path(tmp)
        _nodes(state, N_NODES)
        cluster = LocalCluster(state, N_NODES, GRAPH, restart=False, per_process=per_process)
        try:
            cluster.start(timeout=120)
            cluster.wait_healthy(timeout=180)
            adj = parse_graph(GRAPH).adjacency
            to = [f"n{v}" for v in adj.indices[adj.indptr[0] : adj.indptr[1]]] if hosted else ["n1"]
            with Client(state) as c:
                for size in SIZES[:1] if hosted else SIZES:
                    steps = (
                        3000 if size <= 10_000 else 120
                    )  # a walk of seconds: its start is not its rate
                    reps = 200 if size <= 10_000 else 10
                    rtts = _bare(c, to, size, reps)
                    bare = 1.0 / statistics.mean(rtts)
                    r = _walk(c, GRAPH, size, steps, size % 97)
                    out[f"{'hosted_' if hosted else ''}size_{size}"] = {
                        **r,
                        "per_process": per_process,
                        "bare_to": to,
                        "bare_hops_per_s": bare,
                        "ratio_token_vs_bare": r["token_hops_per_s"] / bare,
                        "bare_rtt_ms_mean": 1000 * statistics.mean(rtts),
                        "payload_mb": 8 * size / 1e6,
                    }
        finally:
            cluster.stop(timeout=15)


def _network_large(out: dict, n: int) -> None:
    """The hop rate at ``n`` hosted nodes (``default_per_process(n)`` per OS process, as ``hushnet up``
    and ``make demo-large`` start them), same model size as the n = 16 row it is compared with."""
    from hushnet.client import Client
    from hushnet.net.cluster import LocalCluster
    from hushnet.net.host import default_per_process
    from hushnet.runs.demo import graph_for

    graph, per_process = graph_for(n), default_per_process(n)
    with tempfile.TemporaryDirectory(prefix="hushnet-bench-runs-large-") as tmp:
        state = pathlib.Path(tmp)
        _nodes(state, n)
        cluster = LocalCluster(state, n, graph, restart=False, per_process=per_process)
        t0 = time.perf_counter()
        try:
            cluster.start(timeout=90 + 0.1 * n)
            cluster.wait_healthy(timeout=120 + 0.5 * n)
            healthy = time.perf_counter() - t0
            with Client(state) as c:
                r = _walk(c, graph, LARGE_SIZE, LARGE_STEPS, n % 97)
        finally:
            cluster.stop(timeout=15)
    small = out[f"size_{LARGE_SIZE}"]["token_hops_per_s"]
    out[f"large_n{n}"] = {
        **r,
        "nodes": n,
        "graph": graph,
        "per_process": per_process,
        "healthy_seconds": healthy,
        "ratio_vs_n16": r["token_hops_per_s"] / small,
    }


def _simulator(out: dict) -> None:
    from hushnet.families.walk.walker import WalkOptions
    from hushnet.protocols.registry import build_machines, transition_matrix
    from hushnet.sim import Simulator
    from hushnet.tasks import LogisticRegressionTask

    n, T, d = 2048, 20_000, 8
    rng = np.random.default_rng(0)
    tasks = []
    for _ in range(n):
        X = rng.standard_normal((8, d))
        X /= np.linalg.norm(X, axis=1, keepdims=True)
        tasks.append(LogisticRegressionTask(X, np.where(X[:, 0] > 0, 1.0, -1.0)))
    W = transition_matrix("regular:2048:8:1")
    ms = build_machines(
        "rw-dpsgd",
        tasks,
        run_seed=1,
        params=dict(steps=T, step_size=0.05, sigma=1.0),
        W=W,
        options=WalkOptions(),
    )
    t0 = time.perf_counter()
    res = Simulator(ms).run()
    secs = time.perf_counter() - t0
    out["simulator_n2048"] = {
        "status": res.status,
        "steps": T,
        "seconds": secs,
        "steps_per_s": T / secs,
    }


def main(out_dir: pathlib.Path) -> dict:
    out: dict = {"nodes": N_NODES, "graph": GRAPH}
    _network(out)
    _network(out, per_process=8)
    if LARGE_N:
        _network_large(out, LARGE_N)
    _simulator(out)
    print(f"{'model':>10} {'token hops/s':>13} {'bare hops/s':>12} {'ratio':>6}")
    for size in SIZES:
        r = out[f"size_{size}"]
        print(
            f"{size:>10} {r['token_hops_per_s']:>13.1f} {r['bare_hops_per_s']:>12.1f} {r['ratio_token_vs_bare']:>6.2f}"
        )
    r = out[f"hosted_size_{SIZES[0]}"]
    print(
        f"{SIZES[0]:>10} {r['token_hops_per_s']:>13.1f} {r['bare_hops_per_s']:>12.1f} "
        f"{r['ratio_token_vs_bare']:>6.2f}  (16 nodes hosted {r['per_process']} to a process)"
    )
    if LARGE_N:
        r = out[f"large_n{LARGE_N}"]
        print(
            f"n={LARGE_N} ({r['graph']}, {r['per_process']} nodes/process), {LARGE_SIZE} floats: "
            f"{r['token_hops_per_s']:.1f} hops/s, {r['ratio_vs_n16']:.2f} of n=16"
        )
    s = out["simulator_n2048"]
    print(f"simulator n=2048, T=20000: {s['steps_per_s']:.0f} steps/s ({s['seconds']:.2f} s)")
    return out


if __name__ == "__main__":
    import json

    print(json.dumps(main(pathlib.Path(__file__).resolve().parent / "out"), indent=2))
