"""The transport envelope: the one byte format every family's messages travel in.

The transport only ever moves an :class:`Envelope` (protocol name, run id, sequence number,
opaque payload).  What a payload holds is the protocol family's wire format, next to its machines
(``hushnet.families.<name>.wire``; the walk's token: :mod:`hushnet.families.walk.wire`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from hushnet.engine.errors import MalformedMessage, WrongRun

_ENV_MAGIC = b"HN\x01"


@dataclass(frozen=True, slots=True)
class Envelope:
    """What a transport delivers between neighbours: ``(protocol, run_id, seq, payload)``."""

    protocol: str
    run_id: str
    seq: int
    payload: bytes

    def encode(self) -> bytes:
        p = self.protocol.encode()
        r = self.run_id.encode()
        if len(p) > 255 or len(r) > 255:
            raise ValueError("protocol name and run id must be at most 255 bytes")
        return b"".join(
            (
                _ENV_MAGIC,
                bytes((len(p),)),
                p,
                bytes((len(r),)),
                r,
                struct.pack("<Q", self.seq),
                self.payload,
            )
        )

    @classmethod
    def decode(
        cls, data: bytes, *, protocol: str | None = None, run_id: str | None = None
    ) -> "Envelope":
        """Parse an envelope; with ``protocol``/``run_id`` given, refuse one meant for another run (:class:`WrongRun`)."""
        try:
            if data[:3] != _ENV_MAGIC:
                raise MalformedMessage("not a hushnet envelope (bad magic)")
            i = 3
            lp = data[i]
            p = data[i + 1 : i + 1 + lp].decode()
            i += 1 + lp
            lr = data[i]
            r = data[i + 1 : i + 1 + lr].decode()
            i += 1 + lr
            (seq,) = struct.unpack_from("<Q", data, i)
            payload = bytes(data[i + 8 :])
        except (IndexError, struct.error, UnicodeDecodeError) as exc:
            raise MalformedMessage(f"truncated or corrupt envelope: {exc}") from exc
        if protocol is not None and p != protocol:
            raise WrongRun(f"envelope for protocol {p!r}, this run uses {protocol!r}")
        if run_id is not None and r != run_id:
            raise WrongRun(f"envelope for run {r!r}, this node runs {run_id!r}")
        return cls(p, r, seq, payload)
