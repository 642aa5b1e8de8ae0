"""Fixed-size cells: every message on a link is a whole number of equal cells.

Sizes would otherwise tell a relay (or a link observer) which kind of message passes and, for
onion packets, where on the path it is.  A cell is ``kind(1) ‖ index(2) ‖ count(2) ‖ used(4) ‖
data ‖ zero padding`` and exactly ``cell_body`` bytes; a message of any length is chunked into
``count`` cells and reassembled strictly (order, count, lengths, zero padding), so truncated,
oversized, reordered or padded-with-garbage input is refused with :class:`CellError`.
"""

from __future__ import annotations

import struct

from hushnet.crypto.errors import CellError

CELL_BODY = 64 * 1024  # network-wide default (docs/design/spec/anonymity.md §6.2, §6.9)
KIND_DATA = 0x01
_HDR = struct.Struct(">BHHI")  # kind, index, count, bytes used in this cell
MAX_CELLS = 0xFFFF


def capacity(cell_body: int = CELL_BODY) -> int:
    """Message bytes one cell carries."""
    if cell_body <= _HDR.size:
        raise ValueError(f"cell body must exceed the {_HDR.size}-byte cell header")
    return cell_body - _HDR.size


def n_cells(message_len: int, cell_body: int = CELL_BODY) -> int:
    return max(1, -(-message_len // capacity(cell_body)))


def to_cells(message: bytes, cell_body: int = CELL_BODY) -> bytes:
    """The message as ``n_cells`` concatenated cells of exactly ``cell_body`` bytes each."""
    cap = capacity(cell_body)
    count = n_cells(len(message), cell_body)
    if count > MAX_CELLS:
        raise ValueError(f"message of {len(message)} bytes needs {count} cells (max {MAX_CELLS})")
    out = bytearray(count * cell_body)
    for i in range(count):
        chunk = message[i * cap : (i + 1) * cap]
        o = i * cell_body
        _HDR.pack_into(out, o, KIND_DATA, i, count, len(chunk))
        out[o + _HDR.size : o + _HDR.size + len(chunk)] = chunk
    return bytes(out)


def from_cells(
    data: bytes, cell_body: int = CELL_BODY, *, expected_cells: int | None = None
) -> bytes:
    """Reassemble; refuse anything that is not exactly the cells :func:`to_cells` would produce."""
    if len(data) == 0 or len(data) % cell_body:
        raise CellError(
            f"{len(data)} bytes is not a whole number of {cell_body}-byte cells (truncated or oversized)"
        )
    count = len(data) // cell_body
    if expected_cells is not None and count != expected_cells:
        raise CellError(
            f"{count} cells where this deployment's messages are exactly {expected_cells} (oversized or truncated)"
        )
    cap = capacity(cell_body)
    parts = []
    mv = memoryview(data)
    for i in range(count):
        o = i * cell_body
        kind, idx, cnt, used = _HDR.unpack_from(data, o)
        if kind != KIND_DATA:
            raise CellError(f"cell {i}: unknown cell kind {kind}")
        if idx != i or cnt != count:
            raise CellError(f"cell {i}: header says {idx}/{cnt}, stream has {count} cells")
        if used > cap or (i < count - 1 and used != cap):
            raise CellError(f"cell {i}: {used} bytes used (capacity {cap})")
        start = o + _HDR.size
        if data.count(0, start + used, o + cell_body) != cell_body - _HDR.size - used:
            raise CellError(f"cell {i}: non-zero padding")  # nothing may ride in the padding
        parts.append(mv[start : start + used])
    return b"".join(parts)
