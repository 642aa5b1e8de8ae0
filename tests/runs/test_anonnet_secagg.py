"""Secure summation (``secagg-sum``) over 16 real nodes (complete:16, mutual TLS on 127.0.0.x).

1. Below threshold: two members never get their first message (masked input with its shares) out —
   their node drops it on the way out; threshold 15 → the round aborts at the masked inputs: no
   sum, no release record anywhere.  Every member charged its ledger once when its masked input
   was handed to the network (the charge must precede the send, and no node can know at start
   whether enough others will show up): conservative, and the only entries of the run.
2. Three members drop out: two never get their masked input out (their pairwise masks in the
   survivors' inputs are removed with shares of those seeds) and one is really stopped after its
   masked input left (its self-mask seed and its seeds with the two are rebuilt from the others'
   shares).  The sum over the 14 members whose masked input arrived equals the plain sum of their
   (noisy) inputs to the fixed-point bound ``2n·2^-(f+1)`` (data and noise rounded apart); every node holds exactly one
   ``aggregate`` charge (the two early ones: theirs was charged before the send failed).
"""

from __future__ import annotations

import asyncio
import pathlib

import numpy as np
import pytest
import uvloop
from helpers.anonnet import network

from hushnet.crypto.masks import FixedPoint
from hushnet.engine.rng import node_generator
from hushnet.families.secagg.wire import MASKED, UNMASK_REQ
from hushnet.privacy.secure_sum import effective_sensitivity
from hushnet.runs.service import RUN_PROTOCOL
from hushnet.runs.spec import Budget, RunSpec

N, D, SIGMA = 16, 40, 0.25


def _spec(seed: int, **pp) -> RunSpec:
    return RunSpec(
        protocol="secagg-sum",
        task="sum",
        graph=f"complete:{N}",
        steps=1,
        seed=seed,
        budget=Budget(1e6, 1e-5),
        sigma=SIGMA,
        noise="public-seed",
        protocol_params={"round_timeout": 5.0, **pp},
    ).with_run_id()


def _vanish(net, vertex: int, run_id: str, kind: int, *, stop: bool) -> None:
    """Make ``vertex`` drop out of ``run_id`` when it receives a message of ``kind`` (optionally stopping the node)."""
    svc = net.svc_by_vertex[vertex]
    node = next(nd for nd in net.nodes if nd.identity.vertex == vertex)
    inner = svc.handle

    def handle(envelope):
        if envelope.run_id == run_id and envelope.payload[:1] == bytes([kind]):
            if stop:
                asyncio.get_running_loop().create_task(node.stop(grace=0.0))
            return None  # gone: never answers
        return inner(envelope)

    svc.handle = handle  # type: ignore[method-assign]


def _mute(net, vertex: int, target_run: str, kind: int) -> None:
    """``vertex``'s node never gets its messages of ``kind`` for ``target_run`` out (as if it had crashed
    first): a wrapper of the node's own send, every other message goes over the real link."""
    node = next(nd for nd in net.nodes if nd.identity.vertex == vertex)
    send = node.send

    async def muted(to, payload, *, protocol, run_id="", **kw):
        if protocol == RUN_PROTOCOL and run_id == target_run and payload[:1] == bytes([kind]):
            raise ConnectionError("muted by the test")
        return await send(to, payload, protocol=protocol, run_id=run_id, **kw)

    node.send = muted  # type: ignore[method-assign]


@pytest.mark.timeout(180)
def test_secure_sum_16_nodes_dropouts_and_threshold(tmp_path: pathlib.Path) -> None:
    rng = np.random.default_rng(3)
    values = [rng.random(D) for _ in range(N)]

    async def go():
        async with network(tmp_path, f"complete:{N}", N, values=values, base_ip=60) as net:
            # ---- 1. below threshold: abort, nothing released, nothing in any ledger -----------------
            spec_a = _spec(1, threshold=15)
            for v in (4, 7):
                _mute(net, v, spec_a.run_id, MASKED)
            run_a = await net.client.start_run(spec_a)
            lead = net.driver(0, run_a)
            await net.wait(lambda: lead.state == "finished", 60, what="the leader to abort")
            assert lead.model is None and lead.finish_result["status"] == "aborted"
            assert "14 masked inputs arrived, threshold 15" in lead.finish_result["reason"]
            await net.wait(
                lambda: all(net.driver(v, run_a).state == "finished" for v in range(N)),
                30,
                what="members to receive the abort",
            )
            for v in range(N):
                entries = net.svc_by_vertex[v].ledger.entries(run_a)
                assert len(entries) == 1, (
                    v,
                    entries,
                )  # the conservative charge made when the input was sent
                assert net.driver(v, run_a).model is None
                assert not [
                    e for e in net.driver(v, run_a).events if e.get("name") == "secagg-release"
                ]

            # ---- 2. 3 members stopped mid-round: exact recovery ---------------------------------------
            spec = _spec(2, threshold=10)
            early, late = (5, 9), 13
            for v in early:
                _mute(net, v, spec.run_id, MASKED)  # the masked input never gets out
            _vanish(net, late, spec.run_id, UNMASK_REQ, stop=True)  # masked, then gone
            run_id = await net.client.start_run(spec)
            lead = net.driver(0, run_id)
            await net.wait(
                lambda: lead.state == "finished", 90, what="the leader to release the sum"
            )
            res = lead.finish_result
            assert res["status"] == "released", res
            survivors = sorted(set(range(N)) - set(early))
            assert res["survivors"] == survivors and res["dropped"] == list(early)
            sens = np.sqrt(D)  # SumTask on [0, 1]: (hi − lo)·√d
            # local-DP calibration of a share R(x) + R(z) seen alone: σ(Δ + q√d) (docs/design/spec/secagg.md)
            std = SIGMA * effective_sensitivity(sens, 1, dim=D, frac_bits=FixedPoint().frac_bits)
            plain = np.zeros(D)
            for u in survivors:  # each member's input + its own Gaussian noise (its run generator)
                plain += values[u] + node_generator(spec.seed, N, u).standard_normal(D) * std
            # data and noise rounded apart: two roundings per member
            bound = FixedPoint().error_bound(2 * len(survivors))
            assert res["error_bound"] == pytest.approx(bound)
            assert np.max(np.abs(lead.model - plain)) <= bound + 1e-9 * np.max(np.abs(plain))
            alive = [v for v in range(N) if v not in (*early, late)]
            await net.wait(
                lambda: all(net.driver(v, run_id).state == "finished" for v in alive),
                30,
                what="members to receive the broadcast sum",
            )
            for v in range(N):
                entries = net.svc_by_vertex[v].ledger.entries(run_id)
                assert len(entries) == 1, (v, entries)
                assert (
                    net.driver(v, run_id).report()["accounting_view"]["view_model"] == "aggregate"
                )
            assert (
                sorted(e["value"] for e in lead.events if e.get("name") == "secagg-release")
                == survivors
            )

    uvloop.run(go())
