"""The process-wide cache of verified signatures never turns a bad signature into a good one.

Every member of a secure-summation round checks the same quorum of survivor-set signatures; with
many nodes in one process each ECDSA verification was repeated by every member.  Only passed
verifications are recorded, keyed by key, signature and message, and the directory check runs on
every call — checked here after a hit for each way a signature can be wrong."""

from __future__ import annotations

import pytest

from hushnet.crypto import signing
from hushnet.crypto.errors import IntegrityError
from hushnet.crypto.signing import Signer, signer_directory


def test_cached_verification_still_refuses_every_forgery():
    a, b = Signer.generate(), Signer.generate()
    d = signer_directory([a, b])
    msg = b"hushnet-secagg-consistency-v1|round"
    sig = a.sign(msg)
    d.verify(0, a.spki, msg, sig)
    assert len(signing._VERIFIED) >= 1
    d.verify(0, a.spki, msg, sig)  # a hit: same verdict
    with pytest.raises(IntegrityError):
        d.verify(0, a.spki, msg + b"x", sig)  # another message
    with pytest.raises(IntegrityError):
        d.verify(0, a.spki, msg, b.sign(msg))  # another node's signature under a's key
    with pytest.raises(IntegrityError):
        d.verify(
            1, a.spki, msg, sig
        )  # a's key presented for node 1: the directory check still runs
    bad = bytearray(sig)
    bad[-1] ^= 1
    with pytest.raises(IntegrityError):
        d.verify(0, a.spki, msg, bytes(bad))
    with pytest.raises(IntegrityError):  # a failure is never cached
        d.verify(0, a.spki, msg, bytes(bad))
