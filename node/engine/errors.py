"""Typed errors for bad protocol input.

Every rejection of a message is one of these, so a driver can report a precise reason to the
operator, and a machine can refuse the message *before* touching its state or its ledger —
which is what keeps the ledger exact when a peer misbehaves.
"""

from __future__ import annotations


class ProtocolError(ValueError):
    """A message or run input that a machine refuses; the machine's state is unchanged."""

    code = "protocol-error"


class MalformedMessage(ProtocolError):
    """Bytes that do not parse as this protocol's message (truncated, wrong kind, bad length)."""

    code = "malformed"


class WrongDimension(ProtocolError):
    """A model / token vector whose length differs from the run's fixed dimension."""

    code = "wrong-dimension"


class ReplayedMessage(ProtocolError):
    """A token for a (run, step) this node already processed, with different contents."""

    code = "replay"


class UnexpectedSender(ProtocolError):
    """A token from a node that cannot be the sender under the public transition matrix."""

    code = "unexpected-sender"


class WrongRun(ProtocolError):
    """An envelope addressed to another run or protocol."""

    code = "wrong-run"
