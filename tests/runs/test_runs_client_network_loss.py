"""The operator client when the network goes away during ``watch``: a clear error, never a hang."""

from __future__ import annotations

import threading
import time

from helpers.runs import cluster, synthetic_shards, wait_for

from hushnet.client import Client
from hushnet.client.core import ClientError
from hushnet.runs.spec import Budget, RunSpec

N, GRAPH = 4, "ring:4"


def test_watch_fails_clearly_when_the_network_goes_away(tmp_path):
    shards, _ = synthetic_shards(N, per_node=10, d=4, seed=3)
    spec = RunSpec(
        protocol="rw-dpsgd",
        task="logreg",
        graph=GRAPH,
        steps=200_000,
        seed=5,
        budget=Budget(1e6, 1e-5),
        sigma=0.5,
        clip=1.0,
        step_size=0.05,
    ).with_run_id()
    outcome: dict[str, object] = {}
    with cluster(tmp_path, N, GRAPH, shards, epsilon=1e6) as c:
        client = Client(tmp_path)
        try:
            run_id = client.start_run(spec)

            def watch() -> None:
                try:
                    outcome["result"] = client.watch(run_id, progress=False, timeout=120, poll=0.5)
                except Exception as exc:  # noqa: BLE001 - the test inspects what the user would see
                    outcome["error"] = exc

            t = threading.Thread(target=watch, daemon=True)
            t.start()
            wait_for(lambda: client.report(run_id).summary()["worst_pair_epsilon"] > 0, timeout=60)
            started = time.monotonic()
            c.stop(timeout=10)  # every node and the bootstrap go away mid-run
            t.join(timeout=90)
            assert not t.is_alive(), "watch hung after the network went away"
            assert time.monotonic() - started < 90
        finally:
            client.close()
    err = outcome.get("error")
    assert isinstance(err, ClientError), outcome
    assert "went away" in str(err) or "unreachable" in str(err), str(err)
