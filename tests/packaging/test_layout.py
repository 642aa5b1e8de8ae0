"""The distribution installs one namespace, ``hushnet``, mapped from the repository's design folders.

setuptools cannot discover packages through a ``package-dir`` rename, so ``setup.py`` discovers them
under each mapped folder (a new sub-package — a new protocol family — needs no list entry).  A package
it missed would be absent from an installed wheel (a Docker image) while the editable install used by
the tests still finds it.  These tests catch that, and that nothing generic (``node``, ``proto``,
``bootstrap``) is installed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _config() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def _setup_packages() -> list[str]:
    src = (REPO / "setup.py").read_text().replace("setup(packages=packages())", "")
    ns: dict = {"__file__": str(REPO / "setup.py")}
    exec(compile(src, "setup.py", "exec"), ns)  # the discovery only, without running setup()
    return ns["packages"]()


def test_every_source_package_is_discovered() -> None:
    cfg = _config()
    assert "packages" not in cfg, (
        "packages are discovered by setup.py, not listed in pyproject.toml"
    )
    found = set()
    for name, folder in cfg["package-dir"].items():
        root = REPO / folder
        for init in root.rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            rel = init.parent.relative_to(root)
            found.add(".".join([name, *rel.parts]) if rel.parts else name)
    discovered = _setup_packages()
    assert len(discovered) == len(set(discovered))
    assert set(discovered) == found, (
        sorted(found - set(discovered)),
        sorted(set(discovered) - found),
    )
    assert {"hushnet.families.walk", "hushnet.bootstrap", "hushnet.v1"} <= found


def test_wheel_holds_only_the_hushnet_namespace(tmp_path: Path) -> None:
    src = (
        tmp_path / "src"
    )  # a copy: setuptools builds in the source tree and would leave build/ in the repo
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, src / name)
    for folder in ("node", "bootstrap", "proto"):
        shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(src),
        ],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    wheel = next(tmp_path.glob("hushnet-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"hushnet", f"hushnet-{wheel.name.split('-')[1]}.dist-info"}, tops
    for module in (
        "hushnet/__init__.py",
        "hushnet/v1/peer_pb2_grpc.py",
        "hushnet/bootstrap/service.py",
        "hushnet/net/node.py",
        "hushnet/privacy/api.py",
    ):
        assert module in names, module


def test_public_api_imports_without_the_repository_on_the_path(tmp_path: Path) -> None:
    code = (
        "import sys, hushnet; hushnet.Client; hushnet.RunSpec; hushnet.Budget; hushnet.Simulator; "
        "hushnet.privacy_matrix; "
        "assert not [m for m in sys.modules if m.split('.')[0] in ('node', 'proto', 'bootstrap')]"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path)


def test_every_design_reference_resolves() -> None:
    """Docstrings and docs cite the spec notes shipped in docs/design/spec: every cited file exists, and
    nothing points at a document the repository does not ship."""
    import re

    cited: set[str] = set()
    stale: list[str] = []
    for path in [
        *REPO.glob("node/**/*.py"),
        *REPO.glob("bootstrap/**/*.py"),
        *REPO.glob("tests/**/*.py"),
        *REPO.glob("benchmarks/**/*.py"),
        *REPO.glob("docs/*.md"),
        REPO / "README.md",
    ]:
        text = path.read_text(errors="replace")
        cited.update(re.findall(r"docs/design/spec/[a-z]+\.md", text))
        if "shared/" + "spec/" in text:  # split so this test does not find itself
            stale.append(str(path.relative_to(REPO)))
    assert cited, "no reference to the design notes found"
    assert all((REPO / c).is_file() for c in cited), sorted(
        c for c in cited if not (REPO / c).is_file()
    )
    assert not stale, f"references to a spec outside the repository: {stale}"
