"""The errors a node raises to its user: the messages are meant to be read as they are."""

from __future__ import annotations

import re

import grpc


class NodeError(RuntimeError):
    """A node cannot start or an operation failed; the message is meant for the user."""


class NotANeighbour(NodeError):
    pass


class PayloadTooLarge(NodeError):
    pass


class NodeStopping(NodeError):
    """Raised by a handler or service asked to work after its node began to stop (its stores may be
    closed); the peer server answers it UNAVAILABLE "node stopping", so the caller retries elsewhere
    or later, as for a node that is down."""


def handler_refusal(protocol: str, exc: BaseException) -> str:
    """The details a peer's server answers when ``protocol``'s handler raised ``exc``.

    A refusal the handler names (``exc.code``, e.g. a run's ``RunRefused``) reads ``handler 'p'
    failed: <code>: <message>``, which :attr:`DeliveryError.refusal` reads back at the sender — so a
    sender can act on *why* a neighbour refused (a run closed there) without a second channel."""
    return f"handler {protocol!r} failed: {exc}"


_REFUSAL = re.compile(r"^handler '[^']*' failed: ([a-z][a-z0-9-]*): ")


class DeliveryError(NodeError):
    """The neighbour refused or could not receive an envelope."""

    def __init__(self, peer: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"delivery to {peer} failed: {code.name}: {details}")
        self.peer, self.code, self.details = peer, code, details

    @property
    def refusal(self) -> str | None:
        """The code of the neighbour handler's named refusal (see :func:`handler_refusal`), or None."""
        if self.code != grpc.StatusCode.INTERNAL:
            return None
        m = _REFUSAL.match(self.details)
        return m.group(1) if m else None
