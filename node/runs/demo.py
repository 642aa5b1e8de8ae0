"""``make demo``: private logistic regression by random walk on a real 16-node network.

Starts a bootstrap and 16 node processes on 127.0.0.x (mutual TLS), gives every node its own
shard of the houses data (the papers' data set, through :func:`node.datasets.load_houses`),
runs RW DP-SGD (random-walk paper, Alg. 1) with a live progress bar, and prints the test
accuracy beside the non-private and local-DP baselines, the privacy report (worst and mean pair,
certified) and the wall time.  The last line is machine-readable::

    demo: accuracy=A nonprivate=B localdp=C worst_pair_epsilon=E delta=D seconds=S

Baselines (computed locally, they are comparisons, not part of the network run): non-private =
full-batch gradient descent on the pooled training data; local-DP = the same walk where every
contribution is protected on its own (``local-dp-sgd`` in the simulator), with σ calibrated so
its certified worst-pair ε equals the private run's.
"""
from __future__ import annotations

import argparse
import math
import os
import pathlib
import sys
import tempfile
import time
from dataclasses import replace

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[2]

SPEC = dict(protocol="rw-dpsgd", task="logreg", graph="hypercube:4", steps=800, seed=7, sigma=4.0, clip=1.0,
            step_size=0.02, cap=50, view_model="sender-known", on_peer_down="deviate")
DELTA = 1e-5
NODE_BUDGET = 12.0  # each node's own ε budget toward every other node (runs.toml)


def _data_dir() -> None:
    """Use $HUSHNET_DATA_DIR, else the default cache if it has the data, else ../shared/data."""
    if os.environ.get("HUSHNET_DATA_DIR"):
        return
    from node.datasets import data_dir

    if (data_dir() / "cal_housing.data.gz").exists():
        return
    shared = REPO.parent / "shared" / "data"
    if (shared / "cal_housing.data.gz").exists():
        os.environ["HUSHNET_DATA_DIR"] = str(shared)
        return
    raise SystemExit("demo: error: the houses data is not available offline. Set HUSHNET_DATA_DIR to a directory "
                     "holding cal_housing.data.gz (or run once online so node.datasets downloads it).")


def nonprivate_accuracy(P) -> float:
    from node.tasks import LogisticRegressionTask

    full = LogisticRegressionTask(P.X_train, P.y_train, clip=1.0)
    w = np.zeros(full.dim)
    for _ in range(400):
        w -= 2.0 * full.raw_gradient(w)
    return full.evaluate(w, P.X_test, P.y_test)["accuracy"]


def localdp_accuracy(spec, tasks, P, target_eps: float, seeds: int = 3) -> tuple[float, float]:
    """Local-DP walk with σ such that its certified worst-pair ε equals ``target_eps``; mean accuracy over seeds."""
    from node.protocols.registry import build_from_spec
    from node.runs.spec import projected_row
    from node.sim import Simulator

    base = replace(spec, protocol="local-dp-sgd", run_id="")

    def eps(sig: float) -> float:
        return float(projected_row(replace(base, sigma=sig), 0)[0].max())

    lo, hi = 0.05, 200.0
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        if eps(mid) > target_eps:
            lo = mid
        else:
            hi = mid
    accs = []
    for s in range(seeds):
        sp = replace(base, sigma=hi, seed=spec.seed + s).with_run_id()
        res = Simulator(build_from_spec(sp, tasks)).run()
        accs.append(tasks[0].evaluate(res.model, P.X_test, P.y_test)["accuracy"])
    return float(np.mean(accs)), hi


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m node.runs.demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--state-dir", type=pathlib.Path, help="keep the network state here (default: a temp dir)")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--report-png", type=pathlib.Path, help="also write the privacy heatmap + loss-by-distance plot")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    _data_dir()
    import logging

    logging.basicConfig(level=logging.WARNING)
    from node.client import Client, ClientError
    from node.net.cluster import LocalCluster
    from node.runs.policy import NodePolicy
    from node.runs.spec import Budget, RunSpec
    from node.tasks import LogisticRegressionTask, houses_partition

    n = args.nodes
    dim = int(round(math.log2(n)))
    graph = f"hypercube:{dim}" if 2**dim == n else f"complete:{n}"
    P = houses_partition(n, per_node=1000, seed=42)
    tasks = [LogisticRegressionTask(X, y, clip=1.0) for X, y in P.shards]
    spec = RunSpec(**{**SPEC, "graph": graph}, budget=Budget(NODE_BUDGET, DELTA)).with_run_id().validate()

    tmp = None
    state = args.state_dir
    if state is None:
        tmp = tempfile.TemporaryDirectory(prefix="hushnet-demo-")
        state = pathlib.Path(tmp.name)
    for i, (X, y) in enumerate(P.shards):
        d = state / "nodes" / f"n{i}"
        d.mkdir(parents=True, exist_ok=True)
        np.savez(d / "data.npz", X=X, y=y)
        NodePolicy.write(d, epsilon=NODE_BUDGET, delta=DELTA, data_path="data.npz")
    print(f"starting a {n}-node network ({graph}) on 127.0.0.x ...", flush=True)
    cluster = LocalCluster(state, n, graph, restart=False)
    try:
        cluster.start(timeout=90)
        cluster.wait_healthy(timeout=120)
        t_up = time.perf_counter() - t0
        print(f"network healthy after {t_up:.1f} s; every node holds {P.shards[0][0].shape[0]} private houses rows",
              flush=True)
        with Client(state) as client:
            try:
                run_id = client.start_run(spec)
            except ClientError as exc:
                print(f"demo: error: {exc}", file=sys.stderr)
                return 1
            print(f"run {run_id}: RW DP-SGD, T={spec.steps}, σ={spec.sigma}, cap={spec.cap}, all {n} nodes accepted",
                  flush=True)
            outcome = client.watch(run_id, progress=not args.no_progress, timeout=300)
            if outcome.state != "finished":
                print(f"demo: error: run {outcome.state}: {outcome.reason}", file=sys.stderr)
                return 1
            report = client.report(run_id)
            w = client.model(run_id)
    finally:
        cluster.stop(timeout=10)
        if tmp is not None:
            tmp.cleanup()
    acc = tasks[0].evaluate(w, P.X_test, P.y_test)["accuracy"]
    summary = report.summary()
    worst = summary["worst_pair_epsilon"]
    nonpriv = nonprivate_accuracy(P)
    ldp, sig_ldp = localdp_accuracy(spec, tasks, P, worst)
    seconds = time.perf_counter() - t0
    if args.report_png:
        import matplotlib

        matplotlib.use("Agg")
        report.save_heatmap(args.report_png)
    print()
    print(report.format_table())
    print()
    print(f"test accuracy: private random walk {acc:.3f} | non-private {nonpriv:.3f} | "
          f"local-DP at the same certified ε (σ={sig_ldp:.2f}) {ldp:.3f}")
    print(f"privacy (certified, δ={DELTA:g}): worst pair ε={worst:.3f}, mean pair ε={summary['mean_pair_epsilon']:.3f}")
    print(f"walk on the network: {summary['run_seconds']:.2f} s; total wall time {seconds:.1f} s")
    print(f"demo: accuracy={acc:.4f} nonprivate={nonpriv:.4f} localdp={ldp:.4f} worst_pair_epsilon={worst:.4f} "
          f"delta={DELTA:g} seconds={seconds:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
