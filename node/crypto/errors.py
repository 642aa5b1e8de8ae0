"""Typed crypto failures.  They subclass the engine's :class:`ProtocolError` so that a machine's
``handle`` turns them into a counted :class:`~hushnet.engine.actions.Fault` before any state change."""

from __future__ import annotations

from hushnet.engine.errors import MalformedMessage, ProtocolError


class CryptoError(ProtocolError):
    """A cryptographic check failed."""

    code = "crypto"


class IntegrityError(CryptoError):
    """A MAC or AEAD tag did not verify: tampered bytes, a wrong key, or a packet for someone else."""

    code = "integrity"


class UnknownEpoch(CryptoError):
    """A packet names a key epoch this node holds no key (or replay cache) for."""

    code = "unknown-epoch"


class CellError(MalformedMessage):
    """Cells that are truncated, oversized, out of order or inconsistent."""

    code = "bad-cell"


class InconsistentShares(CryptoError):
    """Shamir shares that do not lie on one polynomial of the agreed degree (or do not open the commitment)."""

    code = "inconsistent-shares"
