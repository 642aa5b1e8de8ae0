"""A node under hostile or careless input (issue 14, points 3, 4, 9a, 9b), over real mutual TLS.

Bootstrap and three nodes in one event loop on 127.0.0.x (real gRPC, real certificates, the run
service installed as in a node process), each with a data shard and a policy:

* a neighbour's envelope (random bytes) for an accepted run does not start it (point 3);
* hundreds of malformed or refused messages produce a handful of log lines, no traceback, and the
  counts (point 4);
* resubmitting a known run id with a bad signature is refused (point 9a);
* a 100 000-deep JSON payload to ``run.submit`` is refused by the depth limit (point 9b).
"""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib
import re
from dataclasses import replace

import pytest
import uvloop
from helpers.net import inprocess_bootstrap  # noqa: E402
from helpers.runs import synthetic_shards, write_node_data  # noqa: E402

from hushnet.net import pki  # noqa: E402
from hushnet.net.node import DeliveryError, Node, NodeConfig  # noqa: E402
from hushnet.net.operator import Operator, OperatorCredentials  # noqa: E402
from hushnet.runs.service import RUN_PROTOCOL, RunService  # noqa: E402
from hushnet.runs.spec import Budget, RunSpec, SignedRunSpec, sign_spec  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

N = 3
GRAPH = "complete:3"
LOG_INTERVAL = 1.0


async def _network(tmp: pathlib.Path):
    shards, _ = synthetic_shards(N, per_node=10, d=3, seed=1)
    write_node_data(tmp, shards, epsilon=1e6, delta=1e-5)
    addr, stop, task = await inprocess_bootstrap(tmp, GRAPH)
    nodes = [
        Node(
            NodeConfig(
                tmp / "nodes" / f"n{i}",
                f"127.0.0.{60 + i}:0",
                addr,
                "tok",
                tmp / "b" / "ca.pem",
                node_id=f"n{i}",
                probe_s=0.3,
                directory_refresh_s=0.3,
                log_interval_s=LOG_INTERVAL,
            )
        )
        for i in range(N)
    ]
    services = [RunService(nd).install() for nd in nodes]
    await asyncio.gather(*(nd.start() for nd in nodes))
    for _ in range(200):
        if all(
            len(nd.links) == N - 1 and all(lk.healthy for lk in nd.links.values()) for nd in nodes
        ):
            break
        await asyncio.sleep(0.1)
    return nodes, services, stop, task


async def _shutdown(nodes, services, stop, task) -> None:
    for svc in services:
        svc.close()
    for nd in nodes:
        await nd.stop()
    stop.set()
    await task


def _signed(tmp: pathlib.Path, **kw) -> SignedRunSpec:
    base = dict(
        protocol="rw-dpsgd",
        task="logreg",
        graph=GRAPH,
        steps=30,
        seed=3,
        budget=Budget(1e6, 1e-5),
        sigma=2.0,
        clip=1.0,
        step_size=0.1,
    )
    base.update(kw)
    key = pki.load_key((tmp / "b" / "operator.key").read_bytes())
    return sign_spec(RunSpec(**base).with_run_id(), key, (tmp / "b" / "operator.pem").read_bytes())


async def _control(tmp: pathlib.Path, node: Node, command: str, payload) -> dict:
    async with Operator(OperatorCredentials.from_state_dir(tmp / "b")) as op:
        return await op.control(node.node_id, node.address, command, payload)


def test_neighbour_cannot_start_resubmission_rechecked_deep_json_refused(
    tmp_path: pathlib.Path,
) -> None:
    async def go():
        nodes, services, stop, task = await _network(tmp_path)
        try:
            n0, n1 = nodes[0], nodes[1]
            signed = _signed(tmp_path)
            rid = signed.spec.run_id
            dec = await _control(tmp_path, n0, "run.submit", signed.to_bytes())
            assert dec["accept"], dec
            # point 3: random bytes from a neighbour for the accepted run do not start it
            ack = await n1.send("n0", os.urandom(48), protocol=RUN_PROTOCOL, run_id=rid)
            assert ack.accepted
            run = services[0].runs[rid]
            assert run.state == "accepted" and run.contributions == 0 and run.messages_out == 0
            assert services[0].ledger.entries(rid) == []
            st = await _control(tmp_path, n0, "run.status", {"run_id": rid})
            assert st["state"] == "accepted" and st["early_buffered"] == 1
            # point 9a: same run id, signature that does not verify -> refused, the run is untouched
            forged = SignedRunSpec(
                signed.spec, bytes(reversed(signed.signature)), signed.certificate_pem
            )
            dec = await _control(tmp_path, n0, "run.submit", forged.to_bytes())
            assert dec["accept"] is False and "signature" in dec["reason"], dec
            # ... and a spec with the same run id signed by a key that is not the operator's
            other = sign_spec(
                replace(signed.spec, run_id=""), pki.generate_key(), signed.certificate_pem
            )
            dec = await _control(
                tmp_path,
                n0,
                "run.submit",
                SignedRunSpec(signed.spec, other.signature, signed.certificate_pem).to_bytes(),
            )
            assert dec["accept"] is False and "signature" in dec["reason"], dec
            # the genuine resubmission is still "already accepted"
            dec = await _control(tmp_path, n0, "run.submit", signed.to_bytes())
            assert dec["accept"] and dec["state"] == "accepted", dec
            # point 9b: 100 000-deep JSON is a refusal by the depth limit, not a RecursionError
            deep = b"[" * 100_000 + b"]" * 100_000
            dec = await _control(tmp_path, n0, "run.submit", deep)
            assert (
                dec["accept"] is False and "nested" in dec["reason"] and "limit" in dec["reason"]
            ), dec
            with pytest.raises(Exception, match="nested"):
                await _control(tmp_path, n0, "run.status", b'{"run_id": ' + deep + b"}")
            assert run.state == "accepted"
        finally:
            await _shutdown(nodes, services, stop, task)

    uvloop.run(go())


def test_malformed_message_flood_logs_a_few_counted_lines(tmp_path: pathlib.Path, caplog) -> None:
    n_refused, n_garbage, n_unknown = 300, 300, 100

    async def go():
        nodes, services, stop, task = await _network(tmp_path)
        try:
            n0 = nodes[0]
            caplog.clear()
            for i in range(
                n_refused
            ):  # envelopes for runs n1 does not know: the run service refuses each
                with pytest.raises(DeliveryError):
                    await n0.send(
                        "n1", os.urandom(40), protocol=RUN_PROTOCOL, run_id=f"run-{i:05d}"
                    )
            link = n0.links["n1"]
            for _ in range(n_garbage):  # bytes that are not an Envelope at all
                with pytest.raises(Exception):
                    await link.deliver(b"\xff\xfe" + os.urandom(30), timeout=10)
            for _ in range(n_unknown):
                with pytest.raises(DeliveryError):
                    await n0.send("n1", b"x", protocol="no.such.protocol", run_id="r")
            assert nodes[1].rejected >= n_refused + n_garbage + n_unknown
            await asyncio.sleep(LOG_INTERVAL * 2.5)  # the flush loop writes the counts
        finally:
            await _shutdown(nodes, services, stop, task)

    with caplog.at_level(logging.WARNING):
        uvloop.run(go())
    mine = [
        r for r in caplog.records if getattr(r, "node", "") == "n1" and r.levelno >= logging.WARNING
    ]
    assert len(mine) <= 12, [r.getMessage() for r in mine]
    assert not any(r.exc_info for r in mine), "no traceback for refused messages"
    counts: dict[str, int] = {}
    for r in mine:
        counts[r.kind] = counts.get(r.kind, 0) + r.count
    assert counts.get("refused:hushnet.run:unknown-run") == n_refused, counts
    assert counts.get("rejected:malformed-envelope") == n_garbage, counts
    assert counts.get("rejected:unknown-protocol") == n_unknown, counts
    # the flood may span more than one log interval on a loaded machine: each interval opens with one
    # line and then says how many more of the kind it counted (the totals are checked above)
    assert any(
        re.match(r"\d+ more refused:hushnet\.run:unknown-run in the last ", r.getMessage())
        for r in mine
    ), [r.getMessage() for r in mine]
