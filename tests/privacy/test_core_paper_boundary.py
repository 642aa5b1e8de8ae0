"""The papers' uncertified formulas stay in ``hushnet.privacy.paper``, apart from the certified accountant.

A certified module may reach into ``paper`` only inside a function that a caller asked for the
labelled reproduction (``bound="paper"``, ``method="classic"``): a module-level import would make
the boundary invisible and let a printed formula slip into a certified path unnoticed.  The moved
formulas are also checked to be gone from the certified modules, and the labels they produce to
be unchanged.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import hushnet.privacy as hp
from hushnet.privacy import conversions, muffliato, randomwalk
from hushnet.privacy.graphs import metropolis_hastings, parse_graph

PRIVACY = Path(hp.__file__).resolve().parent


def _module_level_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in tree.body:  # top level only: lazy imports inside functions are the allowed form
        if isinstance(node, ast.ImportFrom):
            out.add(node.module or "")
            out |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


@pytest.mark.parametrize("path", sorted(p for p in PRIVACY.glob("*.py")), ids=lambda p: p.name)
def test_certified_modules_do_not_import_paper_at_module_level(path: Path) -> None:
    bad = {m for m in _module_level_imports(path) if m.startswith("hushnet.privacy.paper")}
    assert not bad, f"{path.name} imports {sorted(bad)} at module level"


def test_printed_formulas_left_the_certified_modules() -> None:
    for mod, names in (
        (muffliato, ["thm1_matrix", "thm1_from_source", "cor1_matrix", "thm4_er_bound"]),
        (
            randomwalk,
            ["ring_loss_printed_thm5", "star_loss_printed_thm4", "gossip_baseline_loss_vector"],
        ),
        (conversions, ["gaussian_sigma_classic"]),
    ):
        assert not [n for n in names if hasattr(mod, n)], mod.__name__


def test_paper_bound_keeps_its_label_and_is_the_printed_theorem() -> None:
    from hushnet.privacy.paper.muffliato import thm1_matrix

    W = metropolis_hastings(parse_graph("hypercube:4"))
    pm = muffliato.muffliato_loss_matrix(W, 6, 2.0, 1.5, bound="paper")
    F = thm1_matrix(W, 6)
    np.fill_diagonal(F, 0.0)
    assert pm.bound == "paper" and any("NOT a guarantee" in n for n in pm.notes)
    np.testing.assert_allclose(pm.matrix, 2.0 * F / (2 * 1.5**2), rtol=0, atol=1e-15)
    cert = muffliato.muffliato_loss_matrix(W, 6, 2.0, 1.5)
    assert cert.bound == "certified"
    assert np.max(cert.matrix - pm.matrix) > 0  # the printed theorem under-states some pair's loss
