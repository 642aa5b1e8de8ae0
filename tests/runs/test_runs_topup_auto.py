"""A node that was down when its walk was closed with a deviation gets its top-up when it comes back,
without the operator closing again (issue 14).

Real node processes (``hushnet node serve`` children, mutual TLS on 127.0.0.x).  A ``deviate`` walk on
hypercube:2; node n3 is SIGKILLed mid-walk, the walk goes around it (or, when n3 held the token at
that instant, is resumed from the last durable copy) and finishes, and ``watch`` closes
the run with ``deviated`` — every node but n3 is topped up, n3 is reported as owed.  n3 is restarted
on its state directory: it restores the run, asks its neighbours for the operator's signed close
record, verifies it and applies its top-up — exactly once (forged records: test_runs_close_record.py).
"""

from __future__ import annotations

import pathlib
import time

import pytest
from helpers.runs import cluster, synthetic_shards, wait_for  # noqa: E402

from hushnet.client import Client  # noqa: E402
from hushnet.privacy.ledger import Ledger  # noqa: E402
from hushnet.runs.spec import Budget, RunSpec  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

N, GRAPH, VICTIM = 4, "hypercube:2", 3


def _topups(state: pathlib.Path, node: str, run_id: str) -> tuple[int, int]:
    """(data charges, deviation top-ups) of ``run_id`` on ``node``'s ledger."""
    with Ledger(state / "nodes" / node / "privacy_ledger.sqlite") as led:
        es = led.entries(run_id)
    tops = sum(1 for e in es if e["note"].startswith("deviation top-up"))
    return len(es) - tops, tops


def test_topup_reaches_a_node_that_was_down_at_close(tmp_path: pathlib.Path) -> None:
    shards, _ = synthetic_shards(N, per_node=20, d=4, seed=2)
    with cluster(tmp_path, N, GRAPH, shards, epsilon=1e6, delta=1e-5) as cl:
        c = Client(tmp_path)
        try:
            spec = RunSpec(
                protocol="rw-dpsgd",
                task="logreg",
                graph=GRAPH,
                steps=400,
                seed=3,
                budget=Budget(1e6, 1e-5),
                sigma=0.5,
                clip=1.0,
                step_size=0.05,
                cap=None,
                on_peer_down="deviate",
            ).with_run_id()
            run_id = c.start_run(spec)
            victim = cl.nodes[VICTIM]
            wait_for(
                lambda: _topups(tmp_path, victim.name, run_id)[0] >= 3, timeout=120, every=0.05
            )
            victim.proc.kill()
            victim.proc.wait(timeout=10)
            out = c.watch(run_id, progress=False, timeout=200, pause_timeout=60)
            if out.state == "holder-lost":
                # it held the token (acknowledged) at the kill: the walk is taken up from the last
                # durable copy, a deviation like the skip around it (test_runs_durable.py checks
                # the resume itself); the top-up path under test is the same either way
                assert out.lost_holder["holder"] == victim.name, out
                assert c.resume(run_id)["lost"] == victim.name
                out = c.watch(run_id, progress=False, timeout=200, pause_timeout=60)
            assert out.state == "finished", out
            before = _topups(tmp_path, victim.name, run_id)
            assert (
                before[1] == 0 and before[0] >= 3
            )  # charged, not yet topped up: it was down at the close
            for v in range(N - 1):
                assert _topups(tmp_path, f"n{v}", run_id)[1] == 1
            c.close()  # no gRPC threads in this process while it forks the node (a fork can hang in them)
            victim.spawn()  # nobody calls close again
            c = Client(tmp_path)
            wait_for(lambda: _topups(tmp_path, victim.name, run_id)[1] >= 1, timeout=120, every=0.2)
            time.sleep(6.0)  # another round of asking neighbours must not top up twice
            after = _topups(tmp_path, victim.name, run_id)
            assert after == (before[0], 1), (before, after)

            def victim_status():  # the client reaches the restarted node again once it serves
                st = c.statuses(run_id).get(victim.name)
                return st if isinstance(st, dict) else None

            st = wait_for(victim_status, timeout=60, every=0.5)
            assert st["state"] == "closed" and st["deviation_accounted"], st
        finally:
            c.close()
