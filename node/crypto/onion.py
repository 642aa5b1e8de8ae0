"""Onion packets: per-hop layers sealed to each hop's long-term X25519 onion key (Sphinx-like).

Layout (every size fixed by the deployment: ``R`` header slots of ``S = 64`` bytes, payload ``P``)::

    packet = version(1) ‖ epoch(4) ‖ epk(32) ‖ γ(16) ‖ β(R·S) ‖ payload(P)
    slot   = type(1: RELAY|FINAL) ‖ next_hop(4) ‖ epk_next(32) ‖ γ_next(16) ‖ zero(11)

Hop k derives ``s = X25519(y_k, epk_k)`` and from it (HKDF-SHA256) a header keystream key ρ, a
one-time Poly1305 key μ, a payload keystream key π and a replay tag τ (docs/design/spec/anonymity.md §6.3,
with a fresh ephemeral key per hop because ``cryptography`` offers no scalar blinding).  It checks
``γ = Poly1305_μ(version ‖ epoch ‖ β ‖ payload)`` *first* (so garbage never fills the replay
cache), refuses a τ it already saw in this epoch, then shifts its slot out of the header
(``β ‖ 0^S`` XOR ρ-stream; the filler built by the source keeps the header length constant, so a
hop cannot tell its position) and strips its payload layer.  The slots behind the final one are
random bytes, so the final hop, which decrypts them, cannot count the path length either.  Unlike Sphinx the MAC also covers
the payload, so tampering anywhere is caught at the very next hop.

What a hop learns: its previous hop (the link), its next hop (its slot) and whether it is the
final recipient.  Incoming and outgoing bytes are unlinkable (fresh epk, fresh keystreams).
"""

from __future__ import annotations

import hmac
import os
import struct
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.poly1305 import Poly1305

from hushnet.crypto.errors import CellError, CryptoError, IntegrityError
from hushnet.crypto.keys import KEY_LEN, EpochKeys, KeyPair, exchange, public_bytes
from hushnet.crypto.replay import ReplayCache
from hushnet.engine.errors import ReplayedMessage

VERSION = 1
SLOT = 64
MAC_LEN = 16
RELAY, FINAL = 0x01, 0x02
_PREFIX = struct.Struct(">BI")  # version, epoch
_SLOT = struct.Struct(">BI32s16s11x")
_NONCE = bytes(16)
_SALT = b"hushnet-onion-v1"
_MSG_LEN = struct.Struct(">I")


def packet_length(slots: int, payload_len: int) -> int:
    return _PREFIX.size + KEY_LEN + MAC_LEN + slots * SLOT + payload_len


def _stream(key: bytes, data: bytes, block: int = 0) -> bytes:
    """``data`` XOR ChaCha20_key from 64-byte block ``block`` on (zero nonce: every key here is used
    once).  Slots are one block each, so the filler reads a stream's tail without its head."""
    nonce = (
        _NONCE if block == 0 else block.to_bytes(4, "little") + _NONCE[4:]
    )  # 32-bit LE counter ‖ nonce
    return Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor().update(data)


@dataclass(frozen=True)
class HopKeys:
    rho: bytes
    mu: bytes
    pi: bytes
    tau: bytes


def _derive(shared: bytes, epk: bytes, pk: bytes) -> HopKeys:
    okm = HKDF(algorithm=hashes.SHA256(), length=112, salt=_SALT, info=b"keys").derive(
        shared + epk + pk
    )
    return HopKeys(okm[0:32], okm[32:64], okm[64:96], okm[96:112])


def _mac(mu: bytes, prefix: bytes, beta: bytes, payload: bytes, ad: bytes = b"") -> bytes:
    p = Poly1305(mu)
    p.update(prefix)
    p.update(beta)
    p.update(payload)
    p.update(_ad(ad))
    return p.finalize()


def onion_ad(run_id: str) -> bytes:
    """The associated data of a run's onion layers: a layer of run A fails its MAC in run B."""
    return b"hushnet-onion-run|" + run_id.encode()


def _ad(ad: bytes) -> bytes:
    """Associated data as the MAC's tail: ``ad ‖ len(ad)`` (β and the payload have fixed lengths, so the
    encoding is unambiguous).  The run id goes here: a layer made for one run fails the MAC in any other."""
    return bytes(ad) + len(ad).to_bytes(8, "big")


def build_packet(
    path: list[tuple[int, bytes]],
    message: bytes,
    *,
    epoch: int,
    slots: int,
    payload_len: int,
    ad: bytes = b"",
) -> bytes:
    """The packet for hop 1 of ``path = [(node, onion_public_key), …]`` (the last entry is the recipient).

    ``message`` is padded to ``payload_len − 4`` bytes; ``len(path) ≤ slots``.  ``ad`` (the run id) is
    authenticated by every layer's MAC and must be passed to :func:`peel` again.
    """
    T = len(path)
    if not 1 <= T <= slots:
        raise ValueError(f"path of {T} hops does not fit {slots} header slots")
    if len(message) + _MSG_LEN.size > payload_len:
        raise ValueError(
            f"message of {len(message)} bytes exceeds the payload capacity {payload_len - _MSG_LEN.size}"
        )
    R, S = slots, SLOT
    prefix = _PREFIX.pack(VERSION, epoch)
    epks, keys = [], []
    for _, pk in path:
        e = X25519PrivateKey.generate()
        epk = public_bytes(e.public_key())
        epks.append(epk)
        keys.append(_derive(exchange(e, pk), epk, pk))
    # filler: what hops 1..T-1 will shift into the header's tail (only each stream's last k slots
    # are needed, read by seeking the counter: O(T²·S) instead of O(T·R·S) keystream and memory)
    phi = b""
    for k in range(1, T):  # hops 1..T-1 (0-based index k-1)
        phi = _stream(keys[k - 1].rho, phi + bytes(S), R - k + 1)
    # header and payload layers, innermost first: payload_T = m ⊕ π_T, payload_k = payload_{k+1} ⊕ π_k
    # (one payload buffer at a time: a Mode-B walk has hundreds of hops over a model-sized payload)
    plain = (
        _MSG_LEN.pack(len(message)) + message + bytes(payload_len - _MSG_LEN.size - len(message))
    )
    payload = _stream(keys[T - 1].pi, plain)
    final_slot = _SLOT.pack(FINAL, 0, bytes(32), bytes(16))
    # random, not zero, padding behind the final slot: the final hop decrypts the whole header, and
    # zero slots there would count the path length (issue 11 finding 2; Lightning's Sphinx fix)
    beta = _stream(keys[T - 1].rho, final_slot + os.urandom((R - T) * S)) + phi
    gamma = _mac(keys[T - 1].mu, prefix, beta, payload, ad)
    for k in range(T - 2, -1, -1):
        slot = _SLOT.pack(RELAY, path[k + 1][0], epks[k + 1], gamma)
        beta = _stream(keys[k].rho, slot + beta[: (R - 1) * S])
        payload = _stream(keys[k].pi, payload)
        gamma = _mac(keys[k].mu, prefix, beta, payload, ad)
    return prefix + epks[0] + gamma + beta + payload


@dataclass
class OnionKeyring:
    """A relay's onion keys by epoch and its replay cache (one tag set per epoch held).

    A deployed node passes its own persistent cache (:class:`~hushnet.crypto.replay.PersistentReplayCache`,
    shared by all its runs and kept across restarts): replay protection must last as long as the key."""

    keys: EpochKeys
    replay: ReplayCache = field(default_factory=ReplayCache)

    @classmethod
    def single(
        cls, pair: KeyPair, epoch: int = 0, replay: ReplayCache | None = None
    ) -> "OnionKeyring":
        if replay is None:
            replay = ReplayCache({epoch})
        else:
            replay.open_epoch(epoch)
        return cls(EpochKeys({epoch: pair}), replay)

    def rotate(self, pair: KeyPair, epoch: int, keep: int = 2) -> None:
        """Install the key of a new epoch; keys and replay caches older than ``keep`` epochs are deleted."""
        self.keys.pairs[epoch] = pair
        for e in sorted(self.keys.pairs)[:-keep]:
            del self.keys.pairs[e]
        self.replay.open_epoch(epoch, keep)


@dataclass(frozen=True)
class Peeled:
    """A hop's result: ``final`` (then ``message`` is the plaintext) or the ``next_hop`` and its ``packet``."""

    final: bool
    next_hop: int
    packet: bytes
    message: bytes
    epoch: int


class DuplicatePacket(ReplayedMessage):
    """The very same packet again (a retransmission, or a replay of identical bytes)."""

    code = "replay"


def peel(
    keyring: OnionKeyring, packet: bytes, *, slots: int, payload_len: int, ad: bytes = b""
) -> Peeled:
    """Process one hop: verify, refuse replays, strip the layer.  Raises before any state change
    except the replay-cache insert, which happens only for an authentic packet."""
    R, S = slots, SLOT
    want = packet_length(R, payload_len)
    if len(packet) != want:
        raise CellError(
            f"onion packet of {len(packet)} bytes, this deployment's packets are {want}"
        )
    version, epoch = _PREFIX.unpack_from(packet)
    if version != VERSION:
        raise CellError(f"onion packet version {version}, expected {VERSION}")
    pair = keyring.keys.get(epoch)  # UnknownEpoch
    mv = memoryview(packet)  # no copies of the (possibly multi-megabyte) payload
    o = _PREFIX.size
    epk = packet[o : o + KEY_LEN]
    gamma = packet[o + KEY_LEN : o + KEY_LEN + MAC_LEN]
    o += KEY_LEN + MAC_LEN
    beta = packet[o : o + R * S]
    payload = mv[o + R * S :]
    try:
        hk = _derive(pair.exchange(epk), epk, pair.public)
    except CryptoError as exc:
        raise IntegrityError(f"bad ephemeral key: {exc}") from exc
    mac = Poly1305(hk.mu)
    mac.update(mv[: _PREFIX.size])
    mac.update(beta)
    mac.update(payload)
    mac.update(_ad(ad))
    try:
        mac.verify(gamma)
    except InvalidSignature:
        raise IntegrityError(
            "onion layer MAC does not verify (tampered, or not for this node)"
        ) from None
    dig = gamma  # the MAC under this hop's one-time key identifies the authentic packet's bytes (no pass over the payload)
    prev = keyring.replay.add_if_new(
        epoch, hk.tau, dig
    )  # one SQLite statement per hop on a node's cache
    if prev is not None:
        if hmac.compare_digest(prev, dig):
            raise DuplicatePacket(f"duplicate onion packet in epoch {epoch}")
        raise ReplayedMessage(f"onion replay tag already processed in epoch {epoch}")
    B = _stream(hk.rho, beta + bytes(S))
    kind, nxt, epk_next, gamma_next = _SLOT.unpack_from(B)
    payload2 = _stream(hk.pi, payload)
    if kind == FINAL:
        (n,) = _MSG_LEN.unpack_from(payload2)
        pad = payload_len - _MSG_LEN.size - n
        if pad < 0 or payload2.count(0, _MSG_LEN.size + n) != pad:
            raise IntegrityError("final onion payload has a bad length or non-zero padding")
        return Peeled(True, -1, b"", payload2[_MSG_LEN.size : _MSG_LEN.size + n], epoch)
    if kind != RELAY:
        raise IntegrityError(f"onion slot of unknown type {kind}")
    out = b"".join((packet[: _PREFIX.size], epk_next, gamma_next, B[S:], payload2))
    return Peeled(False, int(nxt), out, b"", epoch)
