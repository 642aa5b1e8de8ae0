"""Dropouts, silent and departing neighbours: runs finish, and the recorded schedule is what happened."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from helpers.gossip import gossip_matrix, noisy_inputs, run, value_tasks

from hushnet.families.gossip.realised import (
    averaging_sensitivities,
    averaging_thm1,
    certified_report,
    privacy_ledger_entries,
    replay_averaging,
    schedule_from_ledgers,
    stream_sensitivity,
)
from hushnet.privacy import koskela as ks
from hushnet.privacy import muffliato as mf
from hushnet.privacy.ledger import BudgetExceeded, Ledger, LedgerBudget
from hushnet.privacy.paper import muffliato as pmf  # the printed bounds (labelled "paper")

N = 12


@pytest.mark.parametrize("q", [0.1, 0.3, 0.5])
def test_dropout_runs_finish_and_ledger_replays(q):
    W = gossip_matrix("er:12:0.4:3")
    tasks, vals = value_tasks(N)
    r, _ = run("muffliato", tasks, W, rounds=20, sigma=0.5, dropout=q)
    assert r.status == "finished" and not r.sim.faults
    sched = schedule_from_ledgers(r.sim.ledgers, N, 20)
    assert sched.recorded.all()
    assert abs(1 - sched.up.mean() - q) < 0.2  # announced dropouts at about the configured rate
    assert sched.asymmetries() == []  # weights rebuilt identically on both ends
    for t, Wt in enumerate(
        sched.W
    ):  # each realised W_t is a gossip matrix (symmetric, doubly stochastic, ≥ 0)
        D = Wt.toarray()
        assert np.allclose(D, D.T) and np.allclose(D.sum(axis=1), 1.0) and D.min() >= 0
        down = ~sched.up[t]
        assert np.allclose(D[down][:, down], np.eye(down.sum()))  # a dropped node keeps its value
    x0 = noisy_inputs(vals, tasks, 5, 0.5)
    assert np.allclose(replay_averaging(sched, x0), r.models, rtol=1e-10, atol=1e-12)
    assert np.abs(r.models.mean(axis=0) - x0.mean(axis=0)).max() < 1e-12
    # [M] eq. (7) identity on the realised schedule: Σ_u F[u, v] (incl. u = v) = T_v = messages v received
    F = averaging_thm1(sched)
    Tv = np.array([sum(len(sched.received(t, v)) for t in range(20)) for v in range(N)])
    P = np.eye(N)
    diag = np.zeros(N)
    for t in range(20):
        sq = P * P
        C = sq / sq.sum(axis=1, keepdims=True)
        for w, v in sched.sent[t]:
            diag[v] += C[w, v]
        P = sched.W[t] @ P
    assert np.allclose(F.sum(axis=0) + diag, Tv, atol=1e-9)


def test_no_dropout_accountant_equals_public_w_accountant():
    W = gossip_matrix("er:12:0.4:3")
    tasks, _ = value_tasks(N)
    for cheb in (False, True):
        r, ms = run("muffliato", tasks, W, rounds=8, sigma=1.0, chebyshev=cheb)
        sched = schedule_from_ledgers(r.sim.ledgers, N, 8)
        for view in ("neighbourhood", "aggregate"):
            S = averaging_sensitivities(sched, ms[0].gamma, view=view)
            assert np.allclose(
                S, mf.exact_sensitivity_matrix(W, 8, chebyshev=cheb, view=view), atol=1e-9
            )
        F = averaging_thm1(sched)
        assert np.allclose(F, np.where(np.eye(N, dtype=bool), 0, pmf.thm1_matrix(W, 8)), atol=1e-12)


def test_dropout_certified_values_are_replayed_and_charged(tmp_path):
    """Certified S from the recorded schedule; the node's ledger charges it and its budget checks it."""
    W = gossip_matrix("er:12:0.4:3")
    tasks, _ = value_tasks(N)
    r, _ = run("muffliato", tasks, W, rounds=12, sigma=2.0, dropout=0.3)
    sched = schedule_from_ledgers(r.sim.ledgers, N, 12)
    S = averaging_sensitivities(sched)
    assert np.all((S >= 0) & (S <= 1 + 1e-12))
    # an observer that received u's initial message sees the LDP value
    for w, v in sched.sent[0]:
        assert S[w, v] == pytest.approx(1.0)
    # a node that received nothing from anyone learns nothing
    entries = privacy_ledger_entries(
        S, 2.0, run_id="run-d", protocol="muffliato", view="neighbourhood"
    )
    led = Ledger(":memory:", node_id="0")
    spent = led.charge(entries[0])
    worst = max(spent.values(), key=lambda s: s.epsilon)
    assert worst.bound == "certified" and worst.method == "gdp"
    tight = Ledger(
        ":memory:", node_id="0", budget=LedgerBudget(epsilon=worst.epsilon * 0.5, delta=1e-6)
    )
    with pytest.raises(BudgetExceeded):
        tight.charge(entries[0])
    rep = certified_report(
        S, 2.0, 2.0, view="neighbourhood", protocol="muffliato", paper=averaging_thm1(sched)
    )
    assert rep["view"] == "neighbourhood" and rep["certified"]["bound"].startswith("certified")
    assert rep["paper"]["bound"].startswith("paper")
    assert rep["certified"]["max"] == pytest.approx(
        2.0 / (2 * 2.0**2)
    )  # LDP value α/(2σ²) reached by neighbours


def test_stream_accountant_on_schedule_matches_koskela():
    W = gossip_matrix("er:12:0.4:3")
    tasks, _ = value_tasks(N)
    r, _ = run("gossip-stream", tasks, W, rounds=5, sigma=1.0)
    sched = schedule_from_ledgers(r.sim.ledgers, N, 5)
    for src, obs in ((1, 0), (5, 0), (7, 3)):
        mine = stream_sensitivity(sched, src, obs)["value"]
        ref = ks.gossip_stream_pair(W, src, obs, 5, 2.0, 1.0)["sensitivity_sq"]
        assert mine == pytest.approx(ref, rel=1e-8, abs=1e-10)
    # aggregate view: [K]'s single-node view plus the final aggregate (the node's own output) — never less
    for src in (5, 9):
        mine = stream_sensitivity(sched, src, 0, view="aggregate")["value"]
        ref = ks.gossip_stream_pair(W, src, 0, 5, 2.0, 1.0, ks.StreamOptions(view="aggregate"))[
            "sensitivity_sq"
        ]
        assert mine >= ref - 1e-10


def test_stream_with_dropouts_accounted_on_realised_schedule():
    W = gossip_matrix("er:12:0.4:3")
    tasks, vals = value_tasks(N)
    r, _ = run("gossip-stream", tasks, W, rounds=6, sigma=1.0, dropout=0.4)
    assert r.status == "finished"
    sched = schedule_from_ledgers(r.sim.ledgers, N, 6)
    assert not sched.up.all()
    res = stream_sensitivity(sched, 1, 0)
    assert 0 <= res["value"] <= 6 + 1e-9  # never worse than LDP over 6 rounds
    direct = sum(1 for t in range(6) if (1, 0) in sched.sent[t])
    assert res["value"] >= direct - 1e-9  # every directly received message leaks its round fully


def test_neighbour_that_never_answers_is_dropped_not_awaited_forever():
    W = gossip_matrix("er:12:0.4:3")
    tasks, vals = value_tasks(N)
    dead = 3
    r, _ = run("muffliato", tasks, W, rounds=10, sigma=0.5, kill=[(dead, 0.0)])
    assert r.status == "finished" and not r.sim.faults
    live = [v for v in range(N) if v != dead]
    assert np.isnan(r.models[dead]).all() and np.isfinite(r.models[live]).all()
    nb = set(sp.csr_matrix(W)[dead].indices) - {dead}
    gone = {
        d.node
        for d in r.sim.deviations
        if d.reason == "neighbour-gone" and d.detail["neighbour"] == dead
    }
    assert gone == nb  # every neighbour declared it gone after give_up_after rounds
    sched = schedule_from_ledgers(r.sim.ledgers, N, 10)
    assert not sched.recorded[:, dead].any()
    assert all(
        dead not in {s for s, _ in sched.sent[t]} | {rcv for _, rcv in sched.sent[t]}
        for t in range(10)
    )
    x0 = noisy_inputs(vals, tasks, 5, 0.5)
    assert np.allclose(replay_averaging(sched, x0)[live], r.models[live], rtol=1e-10, atol=1e-12)
    # the dead node's input never entered anyone's view
    assert np.allclose(averaging_sensitivities(sched)[dead], 0.0)


def test_node_that_leaves_mid_run():
    W = gossip_matrix("er:12:0.4:3")
    tasks, vals = value_tasks(N)
    r, _ = run("muffliato", tasks, W, rounds=30, sigma=0.5, kill=[(7, 0.011)])
    assert r.status == "finished" and not r.sim.faults
    live = [v for v in range(N) if v != 7]
    sched = schedule_from_ledgers(r.sim.ledgers, N, 30)
    left = int(np.argmin(sched.recorded[:, 7]))
    assert 0 < left < 30 and not sched.recorded[left:, 7].any()
    x0 = noisy_inputs(vals, tasks, 5, 0.5)
    assert np.allclose(replay_averaging(sched, x0)[live], r.models[live], rtol=1e-10, atol=1e-12)
    assert any(d.reason == "neighbour-gone" for d in r.sim.deviations)
    # the run's virtual time: a few timeouts, not one per remaining round
    assert r.sim.virtual_time < 30 * 0.002 + 6 * 0.05 * 4


def test_randomized_muffliato_schedule_replay_and_accounting():
    from hushnet.families.gossip.realised import (
        pairwise_schedule_from_ledgers,
        pairwise_sensitivities,
        replay_pairwise,
    )

    W = gossip_matrix("er:12:0.4:3")
    tasks, vals = value_tasks(N)
    r, _ = run("muffliato-randomized", tasks, W, rounds=200, sigma=0.5, schedule_seed=4)
    assert r.status == "finished" and not r.sim.faults
    rec = pairwise_schedule_from_ledgers(r.sim.ledgers, 200)
    x0 = noisy_inputs(vals, tasks, 5, 0.5)
    assert np.allclose(replay_pairwise(rec, 200, x0), r.models, atol=1e-12)
    assert np.abs(r.models.mean(axis=0) - x0.mean(axis=0)).max() < 1e-12
    S = pairwise_sensitivities(rec, 200, N)
    ref = mf.randomized_exact_matrix(W, 200, 2.0, 1.0, 4).matrix
    assert np.allclose(S, ref, atol=1e-9)
    # a dead partner: activations with it are skipped and recorded, the run still finishes
    r2, _ = run(
        "muffliato-randomized", tasks, W, rounds=200, sigma=0.5, schedule_seed=4, kill=[(2, 0.0)]
    )
    assert r2.status == "finished"
    assert any(d.reason == "neighbour-gone" for d in r2.sim.deviations)
