"""Synchronous gossip machines: parity with the matrix recursion, rates, acceleration, determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers.gossip import gossip_matrix, noisy_inputs, run, value_tasks

from hushnet.engine.rng import node_generators
from hushnet.families.gossip.build import build_gossip_machines, code_gap, resolve_params
from hushnet.families.gossip.realised import replay_stream, schedule_from_ledgers
from hushnet.privacy import muffliato as mf
from hushnet.privacy.graphs import chebyshev_gamma
from hushnet.protocols.registry import PROTOCOLS, make_machine


@pytest.mark.parametrize("cheb", [False, True])
def test_twelve_node_run_matches_matrix_simulation(cheb):
    """Simulator run of 12 machines = the centralised recursion x^{t+1} = W x^t (Chebyshev: Def. 3), ≤1e-10."""
    W = gossip_matrix("er:12:0.4:3")
    tasks, vals = value_tasks(12)
    r, ms = run("muffliato", tasks, W, rounds=15, sigma=0.5, chebyshev=cheb)
    assert r.status == "finished" and not r.sim.faults and not r.sim.deviations
    x0 = noisy_inputs(vals, tasks, 5, 0.5)
    ref = list(mf.simulate(W, x0, 15, chebyshev=cheb))[-1]
    assert np.allclose(r.models, ref, rtol=1e-10, atol=1e-12)
    assert np.abs(r.models.mean(axis=0) - x0.mean(axis=0)).max() < 1e-12  # mean preserved exactly
    if cheb:
        assert ms[0].gamma == pytest.approx(chebyshev_gamma(W, kind="code"))


def test_consensus_error_shrinks_at_spec_rate():
    """Plain gossip: ‖x^T − x̄‖ ≤ (1−λ_abs)^T ‖x⁰ − x̄‖ on a 12-node ring (docs/design/spec/gossip.md §0.3, §5 item 6)."""
    W = gossip_matrix("ring:12")
    tasks, vals = value_tasks(12, d=1, seed=2)
    lam_abs = 1 - np.sort(np.abs(np.linalg.eigvalsh(W.toarray())))[-2]
    x0 = noisy_inputs(vals, tasks, 5, 0.0)
    e0 = np.linalg.norm(x0 - x0.mean())
    errs = []
    for T in (5, 10, 20, 40):
        r, _ = run("muffliato", tasks, W, rounds=T, sigma=0.0)
        e = np.linalg.norm(r.models - x0.mean())
        assert e <= (1 - lam_abs) ** T * e0 * (1 + 1e-9)
        errs.append(e)
    assert all(b < a for a, b in zip(errs, errs[1:]))
    # and the rate is attained (the ring's slowest mode dominates): within a factor 2 per 20 rounds
    assert errs[-1] / errs[-2] > 0.5 * (1 - lam_abs) ** 20


def test_chebyshev_faster_than_plain():
    """Accelerated gossip reaches 1e-6 relative consensus error in ≥3× fewer rounds on a 16-ring
    (e^{-T√λ} vs e^{-Tλ}; the centralised recursion needs 58 vs 240)."""
    W = gossip_matrix("ring:16")
    tasks, vals = value_tasks(16, d=1, seed=4)
    x0 = noisy_inputs(vals, tasks, 5, 0.0)
    e0 = np.linalg.norm(x0 - x0.mean())

    def rounds_needed(cheb: bool) -> int:
        ms = build_gossip_machines(
            "muffliato",
            tasks,
            run_seed=5,
            params=dict(rounds=250, sigma=0.0, chebyshev=cheb, record_states=True),
            W=W,
        )
        from hushnet.families.gossip.build import run_gossip

        r = run_gossip(ms)
        states = {}
        for m in r.sim.metrics:
            if m.name == "state":
                states.setdefault(m.step, np.zeros(16))[m.node] = m.value[0]
        for t in sorted(states):
            if np.linalg.norm(states[t] - x0.mean()) <= 1e-6 * e0:
                return t
        return 10**9

    plain, cheb = rounds_needed(False), rounds_needed(True)
    assert cheb * 3 <= plain, (cheb, plain)


def test_t_stop_rule_and_gamma_resolution():
    """rounds='auto' is the spec's T_mix; hypercube d=6, σ=1: ⌈ln 64/√λ⌉ with λ = 2/7."""
    W = gossip_matrix("hypercube:6")
    p = resolve_params("muffliato", {"rounds": "auto", "sigma": 1.0, "chebyshev": True}, W, 64, 1.0)
    assert code_gap(W) == pytest.approx(2 / 7)
    assert p["rounds"] == math.ceil(math.log(64) / math.sqrt(2 / 7)) == mf.t_mix(W, 1.0)
    assert p["gamma"] == pytest.approx(chebyshev_gamma(gap=2 / 7))


def test_determinism_same_seed_same_transcript():
    W = gossip_matrix("er:12:0.4:3")
    tasks, _ = value_tasks(12)
    a, _ = run("muffliato", tasks, W, rounds=10, sigma=1.0, dropout=0.3, seed=9)
    b, _ = run("muffliato", tasks, W, rounds=10, sigma=1.0, dropout=0.3, seed=9)
    c, _ = run("muffliato", tasks, W, rounds=10, sigma=1.0, dropout=0.3, seed=10)
    assert np.array_equal(a.models, b.models)
    assert [e.detail for v in sorted(a.sim.ledgers) for e in a.sim.ledgers[v]] == [
        e.detail for v in sorted(b.sim.ledgers) for e in b.sim.ledgers[v]
    ]
    assert not np.array_equal(a.models, c.models)


def test_streaming_gossip_matches_recursion():
    """[K] θ_{t+1} = W(θ_t + x_t + u_t) with the noise each node draws per round."""
    W = gossip_matrix("er:12:0.4:3")
    tasks, vals = value_tasks(12)
    r, _ = run("gossip-stream", tasks, W, rounds=7, sigma=0.3)
    assert r.status == "finished"
    rngs = node_generators(5, 12)
    z = np.zeros((7, 12, 2))
    for i in range(12):
        for t in range(7):
            z[t, i] = vals[i] + rngs[i].standard_normal(2) * 0.3 * tasks[i].sensitivity()
    sched = schedule_from_ledgers(r.sim.ledgers, 12, 7)
    assert np.allclose(r.models, replay_stream(sched, z), rtol=1e-10, atol=1e-12)
    led = [e for e in r.sim.ledgers[0] if e.kind == "value"]
    assert len(led) == 7 and all(
        e.noise_std == pytest.approx(0.3 * tasks[0].sensitivity()) for e in led
    )


def test_muffliato_gd_learns_and_er_per_step_graphs(tmp_path):
    """Alg. 3 on a planted logistic problem: loss decreases; a fresh public ER graph per step is used."""
    from hushnet.tasks import LogisticRegressionTask

    rng = np.random.default_rng(0)
    w_true = np.array([2.0, -1.0])
    tasks = []
    for _ in range(16):
        X = rng.standard_normal((6, 2))
        X /= np.linalg.norm(X, axis=1, keepdims=True)
        tasks.append(LogisticRegressionTask(X, np.where(X @ w_true > 0, 1.0, -1.0), clip=1.0))
    params = dict(
        steps=8, K=4, step_size=0.7, sigma=0.05, graph="er-per-step", q=0.35, graph_seed=3
    )
    ms = build_gossip_machines("muffliato-gd", tasks, run_seed=2, params=params)
    from hushnet.families.gossip.build import run_gossip

    r = run_gossip(ms)
    assert r.status == "finished" and not r.sim.faults
    loss0 = np.mean([t.loss(np.zeros(3)) for t in tasks])
    loss = np.mean([t.loss(r.models.mean(axis=0)) for t in tasks])
    assert loss < loss0 - 0.1
    grads = [e for e in r.sim.ledgers[0] if e.kind == "gradient"]
    assert len(grads) == 8 and grads[0].sensitivity == 2.0
    rows = [e.detail for e in r.sim.ledgers[0] if e.kind == "schedule"]
    assert {d["step"] for d in rows} == set(range(8))
    nbrs = [frozenset(d["row"]) for d in rows[::4]]
    assert len(set(nbrs)) > 1  # the graph changed between steps


def test_registry_builds_gossip_machines():
    W = gossip_matrix("ring:6")
    tasks, _ = value_tasks(6)
    for name in ("muffliato", "muffliato-randomized", "gossip-stream", "muffliato-gd"):
        assert name in PROTOCOLS
    m = make_machine(
        "muffliato", 2, 6, tasks[2], run_seed=1, run_id="r", params={"rounds": 3, "sigma": 1.0}, W=W
    )
    assert m.name == "muffliato" and m.rounds == 3
