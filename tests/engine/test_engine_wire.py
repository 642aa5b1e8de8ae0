"""Byte formats: envelopes and tokens round-trip exactly and refuse bad input with typed errors."""

import numpy as np
import pytest

from hushnet.engine import Envelope, MalformedMessage, WrongDimension, WrongRun
from hushnet.engine.rng import node_generator, node_generators
from hushnet.families.walk.wire import decode_ack, decode_token, encode_ack, encode_token


def test_envelope_roundtrip_and_wrong_run():
    env = Envelope("rw-dpsgd", "run-abc", 42, b"\x01\x02payload")
    data = env.encode()
    assert Envelope.decode(data, protocol="rw-dpsgd", run_id="run-abc") == env
    with pytest.raises(WrongRun):
        Envelope.decode(data, run_id="run-other")
    with pytest.raises(WrongRun):
        Envelope.decode(data, protocol="pad-ring-sum")
    with pytest.raises(MalformedMessage):
        Envelope.decode(b"XX" + data[2:])
    with pytest.raises(MalformedMessage):
        Envelope.decode(data[:8])


def test_token_bit_exact_little_endian():
    x = np.random.default_rng(0).standard_normal(7) * 1e-300
    p = encode_token(5, 100, -3, 9, x)
    tok = decode_token(p, 7)
    assert tok.step == 5 and tok.total == 100 and tok.aux == -3 and tok.recipient == 9
    assert tok.vector.tobytes() == x.astype("<f8").tobytes()
    # the body really is little-endian float64
    assert p[-8:] == x[-1:].astype("<f8").tobytes()


def test_token_validation():
    p = encode_token(1, 10, 0, 0, np.ones(3))
    with pytest.raises(WrongDimension):
        decode_token(p, 4)
    with pytest.raises(MalformedMessage):
        decode_token(p[:-8], 3)  # declares 3 values, carries 2
    with pytest.raises(MalformedMessage):
        decode_token(p[:10], 3)
    with pytest.raises(MalformedMessage):
        decode_token(encode_token(1, 10, 0, 0, np.array([1.0, np.nan, 0.0])), 3)
    with pytest.raises(MalformedMessage):
        decode_token(encode_ack(3), 3)
    assert decode_ack(encode_ack(77)) == 77


def test_node_generators_are_spawned_children():
    gens = node_generators(123, 5)
    ref = np.random.SeedSequence(123).spawn(5)
    for v in range(5):
        a = gens[v].standard_normal(4)
        b = np.random.Generator(np.random.PCG64(ref[v])).standard_normal(4)
        c = node_generator(123, 5, v).standard_normal(4)
        assert np.array_equal(a, b) and np.array_equal(a, c)
    assert not np.array_equal(
        node_generator(123, 5, 0).random(3), node_generator(123, 5, 1).random(3)
    )


import functools  # noqa: E402

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hushnet.engine import MessageArrived  # noqa: E402


@functools.lru_cache(maxsize=1)
def _ring_machines():
    from helpers.engine import rw_run, synthetic_tasks

    return rw_run("ring:4", synthetic_tasks(4, d=3), steps=50, until=-1.0)[1]


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=120), st.integers(0, 3))
def test_arbitrary_bytes_never_crash_a_machine(payload, src):
    """Whatever a peer sends, a machine answers with actions or a typed Fault — it never raises,
    and only a well-formed token from a neighbour, addressed to it, can advance it."""
    m = _ring_machines()[1]
    before = (m.visits, m.contributions)
    acts = m.handle(MessageArrived(src, payload))
    assert isinstance(acts, list)
    if before != (m.visits, m.contributions):
        tok = decode_token(payload, 4)
        assert tok.recipient == 1 and src in (0, 2)
