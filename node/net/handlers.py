"""Protocol handler registry: how protocols plug into the transport.

The transport delivers opaque :class:`~hushnet.v1.envelope_pb2.Envelope` messages and
knows nothing about random walks or gossip. A protocol is a plain object:

.. code-block:: python

    class MyProtocol:
        protocol = "rw.token"                 # the envelope.protocol it consumes

        def handle(self, envelope: Envelope) -> list[OutgoingEnvelope]:
            ...                               # runs on the node's event loop: keep it short
            return [OutgoingEnvelope(to="n3", payload=b"...", run_id=envelope.run_id)]

``handle`` may also be ``async def``. It is called once per inbound envelope that passed the
transport's checks (mutual TLS, sender certificate == ``envelope.sender``, sender is a graph
neighbour, not a duplicate, size within the limit). Whatever it returns is sent by the node to
the named neighbours (fire-and-forget; failures are logged and counted). Raising an exception
rejects the envelope: the sender gets ``INTERNAL`` with the message, and the node keeps serving.

Handlers are registered per node with :meth:`HandlerRegistry.register` (or
``Node.register_handler``) and may be added or removed at runtime.

Operator commands (the ``Control`` RPC, accepted only from operator certificates) are plain
callables ``fn(payload: bytes) -> bytes`` (or async) registered under a command name in a
:class:`ControlRegistry`; later issues use this to start training runs.
"""

from __future__ import annotations

import inspect
import threading
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol, Union, runtime_checkable

from hushnet.v1.envelope_pb2 import Envelope


@dataclass
class OutgoingEnvelope:
    """An envelope a handler wants sent: to a neighbour id, with protocol bytes.

    ``protocol`` defaults to the handler's own protocol and ``seq`` to the node's next sequence
    number for ``(protocol, run_id)`` when left as None.
    """

    to: str
    payload: bytes
    run_id: str = ""
    protocol: str | None = None
    seq: int | None = None


HandlerResult = Union[list[OutgoingEnvelope], None]


@runtime_checkable
class Handler(Protocol):
    """What the node needs from a protocol: a name and a ``handle`` method."""

    protocol: str

    def handle(self, envelope: Envelope) -> HandlerResult | Awaitable[HandlerResult]: ...


class UnknownProtocol(LookupError):
    """No handler is registered for an envelope's protocol."""


class HandlerRegistry:
    """Protocol name → handler; thread-safe so handlers may be swapped from another thread."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self._lock = threading.Lock()

    def register(self, handler: Handler, *, replace: bool = False) -> None:
        name = getattr(handler, "protocol", None)
        if not isinstance(name, str) or not name:
            raise TypeError("a handler needs a non-empty str attribute 'protocol'")
        if not callable(getattr(handler, "handle", None)):
            raise TypeError("a handler needs a handle(envelope) method")
        with self._lock:
            if name in self._handlers and not replace:
                raise ValueError(f"a handler for protocol {name!r} is already registered")
            self._handlers[name] = handler

    def unregister(self, protocol: str) -> Handler | None:
        with self._lock:
            return self._handlers.pop(protocol, None)

    def get(self, protocol: str) -> Handler:
        with self._lock:
            handler = self._handlers.get(protocol)
        if handler is None:
            raise UnknownProtocol(protocol)
        return handler

    def protocols(self) -> list[str]:
        with self._lock:
            return sorted(self._handlers)

    async def dispatch(self, envelope: Envelope) -> list[OutgoingEnvelope]:
        """Run the handler of ``envelope.protocol``; returns what it wants sent (possibly [])."""
        handler = self.get(envelope.protocol)
        result: Any = handler.handle(envelope)
        if inspect.isawaitable(result):
            result = await result
        if result is None:
            return []
        out = list(result)
        for item in out:
            if not isinstance(item, OutgoingEnvelope):
                raise TypeError(
                    f"handler {envelope.protocol!r} returned {type(item).__name__}, expected OutgoingEnvelope"
                )
            if item.protocol is None:
                item.protocol = handler.protocol
        return out


ControlFn = Callable[[bytes], Union[bytes, Awaitable[bytes]]]


class UnknownCommand(LookupError):
    """No control command of that name."""


class ControlRegistry:
    """Operator command name → ``fn(payload) -> bytes`` (sync or async)."""

    def __init__(self) -> None:
        self._commands: dict[str, ControlFn] = {}

    def register(self, command: str, fn: ControlFn, *, replace: bool = False) -> None:
        if command in self._commands and not replace:
            raise ValueError(f"control command {command!r} already registered")
        self._commands[command] = fn

    def unregister(self, command: str) -> None:
        self._commands.pop(command, None)

    def commands(self) -> list[str]:
        return sorted(self._commands)

    async def run(self, command: str, payload: bytes) -> bytes:
        fn = self._commands.get(command)
        if fn is None:
            raise UnknownCommand(command)
        result = fn(payload)
        if inspect.isawaitable(result):
            result = await result
        return bytes(result or b"")
