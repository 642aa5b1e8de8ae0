"""Progress events carry the final model's loss on public evaluation data, over a real network.

Real nodes (in one process: :mod:`hushnet.runs.local_net`, real mutual TLS on 127.0.0.x, the real
operator client).  The loss is reported only for the final model (released to the operator anyway)
on a file the node owner put in its ``public/`` directory; a spec cannot make a node score a model
on its private data.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from helpers.runs import synthetic_shards

from hushnet.client.core import RunRefusedError
from hushnet.runs.local_net import network
from hushnet.runs.spec import Budget, RunSpec
from hushnet.tasks import LogisticRegressionTask
from hushnet.tasks.data import PUBLIC_DIR

N, GRAPH = 4, "ring:4"


def _spec(eval_data: str, seed: int) -> RunSpec:
    return RunSpec(
        protocol="rw-dpsgd",
        task="logreg",
        graph=GRAPH,
        steps=60,
        seed=seed,
        budget=Budget(1e6, 1e-5),
        sigma=0.5,
        clip=1.0,
        step_size=0.1,
        protocol_params={"eval_data": eval_data},
    ).with_run_id()


def test_progress_events_carry_the_public_loss_of_the_final_model(tmp_path):
    shards, (Xt, yt) = synthetic_shards(N, per_node=10, d=4, seed=11)

    async def go():
        async with network(tmp_path, GRAPH, N, shards=shards, base_ip=140) as net:
            for i in range(N):
                pub = tmp_path / f"n{i}" / PUBLIC_DIR
                pub.mkdir()
                np.savez(pub / "test.npz", X=Xt, y=yt)
            c = net.client
            refusals = []
            for bad in ("data.npz", "../data.npz"):  # the private file, and a path out of public/
                with pytest.raises(RunRefusedError) as err:
                    await c.start_run(_spec(bad, seed=len(refusals) + 1))
                refusals.append(str(err.value))
            spec = _spec("test.npz", seed=3)
            run_id = await c.start_run(spec)
            out = await c.watch(run_id, progress=False, timeout=120, poll=0.5)
            w = await c.model(run_id)
            events = await c._all("run.events", {"run_id": run_id, "after": 0})  # noqa: SLF001
            return refusals, spec, out, w, events

    refusals, spec, out, w, events = asyncio.run(go())
    assert "no public evaluation file 'data.npz'" in refusals[0]
    assert "plain .npz/.csv file name" in refusals[1]
    assert out.state == "finished", out.reason
    expected = LogisticRegressionTask(Xt, yt, clip=1.0).evaluate(w, Xt, yt)["loss"]
    assert out.loss_data == "test.npz"
    assert out.loss == pytest.approx(expected, rel=1e-12)
    assert 0.0 < out.loss < 5.0 and out.loss != pytest.approx(
        np.log(2.0)
    )  # a trained model's loss, not w = 0's
    progress = [e for r in events.values() for e in r["events"] if e["type"] == "progress"]
    scored = [e for e in progress if "loss" in e]
    assert len(scored) == 1 and scored[0]["step"] == spec.steps and scored[0]["node"] == out.holder
    assert scored[0]["loss_of"] == "final model"
    assert (
        len(progress) > 1
    )  # the in-run progress events exist, and carry no loss (intermediate models)
