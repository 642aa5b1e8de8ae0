"""A node whose ledger file holds a budget an older build stored as NaN (SQLite: NULL) (issue 12, left
from the NaN-budget fix): the ledger refuses to open such a file rather than enforce nothing, and a node
opened it without a budget — so it stopped at start.  Its policy's budget now replaces the stored one on
open, keeping every charge; without a policy budget the node still refuses, naming the file and the fix.
"""

from __future__ import annotations

import math
import pathlib
import sqlite3
from types import SimpleNamespace

import numpy as np
import pytest

from hushnet.privacy.conversions import DEFAULT_ORDERS
from hushnet.privacy.ledger import Ledger, LedgerBudget, PrivacyEntry, StoredBudgetError
from hushnet.runs.policy import NodePolicy
from hushnet.runs.service import LEDGER_FILE, RunService

O = np.asarray(DEFAULT_ORDERS, dtype=float)


def _old_file(state: pathlib.Path) -> np.ndarray:
    path = state / LEDGER_FILE
    with Ledger(path, budget=LedgerBudget(5.0, 1e-5), node_id="n0") as led:
        led.charge(
            PrivacyEntry.from_row("r", "x", "anonymous", "certified", ["n1"], O[None, :] * 0.01)
        )
        spent = led.rdp("n1")
    db = sqlite3.connect(path)
    db.execute("UPDATE budget SET epsilon = ? WHERE target = '*'", (math.nan,))
    db.commit()
    db.close()
    with pytest.raises(StoredBudgetError):
        Ledger(path)
    return spent


def test_the_policy_budget_replaces_an_unreadable_stored_one(tmp_path):
    spent = _old_file(tmp_path)
    NodePolicy.write(tmp_path, epsilon=3.0, delta=1e-6)
    svc = RunService(SimpleNamespace(node_id="n0", state_dir=tmp_path))
    led = svc.ledger
    assert (led.budget.epsilon, led.budget.delta) == (3.0, 1e-6)
    assert np.array_equal(led.rdp("n1"), spent)
    led.close()
    with Ledger(tmp_path / LEDGER_FILE) as again:  # stored for good
        assert again.budget.epsilon == 3.0


def test_without_a_policy_budget_the_node_refuses_in_one_line(tmp_path):
    _old_file(tmp_path)
    svc = RunService(SimpleNamespace(node_id="n0", state_dir=tmp_path))
    with pytest.raises(StoredBudgetError) as err:
        svc.ledger
    msg = str(err.value)
    assert "\n" not in msg and "[budget]" in msg and LEDGER_FILE in msg
