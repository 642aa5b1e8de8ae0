"""The hand-appended payload field parses as the same Envelope protobuf would produce."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hushnet.net.wire import encode_envelope, tune_allocator
from hushnet.v1 import envelope_pb2 as epb


@settings(max_examples=60, deadline=None)
@given(
    protocol=st.text(max_size=20),
    run_id=st.text(max_size=20),
    seq=st.integers(0, 2**64 - 1),
    payload=st.binary(max_size=3000),
    sender=st.text(max_size=10),
    recipient=st.text(max_size=10),
)
def test_encode_envelope_matches_protobuf(
    protocol, run_id, seq, payload, sender, recipient
) -> None:
    raw = encode_envelope(protocol, run_id, seq, payload, sender, recipient)
    expected = epb.Envelope(
        protocol=protocol,
        run_id=run_id,
        seq=seq,
        payload=payload,
        sender=sender,
        recipient=recipient,
    )
    assert epb.Envelope.FromString(raw) == expected
    assert len(raw) == expected.ByteSize()


def test_large_payload_varint_lengths() -> None:
    for size in (127, 128, 16383, 16384, 2**21 + 5):
        payload = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
        env = epb.Envelope.FromString(encode_envelope("p", "r", 1, payload, "a", "b"))
        assert env.payload == payload and env.sender == "a"


def test_allocator_tuning_applies_on_glibc() -> None:
    import platform

    if platform.libc_ver()[0] != "glibc":
        return
    assert tune_allocator() is True
    assert tune_allocator() is True  # idempotent
