"""An adversarial review of the driver's charges by reference (issue 12, ``RunDriver._charge`` with
``ContributionCost.repeat_key``): a node must record, for every visit, exactly what the exact path
records (the ledger charged without a key) — no fewer charges, no smaller curves — through two runs
interleaving on one node, σ changing between visits, a crash and restore (``ledger_credit``) with the
ledger reopened or kept, and costs that must not be charged by reference.

Each scenario runs twice from scratch: as the node runs it, then with ``repeat_key`` returning ``None``
(the exact path); the ledgers (also reopened), the entries per run and the runs' charged rows must be
the same bit for bit, and so must every visit's outcome.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.driver_loop import driver_loop  # noqa: F401 - autouse: the driver's event loop

from hushnet.engine.actions import LedgerEntry as EngineEntry
from hushnet.privacy.ledger import Ledger, LedgerBudget
from hushnet.protocols.registry import transition_matrix
from hushnet.runs.accounting import ContributionCost, contribution_cost
from hushnet.runs.driver import RunDriver
from hushnet.runs.run_store import RunStore
from hushnet.runs.spec import Budget, RunSpec

N = 32
IDS = [f"n{i}" for i in range(N)]
V = 5


def _spec(seed: int, sigma: float, eps: float = 1e6) -> RunSpec:
    return RunSpec(
        protocol="rw-dpsgd",
        task="logreg",
        graph="hypercube:5",
        steps=16 * N,
        seed=seed,
        budget=Budget(eps, 1e-5),
        sigma=sigma,
        cap=None,
    ).with_run_id()


def _event(spec: RunSpec, step: int, sigma: float) -> EngineEntry:
    return EngineEntry(
        V, step, "gradient", spec.view_model, 2.0, 2.0 * sigma, sigma, spec.protocol, spec.run_id
    )


def _driver(spec: RunSpec, led: Ledger, cost=None, store=None) -> RunDriver:
    W = transition_matrix(spec.graph)
    cost = cost if cost is not None else contribution_cost(spec, V, IDS, W, led.orders)
    return RunDriver(spec, V, IDS, None, None, ledger=led, cost=cost, W=W, store=store)


def _state(led: Ledger, drivers) -> dict:
    """Everything the node holds about its spending, as exact bytes."""
    cols = led.spent_columns()
    return {
        "keys": cols.keys,
        "eps": cols.epsilon.tobytes(),
        "entries": cols.entries.tobytes(),
        "rdp": b"".join(led.rdp(t).tobytes() for t in cols.keys),
        "counts": led.entry_counts(),
        "notes": [(e["run_id"], e["note"]) for e in led.entries()],
        "rows": [None if d.run_rdp is None else d.run_rdp.tobytes() for d in drivers],
        "contributions": [d.contributions for d in drivers],
    }


def _both(monkeypatch, scenario):
    """The scenario's result as the node runs it, then on the exact path (no keys); and how many
    visits the node charged by reference."""
    by_ref = {"fast": 0, "exact": 0}
    world = ["fast"]
    real = Ledger.charge_repeat

    def counting(self, *a, **k):
        done = real(self, *a, **k)
        by_ref[world[0]] += done
        return done

    monkeypatch.setattr(Ledger, "charge_repeat", counting)
    fast = scenario("fast")
    world[0] = "exact"
    monkeypatch.setattr(ContributionCost, "repeat_key", lambda self, sigma: None)
    exact = scenario("exact")
    assert by_ref["exact"] == 0  # the exact path never charges by reference
    return fast, exact, by_ref["fast"]


def test_two_runs_interleaving_on_one_node_with_sigma_changing(tmp_path, monkeypatch):
    """Two runs (their own costs and keys) visit one node in a random interleaving, each at two noise
    levels, until a tight budget refuses: every visit's outcome, the ledger, its file, the entries of
    each run and each run's charged row are the exact path's."""

    def scenario(tag: str):
        rng = np.random.default_rng(4)
        led = Ledger(tmp_path / f"{tag}.sqlite", node_id=IDS[V])
        led.set_budget(LedgerBudget(6.0, 1e-5))
        specs = [_spec(1, 8.0), _spec(2, 6.0)]
        drivers = [_driver(s, led) for s in specs]
        live = [True, True]
        outcomes = []
        i = 0
        for step in range(400):
            if not any(live):
                break
            if (
                not live[i] or rng.uniform() < 0.2
            ):  # bursts of one run, as a walk's consecutive hops
                i = int(rng.choice([j for j in range(2) if live[j]]))
            # runs of the same σ (streaks the ledger proves allowances for), broken by the other σ
            s = specs[i].sigma * (1.0 if rng.uniform() < 0.8 else 2.0)
            ok = drivers[i]._charge(_event(specs[i], step, s))  # noqa: SLF001 - the node's charge
            outcomes.append((i, s, ok))
            if not ok:
                live[i] = False
        out = _state(led, drivers)
        out["outcomes"] = outcomes
        led.close()
        with Ledger(tmp_path / f"{tag}.sqlite") as again:
            out["reopened"] = _state(again, [])
        return out

    fast, exact, by_ref = _both(monkeypatch, scenario)
    assert by_ref > 20
    assert sum(ok for _, _, ok in fast["outcomes"]) > 40
    assert not all(ok for _, _, ok in fast["outcomes"])  # the budget refused some visit
    assert fast == exact


@pytest.mark.parametrize("reopen", [True, False])
def test_crash_and_restore_charges_each_visit_once(tmp_path, monkeypatch, reopen):
    """A node charges visits by reference, checkpoints, charges more, dies before the next checkpoint
    and is restored (its ledger reopened from the file, or — a driver rebuilt in the same process — the
    very ledger that still holds an allowance): the visits after the checkpoint are redone without a
    second charge (``ledger_credit``), and later ones are charged as the exact path charges them."""

    def scenario(tag: str):
        path = tmp_path / f"{tag}.sqlite"
        led = Ledger(path, node_id=IDS[V])
        led.set_budget(LedgerBudget(1e6, 1e-5))
        spec = _spec(3, 8.0)
        store = RunStore(tmp_path / f"{tag}.runs.sqlite")
        store.accept(spec.run_id, b"signed", V, {})
        d = _driver(spec, led)
        sig = [8.0, 8.0, 8.0, 8.0, 16.0, 8.0, 8.0, 8.0, 8.0, 8.0, 8.0]
        for step in range(6):
            assert d._charge(_event(spec, step, sig[step]))  # noqa: SLF001
        store.checkpoint(spec.run_id, "stopped", "", d.durable_state(), None)
        for step in range(6, 9):  # charged, never checkpointed: the node dies here
            assert d._charge(_event(spec, step, sig[step]))  # noqa: SLF001
        if reopen:
            led.close()
            led = Ledger(path)
        cost = d.cost if not reopen else None  # a restarted process builds its cost again
        again = _driver(spec, led, cost=cost)
        (row,) = store.runs()
        charged = len(led.entries(spec.run_id))
        again.restore(row["driver"], None, "stopped", "", charged)
        assert again.ledger_credit == 3
        for step in range(6, 11):  # 6..8 redone (credited), 9..10 new
            assert again._charge(_event(spec, step, sig[step]))  # noqa: SLF001
        assert again.ledger_credit == 0
        out = _state(led, [again])
        led.close()
        store.close()
        return out

    fast, exact, by_ref = _both(monkeypatch, scenario)
    # steps 1, 2, 3 (step 0 proves an allowance), 7, 8 (step 6 proves one again after σ = 16 came
    # between); then 9 and 10 on the allowance the kept ledger still holds (reopened: 9 charged exactly
    # — it proves a new one — and 10 by reference)
    assert by_ref == (6 if reopen else 7)
    assert len(fast["notes"]) == 11
    assert fast == exact


def test_a_cost_that_is_not_a_contribution_cost_is_never_charged_by_reference(
    tmp_path, monkeypatch
):
    """A family's cost of another type (here a subclass that could charge other rows) takes the exact
    path at every visit: no key, no charge by reference."""

    class Other(ContributionCost):
        pass

    calls = []
    real = Ledger.charge_repeat

    def counting(self, *a, **k):
        calls.append(1)
        return real(self, *a, **k)

    monkeypatch.setattr(Ledger, "charge_repeat", counting)
    led = Ledger(tmp_path / "l.sqlite", node_id=IDS[V])
    spec = _spec(5, 8.0)
    base = contribution_cost(spec, V, IDS, transition_matrix(spec.graph), led.orders)
    cost = Other(base.targets, base.orders, base.walk_slope, base.alpha_max, base.bound_name)
    d = _driver(spec, led, cost=cost)
    for step in range(6):
        assert d._charge(_event(spec, step, 8.0))  # noqa: SLF001
    assert not calls
    assert len(led.entries()) == 6
    led.close()


def test_each_noise_level_has_its_own_key_and_rows(tmp_path):
    """Keys are per σ, bit for bit: two σ a ulp apart never share a key (their rows differ), one σ
    always gets the same key (as a float or a numpy float64), and a key's rows are the ones its σ
    builds."""
    with Ledger(tmp_path / "l.sqlite", node_id=IDS[V]) as led:
        spec = _spec(6, 8.0)
        cost = contribution_cost(spec, V, IDS, transition_matrix(spec.graph), led.orders)
        s = 8.0
        t = float(np.nextafter(s, np.inf))
        assert cost.repeat_key(s) is cost.repeat_key(np.float64(s))
        assert cost.repeat_key(s) is not cost.repeat_key(t)
        assert not np.array_equal(cost.rows(s), cost.rows(t))
        acc_rows = cost.rows(np.float64(s))
        assert np.array_equal(acc_rows.view(np.uint64), cost.curves(s).view(np.uint64))
