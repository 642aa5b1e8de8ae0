"""A ``secagg-dpsgd`` round on 16 real networked nodes against a plain (unmasked) round of the same protocol.

Issue 10 §3 goal: masked round ≤ 3× the plain one.  Both runs are the same protocol, the same 16 nodes
(complete:16, mutual TLS on 127.0.0.x, each node its own key, ledger and data shard), the same rounds,
rotating leader, gradients and noise shares; ``aggregation = "plain"`` only replaces the secure sum by
members sending their noisy share to the leader in the clear (accounted as local DP: it is the cost
baseline, not a private alternative).  A round's time: (latest node finish − earliest node start) / R
over a run of ``ROUNDS`` rounds, so the start spread of the operator's RPCs is amortised.

Two model sizes: the demo's houses model (d = 9: the round is all protocol overhead — key agreement is
cached after the first round, Shamir shares and sealed envelopes per member per round) and d = 10 000
(a larger model, where masking the vector starts to count).  One process (:mod:`hushnet.runs.local_net`):
every node's crypto is serialised on one event loop — pessimistic for the masked round.  The plain and
masked runs alternate, ``REPEATS`` times; medians are reported, ratios never asserted.

Durability (issue 14): the masked runs are durable (every sending batch checkpointed before its messages
leave); a third variant runs the same masked rounds with ``HUSHNET_RUNS_DURABLE=0`` (no run store), and
``durable_ratio`` = durable round / volatile round measured in the same run.
"""

from __future__ import annotations

import os
import pathlib
import statistics
import tempfile

import numpy as np

from hushnet.runs.spec import Budget, RunSpec

N, ROUNDS, REPEATS, THRESHOLD, COLLUSION = 16, 6, 3, 14, 1
DIMS = (8, 10_000)  # features (houses: 8 + intercept)


def _shards(d: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(9)
    w = rng.standard_normal(d)
    out = []
    for _ in range(N):
        X = rng.standard_normal((200, d)) / np.sqrt(d)
        out.append((X, np.where(X @ w > 0, 1.0, -1.0)))
    return out


def _spec(seed: int, aggregation: str) -> RunSpec:
    return RunSpec(
        protocol="secagg-dpsgd",
        task="logreg",
        graph=f"complete:{N}",
        steps=ROUNDS,
        seed=seed,
        budget=Budget(1e9, 1e-5),
        sigma=2.0,
        clip=1.0,
        step_size=0.1,
        protocol_params={
            "threshold": THRESHOLD,
            "collusion": COLLUSION,
            "aggregation": aggregation,
            "round_timeout": 5.0,
        },
    ).with_run_id()


async def _one(net, spec: RunSpec) -> float:
    run_id = await net.client.start_run(spec)
    await net.wait(
        lambda: all(
            (d := net.driver(v, run_id)) is not None and d.state == "finished" for v in range(N)
        ),
        300,
        what=f"{spec.protocol_params['aggregation']} run to finish",
    )
    ds = [net.driver(v, run_id) for v in range(N)]
    assert all(not d.faults for d in ds), [d.faults for d in ds if d.faults][:1]
    return (max(d.timings.finished for d in ds) - min(d.timings.started for d in ds)) / ROUNDS


async def _bench(tmp: pathlib.Path) -> dict:
    from hushnet.runs.local_net import network
    from hushnet.runs.service import DURABLE_ENV

    out = {}
    old = os.environ.get(DURABLE_ENV)
    variants = ("plain", "secure", "secure_volatile")
    try:
        for i, d in enumerate(DIMS):
            times: dict[str, list[float]] = {k: [] for k in variants}
            async with network(
                tmp / f"d{d}",
                f"complete:{N}",
                N,
                shards=_shards(d),
                epsilon=1e9,
                base_ip=150 + 20 * i,
            ) as net:
                for rep in range(REPEATS):
                    order = variants if rep % 2 == 0 else variants[::-1]
                    for k, var in enumerate(order):
                        # read by the nodes at acceptance: the volatile run keeps no run store
                        os.environ[DURABLE_ENV] = "0" if var == "secure_volatile" else "1"
                        agg = "plain" if var == "plain" else "secure"
                        times[var].append(await _one(net, _spec(100 * i + 10 * rep + k, agg)))
            plain, secure = statistics.median(times["plain"]), statistics.median(times["secure"])
            volatile = statistics.median(times["secure_volatile"])
            out[f"d={d + 1}"] = {
                "plain_round_s": plain,
                "secure_round_s": secure,
                "secure_volatile_round_s": volatile,
                "ratio": secure / plain,
                "durable_ratio": secure / volatile,
                "plain_all_s": times["plain"],
                "secure_all_s": times["secure"],
                "secure_volatile_all_s": times["secure_volatile"],
            }
    finally:
        if old is None:
            os.environ.pop(DURABLE_ENV, None)
        else:
            os.environ[DURABLE_ENV] = old
    return out


def main(out_dir: pathlib.Path) -> dict:
    import uvloop

    with tempfile.TemporaryDirectory(prefix="bench-ddp-") as tmp:
        res = uvloop.run(_bench(pathlib.Path(tmp)))
    print(
        f"secagg-dpsgd, {N} nodes in one process, t={THRESHOLD}, c={COLLUSION}, {ROUNDS} rounds per run, "
        f"median of {REPEATS}; goal: secure ≤ 3× plain"
    )
    for k, r in res.items():
        print(
            f"  model {k:>9}: plain round {r['plain_round_s']:.4f} s, secure round {r['secure_round_s']:.4f} s, "
            f"ratio {r['ratio']:.2f}; secure without checkpoints {r['secure_volatile_round_s']:.4f} s, "
            f"durable ratio {r['durable_ratio']:.2f}"
        )
    return {
        "nodes": N,
        "rounds_per_run": ROUNDS,
        "repeats": REPEATS,
        "threshold": THRESHOLD,
        "collusion": COLLUSION,
        "setting": "one process (local_net), complete:16, mutual TLS",
        "results": res,
    }
