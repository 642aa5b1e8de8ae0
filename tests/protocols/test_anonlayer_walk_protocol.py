"""Source-anonymous destination walk (Egger et al., Mode A) on the simulator."""

import numpy as np
import pytest

from hushnet.crypto.cells import from_cells, to_cells
from hushnet.crypto.sealed import seal_token, try_open_token
from hushnet.engine.actions import Fault, LedgerEntry, Send
from hushnet.engine.events import MessageArrived
from hushnet.families.anonymity.anonymous_walk import (
    AnonWalkParams,
    build_walk,
    iterations,
    sealing_info,
)
from hushnet.families.anonymity.wire import HOP_ID, KIND_SEALED
from hushnet.privacy.anonymity_graph import mean_hitting_times
from hushnet.privacy.anonymity_setup import public_setup
from hushnet.privacy.graphs import parse_graph
from hushnet.sim.simulator import Simulator
from hushnet.tasks.logistic import LogisticRegressionTask

N = 40


def _arrive(m, src, payload):
    """``handle`` of an arrival plus the role's work the machine deferred behind its hop ack (zero timers)."""
    from hushnet.engine.actions import SetTimer
    from hushnet.engine.events import TimerFired

    out = m.handle(MessageArrived(src, payload))
    for a in list(out):
        if isinstance(a, SetTimer) and a.delay == 0:
            out = out + m.handle(TimerFired(a.name))
    return out


@pytest.fixture(scope="module")
def setup():
    return public_setup(parse_graph(f"regular:{N}:3:2").adjacency, ell1=2, ell2=4)


def _tasks(n):
    rng = np.random.default_rng(0)
    return [
        LogisticRegressionTask(
            rng.standard_normal((5, 4)), np.where(rng.random(5) > 0.5, 1.0, -1.0)
        )
        for _ in range(n)
    ]


def _params(**kw):
    return AnonWalkParams(
        **{"updates_per_node": 1, "step_size": 0.1, "sigma": 1.0, "cell_body": 1024, **kw}
    )


def _first_token(ms, start=0):
    acts = ms[start].on_start()
    send = next(a for a in acts if isinstance(a, Send))
    ms[start].first_actions = acts
    return send, from_cells(send.payload, 1024)[1 + HOP_ID :]


def test_only_the_destination_opens_and_token_has_no_cleartext(setup):
    ms, keys = build_walk(setup, _tasks(N), _params(), run_seed=3, secret_seed=5)
    send, token = _first_token(ms)
    j = ms[0].chosen[0]
    assert setup.ell1 <= setup.dist[0, j] <= setup.ell2  # never itself nor a neighbour
    assert send.dst in set(setup.adjacency[0].indices)  # handed to a neighbour, not to j
    info = sealing_info("sim", 0)
    opened = [v for v in range(N) if try_open_token(keys[v], token, info) is not None]
    assert opened == [j]
    # fixed size, and neither the model nor the ids/counters appear in the bytes
    ms2, _ = build_walk(setup, _tasks(N), _params(start=5), run_seed=3, secret_seed=6)
    send2, _ = _first_token(ms2, start=5)
    assert len(send2.payload) == len(send.payload)
    led = next(a for a in ms[0].first_actions if isinstance(a, LedgerEntry))
    assert led.detail["anonymity_credited"] is False


def test_sealed_token_walks_to_destination(setup):
    ms, keys = build_walk(setup, _tasks(N), _params(updates_per_node=2), run_seed=3, secret_seed=7)
    res = Simulator(ms).run()
    assert res.status == "finished" and not res.faults
    it = iterations(res.metrics, start=0)
    assert it["hops"].size >= 3
    # each iteration ended at the destination its source chose, at distance in [ℓ1, ℓ2]
    chosen = {v: list(m.chosen) for v, m in enumerate(ms)}
    for s, d in zip(it["source"], it["destination"]):
        assert d == chosen[s].pop(0)
        assert 2 <= setup.dist[s, d] <= 4
    assert np.all(it["hops"] >= setup.dist[it["source"], it["destination"]])
    # one attributable ledger entry per update
    n_updates = sum(len(v) for v in res.ledgers.values())
    assert (
        n_updates == it["hops"].size
    )  # the start update, plus every opening but the last (which finishes)


def test_hitting_times_match_exact_graph(setup):
    """Protocol hop counts agree with the exact expected first-hitting times E[T_ij] of the graph."""
    ms, _ = build_walk(
        setup,
        _tasks(N),
        _params(updates_per_node=10**6, reliable=False),
        run_seed=1,
        secret_seed=11,
    )
    res = Simulator(ms).run(max_events=40_000)
    it = iterations(res.metrics, start=0)
    assert it["hops"].size >= 200
    E = mean_hitting_times(setup.adjacency)
    pred = E[it["source"], it["destination"]]
    diff = it["hops"] - pred
    z = diff.mean() / (it["hops"].std() / np.sqrt(diff.size))
    assert abs(z) < 4.0, f"mean hops {it['hops'].mean():.1f} vs exact {pred.mean():.1f} (z={z:.2f})"


def test_bad_sealed_tokens_rejected(setup):
    ms, keys = build_walk(setup, _tasks(N), _params(updates_per_node=3), run_seed=3, secret_seed=5)
    send, token = _first_token(ms)
    j = ms[0].chosen[0]
    nb = int(setup.adjacency[j].indices[0])

    def codes(out):
        return [a.error.code for a in out if isinstance(a, Fault)]

    non_nb = next(v for v in range(N) if v != j and v not in set(setup.adjacency[j].indices))
    assert codes(_arrive(ms[j], non_nb, send.payload)) == ["unexpected-sender"]
    bad = bytearray(token)
    bad[-3] ^= 1  # body tampered: only the destination can tell
    pay = to_cells(bytes([KIND_SEALED]) + bytes(16) + bytes(bad), 1024)
    assert codes(_arrive(ms[j], nb, pay)) == ["integrity"]
    assert codes(_arrive(ms[j], nb, send.payload[:-1])) == ["bad-cell"]
    assert codes(_arrive(ms[j], nb, send.payload + bytes(1024))) == ["bad-cell"]
    d = ms[j].dim
    wrong_len = seal_token(
        keys[j].public, bytes(8 * (d + 1)), sealing_info("sim", 0)
    )  # one entry too many
    out = _arrive(ms[j], nb, to_cells(bytes([KIND_SEALED]) + bytes(range(16)) + wrong_len, 1024))
    assert codes(out) == ["malformed"]
    other_run = seal_token(keys[j].public, bytes(8 * d), sealing_info("other-run", 0))
    out = _arrive(ms[j], nb, to_cells(bytes([KIND_SEALED]) + bytes(range(1, 17)) + other_run, 1024))
    assert not codes(out) and not any(
        isinstance(a, LedgerEntry) for a in out
    )  # not for this run: relayed
    first = _arrive(ms[j], nb, send.payload)
    assert not codes(first) and any(isinstance(a, LedgerEntry) for a in first)  # opened and updated
    again = _arrive(ms[j], nb, send.payload)  # the same handoff again: re-acknowledged only
    assert codes(again) == ["replay"] and [a.dst for a in again if isinstance(a, Send)] == [nb]
    assert not any(isinstance(a, LedgerEntry) for a in again)
    rewrapped = to_cells(
        bytes([KIND_SEALED]) + bytes(range(2, 18)) + token, 1024
    )  # same token, new hop id
    out = _arrive(ms[j], nb, rewrapped)
    assert codes(out) == ["replay"] and not any(isinstance(a, (LedgerEntry, Send)) for a in out)
    assert ms[j].updates == 1


def test_silent_neighbour_gets_retries_then_the_token_moves_on(setup):
    """Walk loss (D6): a dead neighbour is retried, then the token goes to another neighbour and the
    deviation is recorded; the run still finishes."""
    ms, _ = build_walk(setup, _tasks(N), _params(updates_per_node=1), run_seed=3, secret_seed=5)
    first = ms[0].on_start()
    dead = next(a.dst for a in first if isinstance(a, Send))
    ms, _ = build_walk(setup, _tasks(N), _params(updates_per_node=1), run_seed=3, secret_seed=5)
    sim = Simulator(ms)
    sim.kill(dead, 0.0)
    res = sim.run()
    assert res.status == "finished"
    assert any(
        d.reason == "anon-walk-reroute" and d.detail["silent"] == dead for d in res.deviations
    )
