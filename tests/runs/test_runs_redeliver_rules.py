"""Which failed deliveries the run driver sends again, and how (issue 12; the network case is
``test_gossipnet_redeliver.py``).

A machine with ``redeliver_for`` (gossip) has a transport failure (``UNAVAILABLE``,
``DEADLINE_EXCEEDED``) sent again under the *same* envelope number, before the next message to that
neighbour; a neighbour's refusal is never repeated; a closed run stops repeating; a machine without
``redeliver_for`` (the walk: its ack timer re-sends) gets one attempt, as before.  The send function
here is the driver's boundary (``Node.send``'s signature), scripted to fail.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from hushnet.net.errors import DeliveryError, handler_refusal
from hushnet.runs import driver as driver_mod
from hushnet.runs.driver import RunDriver
from hushnet.runs.spec import Budget, RunSpec

IDS = ["n0", "n1", "n2"]


class _Machine:
    """Only what the sender asks of a machine."""

    def __init__(self, redeliver_for: float | None) -> None:
        if redeliver_for is not None:
            self.redeliver_for = redeliver_for


def _driver(machine: Any, script: list[BaseException | None], calls: list) -> RunDriver:
    spec = RunSpec(
        protocol="muffliato", task="mean", graph="ring:3", steps=2, seed=1, budget=Budget(1e6, 1e-5)
    ).with_run_id()
    seqs = iter(range(100, 200))

    async def send(dst: str, payload: bytes, **kw: Any) -> None:
        calls.append((dst, payload, kw.get("seq")))
        outcome = script.pop(0) if script else None
        if outcome is not None:
            raise outcome

    return RunDriver(spec, 0, IDS, machine, send, next_seq=lambda dst: next(seqs))


def _unavailable() -> DeliveryError:
    return DeliveryError("n1", grpc.StatusCode.UNAVAILABLE, "connection refused")


def _deadline() -> DeliveryError:
    return DeliveryError("n1", grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")


def _refused(code: str) -> DeliveryError:
    return DeliveryError(
        "n1",
        grpc.StatusCode.INTERNAL,
        handler_refusal("hushnet.run", ValueError(f"{code}: refused there")),
    )


@pytest.fixture(autouse=True)
def _fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver_mod, "REDELIVER_FIRST_S", 0.001)
    monkeypatch.setattr(driver_mod, "REDELIVER_MAX_S", 0.002)


async def _settle(calls: list, n: int) -> None:
    for _ in range(2000):
        if len(calls) >= n:
            break
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.02)  # nothing more may follow


def test_transport_failures_are_sent_again_under_the_same_number_in_order() -> None:
    async def go():
        calls: list = []
        d = _driver(_Machine(60.0), [_deadline(), _unavailable()], calls)
        d._enqueue("n1", b"first")
        d._enqueue("n1", b"second")
        await _settle(calls, 4)
        d.shutdown()
        return d, calls

    d, calls = asyncio.run(go())
    assert calls == [
        ("n1", b"first", 100),
        ("n1", b"first", 100),
        ("n1", b"first", 100),
        ("n1", b"second", 101),
    ]
    assert (d.send_failures, d.redeliveries) == (2, 2)
    assert [e["again"] for e in d.events if e["type"] == "send_failed"] == [True, True]


def test_refusals_closed_runs_and_the_walk_are_not_sent_again() -> None:
    async def go():
        out = {}
        for name, machine, script, close in (
            ("refused", _Machine(60.0), [_refused("stale-round")], False),
            ("closed", _Machine(60.0), [_unavailable()], True),
            ("walk", _Machine(None), [_unavailable()], False),
            ("window", _Machine(1e-9), [_unavailable()], False),
        ):
            calls: list = []
            d = _driver(machine, script, calls)
            if close:
                d.close()  # the operator closed the run here
            d._enqueue("n1", b"m")
            await _settle(calls, 1)
            d.shutdown()
            out[name] = (calls, d.redeliveries)
        return out

    out = asyncio.run(go())
    assert out["refused"] == ([("n1", b"m", 100)], 0)
    assert out["closed"] == ([("n1", b"m", 100)], 0)
    assert out["walk"] == ([("n1", b"m", None)], 0)  # one attempt, numbered by the node as before
    assert out["window"] == ([("n1", b"m", 100)], 0)


def test_a_not_started_neighbour_is_asked_again() -> None:
    async def go():
        calls: list = []
        d = _driver(_Machine(60.0), [_refused("not-started")], calls)
        d._enqueue("n2", b"early")
        await _settle(calls, 2)
        d.shutdown()
        return calls

    assert asyncio.run(go()) == [("n2", b"early", 100), ("n2", b"early", 100)]
