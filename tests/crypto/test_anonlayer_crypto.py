"""Crypto primitives of the anonymity layer: sealed boxes, onion packets, cells, replay, Shamir, masks."""

import os
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hushnet.crypto.cells import from_cells, n_cells, to_cells
from hushnet.crypto.errors import (
    CellError,
    CryptoError,
    InconsistentShares,
    IntegrityError,
    UnknownEpoch,
)
from hushnet.crypto.keys import KeyPair, simulation_keypairs
from hushnet.crypto.masks import FixedPoint, mask_stream, pairwise_seed
from hushnet.crypto.onion import OnionKeyring, build_packet, packet_length, peel
from hushnet.crypto.replay import ReplayCache
from hushnet.crypto.sealed import open_sealed, seal, seal_token, token_length, try_open_token
from hushnet.crypto.shamir import (
    PRIME,
    SECRET_LEN,
    SHARE_LEN,
    Share,
    check_encoded,
    combine,
    consistent,
    split,
    split_many,
    split_many_encoded,
)
from hushnet.engine.errors import ReplayedMessage

R, P = 8, 600


@pytest.fixture(scope="module")
def relays():
    kps = simulation_keypairs(7, 6, "onion")
    return kps


def _rings(kps):
    return [OnionKeyring.single(k) for k in kps]


# ---- sealed boxes ------------------------------------------------------------------------------


def test_sealed_box_only_recipient_opens_and_info_binds():
    a, b = KeyPair.generate(), KeyPair.generate()
    box = seal(a.public, b"model bytes", b"run-1")
    assert open_sealed(a, box, b"run-1") == b"model bytes"
    with pytest.raises(IntegrityError):
        open_sealed(b, box, b"run-1")  # wrong recipient
    with pytest.raises(IntegrityError):
        open_sealed(a, box, b"run-2")  # bound to another run/epoch
    bad = bytearray(box)
    bad[40] ^= 1
    with pytest.raises(IntegrityError):
        open_sealed(a, bytes(bad), b"run-1")
    with pytest.raises(IntegrityError):
        open_sealed(a, box[:20], b"run-1")
    assert (
        box[:32] != seal(a.public, b"model bytes", b"run-1")[:32]
    )  # fresh ephemeral key each time


def test_token_trial_open_relay_vs_destination_vs_tamper():
    dest, relay = KeyPair.generate(), KeyPair.generate()
    body = os.urandom(800)
    tok = seal_token(dest.public, body, b"i")
    assert len(tok) == token_length(800)
    assert try_open_token(relay, tok, b"i") is None  # not for me: relay, no exception, no state
    assert try_open_token(dest, tok, b"i") == body
    bad = bytearray(tok)
    bad[-5] ^= 0x80  # body tampered: header still opens -> integrity error at the destination
    with pytest.raises(IntegrityError):
        try_open_token(dest, bytes(bad), b"i")
    other = seal_token(dest.public, body, b"i")
    swapped = tok[:80] + other[80:]  # a body moved under another header
    with pytest.raises(IntegrityError):
        try_open_token(dest, swapped, b"i")


def test_low_order_public_key_refused():
    with pytest.raises(CryptoError):
        KeyPair.generate().exchange(bytes(32))


# ---- onion packets -----------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(path=st.lists(st.integers(0, 5), min_size=1, max_size=R), msg_len=st.integers(0, P - 4))
def test_onion_round_trip_constant_size_unlinkable(relays, path, msg_len):
    rings = _rings(relays)
    msg = os.urandom(msg_len)
    pkt = build_packet([(v, relays[v].public) for v in path], msg, epoch=0, slots=R, payload_len=P)
    for k, v in enumerate(path):
        assert len(pkt) == packet_length(R, P)  # size never tells the position on the path
        res = peel(rings[v], pkt, slots=R, payload_len=P)
        if k < len(path) - 1:
            assert not res.final and res.next_hop == path[k + 1]
            # incoming and outgoing bytes share no 16-byte substring (docs/design/spec/anonymity.md §5.3 19)
            ins = {pkt[i : i + 16] for i in range(0, len(pkt) - 16)}
            assert not any(res.packet[i : i + 16] in ins for i in range(0, len(res.packet) - 16, 7))
            pkt = res.packet
        else:
            assert res.final and res.message == msg


def test_onion_header_does_not_tell_the_position(relays):
    """Spec §6.3 self-test: what a hop receives looks the same whatever its position and the path
    length — every header slot (filler included) is uniform bytes, never the zero padding a
    header without filler would shift in."""
    from scipy.stats import chisquare

    rings = _rings(relays)
    rng = random.Random(3)
    by_remaining: dict[int, list[bytes]] = {}
    for T in range(1, R + 1):
        for _ in range(8):
            path = [rng.randrange(6) for _ in range(T)]
            pkt = build_packet(
                [(v, relays[v].public) for v in path], b"m", epoch=0, slots=R, payload_len=P
            )
            for k, v in enumerate(path):
                beta = pkt[5 + 32 + 16 : 5 + 32 + 16 + R * 64]
                assert all(
                    any(beta[i : i + 64]) for i in range(0, R * 64, 64)
                )  # no all-zero slot anywhere
                by_remaining.setdefault(T - k, []).append(beta)
                res = peel(rings[v], pkt, slots=R, payload_len=P)
                pkt = res.packet
    for left, betas in by_remaining.items():
        counts = np.bincount(np.frombuffer(b"".join(betas), dtype=np.uint8), minlength=256)
        assert chisquare(counts).pvalue > 1e-4, (
            f"header bytes with {left} hops left are not uniform"
        )


def test_onion_relay_learns_only_next_hop(relays):
    """The middle relay's output names only its successor; the message is not readable there."""
    rings = _rings(relays)
    msg = b"THE-INNER-MESSAGE-" * 10
    pkt = build_packet(
        [
            (1, relays[1].public),
            (2, relays[2].public),
            (3, relays[3].public),
            (4, relays[4].public),
        ],
        msg,
        epoch=0,
        slots=R,
        payload_len=P,
    )
    r1 = peel(rings[1], pkt, slots=R, payload_len=P)
    r2 = peel(rings[2], r1.packet, slots=R, payload_len=P)
    assert (r1.next_hop, r2.next_hop) == (2, 3)
    assert r1.message == r2.message == b""
    for blob in (pkt, r1.packet, r2.packet):
        assert b"THE-INNER" not in blob


def test_onion_tamper_replay_epoch_size(relays):
    rings = _rings(relays)

    def mk():
        return build_packet(
            [(1, relays[1].public), (2, relays[2].public)], b"hi", epoch=0, slots=R, payload_len=P
        )

    pkt = mk()
    for pos in (10, 60, len(pkt) - 3):  # MAC, header, payload
        bad = bytearray(pkt)
        bad[pos] ^= 1
        with pytest.raises(IntegrityError):
            peel(rings[1], bytes(bad), slots=R, payload_len=P)
    assert len(rings[1].replay) == 0  # garbage never fills the replay cache
    peel(rings[1], pkt, slots=R, payload_len=P)
    with pytest.raises(ReplayedMessage):
        peel(rings[1], pkt, slots=R, payload_len=P)
    with pytest.raises(IntegrityError):  # not for this relay
        peel(rings[3], mk(), slots=R, payload_len=P)
    with pytest.raises(CellError):
        peel(rings[1], mk()[:-1], slots=R, payload_len=P)
    with pytest.raises(CellError):
        peel(rings[1], mk() + b"\0", slots=R, payload_len=P)
    e5 = build_packet([(1, relays[1].public)], b"x", epoch=5, slots=R, payload_len=P)
    with pytest.raises(UnknownEpoch):
        peel(rings[1], e5, slots=R, payload_len=P)


def test_key_rotation_keeps_previous_epoch_then_forgets(relays):
    ring = OnionKeyring.single(relays[1], epoch=0)
    new = KeyPair.generate()
    old_pkt = build_packet([(1, relays[1].public)], b"old", epoch=0, slots=R, payload_len=P)
    ring.rotate(new, epoch=1)
    assert (
        peel(ring, old_pkt, slots=R, payload_len=P).message == b"old"
    )  # still in flight: accepted
    ring.rotate(KeyPair.generate(), epoch=2)
    with pytest.raises(UnknownEpoch):
        peel(
            ring,
            build_packet([(1, relays[1].public)], b"x", epoch=0, slots=R, payload_len=P),
            slots=R,
            payload_len=P,
        )


# ---- cells and replay caches -------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(n=st.integers(0, 5000))
def test_cells_round_trip_and_fixed_size(n):
    msg = os.urandom(n)
    data = to_cells(msg, 512)
    assert len(data) == 512 * n_cells(n, 512)
    assert from_cells(data, 512) == msg


def test_cells_refuse_bad_input():
    data = to_cells(os.urandom(1500), 512)
    with pytest.raises(CellError):
        from_cells(data[:-1], 512)  # truncated
    with pytest.raises(CellError):
        from_cells(data + bytes(512), 512)  # an extra cell
    with pytest.raises(CellError):
        from_cells(data, 512, expected_cells=2)  # oversized for the deployment
    with pytest.raises(CellError):
        from_cells(data[512:1024] + data[:512] + data[1024:], 512)  # reordered
    bad = bytearray(data)
    bad[-1] = 7  # something hidden in the padding
    with pytest.raises(CellError):
        from_cells(bytes(bad), 512)


def test_replay_cache_per_epoch():
    c = ReplayCache({0})
    c.check_and_add(0, b"t")
    with pytest.raises(ReplayedMessage):
        c.check_and_add(0, b"t")
    with pytest.raises(UnknownEpoch):
        c.check_and_add(1, b"t")
    c.open_epoch(1)
    c.check_and_add(1, b"t")  # a new epoch has its own tag set
    c.open_epoch(2)
    assert c.epochs == [1, 2]


# ---- Shamir ------------------------------------------------------------------------------------


def test_shamir_any_t_recover_and_inconsistency_detected():
    s = os.urandom(32)
    xs = list(range(1, 17))
    sh = split(s, xs, 9)
    rnd = random.Random(0)
    for _ in range(5):
        assert combine(rnd.sample(sh, 9), 9) == s
    assert all(consistent(sh, 9))
    bad = list(sh)
    bad[12] = Share(bad[12].x, (bad[12].y + 1) % (1 << 521 - 1))
    flags = consistent(bad, 9)
    assert flags[12] is False and sum(flags) == 15
    with pytest.raises(InconsistentShares):
        combine(sh[:8], 9)
    assert Share.decode(sh[0].encode()) == sh[0]
    with pytest.raises(InconsistentShares):
        Share.decode(sh[0].encode()[:-1])


def _probably_prime(n: int) -> bool:
    """Miller–Rabin with the first 12 prime bases and 20 random ones (error < 4^-32)."""
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    rnd = random.Random(1)
    for a in [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37] + [
        rnd.randrange(2, n - 1) for _ in range(20)
    ]:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def test_shamir_field_is_the_smallest_prime_above_every_secret():
    assert PRIME > 1 << (8 * SECRET_LEN) and _probably_prime(PRIME)
    assert not any(_probably_prime(c) for c in range((1 << 256) + 1, PRIME, 2))
    top = b"\xff" * 32  # the largest secret embeds without reduction
    assert combine(split(top, [1, 2, 3], 2)[1:], 2) == top


def test_shamir_split_many_independent_polynomials_exact_and_checked():
    secrets_ = [os.urandom(32) for _ in range(6)] + [bytes(32)]
    xs = [v + 1 for v in range(12)]
    sh = split_many(secrets_, xs, 7)
    assert [len(s) for s in sh] == [12] * 7 and all(s.x == x for row in sh for s, x in zip(row, xs))
    rnd = random.Random(3)
    for k, sec in enumerate(secrets_):
        assert combine(rnd.sample(sh[k], 7), 7) == sec and all(consistent(sh[k], 7))
        assert (
            consistent(sh[k][:7] + [sh[(k + 1) % 7][8]], 7)[-1] is False
        )  # another secret's share is off this polynomial
    # fresh randomness per secret: the zero secret's shares are not a shifted copy of another's
    assert len({row[0].y - row[1].y for row in sh}) == len(sh)
    # a holder checks its shares encoded: the point, the length and the field are enforced
    enc = sh[0][4].encode()
    assert check_encoded(enc, 5) is enc
    for bad, x in ((enc, 6), (enc[:-1], 5), (enc[:4] + PRIME.to_bytes(SHARE_LEN - 4, "big"), 5)):
        with pytest.raises(InconsistentShares):
            check_encoded(bad, x)
    assert check_encoded(enc[:4] + (PRIME - 1).to_bytes(SHARE_LEN - 4, "big"), 5)
    # threshold 1 is the secret itself at every point; bad arguments are refused
    assert all(
        s.y == int.from_bytes(secrets_[0], "big") for s in split_many(secrets_[:1], xs, 1)[0]
    )
    for args in (
        ([b"short"], xs, 2),
        (secrets_, [1, 1, 2], 2),
        (secrets_, [0, 1, 2], 2),
        (secrets_, xs, 13),
    ):
        with pytest.raises(ValueError):
            split_many(*args)
        with pytest.raises(ValueError):
            split_many_encoded(*args)


def test_shamir_split_many_encoded_is_split_many_encoded(monkeypatch):
    """Same coefficients (the CSPRNG replayed) → the wire-form dealing is byte for byte the encoded shares."""
    import hushnet.crypto.shamir as sh_mod

    secrets_ = [os.urandom(32) for _ in range(16)]
    xs = [v + 1 for v in range(16)]
    for t in (1, 2, 14, 16):
        pool = os.urandom(40 * 16 * 16)
        monkeypatch.setattr(sh_mod.os, "urandom", lambda n, _p=pool: _p[:n])
        objs = split_many(secrets_, xs, t)
        enc = split_many_encoded(secrets_, xs, t)
        assert enc == [[s.encode() for s in row] for row in objs]
        assert all(
            combine([Share.decode(b) for b in row[-t:]], t) == sec
            for row, sec in zip(enc, secrets_)
        )
    assert split_many_encoded([], xs, 2) == []


# ---- masks -------------------------------------------------------------------------------------


def test_fixed_point_error_bound_and_range():
    fp = FixedPoint(frac_bits=24)
    rng = np.random.default_rng(0)
    x = rng.normal(scale=100.0, size=(16, 4000))
    enc = np.zeros(4000, dtype=np.uint64)
    for row in x:
        enc += fp.encode(row, 16)
    err = np.abs(fp.decode(enc) - x.sum(axis=0)).max()
    assert err <= fp.error_bound(16) + 1e-12 * np.abs(x.sum(axis=0)).max()
    assert err > 0  # rounding really happens: the bound is not vacuous
    with pytest.raises(ValueError):
        fp.encode(np.array([fp.max_abs(16) * 1.01]), 16)
    small = FixedPoint(frac_bits=8, bits=32)
    v = small.encode(np.array([-3.5, 2.25]))
    assert np.allclose(small.decode(small.reduce(v + v)), [-7.0, 4.5])
    # reduce keeps the word type; words exactly `bits` wide are already reduced (returned, not copied)
    w32 = np.array([0xFFFFFFFF, 0x12345678], dtype=np.uint32)
    assert small.reduce(w32) is w32
    r20 = FixedPoint(frac_bits=8, bits=20).reduce(w32)
    assert r20.dtype == np.uint32 and r20.tolist() == [0xFFFFF, 0x45678]
    r40 = FixedPoint(frac_bits=8, bits=40).reduce(np.array([2**64 - 1], dtype=np.uint64))
    assert r40.dtype == np.uint64 and r40.tolist() == [2**40 - 1]


def test_static_secret_cached_per_peer_equals_the_exchange_and_refusals_are_not_cached():
    a, b, c = KeyPair.generate(), KeyPair.generate(), KeyPair.generate()
    s_ab = a.static_secret(b.public)
    assert s_ab == a.exchange(b.public) == b.static_secret(a.public) != a.static_secret(c.public)
    assert a._static == {
        b.public: s_ab,
        c.public: a.exchange(c.public),
    }  # one entry per peer, reused
    assert a.static_secret(b.public) is s_ab
    for bad in (bytes(32), b"short"):  # low-order point, wrong length: refused each time
        for _ in range(2):
            with pytest.raises(CryptoError):
                a.static_secret(bad)
    assert len(a._static) == 2
    # the seed from the cached secret is the HKDF of the plain exchange (the seed derivation is unchanged)
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    info = b"hushnet-secagg-pair|ctx" + (3).to_bytes(4, "big") + (9).to_bytes(4, "big")
    assert pairwise_seed(a, b.public, 9, 3, b"ctx") == HKDF(hashes.SHA256(), 32, None, info).derive(
        a.exchange(b.public)
    )


def test_pairwise_masks_cancel():
    a, b = KeyPair.generate(), KeyPair.generate()
    sab = pairwise_seed(a, b.public, 3, 9, b"ctx")
    assert sab == pairwise_seed(b, a.public, 9, 3, b"ctx")
    assert sab != pairwise_seed(a, b.public, 3, 9, b"other-round")
    m = mask_stream(sab, 1000, b"pair")
    x = np.arange(1000, dtype=np.uint64)
    assert np.array_equal((x + m) - m, x)
    assert np.unique(m).size == 1000 and m.std() > 1e18  # uniform 64-bit words, not a constant
