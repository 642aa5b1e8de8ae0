"""Secure summation over real nodes: 16 members × 10⁵ entries against the plain sum, same network, same run.

Issue 6 goal: secure sum ≤ 3× plain, and the same with 3 dropouts.  Three settings of ``secagg-sum``
(leader = member 0, threshold 10, complete:16):

* ``secagg-64``: the defaults — 64-bit words (f = 24, error ≤ 4.8e-7 per entry, range ±3.4e10),
  complete masking graph (15 keystreams per member; plain SecAgg, tolerates t − 1 = 9 colluders);
* ``secagg-32``: 32-bit words (f = 16, error ≤ 1.2e-4 per entry, range ±2048), complete masking graph
  (the same collusion tolerance as the defaults, half the keystream and wire bytes);
* ``secagg-32-k8``: 32-bit words (f = 16, error ≤ 1.2e-4 per entry, range ±2048) and the Harary
  masking graph of degree 8 (8 keystreams per member; tolerates 8 − 1 − (16 − 10) = 1 colluder).

A round's time is ``leader finished − earliest start of any node`` (one host, one clock); the operator
client starts the 16 nodes one RPC at a time, so the spread of their start times is in it.  Also
reported: ``leader finished − latest start`` (every node running, as in the plain baseline where
each sender times its own delivery).  The plain
baseline is the same network pattern: 15 members send their 10⁵-float64 vector (800 kB) to the
leader over the same mutual-TLS links at the same moment, each acknowledged, and the leader adds them.

* **Separate processes** (:class:`hushnet.net.cluster.LocalCluster`, 16 node processes): members mask
  in parallel as on a real network (on this 2-core host they still share two cores).  Plain = the
  slowest of 15 concurrent 800 kB deliveries to the leader (``ping_neighbors`` issued to all 15
  members at once; each node times its own send → DeliveryAck), the leader's 15 additions of 10⁵
  floats (< 1 ms) being negligible.  No dropouts here: a separate process cannot be made to vanish at
  a chosen protocol step without a test hook in the node.
* **One process** (:mod:`hushnet.runs.local_net`): all 16 nodes in one event loop — the members'
  masking is serialised, so this is pessimistic for the secure sum; here three members never get
  their masked input out (their node's send drops it, as if they crashed right before), so the
  leader waits one ``round_timeout`` (a parameter, 1 s — both phases have it, and shorter ones
  abort runs under load on the shared host) before recovering their masks from Shamir shares.  Reported: the
  wall time, and the wall time minus the leader's *idle* wait (from the last masked input's arrival
  to the unmask request's) — not minus the whole timeout, since work still in flight (deliveries,
  ledger charges) overlaps the wait.  The like-for-like baseline is the plain sum with the same three
  members silent: its leader cannot tell a silent member from a slow one either, so it closes the sum
  when the same ``round_timeout`` expires.

The shared machine is noisy (load average 20 – 40 on 2 cores while this was written): the process
runs are interleaved — ``PROC_ROUNDS`` rounds of plain, secagg-64, secagg-32-k8 with the order
rotating — and reported as medians and the median (and range) of the per-round ratios; the
one-process figures are the best of ``REPEATS`` runs.  Ratios are reported, never asserted.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import tempfile
import time

import numpy as np

from hushnet.runs.spec import Budget, RunSpec

SUM_N, SUM_D, THRESHOLD = 16, 100_000, 10
DROP_TIMEOUT = (
    1.0  # round_timeout of the dropout runs: the time the leader waits for silent members
)
ROUND_TIMEOUT = 5.0  # no-dropout runs: never reached, every phase completes when everyone answered
REPEATS = 3
PROC_ROUNDS = 7
DROPOUTS = (5, 9, 13)
CONFIGS = {
    "secagg-64": {},
    "secagg-32": {"bits": 32, "frac_bits": 16},
    "secagg-32-k8": {"bits": 32, "frac_bits": 16, "mask_degree": 8},
}


def _spec(seed: int, timeout: float, **pp) -> RunSpec:
    return RunSpec(
        protocol="secagg-sum",
        task="sum",
        graph=f"complete:{SUM_N}",
        steps=1,
        seed=seed,
        budget=Budget(1e9, 1e-5),
        sigma=0.01,
        protocol_params={"threshold": THRESHOLD, "round_timeout": timeout, **pp},
    ).with_run_id()


def _values() -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    return [rng.random(SUM_D) for _ in range(SUM_N)]


# ---------------------------------------------------------------------------------------- one process
class _PlainSum:
    """Leader-side handler of the plain baseline: parse float64 vectors and add them."""

    protocol = "bench.plain-sum"

    def __init__(self, expect: int, d: int) -> None:
        self.expect, self.total, self.got = expect, np.zeros(d), 0
        self.done = asyncio.Event()

    def handle(self, envelope) -> None:
        self.total += np.frombuffer(envelope.payload, dtype="<f8")
        self.got += 1
        if self.got == self.expect:
            self.done.set()
        return None


async def _plain_sum_inproc(
    net, values, dropouts: tuple[int, ...] = (), timeout: float = 120.0
) -> float:
    """The plain baseline; with ``dropouts`` those members never send, and the leader — which cannot tell a
    silent member from a slow one — closes the sum when ``timeout`` expires, as the secure leader does."""
    leader = net.ordered[0]
    h = _PlainSum(len(net.ordered) - 1, SUM_D)
    leader.register_handler(h, replace=True)
    t0 = time.perf_counter()
    own = np.array(values[0], dtype=np.float64)  # the leader's own vector
    await asyncio.gather(
        *(
            nd.send(
                leader.node_id,
                np.ascontiguousarray(values[i], dtype="<f8").tobytes(),
                protocol=h.protocol,
                run_id="bench",
            )
            for i, nd in enumerate(net.ordered)
            if i > 0 and i not in dropouts
        )
    )
    try:
        await asyncio.wait_for(h.done.wait(), timeout)
    except asyncio.TimeoutError:
        if not dropouts or h.got != len(net.ordered) - 1 - len(dropouts):
            raise
    _ = h.total + own
    return time.perf_counter() - t0


def _mute(net, vertex: int, run_id: str, kind: int):
    """``vertex``'s node never gets its round messages of ``kind`` out (a wrapper of the node's own send,
    as if it crashed right before); returns the node and its original send, to restore."""
    from hushnet.runs.service import RUN_PROTOCOL

    node = next(nd for nd in net.nodes if nd.identity.vertex == vertex)
    send = node.send

    async def muted(to, payload, *, protocol, **kw):
        if protocol == RUN_PROTOCOL and kw.get("run_id") == run_id and payload[:1] == bytes([kind]):
            raise ConnectionError("muted by the benchmark")
        return await send(to, payload, protocol=protocol, **kw)

    node.send = muted  # type: ignore[method-assign]
    return node, send


def _clock(net, run_id: str) -> list[tuple[int, int, float]]:
    """Record (vertex, message kind, arrival time) of every round message of ``run_id`` at every node."""
    seen: list[tuple[int, int, float]] = []
    for v, svc in net.svc_by_vertex.items():
        inner = svc.handle

        def handle(envelope, _v=v, _inner=inner):
            if envelope.run_id == run_id and envelope.payload:
                seen.append((_v, envelope.payload[0], time.time()))
            return _inner(envelope)

        svc.handle = handle  # type: ignore[method-assign]
    return seen


async def _secure_sum_inproc(
    net, spec: RunSpec, dropouts: tuple[int, ...] = ()
) -> tuple[float, dict]:
    from hushnet.families.secagg.wire import MASKED, UNMASK_REQ

    originals = {v: svc.handle for v, svc in net.svc_by_vertex.items()}  # restored after the run
    sends = [
        _mute(net, v, spec.run_id, MASKED) for v in dropouts
    ]  # their masked input never gets out
    seen = _clock(net, spec.run_id)
    run_id = await net.client.start_run(spec)
    lead = net.driver(0, run_id)
    await net.wait(lambda: lead.state == "finished", 300, what="the secure sum")
    drivers = [net.driver(v, run_id) for v in range(len(net.nodes))]
    starts = [d.timings.started for d in drivers if d.timings.started]
    wall = lead.timings.finished - min(starts)
    busy = [d.machine.busy for d in drivers]
    await net.client.watch(run_id, progress=False, timeout=30)
    for v, h in originals.items():
        net.svc_by_vertex[v].handle = h  # type: ignore[method-assign]
    for node, send in sends:
        node.send = send  # type: ignore[method-assign]
    res = lead.finish_result
    if (
        res["status"] != "released"
    ):  # a phase outlived round_timeout on the loaded host: the caller retries
        return float("inf"), res
    assert res["dropped"] == sorted(dropouts), res
    # the leader's idle wait for the silent members: last masked input in → first unmask request out
    # (measured at its first arrival, so one delivery of a small message is counted as idle too)
    last_masked = max(t for v, k, t in seen if v == 0 and k == MASKED)
    first_req = min((t for v, k, t in seen if k == UNMASK_REQ), default=last_masked)
    return wall, {
        **res,
        "idle_wait_s": max(0.0, first_req - last_masked),
        "machine_cpu_s": sum(busy),
        "leader_cpu_s": busy[0],
        "member_cpu_max_s": max(busy[1:]),
        "from_last_start_s": lead.timings.finished - max(starts),
    }


async def _inproc(tmp: pathlib.Path) -> dict:
    from hushnet.runs.local_net import network

    values = _values()
    out: dict = {}
    async with network(
        tmp, f"complete:{SUM_N}", SUM_N, values=values, base_ip=170, epsilon=1e9
    ) as net:
        plain = min([await _plain_sum_inproc(net, values) for _ in range(REPEATS)])
        plain3 = min(
            [await _plain_sum_inproc(net, values, DROPOUTS, DROP_TIMEOUT) for _ in range(REPEATS)]
        )
        out["plain_sum_s"] = plain
        out["plain_sum_3_dropouts_s"] = plain3
        seeds = iter(range(1, 1000))

        async def released(timeout: float, pp: dict, dropouts: tuple[int, ...]) -> tuple[list, int]:
            runs, aborted = [], 0
            while len(runs) < REPEATS and aborted < 3 * REPEATS:
                wall, res = await _secure_sum_inproc(
                    net, _spec(next(seeds), timeout, **pp), dropouts
                )
                if res["status"] == "released":
                    runs.append((wall, res))
                else:
                    aborted += 1
            if not runs:
                raise RuntimeError(f"every secure sum aborted on this host ({res})")
            return runs, aborted

        for name, pp in CONFIGS.items():
            runs, ab0 = await released(ROUND_TIMEOUT, pp, ())
            secure, res = min(runs, key=lambda r: r[0])
            last = min(r[1]["from_last_start_s"] for r in runs)
            runs, ab3 = await released(DROP_TIMEOUT, pp, DROPOUTS)
            drop, dres = min(runs, key=lambda r: r[0])
            busy3 = min(w - r["idle_wait_s"] for w, r in runs)
            out[name] = {
                "secure_sum_s": secure,
                "ratio_vs_plain": secure / plain,
                "secure_sum_from_last_start_s": last,
                "ratio_from_last_start_vs_plain": last / plain,
                "secure_sum_3_dropouts_s": drop,
                "ratio_3_dropouts_vs_plain": drop / plain,
                "ratio_3_dropouts_vs_plain_3_dropouts": drop / plain3,
                "idle_wait_for_dropouts_s": dres["idle_wait_s"],
                "secure_sum_3_dropouts_minus_idle_wait_s": busy3,
                "ratio_3_dropouts_minus_idle_wait_vs_plain": busy3 / plain,
                "machine_cpu_all_nodes_s": res["machine_cpu_s"],
                "leader_cpu_s": res["leader_cpu_s"],
                "member_cpu_max_s": res["member_cpu_max_s"],
                "error_bound_per_entry": res["error_bound"],
                "aborted_attempts": ab0,
                "aborted_attempts_3_dropouts": ab3,
            }
    return out


# ---------------------------------------------------------------------------------------- processes
def _processes(tmp: pathlib.Path) -> dict:
    from hushnet.client import Client
    from hushnet.net.cluster import LocalCluster
    from hushnet.runs.policy import NodePolicy

    values = _values()
    for i in range(SUM_N):
        d = tmp / "nodes" / f"n{i}"
        d.mkdir(parents=True)
        np.savez(d / "data.npz", X=values[i].reshape(-1, 1), y=np.zeros(SUM_D))
        NodePolicy.write(d, epsilon=1e9, delta=1e-5, data_path="data.npz")
    cluster = LocalCluster(tmp, SUM_N, f"complete:{SUM_N}", restart=False)
    out: dict = {}
    try:
        cluster.start(timeout=180)
        cluster.wait_healthy(timeout=240)
        with Client(tmp) as c:

            async def plain_once() -> float:
                rs = await asyncio.gather(
                    *(
                        c.aio._control(
                            f"n{i}",
                            "ping_neighbors",  # noqa: SLF001
                            {"size": 8 * SUM_D, "to": ["n0"], "run_id": "bench"},
                            timeout=60,
                        )
                        for i in range(1, SUM_N)
                    )
                )
                assert all(r["sent"]["n0"]["ok"] for r in rs), rs
                return max(r["sent"]["n0"]["rtt_ms"] for r in rs) / 1000

            def secure_once(pp: dict, seed: int) -> tuple[float, float]:
                run_id = c.start_run(_spec(seed, ROUND_TIMEOUT, **pp))
                o = c.watch(run_id, progress=False, timeout=300)
                per = {
                    k: r
                    for k, r in c.report(run_id).per_node.items()
                    if isinstance(r, dict) and "timings" in r
                }
                lead = per["n0"]
                assert lead["result"]["status"] == "released", (o.state, lead["result"])
                starts = [r["timings"]["started"] for r in per.values() if r["timings"]["started"]]
                return lead["timings"]["finished"] - min(starts), lead["timings"]["finished"] - max(
                    starts
                )

            c._call(plain_once())  # noqa: SLF001 - warm-up (channels, allocator)
            secure_once(CONFIGS["secagg-32-k8"], 99)
            names = ["plain", *CONFIGS]
            runs: dict[str, list] = {k: [] for k in names}
            for r in range(
                PROC_ROUNDS
            ):  # interleaved, order rotating: load drift hits every variant alike
                for k in names[r % len(names) :] + names[: r % len(names)]:
                    runs[k].append(
                        c._call(plain_once())
                        if k == "plain"  # noqa: SLF001
                        else secure_once(CONFIGS[k], 100 + 10 * r + names.index(k))
                    )
            plain = np.asarray(runs["plain"])
            out.update(
                {
                    "rounds": PROC_ROUNDS,
                    "plain_sum_runs_s": plain.tolist(),
                    "plain_sum_s": float(np.median(plain)),
                }
            )
            for k in CONFIGS:
                wall = np.asarray([w for w, _ in runs[k]])
                last = np.asarray([x for _, x in runs[k]])
                paired, paired_last = wall / plain, last / plain
                out[k] = {
                    "secure_sum_runs_s": wall.tolist(),
                    "secure_sum_s": float(np.median(wall)),
                    "ratio_vs_plain": float(np.median(paired)),
                    "ratio_range": [float(paired.min()), float(paired.max())],
                    "secure_sum_from_last_start_s": float(np.median(last)),
                    "ratio_from_last_start_vs_plain": float(np.median(paired_last)),
                    "ratio_from_last_start_range": [
                        float(paired_last.min()),
                        float(paired_last.max()),
                    ],
                }
    finally:
        cluster.stop(timeout=20)
    return out


def main(out_dir: pathlib.Path) -> dict:
    import uvloop

    with tempfile.TemporaryDirectory(prefix="bench-secagg-") as tmp:
        t = pathlib.Path(tmp)
        (t / "inproc").mkdir()
        (t / "procs").mkdir()
        procs = _processes(t / "procs")
        print("16 processes:", json.dumps(procs))
        inproc = uvloop.run(_inproc(t / "inproc"))
    print(
        f"16 members x {SUM_D} entries, threshold {THRESHOLD}; seconds (ratio to the plain sum); goal <= 3;"
        f" processes: medians of {PROC_ROUNDS} interleaved rounds, one process: best of {REPEATS}"
    )
    print(f"{'':34}{'16 processes':>22}{'one process':>22}")
    print(
        f"{'plain sum over the network':34}{procs['plain_sum_s']:>14.4f}{'':8}{inproc['plain_sum_s']:>14.4f}"
    )
    for name in CONFIGS:
        p, i = procs[name], inproc[name]
        print(
            f"{name + ' secure sum':34}{p['secure_sum_s']:>14.4f} ({p['ratio_vs_plain']:5.2f}){i['secure_sum_s']:>14.4f}"
            f" ({i['ratio_vs_plain']:5.2f})"
        )
        print(
            f"{'  … from the last node start':34}{p['secure_sum_from_last_start_s']:>14.4f} "
            f"({p['ratio_from_last_start_vs_plain']:5.2f}){i['secure_sum_from_last_start_s']:>14.4f}"
            f" ({i['ratio_from_last_start_vs_plain']:5.2f})"
        )
        print(
            f"{'  per-round ratio range (processes)':34}{p['ratio_range'][0]:>10.2f} – {p['ratio_range'][1]:.2f}"
            f"; from last start {p['ratio_from_last_start_range'][0]:.2f} – {p['ratio_from_last_start_range'][1]:.2f}"
        )
        print(
            f"{'  3 dropouts':34}{'-':>22}{i['secure_sum_3_dropouts_s']:>14.4f} ({i['ratio_3_dropouts_vs_plain']:5.2f})"
        )
        print(
            f"{'  … vs plain sum, same 3 dropouts':34}{'-':>22}{inproc['plain_sum_3_dropouts_s']:>14.4f}"
            f" ({i['ratio_3_dropouts_vs_plain_3_dropouts']:5.2f})"
        )
        print(
            f"{'  3 dropouts minus the idle wait':34}{'-':>22}{i['secure_sum_3_dropouts_minus_idle_wait_s']:>14.4f}"
            f" ({i['ratio_3_dropouts_minus_idle_wait_vs_plain']:5.2f})"
        )
        print(
            f"{'  CPU: all machines / leader':34}{'':22}{i['machine_cpu_all_nodes_s']:>9.4f} / {i['leader_cpu_s']:.4f}"
        )
    return {
        "members": SUM_N,
        "entries": SUM_D,
        "threshold": THRESHOLD,
        "dropouts": list(DROPOUTS),
        "dropout_round_timeout_s": DROP_TIMEOUT,
        "configs": CONFIGS,
        "processes": procs,
        "one_process": inproc,
        "goal": "secure sum <= 3x plain (also with 3 dropouts)",
    }


if __name__ == "__main__":
    d = pathlib.Path(__file__).parent / "out"
    d.mkdir(exist_ok=True)
    (d / "bench_secagg_net.json").write_text(json.dumps(main(d), indent=2))
