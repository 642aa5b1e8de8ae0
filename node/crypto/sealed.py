"""Sealed boxes: public-key encryption to one node, anonymous for the sender and key-private.

Construction (docs/design/spec/anonymity.md §6.4 fallback, the shape of libsodium's ``crypto_box_seal``):
a fresh ephemeral X25519 key ``e``, ``s = X25519(e, pk)``, ``k = HKDF-SHA256(s ‖ epk ‖ pk)`` with
the caller's ``info`` as HKDF info, ChaCha20-Poly1305 under ``k`` with a zero nonce (``k`` is
single-use) and ``info`` as associated data; output ``epk ‖ ct ‖ tag``.  The ciphertext carries no
recipient id (the fresh ``epk`` does not identify the recipient), which is what lets a relay
trial-open a token without learning for whom it is.

Static boxes (:func:`seal_static` / :func:`open_static`) are the cheap, *non-anonymous* sibling for
a sender that is known anyway (secure-summation share transport): the key is
``HKDF-SHA256(X25519(sk_sender, pk_recipient) ‖ pk_sender ‖ pk_recipient)`` with the caller's
``info``, the static-static secret cached in the key pair, so a box costs an HKDF and an AEAD and
no X25519 at all.  They authenticate the sender too (only the two key holders can make the key).
What they give up is forward secrecy: whoever later obtains either long-term private key opens
every past box between the pair.

Tokens (:func:`seal_token`) are two-part so that a relay's failed trial costs one X25519 and a
32-byte AEAD, not a pass over the whole model: ``kem = seal(pk, K_c)`` (80 B) then the body under
``K_c`` with ``kem`` as associated data (so a body cannot be moved under another header).
"""

from __future__ import annotations

import hashlib
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from hushnet.crypto.errors import CryptoError, IntegrityError
from hushnet.crypto.keys import KEY_LEN, KeyPair, exchange, public_bytes

_SALT = b"hushnet-seal-v1"
_ZERO_NONCE = bytes(12)
TAG_LEN = 16
SEAL_OVERHEAD = KEY_LEN + TAG_LEN  # 48
KEM_LEN = KEY_LEN + KEY_LEN + TAG_LEN  # sealed 32-byte content key: 80
TOKEN_OVERHEAD = KEM_LEN + TAG_LEN  # 96


def _key(shared: bytes, epk: bytes, pk: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=_SALT, info=info).derive(
        shared + epk + pk
    )


def seal(recipient_public: bytes, plaintext: bytes, info: bytes = b"") -> bytes:
    """Encrypt ``plaintext`` so that only the holder of ``recipient_public``'s secret key can read it."""
    e = X25519PrivateKey.generate()
    epk = public_bytes(e.public_key())
    k = _key(exchange(e, recipient_public), epk, recipient_public, info)
    return epk + ChaCha20Poly1305(k).encrypt(_ZERO_NONCE, plaintext, info)


def seal_many(
    recipient_publics: list[bytes], plaintexts: list[bytes], info: bytes = b""
) -> list[bytes]:
    """:func:`seal` to several *distinct* recipients with one ephemeral key (one key generation instead of
    one per box; secure summation seals a share pair to every other member).  Each box has :func:`seal`'s
    format and opens with :func:`open_sealed`; its key is bound to its recipient's public key, so the
    keys differ and the fixed nonce is never reused under one key.  The boxes share ``epk``, which
    links them to one sealer — fine where the sender is known anyway, not for anonymous senders."""
    if len(recipient_publics) != len(plaintexts):
        raise ValueError("one plaintext per recipient")
    if len(set(recipient_publics)) != len(recipient_publics):
        raise ValueError(
            "seal_many needs distinct recipients (a repeated key would reuse the nonce)"
        )
    e = X25519PrivateKey.generate()
    epk = public_bytes(e.public_key())
    return [
        epk + ChaCha20Poly1305(_key(exchange(e, pk), epk, pk, info)).encrypt(_ZERO_NONCE, pt, info)
        for pk, pt in zip(recipient_publics, plaintexts)
    ]


_STATIC_SALT = b"hushnet-static-box-v1"
NONCE_LEN = 12
STATIC_OVERHEAD = NONCE_LEN + TAG_LEN  # 28


def _static_key(
    mine: KeyPair, peer_public: bytes, sender_pk: bytes, recipient_pk: bytes, info: bytes
) -> bytes:
    shared = mine.static_secret(peer_public)
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=_STATIC_SALT, info=info).derive(
        shared + sender_pk + recipient_pk
    )


def seal_static(
    sender: KeyPair, recipient_public: bytes, plaintext: bytes, info: bytes = b""
) -> bytes:
    """Encrypt ``plaintext`` from ``sender`` to ``recipient_public`` under their static-static key
    (see the module doc): ``nonce ‖ ct ‖ tag``, 28 bytes of overhead, no X25519 after the first box
    to a peer.  The key depends on the direction (sender's key first) and on ``info``, so the two
    directions of a pair never share a key; the 96-bit nonce is random, so even a caller that seals
    twice under the same ``info`` (a repeated round id) reuses a nonce only with probability
    ``≈ m²/2^97`` for ``m`` boxes — no counter state to keep or lose."""
    k = _static_key(sender, recipient_public, sender.public, recipient_public, info)
    nonce = os.urandom(NONCE_LEN)
    return nonce + ChaCha20Poly1305(k).encrypt(nonce, plaintext, info)


def open_static(recipient: KeyPair, sender_public: bytes, box: bytes, info: bytes = b"") -> bytes:
    """Open a :func:`seal_static` box from ``sender_public``; :class:`IntegrityError` if it was made by
    another sender, for another recipient, under other ``info``, or tampered with."""
    if len(box) < STATIC_OVERHEAD:
        raise IntegrityError(f"static box too short ({len(box)} bytes)")
    try:
        k = _static_key(recipient, sender_public, sender_public, recipient.public, info)
    except CryptoError as exc:
        raise IntegrityError(str(exc)) from exc
    try:
        return ChaCha20Poly1305(k).decrypt(box[:NONCE_LEN], box[NONCE_LEN:], info)
    except InvalidTag:
        raise IntegrityError(
            "static box does not open (another sender or recipient, other info, or tampered)"
        ) from None


def open_sealed(keypair: KeyPair, box: bytes, info: bytes = b"") -> bytes:
    """Open a sealed box; :class:`IntegrityError` if it is not for this key, tampered, or bound to other ``info``."""
    if len(box) < SEAL_OVERHEAD:
        raise IntegrityError(f"sealed box too short ({len(box)} bytes)")
    epk = box[:KEY_LEN]
    try:
        k = _key(keypair.exchange(epk), epk, keypair.public, info)
    except CryptoError as exc:
        raise IntegrityError(str(exc)) from exc
    try:
        return ChaCha20Poly1305(k).decrypt(_ZERO_NONCE, box[KEY_LEN:], info)
    except InvalidTag:
        raise IntegrityError(
            "sealed box does not open with this key (tampered, or for another recipient)"
        ) from None


def token_length(body_len: int) -> int:
    return TOKEN_OVERHEAD + body_len


def seal_token(recipient_public: bytes, body: bytes, info: bytes = b"") -> bytes:
    """Two-part sealed token ``kem ‖ AEAD_{K_c}(body)``, ``len = 96 + len(body)``."""
    kc = os.urandom(32)
    kem = seal(recipient_public, kc, info)
    return kem + ChaCha20Poly1305(kc).encrypt(_ZERO_NONCE, body, kem)


def try_open_token(keypair: KeyPair, token: bytes, info: bytes = b"") -> bytes | None:
    """Trial-open a token: ``None`` if its header is not for this key (the relay case, no side effects);
    the body if it is; :class:`IntegrityError` if the header opens but the body was tampered with."""
    if len(token) < TOKEN_OVERHEAD:
        raise IntegrityError(f"token too short ({len(token)} bytes)")
    kem = token[:KEM_LEN]
    try:
        kc = open_sealed(keypair, kem, info)
    except IntegrityError:
        return None
    try:
        return ChaCha20Poly1305(kc).decrypt(_ZERO_NONCE, token[KEM_LEN:], kem)
    except InvalidTag:
        raise IntegrityError(
            "token header is for this node but the body fails authentication (tampered)"
        ) from None


def token_replay_tag(token: bytes) -> bytes:
    """What a destination keeps in its replay cache: a hash of the token's header (unique per sealing)."""
    return hashlib.blake2b(token[:KEM_LEN], digest_size=16).digest()
