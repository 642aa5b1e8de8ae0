"""Gossip over the real network: Muffliato rounds per second on 16 node processes (hypercube:4, model of
10⁴ float64) against the bare envelope hop of the network layer, measured in the same run on the same cluster.

* gossip round: one synchronous two-phase round at every node — AVAIL to every neighbour, VALUE (the
  10⁴-float model) or SKIP to every neighbour, each a mutual-TLS Deliver with its acknowledgement,
  the weighted average, the round's schedule record; measured as rounds / (finish − start) of a run,
  averaged over nodes (every node runs every round).
* bare hop: the network's own ``ping_neighbors`` control command sending one envelope of the same
  size to one neighbour and waiting for its DeliveryAck (sequential, mean over repetitions).

A round costs at least one hop (a node cannot mix before its neighbours' values arrived), so
``ratio_round_vs_bare`` ≤ 1; how close it gets says how much the four messages per neighbour and
per round, the parallel fan-out to 4 neighbours and the Python machine cost.  On a 2-core host the
16 processes share the cores, so a round is bounded by the *aggregate* work of all 16·8 deliveries
(``deliveries_per_s`` against the bare hop's sequential rate says how much of the host's delivery
throughput the rounds use).  The nodes share the
machine's cores, so the numbers are for this host, not a real deployment.  Ratios are reported,
never asserted.
"""

from __future__ import annotations

import pathlib
import statistics
import tempfile
import time

import numpy as np

N_NODES, GRAPH = 16, "hypercube:4"
DIM = 10_000
ROUNDS = 30


def _network(out: dict) -> None:
    from hushnet.client import Client
    from hushnet.net.cluster import LocalCluster
    from hushnet.runs.policy import NodePolicy
    from hushnet.runs.spec import Budget, RunSpec

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="hushnet-bench-gossip-") as tmp:
        state = pathlib.Path(tmp)
        for i in range(N_NODES):
            d = state / "nodes" / f"n{i}"
            d.mkdir(parents=True)
            np.savez(
                d / "data.npz", X=rng.random((DIM, 1)), y=np.zeros(DIM)
            )  # one 10⁴-vector per node
            NodePolicy.write(d, epsilon=1e9, delta=1e-5, data_path="data.npz")
        cluster = LocalCluster(state, N_NODES, GRAPH, restart=False)
        try:
            t0 = time.perf_counter()
            cluster.start(timeout=180)
            cluster.wait_healthy(timeout=240)
            out["cluster_start_s"] = time.perf_counter() - t0
            with Client(state) as c:
                rtts = []
                for _ in range(30):
                    r = c._call(
                        c.aio._control(
                            "n0", "ping_neighbors", {"size": 8 * DIM, "to": ["n1"]}, timeout=60
                        )
                    )
                    rtts.append(r["sent"]["n1"]["rtt_ms"] / 1000)
                bare = 1.0 / statistics.mean(rtts)
                spec = RunSpec(
                    protocol="muffliato",
                    task="mean",
                    graph=GRAPH,
                    steps=ROUNDS,
                    seed=5,
                    budget=Budget(1e9, 1e-5),
                    sigma=1.0,
                    protocol_params={"timeout": 10.0},
                )
                t1 = time.perf_counter()
                run_id = c.start_run(spec)
                accept_s = time.perf_counter() - t1
                o = c.watch(run_id, progress=False, timeout=900)
                rep = c.report(run_id)
                per = [r for r in rep.per_node.values() if isinstance(r, dict) and "timings" in r]
                secs = [r["timings"]["run_seconds"] for r in per if r["timings"].get("run_seconds")]
                rates = [ROUNDS / s for s in secs]
                msgs = sum(r["messages"]["out"] for r in per)
                dev = sum(len(r.get("deviations_list", [])) for r in per)
                rate = statistics.mean(rates)
                out["network"] = {
                    "state": o.state,
                    "nodes": N_NODES,
                    "graph": GRAPH,
                    "dim": DIM,
                    "rounds": ROUNDS,
                    "submit_and_start_s": accept_s,
                    "run_seconds_mean": statistics.mean(secs),
                    "rounds_per_s": rate,
                    "rounds_per_s_min_node": min(rates),
                    "bare_hops_per_s": bare,
                    "bare_rtt_ms_mean": 1000 * statistics.mean(rtts),
                    "ratio_round_vs_bare": rate / bare,
                    "messages_out": msgs,
                    "messages_per_node_round": msgs / (len(per) * ROUNDS),
                    "deviations": dev,
                    "deliveries_per_s": msgs / statistics.mean(secs),
                    "ratio_deliveries_vs_bare": msgs / statistics.mean(secs) / bare,
                    "payload_mb": 8 * DIM / 1e6,
                    "accounting_view": (per[0].get("accounting_view") or {}).get("gossip_view"),
                }
        finally:
            cluster.stop(timeout=20)


def main(out_dir: pathlib.Path) -> dict:
    out: dict = {"benchmark": "gossip_net"}
    _network(out)
    net = out["network"]
    print(f"{'what':40s} {'value':>14s}")
    for k in (
        "rounds_per_s",
        "rounds_per_s_min_node",
        "bare_hops_per_s",
        "ratio_round_vs_bare",
        "deliveries_per_s",
        "ratio_deliveries_vs_bare",
        "messages_per_node_round",
        "run_seconds_mean",
        "deviations",
    ):
        print(f"{k:40s} {net[k]:14.4g}")
    print(
        f"16 nodes, {GRAPH}, model {DIM} float64 ({net['payload_mb']:.2f} MB), {ROUNDS} Muffliato rounds: "
        f"{net['rounds_per_s']:.3g} rounds/s vs bare hop {net['bare_hops_per_s']:.3g}/s "
        f"(ratio {net['ratio_round_vs_bare']:.3g}), state {net['state']}"
    )
    return out


if __name__ == "__main__":
    import json

    d = pathlib.Path(__file__).parent / "out"
    d.mkdir(exist_ok=True)
    res = main(d)
    (d / "bench_gossip_net.json").write_text(json.dumps(res, indent=2))
