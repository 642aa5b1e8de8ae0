"""Every public class name of the ``hushnet`` sources is defined once.

Two classes of one name (``LedgerEntry`` in the engine and in the privacy ledger, ``Budget`` in the
run spec and in the ledger, …) made ``from … import X`` pick one by accident and forced aliases at
every import.  Parsed, not imported, so a module with an import-time side effect cannot hide one.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCES = (
    "node",
    "bootstrap",
)  # installed as hushnet and hushnet.bootstrap (proto/ is generated code)


def _public_classes() -> dict[str, list[str]]:
    where: dict[str, list[str]] = defaultdict(list)
    for folder in SOURCES:
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.parse(path.read_text(), filename=str(path)).body:
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                    where[node.name].append(str(path.relative_to(REPO)))
    return where


def test_no_public_class_is_defined_twice() -> None:
    where = _public_classes()
    assert "RunSpec" in where and "Ledger" in where  # the scan sees the sources
    twice = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not twice, f"public classes defined more than once: {twice}"


def test_the_renamed_classes_are_where_the_imports_expect_them() -> None:
    import hushnet
    from hushnet.bootstrap.topology import PublishedTopology
    from hushnet.engine.actions import LedgerEntry
    from hushnet.families.central import node as central_node
    from hushnet.families.gossip.machines import Topology
    from hushnet.net.handlers import UnknownProtocol
    from hushnet.privacy.ledger import LedgerBudget, PrivacyEntry
    from hushnet.protocols.registry import UnknownRunProtocol
    from hushnet.runs import driver
    from hushnet.runs.spec import Budget

    assert hushnet.Budget is Budget and Budget is not LedgerBudget
    assert central_node.RunRefused is driver.RunRefused and issubclass(
        driver.RunRefused, ValueError
    )
    assert LedgerEntry is not PrivacyEntry and Topology is not PublishedTopology
    assert not issubclass(UnknownRunProtocol, LookupError) and issubclass(
        UnknownProtocol, LookupError
    )
