"""CPU-side costs of the anonymity layer, each against a baseline measured in the same run.

* **Onion relaying** of one RW token (model of d float64) over 3 relays + the recipient
  (4 peels, fixed 64 KiB cells) against (a) a plain copy of the model bytes and (b) the direct
  envelope hop (token encode + envelope encode/decode + strict token decode), the per-message work
  of a plain sender-known handoff.  Issue goal: onion ≤ 4× direct (reported, not asserted).
  The network-level latency (4 link hops instead of 1) comes on top and is measured by the
  network tests once the node driver runs these machines.
* **Secure summation** of 16 members × 10⁵ entries (all rounds of the real machines in the
  simulator: key agreement, Shamir shares, masks, unmasking) with 0 and 3 dropouts, against
  (a) the plain numpy sum and (b) a plain aggregation over the wire (16 vectors serialised, parsed
  and summed by the aggregator).  Members run in parallel on a real network, so the table also
  gives the critical path: the slowest member's CPU + the leader's.  Issue goal: ≤ 3× plain.
"""

from __future__ import annotations

import pathlib
import time
from typing import Callable

import numpy as np

from hushnet.crypto.cells import CELL_BODY, from_cells, to_cells
from hushnet.crypto.keys import simulation_keypairs
from hushnet.crypto.onion import OnionKeyring, build_packet, peel
from hushnet.engine.wire import Envelope
from hushnet.families.anonymity.onion import payload_len_for
from hushnet.families.secagg.machines import build_round
from hushnet.families.secagg.params import SecAggParams
from hushnet.families.walk.wire import decode_token, encode_token
from hushnet.sim.simulator import Simulator

REPEATS = 7  # the shared 2-core machine is noisy: keep the best of several


def _best(fn: Callable[[], object], repeats: int = REPEATS) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _onion(d: int) -> dict:
    x = np.random.default_rng(0).standard_normal(d)
    token = encode_token(5, 100, 0, 3, x)
    kps = simulation_keypairs(1, 5, "onion")
    path = [1, 2, 3, 4]  # three relays and the recipient
    slots = 8
    plen = payload_len_for(len(token), CELL_BODY, slots)

    def copy():
        bytearray(x.tobytes())

    def direct():
        env = Envelope("rw-dpsgd", "run", 1, encode_token(5, 100, 0, 3, x)).encode()
        decode_token(Envelope.decode(env).payload, d)

    rings = {}

    def onion():
        for v in path:
            rings[v] = OnionKeyring.single(kps[v])
        pkt = build_packet(
            [(v, kps[v].public) for v in path], token, epoch=0, slots=slots, payload_len=plen
        )
        data = to_cells(pkt)
        for v in path:
            res = peel(rings[v], from_cells(data), slots=slots, payload_len=plen)
            if not res.final:
                data = to_cells(res.packet)
        decode_token(res.message, d)

    t_copy, t_direct, t_onion = _best(copy, 15), _best(direct, 15), _best(onion, 15)
    # per-hop share: the sender's wrap vs one relay's peel
    pkt = build_packet(
        [(v, kps[v].public) for v in path], token, epoch=0, slots=slots, payload_len=plen
    )
    t_wrap = _best(
        lambda: to_cells(
            build_packet(
                [(v, kps[v].public) for v in path], token, epoch=0, slots=slots, payload_len=plen
            )
        ),
        15,
    )

    def one_peel():
        r = OnionKeyring.single(kps[1])
        to_cells(peel(r, from_cells(to_cells(pkt)), slots=slots, payload_len=plen).packet)

    t_peel = _best(one_peel, 15)
    t_parts = (
        t_wrap + len(path) * t_peel
    )  # end-to-end CPU from separately timed parts (robust to load spikes)
    return {
        "model_entries": d,
        "token_bytes": len(token),
        "cells": len(to_cells(pkt)) // CELL_BODY,
        "plain_copy_s": t_copy,
        "direct_hop_s": t_direct,
        "onion_3_relays_s": t_onion,
        "onion_wrap_s": t_wrap,
        "onion_peel_per_hop_s": t_peel,
        "onion_sum_of_parts_s": t_parts,
        "ratio_onion_parts_vs_direct": t_parts / t_direct,
        "ratio_onion_vs_direct": t_onion / t_direct,
        "ratio_onion_vs_copy": t_onion / t_copy,
        "ratio_peel_vs_direct": t_peel / t_direct,
    }


def _timed_machines(ms) -> dict[int, float]:
    cpu: dict[int, float] = {}
    for m in ms:
        orig = m.handle

        def handle(ev, _orig=orig, _v=m.ctx.node):
            t0 = time.perf_counter()
            try:
                return _orig(ev)
            finally:
                cpu[_v] = cpu.get(_v, 0.0) + time.perf_counter() - t0

        m.handle = handle  # type: ignore[method-assign]
    return cpu


def _secagg(members: int, d: int, dropouts: int) -> dict:
    rng = np.random.default_rng(1)
    vecs = {v: rng.normal(size=d) for v in range(members)}
    stack = np.stack([vecs[v] for v in range(members)])

    def plain():
        stack.sum(axis=0)

    def plain_wire():
        msgs = [vecs[v].astype("<f8").tobytes() for v in range(members)]
        total = np.zeros(d)
        for b in msgs:
            total += np.frombuffer(b, dtype="<f8")

    best = None
    for _ in range(3):
        p = SecAggParams(
            members=tuple(range(members)), leader=members, threshold=members // 2 + 1, dim=d
        )
        ms, _ = build_round(vecs, p, members + 1, run_seed=2)
        cpu = _timed_machines(ms)
        sim = Simulator(ms, latency=1e-3)
        for v in range(dropouts):  # gone before their masked input (with its shares) leaves: in D
            sim.kill(3 + 4 * v, 0.0)
        t0 = time.perf_counter()
        res = sim.run()
        wall = time.perf_counter() - t0
        assert res.status == "finished" and res.finish.result["status"] == "released"
        surv = res.finish.result["survivors"]
        err = float(np.abs(res.model - stack[surv].sum(axis=0)).max())
        member_cpu = max(cpu.get(v, 0.0) for v in surv)
        row = {
            "total_cpu_s": wall,
            "leader_cpu_s": cpu.get(members, 0.0),
            "slowest_member_cpu_s": member_cpu,
            "critical_path_s": member_cpu + cpu.get(members, 0.0),
            "max_abs_error": err,
            "error_bound": res.finish.result["error_bound"],
            "dropped": res.finish.result["dropped"],
        }
        if best is None or row["total_cpu_s"] < best["total_cpu_s"]:
            best = row
    t_plain, t_wire = _best(plain), _best(plain_wire)
    assert best is not None
    best.update(
        {
            "members": members,
            "entries": d,
            "dropouts": dropouts,
            "plain_sum_s": t_plain,
            "plain_wire_sum_s": t_wire,
            "ratio_total_vs_plain_wire": best["total_cpu_s"] / t_wire,
            "ratio_critical_path_vs_plain_wire": best["critical_path_s"] / t_wire,
            "ratio_total_vs_plain_sum": best["total_cpu_s"] / t_plain,
        }
    )
    return best


def main(out_dir: pathlib.Path) -> dict:
    onion = [_onion(d) for d in (1_000, 100_000)]
    print(
        f"{'model entries':>14} {'copy ms':>9} {'direct ms':>10} {'onion ms':>9} {'wrap ms':>8} {'peel/hop ms':>12} "
        f"{'onion/direct':>13} {'parts/direct':>13} {'peel/direct':>12}"
    )
    for r in onion:
        print(
            f"{r['model_entries']:>14} {1e3 * r['plain_copy_s']:9.3f} {1e3 * r['direct_hop_s']:10.3f} "
            f"{1e3 * r['onion_3_relays_s']:9.3f} {1e3 * r['onion_wrap_s']:8.3f} {1e3 * r['onion_peel_per_hop_s']:12.3f} "
            f"{r['ratio_onion_vs_direct']:13.1f} {r['ratio_onion_parts_vs_direct']:13.1f} {r['ratio_peel_vs_direct']:12.2f}"
        )
    sec = [_secagg(16, 100_000, k) for k in (0, 3)]
    print(
        f"{'dropouts':>9} {'plain ms':>9} {'wire ms':>8} {'secagg total ms':>16} {'crit. path ms':>14} "
        f"{'total/wire':>11} {'crit/wire':>10} {'max err':>9} {'bound':>9}"
    )
    for r in sec:
        print(
            f"{r['dropouts']:>9} {1e3 * r['plain_sum_s']:9.2f} {1e3 * r['plain_wire_sum_s']:8.2f} {1e3 * r['total_cpu_s']:16.1f} "
            f"{1e3 * r['critical_path_s']:14.1f} {r['ratio_total_vs_plain_wire']:11.1f} {r['ratio_critical_path_vs_plain_wire']:10.1f} "
            f"{r['max_abs_error']:9.2e} {r['error_bound']:9.2e}"
        )
    return {
        "onion": onion,
        "secure_sum": sec,
        "goals": {"onion_vs_direct": 4.0, "secure_sum_vs_plain": 3.0},
        "notes": [
            "CPU only, best of 7-15 repetitions (secure sum: best of 3 rounds), same run as the baselines; nothing is asserted",
            "onion: wrap at the sender + 3 relay peels + the recipient's peel, 64 KiB cells, 8 header slots; "
            "peel/direct compares one relay's work with one plain handoff (the per-hop latency on a network); "
            "parts = wrap + 4 peels timed separately (best of 15 each), less sensitive to load spikes than the whole pipeline",
            "secure sum: all machines of one round in the simulator (sequential CPU = total); critical path = slowest member + leader",
        ],
    }


if __name__ == "__main__":
    import json

    out = pathlib.Path(__file__).resolve().parent / "out"
    out.mkdir(exist_ok=True)
    print(json.dumps(main(out), indent=1, default=float)[:2000])
