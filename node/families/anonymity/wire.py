"""The anonymity layer's messages: their kind bytes and the hop acknowledgement.

Every payload starts with its kind.  The bodies are the crypto layer's formats: onion packets
(:mod:`hushnet.crypto.onion`) cut into fixed-size cells (:mod:`hushnet.crypto.cells`), and the sealed
token (:mod:`hushnet.crypto.sealed`).  A hop ack is not celled: the kind and a 16-byte identifier of
the transmission it confirms, seen only by the link's two ends.

* ``KIND_PACKET`` (``O``): an onion packet of :class:`~hushnet.families.anonymity.onion.OnionLayer`;
* ``KIND_SEALED`` (``S``): the sealed token of the source-anonymous walk, Mode A — kind, ``HOP_ID``
  bytes of hop id, then the cells;
* ``KIND_ONION`` (``B``): the same walk's Mode B onion (the source samples the walk);
* ``KIND_HOP_ACK`` (``A``): kind + 16 bytes, for all three.
"""

from __future__ import annotations

KIND_PACKET = 0x4F  # 'O'
KIND_SEALED = 0x53  # 'S'
KIND_ONION = 0x42  # 'B'
KIND_HOP_ACK = 0x41  # 'A' (acks are not celled: 17 bytes that only confirm a handoff to its sender)
#: bytes of a hop id (the sealed walk's per-transmission identifier) and of a hop ack's body
HOP_ID = 16
