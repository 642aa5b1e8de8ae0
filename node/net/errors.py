"""The errors a node raises to its user: the messages are meant to be read as they are."""

from __future__ import annotations

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


class DeliveryError(NodeError):
    """The neighbour refused or could not receive an envelope."""

    def __init__(self, peer: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"delivery to {peer} failed: {code.name}: {details}")
        self.peer, self.code, self.details = peer, code, details
