"""Node signatures for protocol messages that must hold against the party relaying them.

Why a signature and not a MAC: a secure-summation member's confirmation of the survivor set is
relayed by the leader, the very party it must bind; a MAC key shared with the leader (or derived
from keys it can compute) would let it forge confirmations.  The node's ECDSA P-256 identity key
(its TLS key, :mod:`hushnet.net.pki`) already has its public half bound to its vertex by the
bootstrap directory, as the SHA-256 of the DER SubjectPublicKeyInfo (``Member.key_sha256``), so a
signed message carries the signer's SubjectPublicKeyInfo and a verifier checks it against that hash
— no certificate exchange between members that are not neighbours.

Every signed message starts with a purpose label chosen by the caller (e.g.
``b"hushnet-secagg-consistency-v1|"``): the same key signs the bootstrap heartbeats
(``hushnet.v1|…``), so the labels keep the two languages disjoint.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from hushnet.crypto.errors import IntegrityError

_ALG = ec.ECDSA(hashes.SHA256())
#: an encoded signature never exceeds this (DER ECDSA P-256: ≤ 72 bytes); longer is refused unread
MAX_SIG_LEN = 80
MAX_SPKI_LEN = 128  # DER SubjectPublicKeyInfo of a P-256 key: 91 bytes


def spki_bytes(public_key: ec.EllipticCurvePublicKey) -> bytes:
    return public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


@dataclass(frozen=True, eq=False)
class Signer:
    """A node's signing key (ECDSA P-256) and its DER SubjectPublicKeyInfo."""

    private: ec.EllipticCurvePrivateKey
    spki: bytes

    @classmethod
    def from_key(cls, key: ec.EllipticCurvePrivateKey) -> "Signer":
        if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(
            key.curve, ec.SECP256R1
        ):
            raise ValueError("a node signing key is an ECDSA P-256 private key")
        return cls(key, spki_bytes(key.public_key()))

    @classmethod
    def generate(cls) -> "Signer":
        return cls.from_key(ec.generate_private_key(ec.SECP256R1()))

    def sign(self, message: bytes) -> bytes:
        return self.private.sign(message, _ALG)


@dataclass(frozen=True)
class SignerDirectory:
    """vertex → SHA-256 of the node's DER SubjectPublicKeyInfo (the bootstrap's ``key_sha256``)."""

    keys: dict[int, bytes] = field(default_factory=dict)

    def verify(self, node: int, spki: bytes, message: bytes, signature: bytes) -> None:
        """Raise :class:`IntegrityError` unless ``signature`` is ``node``'s over ``message``."""
        want = self.keys.get(int(node))
        if want is None:
            raise IntegrityError(f"node {node} has no signing key in the directory")
        if (
            len(spki) > MAX_SPKI_LEN
            or len(signature) > MAX_SIG_LEN
            or hashlib.sha256(spki).digest() != want
        ):
            raise IntegrityError(
                f"the signing key presented for node {node} is not the one in the directory"
            )
        key = hashlib.sha256(
            b"".join(
                (
                    len(spki).to_bytes(2, "big"),
                    spki,
                    len(signature).to_bytes(2, "big"),
                    signature,
                    message,
                )
            )
        ).digest()
        if key in _VERIFIED:  # this very (key, signature, message) verified before in this process
            _VERIFIED.move_to_end(key)
            return
        try:
            pub = _public_key(spki)
            pub.verify(signature, message, _ALG)
        except (InvalidSignature, ValueError, TypeError):
            raise IntegrityError(f"signature of node {node} does not verify") from None
        _VERIFIED[key] = None
        if len(_VERIFIED) > _VERIFIED_MAX:
            _VERIFIED.popitem(last=False)


#: Successful verifications by SHA-256 of (length-prefixed key, length-prefixed signature, message): a
#: secure-summation round has every member check the same quorum of signatures, and nodes hosted in one
#: process (``hushnet up --per-process``, the in-process network) would each redo the same ECDSA
#: verifications.  Only a verification that passed is recorded, keyed by everything it depended on
#: (the directory's hash check above still runs for every call), so a hit is the same verdict; a
#: failure is never cached and a forgery always meets the real check.
_VERIFIED: OrderedDict[bytes, None] = OrderedDict()
_VERIFIED_MAX = 1 << 14


@lru_cache(maxsize=1024)
def _public_key(spki: bytes) -> ec.EllipticCurvePublicKey:
    """The parsed key of a DER SubjectPublicKeyInfo (cached: the same few keys sign every round)."""
    pub = serialization.load_der_public_key(spki)
    if not isinstance(pub, ec.EllipticCurvePublicKey):
        raise ValueError("not an EC key")
    return pub


def signer_directory(signers: list[Signer] | dict[int, Signer]) -> SignerDirectory:
    items = signers.items() if isinstance(signers, dict) else enumerate(signers)
    return SignerDirectory({int(v): hashlib.sha256(s.spki).digest() for v, s in items})


def simulation_signers(seed: int, n: int) -> list[Signer]:
    """Reproducible signing keys for the in-process simulator ONLY (anyone knowing the seed can sign)."""
    order = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551  # of the P-256 group
    out = []
    for v in range(n):
        d = (
            int.from_bytes(hashlib.sha256(f"hushnet-sim-sign|{seed}|{v}".encode()).digest(), "big")
            % (order - 1)
            + 1
        )
        out.append(Signer.from_key(ec.derive_private_key(d, ec.SECP256R1())))
    return out
