"""secagg-dpsgd over real nodes (complete:8, mutual TLS on 127.0.0.x, each node its own key, data and ledger).

1. Parity: with public-seed noise the networked run's final model equals the simulator's to 1e-12 at every
   node (same machines, same generators; the masks cancel exactly and the fixed point is deterministic).
2. Dropout: node 5's masked input of round 1 never gets out (its node drops it on the way, as if it crashed
   right before); the leader closes the round after its timeout with 7 survivors, recovers node 5's pairwise
   masks from the others' shares, and every node applies the same exact sum; node 5 rejoins in round 2.
   The model equals the update rule written out independently.
3. Ledgers: every node's persistent ledger toward every other node equals an independent Gaussian-view
   computation (quadrature of the view with √(t−c)·s unknown noise on a shift of Δ, composed over rounds),
   and the report names the collusion parameter.
"""

from __future__ import annotations

import math
import pathlib
import struct

import numpy as np
import pytest
import uvloop
from helpers.ddp import reference_model, renyi_gaussian_numeric, shards

from hushnet.crypto.masks import FixedPoint
from hushnet.families.secagg.wire import MASKED, ROUND
from hushnet.privacy.conversions import gdp_epsilon
from hushnet.privacy.secure_sum import share_std
from hushnet.protocols.registry import build_from_spec
from hushnet.runs.local_net import network
from hushnet.runs.service import RUN_PROTOCOL
from hushnet.runs.spec import Budget, RunSpec
from hushnet.sim import Simulator
from hushnet.tasks import LogisticRegressionTask

N, ROUNDS, T, C, SIGMA, CLIP, DELTA = 8, 3, 6, 2, 1.5, 0.5, 1e-5


def _spec(seed: int, timeout: float) -> RunSpec:
    return RunSpec(
        protocol="secagg-dpsgd",
        task="logreg",
        graph=f"complete:{N}",
        steps=ROUNDS,
        seed=seed,
        budget=Budget(1e3, DELTA),
        sigma=SIGMA,
        clip=CLIP,
        step_size=0.5,
        noise="public-seed",
        protocol_params={"threshold": T, "collusion": C, "round_timeout": timeout},
    ).with_run_id()


def _mute(net, vertex: int, run_id: str, prefix: bytes) -> None:
    node = next(nd for nd in net.nodes if nd.identity.vertex == vertex)
    send = node.send

    target = run_id

    async def muted(to, payload, *, protocol, run_id="", **kw):
        if (
            protocol == RUN_PROTOCOL
            and run_id == target
            and bytes(payload[: len(prefix)]) == prefix
        ):
            raise ConnectionError("muted by the test")
        return await send(to, payload, protocol=protocol, run_id=run_id, **kw)

    node.send = muted  # type: ignore[method-assign]


@pytest.mark.timeout(240)
def test_secagg_dpsgd_network_parity_dropout_and_ledgers(tmp_path: pathlib.Path) -> None:
    sh = shards(N, seed=4)
    spec = _spec(21, 5.0)
    tasks = [LogisticRegressionTask(X, y, **spec.task_kwargs()) for X, y in sh]
    sim = Simulator(build_from_spec(spec, tasks)).run()
    assert sim.status == "finished"
    s = share_std(SIGMA, 2 * CLIP, T, C, dim=tasks[0].dim, frac_bits=24)

    async def go():
        async with network(tmp_path, f"complete:{N}", N, shards=sh, base_ip=120) as net:
            # ---- 1. parity --------------------------------------------------------------------------------
            run_id = await net.client.start_run(spec)
            await net.wait(
                lambda: all(
                    (d := net.driver(v, run_id)) is not None and d.state == "finished"
                    for v in range(N)
                ),
                120,
                what="every node to finish",
            )
            for v in range(N):
                d = net.driver(v, run_id)
                assert np.max(np.abs(d.model - sim.model)) <= 1e-12, v
                assert not d.faults, d.faults
            rep = net.driver(3, run_id).report()
            assert (
                rep["accounting_view"]["collusion"] == C
                and rep["accounting_view"]["view_model"] == "aggregate"
            )
            assert f"c={C}" in rep["certified_bound"]
            # ---- 3. ledgers vs an independent Gaussian view -----------------------------------------------
            std = (
                math.sqrt(T - C) * s
            )  # noise a coalition of C members does not know, at the fewest survivors
            for v in range(N):
                led = net.svc_by_vertex[v].ledger
                assert len(led.entries(run_id)) == ROUNDS
                others = [f"n{u}" for u in range(N) if u != v]
                for tgt in others:
                    curve = led.rdp(tgt)
                    for j, a in enumerate(led.orders):
                        if a in (2.0, 8.0, 32.0):
                            assert curve[j] == pytest.approx(
                                ROUNDS * renyi_gaussian_numeric(a, 2 * CLIP, std), rel=1e-6
                            )
                    spent = led.spent(tgt, delta=DELTA)
                    assert spent.epsilon == pytest.approx(
                        gdp_epsilon(math.sqrt(ROUNDS) * 2 * CLIP / std, DELTA), rel=1e-6
                    )

            # ---- 2. a member's masked input of round 1 never gets out ------------------------------------
            spec2 = _spec(22, 1.0)
            _mute(net, 5, spec2.run_id, struct.pack(">BI", ROUND, 1) + bytes([MASKED]))
            run2 = await net.client.start_run(spec2)
            await net.wait(
                lambda: all(
                    (d := net.driver(v, run2)) is not None and d.state == "finished"
                    for v in range(N)
                ),
                120,
                what="every node to finish the dropout run",
            )
            res = net.driver(0, run2).finish_result
            models = [net.driver(v, run2).model for v in range(N)]
            assert all(np.array_equal(m, models[0]) for m in models)
            surv = [list(range(N)), [u for u in range(N) if u != 5], list(range(N))]
            ref = reference_model(
                tasks, spec2.seed, ROUNDS, spec2.step_size, s, surv, drew=[list(range(N))] * ROUNDS
            )
            assert (
                np.max(np.abs(models[0] - ref))
                <= ROUNDS * spec2.step_size * FixedPoint().error_bound(2 * N) + 1e-12
            )
            assert res["survivors"] == [N, N - 1, N]
            assert (
                len(net.svc_by_vertex[5].ledger.entries(run2)) == ROUNDS
            )  # charged before the send was lost

    uvloop.run(go())
