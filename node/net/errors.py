"""The errors a node raises to its user: the messages are meant to be read as they are."""

from __future__ import annotations

import grpc


class NodeError(RuntimeError):
    """A node cannot start or an operation failed; the message is meant for the user."""


class NotANeighbour(NodeError):
    pass


class PayloadTooLarge(NodeError):
    pass


class DeliveryError(NodeError):
    """The neighbour refused or could not receive an envelope."""

    def __init__(self, peer: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"delivery to {peer} failed: {code.name}: {details}")
        self.peer, self.code, self.details = peer, code, details
