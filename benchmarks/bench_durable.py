"""Durable walks (issue 14): the cost of a checkpoint per hop, and the time to resume after a restart.

* hop rate with durable handoffs against the same run without them (``HUSHNET_RUNS_DURABLE=0`` in
  the nodes' environment, i.e. the walk before issue 14): the same specs (seed, graph, model size)
  on clusters of the same shape that run side by side — durable (default ``synchronous=NORMAL``),
  durable with an fsync per hop, not durable, and durable with every checkpoint a SQLite transaction
  (``HUSHNET_RUNS_LOG_MB=0``, the store before its checkpoint log) — taking turns walk by walk (the
  order rotates each repeat, so a change in the shared machine's load hits all alike); hops / (finish
  − start), the median of :data:`REPEATS` walks each.  A durable hop adds one record of the run
  store's checkpoint log at the receiver (the checkpoint: generator state, the token once, new replay
  digests) before its Deliver answers (the ack) and its forward leaves; the receivers' time writing it
  is reported per hop.  Goal ≥ 0.8.
* resume time: the token's holder is SIGKILLed mid-walk and started again on its state directory;
  measured from the restart to (a) the node answering the run's status again (restored), and (b)
  the walk passing the step it was killed at.

Ratios are reported, never asserted.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import statistics
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


REPEATS = 7


@contextlib.contextmanager
def _env(durable: bool, sync: str, log: bool = True):
    """The nodes' environment while they are spawned (a restarted node gets it again); ``log=False``
    writes every checkpoint as a SQLite transaction (``HUSHNET_RUNS_LOG_MB=0``)."""
    from hushnet.runs.run_store import LOG_ENV, SYNC_ENV
    from hushnet.runs.service import DURABLE_ENV

    old = {k: os.environ.get(k) for k in (DURABLE_ENV, SYNC_ENV, LOG_ENV)}
    os.environ[DURABLE_ENV] = "1" if durable else "0"
    os.environ[SYNC_ENV] = sync
    if log:
        os.environ.pop(LOG_ENV, None)
    else:
        os.environ[LOG_ENV] = "0"
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _cluster(stack: contextlib.ExitStack, durable: bool, sync: str = "normal", log: bool = True):
    from hushnet.client import Client
    from hushnet.net.cluster import LocalCluster
    from hushnet.runs.policy import NodePolicy

    state = pathlib.Path(
        stack.enter_context(tempfile.TemporaryDirectory(prefix="hushnet-bench-durable-"))
    )
    for i in range(N_NODES):
        d = state / "nodes" / f"n{i}"
        d.mkdir(parents=True)
        np.savez(d / "data.npz", X=np.zeros((1, 1)), y=np.ones(1))
        NodePolicy.write(d, epsilon=1e9, delta=1e-5, data_path="data.npz")
    cluster = LocalCluster(state, N_NODES, GRAPH, restart=False)
    stack.callback(cluster.stop, timeout=15)
    with _env(durable, sync, log):
        cluster.start(timeout=120)
    cluster.wait_healthy(timeout=180)
    client = stack.enter_context(Client(state))
    return cluster, client


def _walk(c, seed: int) -> dict:
    """One 600-step walk: hops per second, and the receivers' checkpoint time per hop."""
    run_id = c.start_run(_spec(seed=seed))
    o = c.watch(run_id, progress=False, timeout=600)
    assert o.state == "finished", o
    r = c.report(run_id)
    per = [x for x in r.per_node.values() if "messages" in x]
    # every hop is one envelope: the Deliver's answer is the handoff's ack (WalkOptions.link_receipts)
    hops = sum(x["messages"]["out"] for x in per)
    ck = [x.get("durability") or {} for x in per]
    n_ck = sum(d.get("checkpoints", 0) for d in ck)
    s_ck = sum(d.get("checkpoint_seconds", 0.0) for d in ck)
    return {
        "hops_per_s": hops / r.summary()["run_seconds"],
        "checkpoint_ms": 1e3 * s_ck / n_ck if n_ck else None,
    }


def _resume(cluster, c, durable_env) -> dict:
    """Kill -9 the token's holder mid-walk, restart it on its state directory, time the way back."""
    run_id = c.start_run(_spec(seed=21, steps=3000))
    end = time.monotonic() + 60
    while _holder(c, run_id)[1] < 300 and time.monotonic() < end:
        time.sleep(0.02)
    victim, at = _holder(c, run_id)
    child = cluster.nodes[int(victim[1:])]
    child.proc.kill()
    child.proc.wait(timeout=10)
    t0 = time.monotonic()
    with durable_env:
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
    return {
        "killed_holder": victim,
        "killed_at_step": at,
        "restart_to_restored_s": t_restored,
        "restart_to_walk_moving_s": t_moving,
        "final_state": o.state,
        "final_step": o.step,
    }


def main(out_dir: pathlib.Path) -> dict:
    """Three clusters side by side (durable with the default sync, durable with an fsync per hop, not
    durable); the same walks run on each in turn (the order rotates each repeat), so a change in the
    machine's load hits all three alike; ratios of the medians."""
    out: dict = {
        "nodes": N_NODES,
        "graph": GRAPH,
        "model_floats": SIZE,
        "steps": STEPS,
        "repeats": REPEATS,
    }
    kinds = {
        "durable": (True, "normal"),
        "durable_sync_full": (True, "full"),
        "not_durable": (False, "normal"),
        "durable_sqlite_only": (True, "normal", False),
    }
    with contextlib.ExitStack() as stack:
        clusters = {k: _cluster(stack, *v) for k, v in kinds.items()}
        runs: dict[str, list[dict]] = {k: [] for k in kinds}
        order = list(kinds)
        for rep in range(REPEATS):
            for k in order[rep % len(order) :] + order[: rep % len(order)]:
                runs[k].append(_walk(clusters[k][1], seed=7 + rep))
        for k in kinds:
            rates = [r["hops_per_s"] for r in runs[k]]
            cks = [r["checkpoint_ms"] for r in runs[k] if r["checkpoint_ms"] is not None]
            out[k] = {
                "hops_per_s": statistics.median(rates),
                "runs_hops_per_s": rates,
                "checkpoint_ms_per_hop": statistics.median(cks) if cks else None,
            }
        base = out["not_durable"]["hops_per_s"]
        out["ratio_durable_vs_not"] = out["durable"]["hops_per_s"] / base
        out["ratio_durable_sync_full_vs_not"] = out["durable_sync_full"]["hops_per_s"] / base
        out["ratio_sqlite_only_vs_not"] = out["durable_sqlite_only"]["hops_per_s"] / base
        out["ratio_durable_vs_sqlite_only"] = (
            out["durable"]["hops_per_s"] / out["durable_sqlite_only"]["hops_per_s"]
        )
        out["ratios_per_repeat"] = [
            d["hops_per_s"] / n["hops_per_s"] for d, n in zip(runs["durable"], runs["not_durable"])
        ]
        print(
            f"hops/s (medians of {REPEATS}): durable (default, sync=normal) {out['durable']['hops_per_s']:.1f}, "
            f"durable (fsync) {out['durable_sync_full']['hops_per_s']:.1f}, without {base:.1f}; ratios "
            f"{out['ratio_durable_vs_not']:.2f} / {out['ratio_durable_sync_full_vs_not']:.2f} (goal >= 0.8); "
            f"checkpoint {out['durable']['checkpoint_ms_per_hop']} ms per hop"
        )
        print(
            f"every checkpoint a SQLite transaction (HUSHNET_RUNS_LOG_MB=0): "
            f"{out['durable_sqlite_only']['hops_per_s']:.1f} hops/s, {out['ratio_sqlite_only_vs_not']:.2f} of "
            f"not durable; the checkpoint log {out['ratio_durable_vs_sqlite_only']:.2f}x that; checkpoint "
            f"{out['durable_sqlite_only']['checkpoint_ms_per_hop']} ms per hop"
        )
        cluster, client = clusters["durable"]
        out["resume"] = r = _resume(cluster, client, _env(*kinds["durable"]))
    print(
        f"holder {r['killed_holder']} killed at step {r['killed_at_step']}: restored {r['restart_to_restored_s']} s "
        f"after restart, walk moving again after {r['restart_to_walk_moving_s']:.2f} s; run {r['final_state']}"
    )
    return out


if __name__ == "__main__":
    import json

    print(json.dumps(main(pathlib.Path(__file__).resolve().parent / "out"), indent=2))
