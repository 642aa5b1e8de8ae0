"""Progress events carry the final model's loss on public evaluation data, over a real network.

The loss is reported only for the final model (released to the operator anyway) on a file the node
owner put in its ``public/`` directory; a spec cannot make a node score a model on its private data.
"""
from __future__ import annotations

import numpy as np
import pytest

from node.client import Client
from node.client.core import RunRefusedError
from node.runs.spec import Budget, RunSpec
from node.tasks import LogisticRegressionTask
from node.tasks.data import PUBLIC_DIR

from runs_helpers import cluster, synthetic_shards

N, GRAPH = 4, "ring:4"


def _spec(eval_data: str, seed: int) -> RunSpec:
    return RunSpec(protocol="rw-dpsgd", task="logreg", graph=GRAPH, steps=60, seed=seed, budget=Budget(1e6, 1e-5),
                   sigma=0.5, clip=1.0, step_size=0.1, protocol_params={"eval_data": eval_data}).with_run_id()


def test_progress_events_carry_the_public_loss_of_the_final_model(tmp_path):
    shards, (Xt, yt) = synthetic_shards(N, per_node=10, d=4, seed=11)
    with cluster(tmp_path, N, GRAPH, shards, epsilon=1e6):
        for i in range(N):
            pub = tmp_path / "nodes" / f"n{i}" / PUBLIC_DIR
            pub.mkdir()
            np.savez(pub / "test.npz", X=Xt, y=yt)
        with Client(tmp_path) as client:
            # the node's private file is not public: naming it is refused at acceptance, nothing runs
            with pytest.raises(RunRefusedError, match="no public evaluation file 'data.npz'"):
                client.start_run(_spec("data.npz", seed=1))
            with pytest.raises(RunRefusedError, match="plain .npz/.csv file name"):
                client.start_run(_spec("../data.npz", seed=2))

            spec = _spec("test.npz", seed=3)
            run_id = client.start_run(spec)
            seen: list[tuple[int, int]] = []
            out = client.watch(run_id, progress=lambda s, t: seen.append((s, t)), timeout=120)
            assert out.state == "finished", out.reason
            w = client.model(run_id)
            expected = LogisticRegressionTask(Xt, yt, clip=1.0).evaluate(w, Xt, yt)["loss"]
            assert out.loss_data == "test.npz"
            assert out.loss == pytest.approx(expected, rel=1e-12)
            assert out.loss < np.log(2.0)  # better than w = 0 on the planted, separable data
            events = client._call(client._async._all("run.events", {"run_id": run_id, "after": 0}))
            progress = [e for r in events.values() for e in r["events"] if e["type"] == "progress"]
            scored = [e for e in progress if "loss" in e]
            assert len(scored) == 1 and scored[0]["step"] == spec.steps and scored[0]["node"] == out.holder
            assert scored[0]["loss_of"] == "final model"
            assert len(progress) > 1  # the in-run progress events exist, and carry no loss (intermediate models)
