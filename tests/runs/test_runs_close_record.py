"""The operator's signed close record (issue 14): what a node relays to a neighbour that was down at the
close.  Only what the operator signed verifies: a changed ``deviated`` flag, another run id, another
key or garbage are refused with a one-line error."""

from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from hushnet.runs.spec import SpecError, SpecSignatureError, parse_close, sign_close, verify_close


def test_close_record_verifies_only_as_signed():
    key, other = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    rec = sign_close("run-1", True, key)
    assert verify_close(rec, key.public_key()) == ("run-1", True)
    with pytest.raises(SpecSignatureError):
        verify_close(rec, other.public_key())
    for field, value in (("deviated", False), ("run_id", "run-2")):
        doc = json.loads(rec)
        doc[field] = value
        with pytest.raises(SpecSignatureError):
            verify_close(json.dumps(doc), key.public_key())
    for bad in ("", "{}", "[1]", '{"run_id": "r", "deviated": true, "signature": "***"}'):
        with pytest.raises(SpecError):
            parse_close(bad)
