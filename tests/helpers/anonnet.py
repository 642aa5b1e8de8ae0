"""Test-side observer for the in-process network (:mod:`hushnet.runs.local_net`)."""

from __future__ import annotations

import contextlib
import contextvars
import time
from typing import Any

from hushnet.net.node import Node
from hushnet.runs import local_net
from hushnet.runs.service import RUN_PROTOCOL, RunService

_PEER: contextvars.ContextVar[str] = contextvars.ContextVar("grpc_peer", default="")


class Spy:
    """Wraps a node's run handler: records what the receiver's handler sees (authenticated sender,
    the gRPC peer address of the Deliver call, the payload bytes) — a test-side observer only."""

    def __init__(self, node: Node, service: RunService) -> None:
        self.node, self.service = node, service
        self.seen: list[dict[str, Any]] = []
        self._rpc = node._rpc_deliver  # noqa: SLF001 - observe the real RPC entry, no behaviour change

        async def deliver(raw: bytes, context):
            _PEER.set(context.peer())  # per-call (context variables follow the RPC's task)
            return await self._rpc(raw, context)

        node._rpc_deliver = deliver  # noqa: SLF001
        self._handle = service.handle

        def handle(envelope):
            if envelope.protocol == RUN_PROTOCOL:
                self.seen.append(
                    {
                        "sender": envelope.sender,
                        "peer": _PEER.get(),
                        "payload": bytes(envelope.payload),
                        "run_id": envelope.run_id,
                        "seq": int(envelope.seq),
                        "t": time.monotonic(),
                    }
                )
            return self._handle(envelope)

        service.handle = handle  # type: ignore[method-assign]


@contextlib.asynccontextmanager
async def network(*args: Any, **kw: Any):
    """:func:`hushnet.runs.local_net.network` with a :class:`Spy` on every node (``net.spies[vertex]``)."""
    async with local_net.network(*args, observe=Spy, **kw) as net:
        net.spies = net.observers
        yield net
