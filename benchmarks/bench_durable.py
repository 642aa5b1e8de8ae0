"""Durable walks (issue 14): the cost of a checkpoint per hop, and the time to resume after a restart.

* hop rate with durable handoffs against the same run without them (``HUSHNET_RUNS_DURABLE=0`` in
  the nodes' environment, i.e. the walk before issue 14): the same spec (seed, graph, model size)
  on two clusters of the same shape, hops / (finish − start).  A durable hop adds one fsync'd
  SQLite transaction at the receiver (the checkpoint: generator state, the token, replay digests)
  before its ack and its forward leave.  Goal ≥ 0.8.
* resume time: the token's holder is SIGKILLed mid-walk and started again on its state directory;
  measured from the restart to (a) the node answering the run's status again (restored), and (b)
  the walk passing the step it was killed at.

Ratios are reported, never asserted.
"""

from __future__ import annotations

import os
import pathlib
import tempfile
import time

import numpy as np

N_NODES, GRAPH = 8, "hypercube:3"
SIZE, STEPS = 10_000, 600


def _spec(seed: int, steps: int = STEPS):
    from hushnet.runs.spec import Budget, RunSpec

    return RunSpec(
        protocol="rw-dpsgd",
        task="hushnet.runs.synthetic:ZeroGradientTask",
        graph=GRAPH,
        steps=steps,
        seed=seed,
        budget=Budget(1e9, 1e-5),
        sigma=1.0,
        step_size=0.01,
        task_params={"size": SIZE},
        on_peer_down="pause",
    )


def _holder(c, run_id: str) -> tuple[str, int]:
    st = [s for s in c.statuses(run_id).values() if isinstance(s, dict)]
    best = max(st, key=lambda s: (s.get("token") or {}).get("last_step", -1))
    return best["node"], (best.get("token") or {}).get("last_step", -1)


def _cluster(durable: bool, out: dict, key: str, resume: bool, sync: str = "normal") -> None:
    from hushnet.client import Client
    from hushnet.net.cluster import LocalCluster
    from hushnet.runs.policy import NodePolicy
    from hushnet.runs.run_store import SYNC_ENV
    from hushnet.runs.service import DURABLE_ENV

    old, old_sync = os.environ.get(DURABLE_ENV), os.environ.get(SYNC_ENV)
    os.environ[DURABLE_ENV] = "1" if durable else "0"
    os.environ[SYNC_ENV] = sync
    try:
        with tempfile.TemporaryDirectory(prefix="hushnet-bench-durable-") as tmp:
            state = pathlib.Path(tmp)
            for i in range(N_NODES):
                d = state / "nodes" / f"n{i}"
                d.mkdir(parents=True)
                np.savez(d / "data.npz", X=np.zeros((1, 1)), y=np.ones(1))
                NodePolicy.write(d, epsilon=1e9, delta=1e-5, data_path="data.npz")
            cluster = LocalCluster(state, N_NODES, GRAPH, restart=False)
            try:
                cluster.start(timeout=120)
                cluster.wait_healthy(timeout=180)
                with Client(state) as c:
                    rates = []
                    for rep in range(1):
                        run_id = c.start_run(_spec(seed=7 + rep))
                        o = c.watch(run_id, progress=False, timeout=600)
                        r = c.report(run_id)
                        hops = (
                            sum(
                                x["messages"]["out"] for x in r.per_node.values() if "messages" in x
                            )
                            / 2
                        )
                        rates.append(hops / r.summary()["run_seconds"])
                        assert o.state == "finished", o
                    out[key] = {"hops_per_s": max(rates), "runs_hops_per_s": rates}
                    if resume:
                        run_id = c.start_run(_spec(seed=21, steps=3000))
                        end = time.monotonic() + 60
                        while _holder(c, run_id)[1] < 300 and time.monotonic() < end:
                            time.sleep(0.02)
                        victim, at = _holder(c, run_id)
                        child = cluster.nodes[int(victim[1:])]
                        child.proc.kill()
                        child.proc.wait(timeout=10)
                        t0 = time.monotonic()
                        child.spawn()
                        t_restored = None
                        while time.monotonic() - t0 < 120:
                            st = c.statuses(run_id).get(victim)
                            if t_restored is None and isinstance(st, dict):
                                t_restored = time.monotonic() - t0
                            if t_restored is not None and _holder(c, run_id)[1] > at + 1:
                                break
                            time.sleep(0.05)
                        t_moving = time.monotonic() - t0
                        o = c.watch(run_id, progress=False, timeout=600, pause_timeout=60)
                        out["resume"] = {
                            "killed_holder": victim,
                            "killed_at_step": at,
                            "restart_to_restored_s": t_restored,
                            "restart_to_walk_moving_s": t_moving,
                            "final_state": o.state,
                            "final_step": o.step,
                        }
            finally:
                cluster.stop(timeout=15)
    finally:
        for k, v in ((DURABLE_ENV, old), (SYNC_ENV, old_sync)):
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main(out_dir: pathlib.Path) -> dict:
    out: dict = {"nodes": N_NODES, "graph": GRAPH, "model_floats": SIZE, "steps": STEPS}
    _cluster(
        True, out, "durable", resume=True
    )  # the default: survives kill -9 (WAL, synchronous=NORMAL)
    _cluster(
        True, out, "durable_sync_full", resume=False, sync="full"
    )  # also survives power loss (fsync per hop)
    _cluster(False, out, "not_durable", resume=False)
    base = out["not_durable"]["hops_per_s"]
    out["ratio_durable_vs_not"] = out["durable"]["hops_per_s"] / base
    out["ratio_durable_sync_full_vs_not"] = out["durable_sync_full"]["hops_per_s"] / base
    print(
        f"hops/s: durable (default, sync=normal) {out['durable']['hops_per_s']:.1f}, durable (fsync) "
        f"{out['durable_sync_full']['hops_per_s']:.1f}, without {base:.1f}; ratios "
        f"{out['ratio_durable_vs_not']:.2f} / {out['ratio_durable_sync_full_vs_not']:.2f} (goal >= 0.8)"
    )
    r = out["resume"]
    print(
        f"holder {r['killed_holder']} killed at step {r['killed_at_step']}: restored {r['restart_to_restored_s']} s "
        f"after restart, walk moving again after {r['restart_to_walk_moving_s']:.2f} s; run {r['final_state']}"
    )
    return out


if __name__ == "__main__":
    import json

    print(json.dumps(main(pathlib.Path(__file__).resolve().parent / "out"), indent=2))
