"""Central DP-SGD's messages: a gradient request (aggregator → node, the current model) and its reply
(node → aggregator, the clipped gradient), both in the walk's token frame with their own kinds, and
the operator command that carries them over the control channel."""

from __future__ import annotations

import numpy as np

from hushnet.families.walk.wire import Token, decode_token, encode_token

KIND_GRADIENT_REQUEST = 3
KIND_GRADIENT_REPLY = 4
#: the node's operator command that answers one request (:mod:`hushnet.families.central.node`)
GRADIENT_COMMAND = "run.gradient"


def encode_request(step: int, total: int, node: int, model: np.ndarray) -> bytes:
    """The aggregator's request to ``node`` for its gradient at ``model`` (step ``step`` of ``total``)."""
    return encode_token(step, total, 0, node, model, kind=KIND_GRADIENT_REQUEST)


def decode_request(payload: bytes, dim: int) -> Token:
    """Strictly parse a request (kind, header, dimension, length, finite values)."""
    return decode_token(payload, dim, kind=KIND_GRADIENT_REQUEST)


def encode_reply(step: int, total: int, aggregator: int, gradient: np.ndarray) -> bytes:
    """A node's reply to the aggregator: its clipped gradient for step ``step``."""
    return encode_token(step, total, 0, aggregator, gradient, kind=KIND_GRADIENT_REPLY)


def decode_reply(payload: bytes, dim: int) -> Token:
    """Strictly parse a reply (kind, header, dimension, length, finite values)."""
    return decode_token(payload, dim, kind=KIND_GRADIENT_REPLY)
