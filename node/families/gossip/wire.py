"""The gossip family's messages: the synchronous rounds' and randomized Muffliato's round messages,
and the secure neighbourhood summation's invitations and SecAgg envelopes.

Every message starts with the same 21-byte header ``<BQII``: kind, round (or activation), ``aux`` and
a length.  For round messages the length is the vector's dimension and ``aux`` is the AVAIL flag or
the sender's announced degree (VALUE/JOIN); for secure-summation messages it is the body's byte
length and ``aux`` is the leader's degree (INVITE) or the leader's vertex (SECAGG).  Decoding is
strict (known kind, exact lengths, finite values): everything a receiver observes of a gossip run is
this header and the vector, and the accounting (:mod:`hushnet.families.gossip.accounting`) is
written against exactly that.
"""

from __future__ import annotations

import struct

import numpy as np

from hushnet.engine.errors import MalformedMessage, WrongDimension

__all__ = [
    "KIND_AVAIL",
    "KIND_VALUE",
    "KIND_SKIP",
    "KIND_HEARTBEAT",
    "KIND_JOIN",
    "KIND_INVITE",
    "KIND_SECAGG",
    "ROUND_KINDS",
    "SECURE_KINDS",
    "encode_round",
    "decode_round",
    "encode_invite",
    "encode_secagg",
    "decode_secure",
    "decode_members",
]

KIND_AVAIL = 16
KIND_VALUE = 17
KIND_SKIP = 18
KIND_HEARTBEAT = 19
#: secure summation: "my value goes into your sum" (a VALUE without the value), aux = degree
KIND_JOIN = 20
#: the plain rounds' kinds (:func:`decode_round` accepts exactly these)
ROUND_KINDS = (KIND_AVAIL, KIND_VALUE, KIND_SKIP, KIND_HEARTBEAT, KIND_JOIN)
#: secure summation: a leader's member list (:mod:`hushnet.families.gossip.secure`)
KIND_INVITE = 21
#: secure summation: one SecAgg message of the sum led by ``aux``
KIND_SECAGG = 22
SECURE_KINDS = (KIND_INVITE, KIND_SECAGG)

#: round messages: kind, round, aux (AVAIL: up flag; VALUE/JOIN: announced degree), dim
_ROUND_HDR = struct.Struct("<BQII")
#: secure-summation messages: kind, round, aux (INVITE: leader's degree; SECAGG: leader vertex), body length
_SECURE_HDR = struct.Struct("<BQII")
_U32 = struct.Struct("<I")
_F64 = np.dtype("<f8")


def encode_round(kind: int, rnd: int, aux: int, vector: np.ndarray | None = None) -> bytes:
    if vector is None:
        return _ROUND_HDR.pack(kind, rnd, aux, 0)
    v = np.ascontiguousarray(vector, dtype=_F64)
    return _ROUND_HDR.pack(kind, rnd, aux, v.shape[0]) + v.tobytes()


def decode_round(payload: bytes, dim: int) -> tuple[int, int, int, np.ndarray | None]:
    """Strict parse: known kind, complete header, VALUE of exactly the run's dimension, finite values."""
    if len(payload) < _ROUND_HDR.size:
        raise MalformedMessage(
            f"gossip message too short ({len(payload)} bytes, header needs {_ROUND_HDR.size})"
        )
    kind, rnd, aux, d = _ROUND_HDR.unpack_from(payload)
    if kind not in ROUND_KINDS:
        raise MalformedMessage(f"unknown gossip message kind {kind}")
    body = len(payload) - _ROUND_HDR.size
    if kind != KIND_VALUE:
        if d != 0 or body != 0:
            raise MalformedMessage("AVAIL/SKIP/HEARTBEAT/JOIN messages carry no vector")
        if kind == KIND_AVAIL and aux not in (0, 1):
            raise MalformedMessage(f"availability flag must be 0 or 1, got {aux}")
        if kind == KIND_JOIN and aux < 1:
            raise MalformedMessage(
                "a JOIN sender announces at least one heard neighbour (the receiver)"
            )
        return kind, rnd, aux, None
    if d != dim:
        raise WrongDimension(f"round value has dimension {d}, this run's model has dimension {dim}")
    if body != 8 * d:
        raise MalformedMessage(f"round value declares {d} float64 values but carries {body} bytes")
    vec = np.frombuffer(payload, dtype=_F64, count=d, offset=_ROUND_HDR.size).copy()
    if not np.isfinite(vec.sum()) and not np.all(
        np.isfinite(vec)
    ):  # the sum is finite iff all are (barring overflow)
        raise MalformedMessage("round value contains NaN or infinity")
    if aux < 1:
        raise MalformedMessage(
            "a VALUE sender announces at least one heard neighbour (the receiver)"
        )
    return kind, rnd, aux, vec


def encode_invite(rnd: int, degree: int, members: list[int]) -> bytes:
    body = b"".join(_U32.pack(int(v)) for v in sorted(members))
    return _SECURE_HDR.pack(KIND_INVITE, rnd, degree, len(body)) + body


def encode_secagg(rnd: int, leader: int, data: bytes) -> bytes:
    return _SECURE_HDR.pack(KIND_SECAGG, rnd, leader, len(data)) + data


def decode_secure(payload: bytes) -> tuple[int, int, int, bytes]:
    """Strict parse of the header and a body of exactly the declared length (the kind is the caller's)."""
    if len(payload) < _SECURE_HDR.size:
        raise MalformedMessage(f"secure gossip message too short ({len(payload)} bytes)")
    kind, rnd, aux, n = _SECURE_HDR.unpack_from(payload)
    body = payload[_SECURE_HDR.size :]
    if len(body) != n:
        raise MalformedMessage(
            f"secure gossip message declares {n} body bytes, carries {len(body)}"
        )
    return kind, rnd, aux, body


def decode_members(body: bytes) -> list[int]:
    """An INVITE's member list (the vertices, sorted by the sender)."""
    if len(body) % _U32.size:
        raise MalformedMessage("invite member list is not a list of u32 vertices")
    return [int(x) for (x,) in _U32.iter_unpack(body)]
