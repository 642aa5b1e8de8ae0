"""The committed generated code must match what grpcio-tools produces from the .proto files."""

from __future__ import annotations

import importlib.util
import pathlib
import re

import pytest

_CODEGEN = pathlib.Path(__file__).resolve().parents[2] / "proto" / "codegen.py"
_spec = importlib.util.spec_from_file_location("hushnet_proto_codegen", _CODEGEN)
codegen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(codegen)

# Lines that name the generator's version: they legitimately differ between grpcio-tools releases.
_VERSION_LINES = re.compile(
    r"^(# Protobuf Python Version:.*|GRPC_GENERATED_VERSION = .*|\s+\d+,)$", re.M
)


def _normalise(text: str) -> str:
    return _VERSION_LINES.sub("<version>", text)


def test_generated_code_is_fresh(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("grpc_tools")
    produced = codegen.generate(tmp_path)
    names = sorted(p.name for p in produced)
    committed = sorted(p.name for p in codegen.VERSION_DIR.glob("*_pb2*.py"))
    assert names == committed, (
        "generated module set differs from the committed one; run python proto/codegen.py"
    )
    for path in produced:
        fresh = _normalise(path.read_text())
        stored = _normalise((codegen.VERSION_DIR / path.name).read_text())
        assert fresh == stored, f"{path.name} is stale: run python proto/codegen.py"


def test_generated_package_imports_cleanly() -> None:
    from hushnet.v1 import bootstrap_pb2_grpc, envelope_pb2, envelope_pb2_grpc, peer_pb2_grpc

    env = envelope_pb2.Envelope(
        protocol="p", run_id="r", seq=7, payload=b"\x00\x01", sender="n0", recipient="n1"
    )
    assert envelope_pb2.Envelope.FromString(env.SerializeToString()) == env
    assert hasattr(peer_pb2_grpc, "PeerStub") and hasattr(bootstrap_pb2_grpc, "BootstrapStub")
    assert envelope_pb2.DESCRIPTOR.package == "hushnet.v1"
    # envelope.proto declares no service: protoc still emits its _grpc module (the fresh-set check
    # above needs it), holding only the grpcio version check, which the installed grpcio passes
    assert envelope_pb2_grpc.GRPC_GENERATED_VERSION and not envelope_pb2_grpc._version_not_supported
    assert not [n for n in vars(envelope_pb2_grpc) if n.endswith(("Stub", "Servicer"))]
