"""Transport failures injected into an in-process network (:mod:`hushnet.runs.local_net`), the two ways a
busy or unreachable receiver makes a delivery fail (issue 12), for the re-send tests of every family.

* :func:`hold_first` — the receiver is *busy*: it takes the sender's first run envelope and answers only
  after the sender's deadline (``DEADLINE_EXCEEDED`` at the sender, yet delivered): a copy sent again
  must be dropped by the receiver's replay cache, never delivered twice;
* :func:`cut` / :func:`mend_after_failure` — the receiver *refuses* the sender's envelopes (``UNAVAILABLE``
  from its real server, one way only) until the sender has recorded a failed delivery: not delivered, so
  only a second delivery brings it.

Both act on the real RPC path (the run service's handler, the node's server); no network is mocked.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hushnet.net.errors import NodeStopping
from hushnet.runs.service import RUN_PROTOCOL

#: the senders' run delivery deadline (the service's default is 30 s): short, so a failure comes fast
DEADLINE_S = 1.5


def short_deadlines(net: Any) -> None:
    """Every node's run deliveries time out after :data:`DEADLINE_S`."""
    for svc in net.services:
        svc.send_timeout_s = DEADLINE_S


def node_at(net: Any, vertex: int) -> Any:
    return next(nd for nd in net.nodes if nd.identity.vertex == vertex)


def hold_first(net: Any, receiver: int, sender: int, kind: int | None = None) -> dict[str, int]:
    """``receiver`` takes ``sender``'s first run envelope (whose payload starts with byte ``kind``, if
    given) and answers it after three deadlines.  Returns a counter (``held``: envelopes held, 0 or 1)."""
    svc = net.svc_by_vertex[receiver]
    src = node_at(net, sender).node_id
    inner = svc.handle
    state = {"held": 0}

    def handle(envelope):
        out = inner(envelope)  # taken by the run (or buffered for its start) ...
        if (
            envelope.protocol == RUN_PROTOCOL
            and envelope.sender == src
            and not state["held"]
            and (kind is None or envelope.payload[:1] == bytes([kind]))
        ):
            state["held"] += 1

            async def late():  # ... and answered after the sender's deadline
                await asyncio.sleep(3 * DEADLINE_S)
                return out

            return late()
        return out

    svc.handle = handle  # type: ignore[method-assign]
    return state


def cut(net: Any, receiver: int, sender: int, prefix: bytes = b"") -> None:
    """``receiver`` refuses ``sender``'s run envelopes whose payload starts with ``prefix`` (until
    :func:`mend`); the others, and ``receiver``'s own sends to ``sender``, still go.  The refusal is the node's real one for a service that cannot take envelopes
    (:class:`~hushnet.net.errors.NodeStopping`): its server answers ``UNAVAILABLE`` and forgets the
    envelope's number, so a later copy is delivered.  (The node's ``cut`` set would cut both ways.)"""
    svc = net.svc_by_vertex[receiver]
    src = node_at(net, sender).node_id
    refused: dict[str, bytes] = getattr(svc, "_test_refused", {})
    refusals: dict[str, int] = getattr(svc, "_test_refusals", {})
    if not hasattr(svc, "_test_refused"):
        inner = svc.handle

        def handle(envelope):
            p = refused.get(envelope.sender)
            if (
                envelope.protocol == RUN_PROTOCOL
                and p is not None
                and bytes(envelope.payload[: len(p)]) == p
            ):
                refusals[envelope.sender] = refusals.get(envelope.sender, 0) + 1
                raise NodeStopping(f"refusing {envelope.sender} (fault injection)")
            return inner(envelope)

        svc.handle = handle  # type: ignore[method-assign]
        svc._test_refused = refused  # noqa: SLF001
        svc._test_refusals = refusals  # noqa: SLF001
    refused[src] = prefix


def refusals(net: Any, receiver: int, sender: int) -> int:
    """How many of ``sender``'s envelopes ``receiver`` refused (:func:`cut`)."""
    svc = net.svc_by_vertex[receiver]
    return getattr(svc, "_test_refusals", {}).get(node_at(net, sender).node_id, 0)


def mend(net: Any, receiver: int, sender: int) -> None:
    net.svc_by_vertex[receiver]._test_refused.pop(node_at(net, sender).node_id, None)  # noqa: SLF001


async def mend_after_failure(
    net: Any, run_id: str, receiver: int, sender: int, timeout: float = 60.0
) -> None:
    """Wait until ``sender``'s driver recorded a failed delivery *to* ``receiver``, then restore the link."""
    d = net.driver(sender, run_id)
    to = node_at(net, receiver).node_id
    await net.wait(
        lambda: any(e["type"] == "send_failed" and e["to"] == to for e in d.events),
        timeout,
        what=f"node {sender}'s delivery to {receiver} to fail",
    )
    mend(net, receiver, sender)


#: how a refused delivery fails at its sender: the node's transport retries ``UNAVAILABLE`` until the
#: deadline, and its last attempt, given what is left of it, may end ``DEADLINE_EXCEEDED`` instead
REFUSED = ("UNAVAILABLE", "DEADLINE_EXCEEDED")


def failed_to(driver: Any, node_id: str, *codes: str) -> bool:
    """Whether ``driver`` recorded a delivery to ``node_id`` that failed with one of the gRPC statuses
    ``codes``."""
    return any(
        e["type"] == "send_failed" and e["to"] == node_id and any(c in e["error"] for c in codes)
        for e in driver.events
    )


async def until_finished_or_deviated(net: Any, run_id: str, n: int, timeout: float = 120.0) -> None:
    """Wait until every node finished the run, or any node recorded a deviation (the failure a lost
    message causes in the round protocols: the test then says which)."""
    await net.wait(
        lambda: (
            all(net.driver(v, run_id).state == "finished" for v in range(n))
            or any(net.driver(v, run_id).deviations for v in range(n))
        ),
        timeout,
        what="the run to finish (or a deviation)",
    )
