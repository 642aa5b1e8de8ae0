"""The secagg family's message formats: the secure sum's (Bonawitz et al.) and ``secagg-dpsgd``'s.

Secure sum (:mod:`hushnet.families.secagg.machines`): every message starts with its kind byte; id
lists are a big-endian u16 count and u32 vertices (:func:`pack_ids`), and a receiver reads a message
with :class:`Reader`, which refuses truncated messages and trailing bytes (``MalformedMessage``).  A
MASKED message's header is :data:`HEAD` bytes (kind, dim, offset of the 8-byte aligned words).  The
machine writes and checks the bodies (they carry signatures and sealed shares bound to the round's
context); this module is the vocabulary both ends share.  The gossip family's secure neighbourhood
summation wraps these messages in its own envelopes (:mod:`hushnet.families.gossip.wire`).

``secagg-dpsgd`` (:mod:`hushnet.families.secagg.dpsgd`): kind and round (:data:`DDP_HEAD`), then the
round's secure-sum message, outcome (:data:`DDP_OUTCOME`: status, survivors, dim) or lost leader
(:data:`DDP_LOST`).
"""

from __future__ import annotations

import struct

from hushnet.engine.errors import MalformedMessage

__all__ = [
    "MASKED",
    "UNMASK_REQ",
    "UNMASK",
    "RESULT",
    "ABORT",
    "ANNOUNCE",
    "CHECK_REQ",
    "CHECK_SIG",
    "NONCE_LEN",
    "HEAD",
    "U16",
    "U32",
    "SECRET_B",
    "SECRET_S",
    "pack_ids",
    "Reader",
    "ROUND",
    "OUTCOME",
    "PLAIN",
    "SYNC",
    "GONE",
    "LOST",
    "DDP_HEAD",
    "DDP_OUTCOME",
    "DDP_LOST",
]

# ---- secure sum ----------------------------------------------------------------------------------

# 0x61 / 0x62 were the advertise and key-list messages of the three-trip version, 0x63 / 0x64 the
# separate share messages of the four-round one: retired, never reused
MASKED, UNMASK_REQ, UNMASK, RESULT, ABORT = 0x65, 0x66, 0x67, 0x68, 0x69
ANNOUNCE, CHECK_REQ, CHECK_SIG = (
    0x6A,
    0x6B,
    0x6C,
)  # the leader's fresh nonce; the survivor-set confirmation
#: the leader's fresh per-execution nonce (bytes)
NONCE_LEN = 32
#: MASKED header: kind, dim, offset of the words
HEAD = 9
U16, U32 = struct.Struct(">H"), struct.Struct(">I")
SECRET_B, SECRET_S = (
    0,
    1,
)  # which secret a revealed share belongs to: a self-mask seed b_u, a pairwise seed s_uv


def pack_ids(ids: list[int] | tuple[int, ...] | set[int]) -> bytes:
    ids = sorted(ids)
    return U16.pack(len(ids)) + b"".join(U32.pack(i) for i in ids)


class Reader:
    def __init__(self, data: bytes, off: int = 1) -> None:
        self.d, self.o = data, off

    def take(self, n: int) -> bytes:
        if self.o + n > len(self.d):
            raise MalformedMessage("truncated secure-summation message")
        b = self.d[self.o : self.o + n]
        self.o += n
        return b

    def u16(self) -> int:
        return U16.unpack(self.take(2))[0]

    def u32(self) -> int:
        return U32.unpack(self.take(4))[0]

    def ids(self) -> list[int]:
        return [self.u32() for _ in range(self.u16())]

    def end(self) -> None:
        if self.o != len(self.d):
            raise MalformedMessage(
                f"{len(self.d) - self.o} trailing bytes in secure-summation message"
            )


# ---- secagg-dpsgd --------------------------------------------------------------------------------

ROUND, OUTCOME, PLAIN, SYNC, GONE, LOST = 0x70, 0x71, 0x72, 0x73, 0x74, 0x75
#: kind, round
DDP_HEAD = struct.Struct(">BI")
#: status, survivors, dim
DDP_OUTCOME = struct.Struct(">BII")
#: the lost leader
DDP_LOST = struct.Struct(">I")
