"""Generate the Python code of the wire contract with ``grpcio-tools``.

Why committed code: a fresh clone and an installed wheel import :mod:`hushnet.v1`
without a build step, and a test (``tests/net/test_proto_fresh.py``) calls
:func:`generate` into a temporary directory and compares, so stale code cannot slip in.

protoc writes imports relative to its include root (``from hushnet.v1 import ...``); we
rewrite them to the importable package path ``hushnet.v1``.

Usage: ``python -m proto.codegen`` (rewrites the files next to the ``.proto`` sources).
"""

from __future__ import annotations

import pathlib
import sys
import tempfile

PROTO_ROOT = pathlib.Path(__file__).resolve().parent
VERSION_DIR = PROTO_ROOT / "hushnet" / "v1"


def proto_files() -> list[pathlib.Path]:
    """The ``.proto`` sources of version 1, sorted for a stable order."""
    return sorted(VERSION_DIR.glob("*.proto"))


def generate(out_root: pathlib.Path) -> list[pathlib.Path]:
    """Run protoc over every ``.proto`` file, writing ``out_root/hushnet/v1/*.py``.

    Returns the generated files (import lines already fixed).
    """
    import importlib.resources

    from grpc_tools import protoc  # dev dependency, only needed to regenerate

    out_root = pathlib.Path(out_root)
    out_root.mkdir(parents=True, exist_ok=True)
    well_known = str(importlib.resources.files("grpc_tools") / "_proto")
    rel = [str(p.relative_to(PROTO_ROOT)) for p in proto_files()]
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        *rel,
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise RuntimeError(f"protoc failed with exit code {rc}")
    return sorted((out_root / "hushnet" / "v1").glob("*_pb2*.py"))


def main() -> int:
    """Regenerate the committed modules in place."""
    with tempfile.TemporaryDirectory() as tmp:
        for path in generate(pathlib.Path(tmp)):
            target = VERSION_DIR / path.name
            target.write_text(path.read_text())
            print(f"wrote {target.relative_to(PROTO_ROOT.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
