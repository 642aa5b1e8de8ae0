"""Admission checks on every inbound RPC: the caller's certificate, its membership entry and key, and the
refusal path (a gRPC status to the caller, a rate-limited log line, a counter).  A mixin of
:class:`hushnet.net.node.Node`."""

from __future__ import annotations

import logging
from typing import Any

import grpc

from hushnet.net import pki


class _Rejected(Exception):
    """A refused RPC: ``code``/``message`` go to the caller; ``kind`` groups it in the rate-limited log;
    ``exc_info`` (an unexpected handler failure) is logged with the first line of its kind only."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        kind: str | None = None,
        exc_info: Any = None,
        **fields: Any,
    ) -> None:
        super().__init__(message)
        self.code, self.message, self.fields = code, message, fields
        self.kind = kind or f"rejected:{code.name}"
        self.exc_info = exc_info


#: (identity, key fingerprint) by certificate PEM, for every node of the process: what a certificate says
#: is public and the same whichever node reads it.  Per node, each neighbour's certificate was parsed once
#: by each of its neighbours in the process, and the operator's by every node it asked for its status
#: (2 048 parses of one certificate in a 2048-node start-up).
_CALLERS: dict[bytes, tuple[pki.PeerIdentity | None, str]] = {}
_CALLERS_MAX = 65536


def caller_of(pem: bytes) -> tuple[pki.PeerIdentity | None, str]:
    """(identity, key fingerprint) of a certificate, parsed once per process."""
    hit = _CALLERS.get(pem)
    if hit is None:
        cert = pki.load_cert(pem)
        hit = (pki.identity_of(cert), pki.key_sha256(cert.public_key()))
        if len(_CALLERS) >= _CALLERS_MAX:
            _CALLERS.clear()
        _CALLERS[pem] = hit
    return hit


class AdmissionMixin:
    """Who is calling, and may they (state on :class:`~hushnet.net.node.Node`)."""

    def _caller(self, context) -> tuple[pki.PeerIdentity | None, str]:
        """(identity, key fingerprint) of the caller, cached per certificate for the whole process."""
        auth = context.auth_context() or {}
        pems = auth.get("x509_pem_cert") or []
        if not pems:
            return None, ""
        return caller_of(pems[0])

    async def _reject(self, context, exc: _Rejected) -> None:
        self.rejected += 1
        level = logging.ERROR if exc.exc_info is not None else logging.WARNING
        self.rlog.log_event(
            level,
            exc.kind,
            "rejected: %s",
            exc.message,
            exc_info=exc.exc_info,
            extra={
                "event": "rejected",
                "code": exc.code.name,
                "peer": context.peer(),
                **exc.fields,
            },
        )
        await context.abort(exc.code, exc.message)

    async def _check_member(self, who: pki.PeerIdentity, key_sha: str) -> None:
        member = self.members.get(who.name)
        if member is None or member.key_sha256 != key_sha:
            # A valid certificate from a caller we do not know yet is usually a node that joined after our
            # last directory read: read it again (at most every 0.5 s, waiting rather than refusing).
            await self._refresh_directory(force=False, min_interval=0.5, wait=True)
            member = self.members.get(who.name)
        if member is None:
            raise _Rejected(
                grpc.StatusCode.PERMISSION_DENIED,
                f"node {who.name} is not in the membership directory",
                kind="rejected:not-a-member",
                caller=who.name,
            )
        if member.key_sha256 != key_sha:
            raise _Rejected(
                grpc.StatusCode.PERMISSION_DENIED,
                f"certificate presented for {who.name} does not match its membership entry",
                kind="rejected:key-mismatch",
                caller=who.name,
            )
