"""Cryptographic primitives at the edge of the sans-IO machines (issue 6).

Everything here is a pure function or a small stateful object (a replay cache, a keyring) with no
I/O, so the protocol machines in :mod:`hushnet.families.anonymity.onion`, :mod:`hushnet.families.anonymity.anonymous_walk`
and :mod:`hushnet.families.secagg.machines` stay sans-IO.  All primitives come from ``cryptography``
(X25519, HKDF-SHA256, ChaCha20, ChaCha20-Poly1305, Poly1305); only Shamir sharing over a prime
field is implemented here (no well-kept prime-field library exists on PyPI).

Randomness for keys, nonces and polynomial coefficients always comes from the operating system's
CSPRNG, never from a run's generator: the run seed is public, so anything derived from it would be
known to every node.
"""

from hushnet.crypto.cells import CELL_BODY, from_cells, n_cells, to_cells
from hushnet.crypto.errors import CellError, CryptoError, IntegrityError, UnknownEpoch
from hushnet.crypto.keys import KeyDirectory, KeyPair, simulation_keypairs
from hushnet.crypto.masks import (
    FixedPoint,
    mask_stream,
    pairwise_seed,
)
from hushnet.crypto.onion import OnionKeyring, build_packet, packet_length, peel
from hushnet.crypto.replay import ReplayCache
from hushnet.crypto.sealed import open_sealed, seal, seal_token, token_length, try_open_token
from hushnet.crypto.shamir import PRIME, Share, combine, consistent, split

__all__ = [
    "CELL_BODY",
    "from_cells",
    "n_cells",
    "to_cells",
    "CellError",
    "CryptoError",
    "IntegrityError",
    "UnknownEpoch",
    "KeyDirectory",
    "KeyPair",
    "simulation_keypairs",
    "FixedPoint",
    "mask_stream",
    "pairwise_seed",
    "OnionKeyring",
    "build_packet",
    "packet_length",
    "peel",
    "ReplayCache",
    "open_sealed",
    "seal",
    "seal_token",
    "token_length",
    "try_open_token",
    "PRIME",
    "Share",
    "combine",
    "consistent",
    "split",
]
