"""The anonymity layer over real nodes (mutual TLS on 127.0.0.x), each against a baseline in the same run.

* **Onion hop latency**: seconds per walk step of ``rw-dpsgd-onion`` (3 relays: 4 TLS link hops,
  each acknowledged, fixed-size cells) against plain ``rw-dpsgd`` (1 link hop) on the same
  network, same data, same length — the direct envelope hop of a token.  The variants run
  interleaved (``ONION_REPEATS`` rounds, the order rotating each round) so that load drift on the
  shared machine hits all of them alike; the record holds every run, the medians, the ratio of
  the medians and the median of the per-round ratios.  Also the bare ``Node.send`` round trip of
  a token-sized envelope for reference.  Goal: onion ≤ 3× direct (issue 11).
* **Hop acks**: the onion variants use the node's transport receipt as the hop ack (one RPC per link
  hop); ``onion_64KiB_msgack`` runs the same layer with a separate ack message per hop (two RPCs per
  link hop, as before), so before and after are measured in the same run.
Secure summation has its own benchmark, :mod:`benchmarks.bench_secagg_net` (16 node processes).

Every node shares one Python process here (:mod:`hushnet.runs.local_net`): work that runs in parallel
on a real network is serialised, and the shared machine is noisy: hence medians of interleaved
rounds, and the process-CPU ratio beside the wall-time one.  Ratios are reported, never asserted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import tempfile
import time

import numpy as np

from hushnet.runs.local_net import network
from hushnet.runs.spec import Budget, RunSpec
from hushnet.runs.synthetic import planted_logistic_shards

WALK_GRAPH, WALK_N, WALK_D, WALK_T = "regular:10:4:1", 10, 16, 80
ONION_REPEATS = 7


async def _walk_seconds_per_step(net, spec: RunSpec) -> tuple[float, float]:
    """(wall seconds per step from the start node's start to the finish, process CPU seconds per step
    of the whole run including its start — all nodes share this process, so CPU is their summed work,
    and unlike wall time it does not grow when other programs load the machine)."""
    c0 = time.process_time()
    run_id = await net.client.start_run(spec)
    drivers = [net.driver(v, run_id) for v in range(len(net.nodes))]
    await net.wait(
        lambda: any(d.state == "finished" for d in drivers), 300, what=f"{spec.protocol} to finish"
    )
    cpu = time.process_time() - c0
    holder = next(d for d in drivers if d.state == "finished")
    t0 = drivers[spec.start].timings.started
    await net.client.watch(run_id, progress=False, timeout=30)
    return (holder.timings.finished - t0) / spec.steps, cpu / spec.steps


@contextlib.contextmanager
def _message_acks(on: bool):
    """Build onion machines that acknowledge each hop with a message instead of the transport receipt."""
    import hushnet.families.anonymity.node as anon

    orig = anon.build_onion

    def build(*a, **k):
        m = orig(*a, **k)
        m.p = dataclasses.replace(m.p, link_receipts=False)
        return m

    anon.build_onion = build if on else orig
    try:
        yield
    finally:
        anon.build_onion = orig


async def _bare_hop(net, payload_len: int, repeats: int = 100) -> float:
    a = net.ordered[0]
    b = a.neighbors[0]
    payload = bytes(payload_len)
    best = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        await a.send(b, payload, protocol="net.discard", run_id="bench")
        best.append(time.perf_counter() - t0)
    return float(np.median(best))


async def _onion_part(tmp: pathlib.Path) -> dict:
    async with network(
        tmp,
        WALK_GRAPH,
        WALK_N,
        shards=planted_logistic_shards(WALK_N, m=20, d=WALK_D, seed=0),
        base_ip=140,
        epsilon=1e9,
    ) as net:
        common = dict(
            task="logreg",
            graph=WALK_GRAPH,
            steps=WALK_T,
            budget=Budget(1e9, 1e-5),
            sigma=2.0,
            step_size=0.05,
        )
        variants = {
            "direct": dict(protocol="rw-dpsgd"),
            "onion_64KiB": dict(
                protocol="rw-dpsgd-onion", view_model="anonymous", protocol_params={"hops": 3}
            ),
            "onion_64KiB_msgack": dict(
                protocol="rw-dpsgd-onion", view_model="anonymous", protocol_params={"hops": 3}
            ),
            "onion_4KiB": dict(
                protocol="rw-dpsgd-onion",
                view_model="anonymous",
                protocol_params={"hops": 3, "cell_body": 4096},
            ),
        }
        names = list(variants)
        runs: dict[str, list[float]] = {k: [] for k in names}
        cpu: dict[str, list[float]] = {k: [] for k in names}
        seed = 0
        await _walk_seconds_per_step(
            net, RunSpec(seed=999, **variants["onion_4KiB"], **common).with_run_id()
        )  # warm-up
        for r in range(
            ONION_REPEATS
        ):  # interleaved, order rotating: load drift hits every variant alike
            for k in names[r % len(names) :] + names[: r % len(names)]:
                seed += 1
                with _message_acks(k.endswith("_msgack")):
                    wall, c = await _walk_seconds_per_step(
                        net, RunSpec(seed=seed, **variants[k], **common).with_run_id()
                    )
                runs[k].append(wall)
                cpu[k].append(c)
        bare = await _bare_hop(net, 8 * WALK_D + 64)
    med = {k: float(np.median(v)) for k, v in runs.items()}
    out = {
        "model_entries": WALK_D,
        "steps": WALK_T,
        "graph": WALK_GRAPH,
        "relays": 3,
        "repeats": ONION_REPEATS,
        "seconds_per_step_runs": runs,
        "cpu_seconds_per_step_runs": cpu,
        "direct_step_s": med["direct"],
        "onion_step_s_64KiB_cells": med["onion_64KiB"],
        "onion_step_s_4KiB_cells": med["onion_4KiB"],
        "onion_step_s_64KiB_cells_message_acks": med["onion_64KiB_msgack"],
        "bare_envelope_round_trip_s": bare,
        "goal": "onion <= 3x direct",
    }
    for k, tag in (
        ("onion_64KiB", "64KiB"),
        ("onion_4KiB", "4KiB"),
        ("onion_64KiB_msgack", "64KiB_msgack"),
    ):
        paired = np.asarray(runs[k]) / np.asarray(runs["direct"])
        out[f"ratio_onion_vs_direct_{tag}"] = med[k] / med["direct"]
        out[f"ratio_onion_vs_direct_{tag}_paired_median"] = float(np.median(paired))
        out[f"ratio_onion_vs_direct_{tag}_paired_range"] = [
            float(paired.min()),
            float(paired.max()),
        ]
        out[f"ratio_onion_vs_direct_{tag}_cpu"] = float(
            np.median(cpu[k]) / np.median(cpu["direct"])
        )
    return out


def main(out_dir: pathlib.Path) -> dict:
    import uvloop

    with tempfile.TemporaryDirectory(prefix="bench-anonnet-") as tmp:
        t = pathlib.Path(tmp)
        (t / "onion").mkdir()
        onion = uvloop.run(_onion_part(t / "onion"))
    print(f"{'measurement':<52}{'seconds':>12}{'ratio':>9}  goal")
    print(f"{'rw-dpsgd step (direct envelope hop)':<52}{onion['direct_step_s']:>12.5f}")
    print(
        f"{'rw-dpsgd-onion step, 3 relays, 64 KiB cells':<52}{onion['onion_step_s_64KiB_cells']:>12.5f}"
        f"{onion['ratio_onion_vs_direct_64KiB']:>9.2f}  <= 3"
    )
    print(
        f"{'rw-dpsgd-onion step, 3 relays, 4 KiB cells':<52}{onion['onion_step_s_4KiB_cells']:>12.5f}"
        f"{onion['ratio_onion_vs_direct_4KiB']:>9.2f}  <= 3"
    )
    print(
        f"{'  … 64 KiB cells, hop ack as a message (before)':<52}{onion['onion_step_s_64KiB_cells_message_acks']:>12.5f}"
        f"{onion['ratio_onion_vs_direct_64KiB_msgack']:>9.2f}"
    )
    print(
        f"{'  … median of the per-round ratios (64 KiB / 4 KiB)':<52}{'':>12}"
        f"{onion['ratio_onion_vs_direct_64KiB_paired_median']:>9.2f} / {onion['ratio_onion_vs_direct_4KiB_paired_median']:.2f}"
    )
    print(
        f"{'  … process CPU per step, ratio (64 KiB / 4 KiB)':<52}{'':>12}"
        f"{onion['ratio_onion_vs_direct_64KiB_cpu']:>9.2f} / {onion['ratio_onion_vs_direct_4KiB_cpu']:.2f}"
    )
    print(
        f"{'bare envelope round trip (reference)':<52}{onion['bare_envelope_round_trip_s']:>12.5f}"
    )
    return {"onion": onion}


if __name__ == "__main__":
    main(pathlib.Path(__file__).parent / "out")
