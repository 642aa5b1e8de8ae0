"""RW DP-SGD machines in the simulator: the walk follows W, the cap/noise rule, determinism, failures."""

import numpy as np
import pytest
from helpers.engine import rw_run, synthetic_tasks
from scipy import stats

from hushnet.engine import MessageArrived, ReplayedMessage, UnexpectedSender, WrongDimension
from hushnet.engine.actions import Fault, Send
from hushnet.engine.rng import node_generators
from hushnet.families.walk.hops import TransitionRow
from hushnet.families.walk.wire import encode_token


def _transitions(visits: np.ndarray, n: int) -> np.ndarray:
    C = np.zeros((n, n), dtype=np.int64)
    np.add.at(C, (visits[:-1], visits[1:]), 1)
    return C


def test_walk_follows_W_chi_square():
    """PART D 22: moves only along edges/self-loops, transition counts ~ W[u,:], visit frequency → 1/n."""
    n = 16
    tasks = synthetic_tasks(n)
    res, _, W = rw_run(
        "er:16:0.3:4", tasks, steps=200 * n, sigma=1.0, step_size=0.01, reliable=False
    )
    assert res.status == "finished"
    visits = res.visits()
    assert visits.size == 200 * n
    Wd = W.toarray()
    C = _transitions(visits, n)
    assert np.all(C[Wd == 0] == 0), "the walk used a pair that is not an edge or self-loop"
    for u in range(n):
        support = np.flatnonzero(Wd[u])
        obs = C[u, support]
        exp = Wd[u, support] * obs.sum()
        p = stats.chisquare(obs, exp).pvalue
        assert p > 1e-4, f"row {u}: transitions do not match W (p={p:.2g})"
    # visit frequencies → π = 1/n.  Successive visits are correlated, so the i.i.d. χ² statistic is
    # deflated by the chain's variance-inflation bound (1+λ*)/(1−λ*), λ* = max_{i≥2} |λ_i| (reversible W)
    lam = np.sort(np.abs(np.linalg.eigvalsh(Wd)))[-2]
    kappa = (1 + lam) / (1 - lam)
    freq = np.bincount(visits, minlength=n)
    chi2 = ((freq - visits.size / n) ** 2 / (visits.size / n)).sum() / kappa
    p = stats.chi2.sf(chi2, n - 1)
    assert p > 1e-3, f"visit frequencies are not uniform (p={p:.2g})"


def test_complete_graph_visits_uniform_chi_square():
    """On W = J/n the holders are i.i.d. uniform, so the plain χ² test applies (T = 200n)."""
    n = 20
    res, _, _ = rw_run("complete:20", synthetic_tasks(n), steps=200 * n, reliable=False, seed=2)
    freq = np.bincount(res.visits(), minlength=n)
    assert stats.chisquare(freq).pvalue > 1e-3


def test_transition_row_sampling_matches_row():
    rng = np.random.default_rng(0)
    row = TransitionRow(0, np.array([0, 3, 5]), np.array([0.5, 0.3, 0.2]))
    draws = np.array([row.sample(rng) for _ in range(20000)])
    obs = np.array([(draws == c).sum() for c in (0, 3, 5)])
    assert stats.chisquare(obs, np.array([0.5, 0.3, 0.2]) * draws.size).pvalue > 1e-3


def _replay_reference(res, ms, tasks, *, seed, n, steps, step_size, sigma, cap, over_cap):
    """Re-derive every update from the nodes' own generators: x_{t+1} = x_t − γ(g_t + η_t), η fresh at every visit."""
    views = {t: (v, x, nxt) for v, m in enumerate(ms) for (t, x, nxt) in m.view}
    assert sorted(views) == list(range(steps))
    gens = node_generators(seed, n)
    counts = np.zeros(n, dtype=int)
    x_final = None
    for t in range(steps):
        v, x, nxt = views[t]
        d = x.size
        noise_std = tasks[v].sensitivity() * sigma
        if counts[v] < cap:
            counts[v] += 1
            eta = gens[v].standard_normal(d) * noise_std
            x_new = x - step_size * (tasks[v].gradient(x) + eta)
        elif over_cap == "noise":
            eta = gens[v].standard_normal(d) * noise_std
            x_new = x - step_size * eta
        else:
            x_new = x
        if t + 1 < steps:
            hop = ms[v].hop.sample(gens[v])
            assert hop == nxt, f"step {t}: node {v} forwarded to {nxt}, its generator says {hop}"
            np.testing.assert_array_equal(views[t + 1][1], x_new)
        else:
            x_final = x_new
    np.testing.assert_array_equal(res.model, x_final)
    return counts


@pytest.mark.parametrize("over_cap", ["noise", "nothing"])
def test_cap_and_noise_rule(over_cap):
    """PART D 23: noise at every visit incl. over-cap ones (RW), nothing at all over cap (local DP); ≤ N_max gradients."""
    n, steps, cap, seed = 8, 400, 5, 11
    tasks = synthetic_tasks(n, clip=0.5)
    res, ms, _ = rw_run(
        "ring:8",
        tasks,
        seed=seed,
        steps=steps,
        sigma=0.7,
        step_size=0.05,
        cap=cap,
        over_cap=over_cap,
        record_view=True,
        reliable=False,
    )
    assert res.status == "finished"
    counts = _replay_reference(
        res,
        ms,
        tasks,
        seed=seed,
        n=n,
        steps=steps,
        step_size=0.05,
        sigma=0.7,
        cap=cap,
        over_cap=over_cap,
    )
    grads = res.ledger_counts("gradient")
    noise = res.ledger_counts("noise")
    assert grads.max() <= cap and np.array_equal(grads, counts)
    visits = np.array([m.visits for m in ms])
    if over_cap == "noise":
        np.testing.assert_array_equal(grads + noise, visits)  # every visit is on the ledger
        assert noise.sum() == steps - grads.sum() > 0
    else:
        assert noise.sum() == 0


def test_view_is_only_own_visits():
    """PART D 25: a node's view holds (t, x_t, next) of its own visits and nothing else; tokens carry no sender."""
    n = 6
    tasks = synthetic_tasks(n)
    res, ms, _ = rw_run("complete:6", tasks, steps=60, record_view=True, reliable=False)
    holders = res.visits()
    for v, m in enumerate(ms):
        assert [t for t, _, _ in m.view] == list(np.flatnonzero(holders == v))
        for t, _, nxt in m.view:
            if t + 1 < 60:
                assert nxt == holders[t + 1]
    p = encode_token(3, 60, 0, 2, np.zeros(4))
    assert len(p) == 33 + 32  # kind, step, total, aux, recipient, dim + the vector: no sender field


def test_determinism_and_transport_independence():
    """PART D 24 + parity: same seed ⇒ bit-identical model and ledgers, whatever the transport timing/acks."""
    tasks = synthetic_tasks(12)
    a, _, _ = rw_run("er:12:0.4:1", tasks, seed=5, steps=300, cap=20)
    b, _, _ = rw_run("er:12:0.4:1", tasks, seed=5, steps=300, cap=20, reliable=False, latency=0.37)
    c, _, _ = rw_run("er:12:0.4:1", tasks, seed=6, steps=300, cap=20)
    assert a.model.tobytes() == b.model.tobytes()
    assert [(e.node, e.step, e.kind) for led in a.ledgers.values() for e in led] == [
        (e.node, e.step, e.kind) for led in b.ledgers.values() for e in led
    ]
    assert not np.array_equal(a.model, c.model)


def test_complete_graph_sgd_and_local_dp_machines_run():
    tasks = synthetic_tasks(10)
    r1, _, _ = rw_run("complete:10", tasks, protocol="pad-complete-sgd", steps=100, cap=12)
    r2, _, _ = rw_run("complete:10", tasks, protocol="local-dp-sgd", steps=100, cap=3)
    assert r1.status == r2.status == "finished"
    assert r2.ledger_counts("gradient").max() <= 3 and r2.ledger_counts("noise").sum() == 0


# ---- bad input --------------------------------------------------------------------------------


def _holder_setup():
    """Fresh machines of a 4-node ring run (built, nothing delivered yet)."""
    tasks = synthetic_tasks(4, d=3)
    _, ms, _ = rw_run("ring:4", tasks, steps=50, until=-1.0)
    return ms, tasks


def test_bad_tokens_are_refused_and_ledger_stays_exact():
    ms, tasks = _holder_setup()
    m = ms[1]  # neighbours on ring:4 are 0 and 2; node 3 is not a neighbour
    good = encode_token(1, 50, 0, 1, np.zeros(4))  # dim 4 = 3 features + intercept
    acts = m.handle(MessageArrived(3, good))
    assert isinstance(acts[0], Fault) and isinstance(acts[0].error, UnexpectedSender)
    acts = m.handle(MessageArrived(0, encode_token(1, 50, 0, 1, np.zeros(7))))
    assert isinstance(acts[0].error, WrongDimension)
    assert m.visits == 0 and m.contributions == 0
    acts = m.handle(MessageArrived(0, good))
    assert not any(isinstance(a, Fault) for a in acts)
    visits_after = m.visits
    # the same bytes again (a retransmission whose ack was lost): acknowledged again, not re-processed
    again = m.handle(MessageArrived(0, good))
    assert [type(a) for a in again] == [Send] and m.visits == visits_after
    # a different token for the same (run, step): a replay
    acts = m.handle(MessageArrived(0, encode_token(1, 50, 0, 1, np.ones(4))))
    assert isinstance(acts[0].error, ReplayedMessage)
    # an older step: stale
    acts = m.handle(MessageArrived(2, encode_token(0 + 1, 50, 7, 1, np.ones(4))))
    assert isinstance(acts[0].error, ReplayedMessage)
    assert m.visits == visits_after
    assert m.contributions == visits_after


def test_misbehaving_peers_do_not_change_the_run():
    """Foreign-run envelopes, replayed and mis-sized tokens injected mid-run: typed faults, same model, same ledger."""
    from hushnet.engine import Envelope, WrongRun
    from hushnet.families.walk.walker import WalkOptions
    from hushnet.protocols.registry import build_machines, transition_matrix
    from hushnet.sim import Simulator

    tasks = synthetic_tasks(6, d=3)
    W = transition_matrix("ring:6")
    params = dict(steps=120, step_size=0.1, sigma=1.0, cap=30)

    def run(inject: bool):
        ms = build_machines(
            "rw-dpsgd", tasks, run_seed=9, run_id="r1", params=params, W=W, options=WalkOptions()
        )
        sim = Simulator(ms)
        if inject:
            tok = encode_token(1, 120, 0, 1, np.zeros(4))
            sim.inject(1, 0, Envelope("rw-dpsgd", "other-run", 1, tok).encode(), at=0.0105)
            sim.inject(
                2,
                1,
                Envelope("rw-dpsgd", "r1", 99, encode_token(3, 120, 0, 2, np.zeros(9))).encode(),
                at=0.02,
            )
            sim.inject(
                3,
                0,
                Envelope("rw-dpsgd", "r1", 98, encode_token(5, 120, 0, 3, np.zeros(4))).encode(),
                at=0.03,
            )
        return sim.run()

    clean, dirty = run(False), run(True)
    kinds = sorted(type(f.error).__name__ for f in dirty.faults)
    assert kinds == ["UnexpectedSender", "WrongDimension", "WrongRun"], kinds
    assert dirty.model.tobytes() == clean.model.tobytes()
    strip = lambda r: [(e.node, e.step, e.kind) for v in sorted(r.ledgers) for e in r.ledgers[v]]  # noqa: E731
    assert strip(dirty) == strip(clean)
    assert isinstance(dirty.faults[0].error, WrongRun)


# ---- failures: a node killed mid-walk ----------------------------------------------------------


def _first_handoff_target(graph, tasks, **kw):
    res, _, _ = rw_run(graph, tasks, **kw)
    holders = res.visits()
    t = int(np.flatnonzero(holders != holders[0])[0])  # first step held by another node
    return res, holders, t


def test_killed_neighbour_pauses_run_by_default():
    tasks = synthetic_tasks(8)
    base, holders, t = _first_handoff_target("ring:8", tasks, seed=3, steps=80)
    victim = int(holders[t])
    res, _, _ = rw_run("ring:8", tasks, seed=3, steps=80, kill=[(victim, 0.0)])
    assert res.status == "paused" and res.finish is None
    assert (
        res.pauses and res.pauses[0].node == holders[t - 1] and str(victim) in res.pauses[0].reason
    )
    assert not res.deviations
    # nothing after the stall point was recorded, and the dead node never contributed
    assert victim not in res.ledgers
    assert max(e.step for led in res.ledgers.values() for e in led) == t - 1


def test_paused_run_resumes_when_the_neighbour_returns_with_the_same_model():
    """Pause keeps W: once the neighbour is back the walk resumes and ends with the model of the undisturbed run."""
    tasks = synthetic_tasks(8)
    base, holders, t = _first_handoff_target("ring:8", tasks, seed=3, steps=80)
    victim = int(holders[t])
    res, _, _ = rw_run("ring:8", tasks, seed=3, steps=80, kill=[(victim, 0.0, 2.5)])
    assert res.status == "finished" and res.pauses and not res.deviations
    assert any(m.name == "resumed" for m in res.metrics)
    assert res.model.tobytes() == base.model.tobytes()


def test_killed_neighbour_deviation_is_recorded_and_run_finishes():
    tasks = synthetic_tasks(8)
    base, holders, t = _first_handoff_target("ring:8", tasks, seed=3, steps=80)
    victim = int(holders[t])
    res, _, _ = rw_run(
        "ring:8", tasks, seed=3, steps=80, kill=[(victim, 0.0)], on_peer_down="deviate"
    )
    assert res.status == "finished"
    assert res.deviations and res.deviations[0].detail["dead"] == victim
    assert victim not in res.visits()
    assert sorted(e.step for led in res.ledgers.values() for e in led) == list(range(80))


def test_killed_holder_stalls_visibly():
    """The holder dies while waiting for a dead neighbour: no event is left, the run says 'stalled' (never silent)."""
    tasks = synthetic_tasks(8)
    base, holders, t1 = _first_handoff_target("ring:8", tasks, seed=3, steps=80)
    victim = int(holders[t1])
    t2 = t1 + int(np.flatnonzero(holders[t1:] != victim)[0])
    nxt = int(holders[t2])
    res, _, _ = rw_run(
        "ring:8", tasks, seed=3, steps=80, kill=[(nxt, 0.0), (victim, 0.5)], stop_on_pause=False
    )
    assert res.status == "stalled" and res.finish is None
    assert res.pauses and res.pauses[0].node == victim
    last = max((e.step, e.node) for led in res.ledgers.values() for e in led)
    assert last == (t2 - 1, victim)


def test_parity_simulator_vs_concurrent_loopback_driver():
    """Same run, same seed: the simulator and a concurrent asyncio driver with random real delays
    (the node driver's shape) give the same model (to 1e-12 — here bit for bit) and the same ledgers."""
    import asyncio

    from hushnet.families.walk.walker import WalkOptions
    from hushnet.protocols.registry import build_machines, transition_matrix
    from hushnet.sim import Simulator
    from hushnet.sim.loopback import LoopbackNetwork

    tasks = synthetic_tasks(8, d=3)
    W = transition_matrix("er:8:0.5:2")
    params = dict(steps=150, step_size=0.1, sigma=0.8, cap=15)

    def machines():
        return build_machines(
            "rw-dpsgd",
            tasks,
            run_seed=21,
            run_id="parity",
            params=params,
            W=W,
            options=WalkOptions(ack_timeout=0.5),
        )

    sim = Simulator(machines()).run()
    net = asyncio.run(LoopbackNetwork(machines(), delay=(0.0, 1.5e-3), seed=4).run(timeout=30))
    assert sim.status == net.status == "finished"
    np.testing.assert_allclose(net.model, sim.model, rtol=0, atol=1e-12)
    assert net.model.tobytes() == sim.model.tobytes()
    strip = lambda r: {v: [(e.step, e.kind, e.noise_std) for e in r.ledgers[v]] for v in r.ledgers}  # noqa: E731
    assert strip(net) == strip(sim)
    assert not net.faults and not sim.faults
