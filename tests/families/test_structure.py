"""Each protocol family is one package, so adding a family means one new package and one line in
:data:`hushnet.families.FAMILIES`.

These checks fail if a family is scattered again: every family in the list is a package
``node/families/<name>/`` whose ``__init__`` holds the family object and which has its typed
parameters (``params.py``), machines (``machines.py``) and wire format (``wire.py``); and no module of
the source tree outside that package spells one of the family's protocol names as a string literal
(the family's own modules import the names from its ``params``).

One kind of exception is listed below, each with its reason: ``CONSUMERS`` are modules that *use*
protocols by name the way a user does (the demos pick which protocols to show, the privacy
library's researcher API is keyed by protocol name).  A test below checks that every listed
exception is still needed, so the list only shrinks.
"""

from __future__ import annotations

import ast
import functools
import importlib
from pathlib import Path

import pytest

from hushnet.families import FAMILIES, Family

REPO = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = (REPO / "node", REPO / "bootstrap")
FAMILY_DIR = REPO / "node" / "families"
#: what every family package holds besides its ``__init__`` (the family object)
REQUIRED_MODULES = ("params", "machines", "wire")

#: module (relative to the repository) -> (family names it may name, why)
CONSUMERS: dict[str, tuple[tuple[str, ...], str]] = {
    "node/runs/demo.py": (("walk",), "the demo chooses which protocols to run and compare"),
    "node/runs/demo_ddp.py": (
        ("walk", "secagg", "central"),
        "the distributed-DP demo compares protocols by name",
    ),
    "node/privacy/api.py": (("gossip",), "privacy_matrix / privacy_pair are keyed by protocol"),
    "node/privacy/muffliato.py": (("gossip",), "the Muffliato accountant's variants"),
    "node/privacy/koskela.py": (("gossip",), "the streaming-gossip accountant"),
    "node/privacy/paper/__init__.py": (("gossip",), "the papers' formulas, named by protocol"),
}


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


@functools.cache
def _string_literals(path: Path) -> frozenset[str]:
    """Every string constant of a module (docstrings and comments excluded: prose may name protocols)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    return frozenset(
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        if id(node) not in docstrings
    )


def _namers(family: Family) -> dict[str, set[str]]:
    """Modules outside the family's package → the family's protocol names they spell as literals."""
    own = FAMILY_DIR / family.name
    found: dict[str, set[str]] = {}
    for root in SOURCE_ROOTS:
        for path in sorted(root.rglob("*.py")):
            if own in path.parents or "__pycache__" in path.parts:
                continue
            hits = _string_literals(path) & set(family.protocols)
            if hits:
                found[_rel(path)] = hits
    return found


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_family_is_one_package(family: Family) -> None:
    package = FAMILY_DIR / family.name
    assert (package / "__init__.py").is_file(), f"{family.name} is not a package {_rel(package)}/"
    module = importlib.import_module(f"hushnet.families.{family.name}")
    assert module.FAMILY is family and type(family).__module__ == module.__name__
    for part in REQUIRED_MODULES:
        assert (package / f"{part}.py").is_file(), f"{family.name} has no {part}.py"
        importlib.import_module(f"hushnet.families.{family.name}.{part}")


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_no_module_outside_the_family_names_its_protocols(family: Family) -> None:
    allowed = {m for m, (fams, _) in CONSUMERS.items() if family.name in fams}
    scattered = {m: sorted(p) for m, p in _namers(family).items() if m not in allowed}
    assert not scattered, (
        f"{family.name}'s protocol names are spelled outside node/families/{family.name}/ "
        f"(import them from hushnet.families.{family.name}.params): {scattered}"
    )


def test_every_listed_exception_is_still_needed() -> None:
    by_name = {f.name: f for f in FAMILIES}
    for module, (families, _why) in CONSUMERS.items():
        for name in families:
            assert module in _namers(by_name[name]), f"{module} no longer names {name}: unlist it"


def test_the_family_list_names_every_family_package() -> None:
    """A family package that is not in FAMILIES would never run: one line in the list is the wiring."""
    packages = {p.parent.name for p in FAMILY_DIR.glob("*/__init__.py")}
    assert packages == {f.name for f in FAMILIES}
