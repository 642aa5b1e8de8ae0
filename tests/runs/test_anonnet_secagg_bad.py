"""Secure summation over real nodes (complete:8, mutual TLS on 127.0.0.x) with misbehaving participants.

Members 0..6 sum (leader 0, threshold 4); node 7 is in the run's graph but not a member.  One round,
three offences, each by a different node, each with the real machine on a real node whose outgoing
message is corrupted by a test-side wrapper (of the machine's or the node's own send; the network is
never mocked):

* member 2 sends a masked input of the wrong length (one word short);
* node 7, not a member, sends a well-formed masked input of the right length to the leader;
* member 5 reveals a share (in its unmask answer) that is not on the dealer's committed polynomial.

Each is rejected at the leader with a typed, counted, logged Fault.  The offender of the wrong length
is treated as dropped (its pairwise masks in the others' inputs removed through shares of those seeds), the
non-member's input is ignored, the lying share is outvoted by the commitment check; the released sum
equals the plain sum of the survivors' (noisy) inputs to the fixed-point bound, and the ledgers hold
exactly what left: one ``aggregate`` charge at every member whose masked input left (the wrong-length
one included: it did leave), nothing at the non-member, and the leader's release record names
exactly the survivors.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import uvloop
from helpers.anonnet import network

from hushnet.crypto.masks import FixedPoint
from hushnet.crypto.shamir import PRIME, SHARE_LEN
from hushnet.engine.rng import node_generator
from hushnet.families.secagg import wire as sa
from hushnet.net.node import DeliveryError
from hushnet.privacy.secure_sum import effective_sensitivity
from hushnet.runs.service import RUN_PROTOCOL
from hushnet.runs.spec import Budget, RunSpec

N, D, SIGMA = 8, 24, 0.25
MEMBERS, LEADER = tuple(range(7)), 0
SHORT, OUTSIDER, LIAR = 2, 7, 5


def _corrupt_outgoing(net, vertex: int, run_id: str, when_kind: int, corrupt) -> None:
    """When ``vertex`` receives a round message of ``when_kind``, wrap its real machine's outgoing
    messages with ``corrupt(payload) -> payload`` (the machine itself runs unchanged)."""
    svc = net.svc_by_vertex[vertex]
    inner_handle = svc.handle

    def handle(envelope):
        if envelope.run_id == run_id and envelope.payload[:1] == bytes([when_kind]):
            machine = net.driver(vertex, run_id).machine.inner
            send = machine._send  # noqa: SLF001 - the wrapper sits on the machine's own output

            def lying_send(dst: int, data: bytes):
                return send(dst, corrupt(data))

            machine._send = lying_send  # type: ignore[method-assign]
        return inner_handle(envelope)

    svc.handle = handle  # type: ignore[method-assign]


def _corrupt_send(net, vertex: int, run_id: str, kind: int, corrupt) -> None:
    """``vertex``'s node sends its round messages of ``kind`` through ``corrupt(payload) -> payload``
    (a wrapper of the node's own send: the first message leaves at start, before anything arrives)."""
    node = next(nd for nd in net.nodes if nd.identity.vertex == vertex)
    send = node.send

    async def corrupted(to, payload, *, protocol, run_id="", **kw):
        if protocol == RUN_PROTOCOL and run_id == target and payload[:1] == bytes([kind]):
            payload = corrupt(payload)
        return await send(to, payload, protocol=protocol, run_id=run_id, **kw)

    target = run_id
    node.send = corrupted  # type: ignore[method-assign]


def _short_masked(data: bytes) -> bytes:
    return data[:-8] if data[:1] == bytes([sa.MASKED]) else data  # one 64-bit word short


def _lying_unmask(data: bytes) -> bytes:
    if data[:1] != bytes([sa.UNMASK]):
        return data
    b = bytearray(data)
    off = 3 + 4 + 1  # first revealed share: kind, count, owner, which
    y = int.from_bytes(b[off + 4 : off + SHARE_LEN], "big")
    b[off + 4 : off + SHARE_LEN] = ((y + 12345) % PRIME).to_bytes(SHARE_LEN - 4, "big")
    return bytes(b)


@pytest.mark.timeout(120)
def test_bad_inputs_over_the_network_rejected_counted_and_accounted(tmp_path: pathlib.Path) -> None:
    rng = np.random.default_rng(8)
    values = [rng.random(D) for _ in range(N)]

    async def go():
        async with network(tmp_path, f"complete:{N}", N, values=values, base_ip=96) as net:
            spec = RunSpec(
                protocol="secagg-sum",
                task="sum",
                graph=f"complete:{N}",
                steps=1,
                seed=4,
                budget=Budget(1e6, 1e-5),
                sigma=SIGMA,
                noise="public-seed",
                protocol_params={
                    "round_timeout": 3.0,
                    "threshold": 4,
                    "members": list(MEMBERS),
                    "leader": LEADER,
                },
            ).with_run_id()
            _corrupt_send(net, SHORT, spec.run_id, sa.MASKED, _short_masked)
            _corrupt_outgoing(net, LIAR, spec.run_id, sa.UNMASK_REQ, _lying_unmask)
            run_id = await net.client.start_run(spec)
            lead = net.driver(LEADER, run_id)
            # the outsider sends a masked input of the right length over its own mTLS link to the leader
            outsider = net.ordered[OUTSIDER]
            forged = bytes([sa.MASKED]) + sa.U32.pack(D) + np.arange(D, dtype="<u8").tobytes()
            with pytest.raises(DeliveryError, match="not a member"):
                await outsider.send(
                    net.ordered[LEADER].node_id,
                    forged,
                    protocol=RUN_PROTOCOL,
                    run_id=run_id,
                    timeout=30.0,
                )
            await net.wait(
                lambda: lead.state == "finished", 60, what="the leader to release the sum"
            )
            res = lead.finish_result
            assert res["status"] == "released", res

            # each offence: a typed Fault, counted in the leader's driver and in its event stream (logged)
            codes = [f["code"] for f in lead.faults]
            assert sorted(codes) == [
                "inconsistent-shares",
                "unexpected-sender",
                "wrong-dimension",
            ], lead.faults
            assert sorted(e["code"] for e in lead.events if e["type"] == "fault") == sorted(codes)
            assert any(
                f"member {LIAR}" in f["message"]
                for f in lead.faults
                if f["code"] == "inconsistent-shares"
            )

            # exact sum over the survivors: the short input is dropped, the outsider never counted
            survivors = [u for u in MEMBERS if u != SHORT]
            assert (
                res["survivors"] == survivors
                and res["dropped"] == [SHORT]
                and res["offenders"] == [LIAR]
            )
            sens = np.sqrt(D)  # SumTask on [0, 1]
            # local-DP calibration of a share R(x) + R(z) seen alone: σ(Δ + q√d) (docs/design/spec/secagg.md)
            std = SIGMA * effective_sensitivity(sens, 1, dim=D, frac_bits=FixedPoint().frac_bits)
            plain = sum(
                values[u] + node_generator(spec.seed, N, u).standard_normal(D) * std
                for u in survivors
            )
            bound = FixedPoint().error_bound(2 * len(survivors))  # data and noise rounded apart
            assert np.max(np.abs(lead.model - plain)) <= bound + 1e-9 * np.max(np.abs(plain))

            # ledgers: exactly what left, nothing released unaccounted
            await net.wait(
                lambda: all(net.driver(u, run_id).state == "finished" for u in survivors),
                30,
                what="survivors to receive the broadcast sum",
            )
            for v in range(N):
                entries = net.svc_by_vertex[v].ledger.entries(run_id)
                assert len(entries) == (1 if v in MEMBERS else 0), (v, entries)
            released = sorted(e["value"] for e in lead.events if e.get("name") == "secagg-release")
            assert released == survivors
            assert (
                net.driver(OUTSIDER, run_id).model is None
                and net.driver(SHORT, run_id).model is None
            )

    uvloop.run(go())
