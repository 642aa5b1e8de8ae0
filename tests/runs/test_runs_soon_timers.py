"""A zero-delay timer of a batch that sends fires once the batch's message is under way (issue 12).

The walk sets one to draw the next visit's noise while the token is away; an onion relay, to do its
work after its ack.  On the event loop it ran *before* the send: the driver's sender task wakes one
step later and gRPC starts a call from a task of its own one step after that, so at n = 16 (10⁴
floats) every hop's noise draw sat between the receiver's checkpoint and its send.  The send function
here is the driver's boundary (``Node.send``'s signature) and starts its delivery the way gRPC does, from
a task of its own, calling ``started`` once that task exists.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hushnet.engine.actions import CancelTimer, Send, SetTimer
from hushnet.engine.events import MessageArrived, RunStarted, TimerFired
from hushnet.runs.driver import RunDriver
from hushnet.runs.spec import Budget, RunSpec

IDS = ["n0", "n1", "n2"]


class _Machine:
    """Answers the start (or a message) with a send to n1 and a zero-delay timer; logs the timer."""

    def __init__(self, log: list[str], cancel: bool = False) -> None:
        self.log = log
        self.cancel = cancel

    def handle(self, event: Any) -> list:
        if isinstance(event, (RunStarted, MessageArrived)):
            acts: list = [Send(1, b"token"), SetTimer("draw", 0.0)]
            return acts + ([CancelTimer("draw")] if self.cancel else [])
        if isinstance(event, TimerFired):
            self.log.append(f"timer {event.name}")
        return []


def _driver(machine: Any, send: Any) -> RunDriver:
    spec = RunSpec(
        protocol="rw-dpsgd", task="mean", graph="ring:3", steps=2, seed=1, budget=Budget(1e6, 1e-5)
    ).with_run_id()
    d = RunDriver(spec, 0, IDS, machine, send)
    d.state = "running"
    return d


def _grpc_like(log: list[str], release: asyncio.Event | None = None):
    """A send that starts its delivery from a task of its own (as a gRPC call does) and says so."""

    async def send(dst: str, payload: bytes, *, started=None, **kw: Any) -> None:
        async def invoke() -> None:
            log.append(f"under way to {dst}")
            if release is not None:
                await release.wait()

        call = asyncio.get_running_loop().create_task(invoke())
        if started is not None:
            started()
        await call

    return send


async def _idle(steps: int = 20) -> None:
    for _ in range(steps):
        await asyncio.sleep(0)


def _one_batch(send_for) -> list[str]:
    """The start's batch (a send to n1 and a zero-delay timer) through a driver whose send is
    ``send_for(log)``; what was logged once the loop is idle."""

    async def go() -> list[str]:
        log: list[str] = []
        d = _driver(_Machine(log), send_for(log))
        d._execute(d.machine.handle(RunStarted()))
        await _idle()
        d.shutdown()
        return log

    return asyncio.run(go())


def test_the_timer_fires_after_the_send_is_under_way() -> None:
    assert _one_batch(_grpc_like) == ["under way to n1", "timer draw"]


def test_a_transport_that_never_says_still_gets_the_timer_fired() -> None:
    def silent(log: list[str]):
        async def send(dst: str, payload: bytes, **kw: Any) -> None:
            await _idle(3)
            log.append(f"sent to {dst}")

        return send

    assert _one_batch(silent) == ["sent to n1", "timer draw"]


def test_behind_a_busy_destination_the_timer_does_not_wait() -> None:
    """The first send to n1 hangs: the second batch's message waits in the queue, its timer does not."""

    async def go() -> list[str]:
        log: list[str] = []
        release = asyncio.Event()
        d = _driver(_Machine(log), _grpc_like(log, release))
        d._execute(d.machine.handle(RunStarted()))
        await _idle()
        d._execute(d.machine.handle(MessageArrived(2, b"x")))
        await _idle()
        out = list(log)
        release.set()
        await _idle()
        d.shutdown()
        return out

    assert asyncio.run(go()) == ["under way to n1", "timer draw", "timer draw"]


def test_a_held_timer_is_cancelled_and_replaced_like_any_other() -> None:
    async def go() -> tuple[list[str], list[str]]:
        log: list[str] = []
        d = _driver(_Machine(log, cancel=True), _grpc_like(log))
        d._execute(d.machine.handle(RunStarted()))
        await _idle()
        cancelled = list(log)
        # set twice in one batch: fires once
        log.clear()
        d.machine.cancel = False
        d._execute(
            d.machine.handle(RunStarted()) + [SetTimer("draw", 0.0)]
        )  # the second replaces the first
        await _idle()
        d.shutdown()
        return cancelled, log

    cancelled, replaced = asyncio.run(go())
    assert cancelled == ["under way to n1"]
    assert replaced == ["under way to n1", "timer draw"]


@pytest.mark.parametrize("stop", ["shutdown", "stop"])
def test_a_held_timer_of_an_ended_run_never_fires(stop: str) -> None:
    async def go() -> list[str]:
        log: list[str] = []
        d = _driver(_Machine(log), _grpc_like(log))
        d._execute(d.machine.handle(RunStarted()))
        if stop == "shutdown":
            d.shutdown()
        else:
            d._stop("test")
        await _idle()
        return log

    assert "timer draw" not in asyncio.run(go())
