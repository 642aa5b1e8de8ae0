"""The ledger's maths stand apart from its SQLite store.

``ledger_math`` must carry no I/O so that the accountant's arithmetic can be reused (simulator,
operator-side projections) and read without the persistence around it; the node's ``Ledger`` must
give exactly the numbers the pure state gives for the same entries, and a reopened file must
rebuild the same state.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import hushnet.privacy.ledger_math as lm
from hushnet.privacy.conversions import DEFAULT_ORDERS
from hushnet.privacy.ledger import Ledger


def test_ledger_math_imports_no_storage() -> None:
    tree = ast.parse(Path(lm.__file__).read_text())
    imported = {
        a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    imported |= {
        (n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
    }
    assert not imported & {"sqlite3", "json", "threading", "time", "pathlib"}, imported
    code = "import sys, hushnet.privacy.ledger_math; assert 'sqlite3' not in sys.modules"
    # a fresh interpreter without `make coverage`'s start-up hook: coverage keeps its data in SQLite
    env = {k: v for k, v in os.environ.items() if not k.startswith("COVERAGE_PROCESS")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def _entries(rng: np.random.Generator) -> list[lm.PrivacyEntry]:
    out = []
    for i in range(12):
        targets = [str(t) for t in rng.choice(6, size=3, replace=False)]
        if i % 3 == 0:  # Gaussian entries carry μ: the GDP curve applies while every entry has one
            out.append(
                lm.PrivacyEntry.gaussian(
                    f"r{i}",
                    "rw",
                    "anonymous",
                    "certified",
                    {t: float(rng.uniform(0.05, 0.4)) for t in targets},
                )
            )
        else:
            rows = rng.uniform(0, 0.02, size=(3, 1)) * DEFAULT_ORDERS
            out.append(
                lm.PrivacyEntry.from_row(
                    f"r{i}",
                    "muffliato",
                    "neighbourhood",
                    "paper" if i == 5 else "certified",
                    targets,
                    rows,
                )
            )
    return out


def test_pure_state_and_persistent_ledger_agree_and_reopen(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    budget = lm.LedgerBudget(2.0, 1e-6, per_target={"3": (0.5, 1e-5)})
    state = lm.LedgerState(DEFAULT_ORDERS, "9", budget)
    path = tmp_path / "l.sqlite"
    refused_pure, refused_node = [], []
    with Ledger(path, budget=budget, node_id="9") as led:
        for e in _entries(rng):
            costs = state.validate(e)
            bad = lm.LedgerState.violations(state.projection(costs))
            if bad:
                refused_pure.append((e.run_id, lm.LedgerState.refusal(bad, e.run_id).target))
            else:
                for t, (v, mu) in costs.items():
                    state.add(t, v, mu, e.bound)
            try:
                led.charge(e)
            except lm.BudgetExceeded as exc:
                refused_node.append((e.run_id, exc.target))
        assert refused_pure == refused_node and refused_node  # the budget did bite
        for t in state.targets():
            assert led.spent(t) == state.spent(t, state.default_delta(t))
        assert led.remaining() == state.remaining()
    with Ledger(path) as again:  # the store rebuilds the same state (budget included)
        assert again.budget == budget
        for t in state.targets():
            assert again.spent(t) == state.spent(t, state.default_delta(t))
            np.testing.assert_array_equal(again.rdp(t), state.rdp(t))


@pytest.mark.parametrize(
    "budget, msg",
    [
        (lm.LedgerBudget(1.0, 0.0), "delta in \\(0, 1\\)"),
        (lm.LedgerBudget(1.0, 1e-6, per_target={"a": (-1.0, 1e-6)}), "budget for 'a'"),
        (lm.LedgerBudget(1.0, 1e-6, rdp_curve=np.ones(3)), "on the ledger's orders"),
    ],
)
def test_check_budget_one_line_errors(budget: lm.LedgerBudget, msg: str) -> None:
    with pytest.raises(lm.LedgerError, match=msg):
        lm.check_budget(budget, DEFAULT_ORDERS)
