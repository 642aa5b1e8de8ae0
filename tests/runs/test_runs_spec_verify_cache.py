"""Spec signature checks once per process for the nodes it hosts (issue 12), never at the cost of soundness.

Real certificates from a real bootstrap authority: the first node of a process checks the operator's
certificate chain and signature; the others reuse that verdict for the *same* bytes only — a tampered
spec, another signature, a different run id or another network's CA are each checked (and refused) again.
"""

from __future__ import annotations

import dataclasses
import pathlib
from types import SimpleNamespace

import pytest

from hushnet.bootstrap.authority import load_or_create
from hushnet.net import pki
from hushnet.runs import service as service_mod
from hushnet.runs.service import RunService
from hushnet.runs.spec import Budget, RunSpec, SignedRunSpec, SpecError, sign_spec


class _Hosted:
    """The part of a node's RunService that verifies specs (the rest needs a running node)."""

    _verify = RunService._verify
    _verify_once = RunService._verify_once

    def __init__(self, ca_pem: bytes) -> None:
        self.node = SimpleNamespace(identity=SimpleNamespace(ca_pem=ca_pem))


def _node(ca_pem: bytes) -> _Hosted:
    return _Hosted(ca_pem)


@pytest.fixture
def counted(monkeypatch):
    service_mod._VERIFIED.clear()
    calls = []
    real = service_mod.verify_spec

    def counting(signed, key):
        calls.append(signed.spec.run_id)
        return real(signed, key)

    monkeypatch.setattr(service_mod, "verify_spec", counting)
    yield calls
    service_mod._VERIFIED.clear()


def test_one_check_per_process_and_every_change_rechecked(tmp_path: pathlib.Path, counted) -> None:
    auth = load_or_create(tmp_path / "b", token="tok")
    op_key = pki.load_key((tmp_path / "b" / "operator.key").read_bytes())
    op_cert = (tmp_path / "b" / "operator.pem").read_bytes()
    spec = RunSpec(
        protocol="rw-dpsgd",
        task="logreg",
        graph="ring:8",
        steps=40,
        seed=5,
        budget=Budget(10.0, 1e-5),
        sigma=2.0,
        clip=1.0,
        step_size=0.1,
    )
    signed = sign_spec(spec, op_key, op_cert)
    nodes = [_node(auth.ca_pem) for _ in range(32)]
    for nd in nodes:  # 32 hosted nodes receive the same bytes
        got = nd._verify(SignedRunSpec.from_bytes(signed.to_bytes()))
        assert got.run_id == signed.spec.run_id
    assert len(counted) == 1

    tampered = SignedRunSpec(dataclasses.replace(signed.spec, steps=41), signed.signature, op_cert)
    with pytest.raises(SpecError):
        nodes[0]._verify(tampered)
    wrong_id = SignedRunSpec(
        dataclasses.replace(signed.spec, run_id="r-forged"), signed.signature, op_cert
    )
    with pytest.raises(SpecError):
        nodes[1]._verify(wrong_id)
    other = load_or_create(
        tmp_path / "other", token="tok"
    )  # another network's CA: not our operator
    with pytest.raises(SpecError, match="not issued by this network's CA"):
        _node(other.ca_pem)._verify(signed)
    assert (
        len(counted) == 3
    )  # tampered and wrong run id reached the signature check; the foreign CA stopped before
    with pytest.raises(SpecError):  # a failure is not remembered: refused again, checked again
        nodes[2]._verify(tampered)
    assert len(counted) == 4
    resigned = sign_spec(
        spec, op_key, op_cert
    )  # ECDSA: a new signature over the same spec is checked once more
    nodes[3]._verify(resigned)
    nodes[4]._verify(resigned)
    assert len(counted) == 5
