"""The privacy ledger: composition, conversion, budget refusal, persistence, concurrency."""

from __future__ import annotations

import math
import sqlite3
import threading

import numpy as np
import pytest

from hushnet.privacy.conversions import DEFAULT_ORDERS, gdp_epsilon, rdp_to_dp
from hushnet.privacy.ledger import BudgetExceeded, Ledger, LedgerBudget, LedgerError, PrivacyEntry

O = DEFAULT_ORDERS


def gauss(run: str, mu: dict, bound: str = "certified") -> PrivacyEntry:
    return PrivacyEntry.gaussian(run, "muffliato", "neighbourhood", bound, mu)


def test_rdp_adds_and_gdp_composes_in_quadrature():
    with Ledger(":memory:") as led:
        led.charge(gauss("r1", {"a": 0.3, "b": 0.1}))
        led.charge(gauss("r2", {"a": 0.4}))
        np.testing.assert_allclose(led.rdp("a"), O * (0.3**2 + 0.4**2) / 2)
        s = led.spent("a", delta=1e-6)
        assert s.method == "gdp" and s.bound == "certified" and s.entries == 2
        assert s.epsilon == pytest.approx(gdp_epsilon(0.5, 1e-6))
        # the tight GDP value is below Mironov's conversion of the same composed curve
        assert s.epsilon < rdp_to_dp(O, led.rdp("a"), 1e-6)[0]
        assert led.spent("zz", delta=1e-6).epsilon == 0.0


def test_one_non_gdp_entry_falls_back_to_rdp_conversion_and_paper_label_propagates():
    with Ledger(":memory:") as led:
        led.charge(gauss("r1", {"a": 0.3}))
        rw = PrivacyEntry("r2", "rw", "anonymous", "paper", {"a": O * 0.01})
        led.charge(rw)
        s = led.spent("a", delta=1e-5)
        eps, order = rdp_to_dp(O, O * 0.3**2 / 2 + O * 0.01, 1e-5)
        assert s.method == "rdp" and s.epsilon == pytest.approx(eps) and s.best_order == order
        assert s.bound == "paper"  # one paper-labelled entry makes the total a paper value


def test_refused_charge_leaves_no_trace_and_names_worst_node(tmp_path):
    path = tmp_path / "ledger.sqlite"
    budget = LedgerBudget(epsilon=3.0, delta=1e-6, per_target={"b": (0.5, 1e-6)})
    with Ledger(path, budget=budget) as led:
        led.charge(gauss("r1", {"a": 0.2, "b": 0.1, "c": 0.2}))
        before = (led.rdp("a"), led.rdp("b"), led.rdp("c"), len(led.entries()))
        big = gauss("r2", {"a": 0.5, "b": 0.4, "c": 0.1})  # breaks b's tighter budget, not a's
        assert set(led.would_exceed(big)) == {"b"}
        with pytest.raises(BudgetExceeded) as err:
            led.charge(big)
        e = err.value
        assert e.target == "b" and e.budget_epsilon == 0.5 and e.run_id == "r2"
        assert e.epsilon == pytest.approx(gdp_epsilon(math.hypot(0.1, 0.4), 1e-6))
        assert "'b'" in str(e) and "0.5" in str(e)
        after = (led.rdp("a"), led.rdp("b"), led.rdp("c"), len(led.entries()))
        for x, y in zip(before[:3], after[:3]):
            np.testing.assert_array_equal(x, y)
        assert before[3] == after[3] == 1
    db = sqlite3.connect(path)
    counts = [db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in ("entries", "blocks")]
    assert counts == [1, 1]  # nothing of r2 reached the file


def test_worst_node_is_the_largest_excess():
    with Ledger(":memory:", budget=LedgerBudget(1.0, 1e-6, per_target={"x": (0.3, 1e-6)})) as led:
        with pytest.raises(BudgetExceeded) as err:
            led.charge(gauss("r", {"x": 0.2, "y": 2.0}))
        assert err.value.target == "y" and set(err.value.violations) == {"x", "y"}


def test_persistence_across_reopen(tmp_path):
    path = tmp_path / "l.sqlite"
    with Ledger(
        path,
        budget=LedgerBudget(
            3.0, 1e-5, per_target={"n7": (1.0, 1e-6)}, per_target_rdp={"n9": O * 0.5}
        ),
        node_id="n0",
    ) as led:
        led.charge(gauss("r1", {"n1": 0.2, "n7": 0.1}))
        led.charge(
            PrivacyEntry.from_row(
                "r2",
                "rw",
                "sender-known",
                "certified",
                ["n1", "n2"],
                np.vstack([O * 0.001, O * 0.002]),
            )
        )
        spent = led.spent()
        remaining = led.remaining()
    with Ledger(path) as again:
        assert again.node_id == "n0"
        assert again.budget.for_target("n7") == (1.0, 1e-6) and again.budget.epsilon == 3.0
        np.testing.assert_array_equal(again.budget.curve_for("n9"), O * 0.5)
        assert again.budget.for_target("n9") == (3.0, 1e-5) and again.budget.curve_for("n1") is None
        assert again.spent() == spent
        assert again.remaining() == remaining
        assert [e["run_id"] for e in again.entries()] == ["r1", "r2"]
        np.testing.assert_allclose(again.entries("r2")[0]["rdp"]["n2"], O * 0.002)
        with pytest.raises(LedgerError, match="itself"):
            again.charge(gauss("r3", {"n0": 0.1}))
    with pytest.raises(LedgerError, match="orders"):
        Ledger(path, orders=[2.0, 3.0])


def test_remaining_and_budget_rdp_curve():
    curve = O * 0.05  # allow a Gaussian with mu^2/2 <= 0.05, i.e. mu <= sqrt(0.1)
    with Ledger(":memory:", budget=LedgerBudget(math.inf, 1e-6, rdp_curve=curve)) as led:
        led.charge(gauss("r1", {"a": 0.2}))
        assert led.would_exceed(gauss("r2", {"a": 0.2})) == {}
        assert "a" in led.would_exceed(gauss("r2", {"a": 0.3}))
        with pytest.raises(BudgetExceeded):
            led.charge(gauss("r2", {"a": 0.3}))
    with Ledger(
        ":memory:", budget=LedgerBudget(math.inf, 1e-6, per_target_rdp={"b": O * 0.01})
    ) as led:
        led.charge(gauss("r1", {"a": 1.0}))  # no curve toward a
        with pytest.raises(BudgetExceeded) as err:
            led.charge(gauss("r2", {"a": 0.1, "b": 0.2}))  # 0.2^2/2 = 0.02 > 0.01 toward b
        assert err.value.target == "b"
    with Ledger(":memory:", budget=LedgerBudget(1.0, 1e-6)) as led:
        led.charge(gauss("r1", {"a": 0.1}))
        rem = led.remaining(targets=["b"])
        assert rem["a"] == pytest.approx(1.0 - gdp_epsilon(0.1, 1e-6))
        assert rem["b"] == 1.0


def test_invalid_entries_rejected():
    with Ledger(":memory:") as led:
        with pytest.raises(LedgerError, match="bound"):
            led.charge(PrivacyEntry("r", "p", "v", "guess", {"a": O}))
        with pytest.raises(LedgerError, match="shape"):
            led.charge(PrivacyEntry("r", "p", "v", "certified", {"a": np.ones(3)}))
        with pytest.raises(LedgerError, match="non-negative"):
            led.charge(PrivacyEntry("r", "p", "v", "certified", {"a": -O}))
        assert led.entries() == []


def test_concurrent_charges_never_overspend(tmp_path):
    mu = 0.1
    with Ledger(
        tmp_path / "c.sqlite",
        budget=LedgerBudget(gdp_epsilon(mu * math.sqrt(10), 1e-6) * (1 + 1e-9), 1e-6),
    ) as led:
        ok, refused = [], []

        def worker(i):
            try:
                led.charge(gauss(f"r{i}", {"a": mu}))
                ok.append(i)
            except BudgetExceeded:
                refused.append(i)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(25)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(ok) == 10 and len(refused) == 15
        assert len(led.entries()) == 10


def test_spending_that_already_happened_is_recorded_past_the_budget(tmp_path):
    """A deviation top-up records data already used: it must land even over budget, and then block new charges."""
    path = tmp_path / "ledger.sqlite"
    with Ledger(path, budget=LedgerBudget(epsilon=1.0, delta=1e-6)) as led:
        big = gauss("r1", {"a": 2.0})
        with pytest.raises(BudgetExceeded):
            led.charge(big)
        spent = led.charge(big, enforce_budget=False)
        assert spent["a"].epsilon > 1.0 and len(led.entries()) == 1
        assert "a" in led.would_exceed(gauss("r2", {"a": 1e-3}))
        with pytest.raises(BudgetExceeded):
            led.charge(gauss("r2", {"a": 1e-3}))
    with Ledger(path) as again:  # persisted like any other entry
        assert again.spent("a", delta=1e-6).epsilon == pytest.approx(spent["a"].epsilon)
