"""Mode B of the source-anonymous walk (onion random walk, docs/design/spec/anonymity.md §6.3) on the simulator."""

import numpy as np
import pytest

from hushnet.crypto.cells import from_cells, to_cells
from hushnet.crypto.onion import packet_length
from hushnet.crypto.sealed import seal_token
from hushnet.engine.actions import Fault, LedgerEntry, Send
from hushnet.engine.events import MessageArrived
from hushnet.families.anonymity.anonymous_walk import (
    AnonWalkParams,
    build_walk,
    iterations,
    sealing_info,
)
from hushnet.families.anonymity.onion_walk import OnionWalk
from hushnet.families.anonymity.wire import HOP_ID, KIND_ONION
from hushnet.privacy.anonymity_graph import mean_hitting_times
from hushnet.privacy.anonymity_setup import onion_path_length_max, public_setup
from hushnet.privacy.graphs import parse_graph
from hushnet.protocols.registry import build_machines
from hushnet.sim.simulator import Simulator
from hushnet.tasks.logistic import LogisticRegressionTask

N, CELL = 40, 4096


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
        **{
            "updates_per_node": 1,
            "step_size": 0.1,
            "sigma": 1.0,
            "cell_body": CELL,
            "mode": "B",
            **kw,
        }
    )


def _sends(acts):
    return [
        a for a in acts if isinstance(a, Send) and a.payload[:1] != b"A"
    ]  # acks are 17 uncelled bytes


def _codes(acts):
    return [a.error.code for a in acts if isinstance(a, Fault)]


def _follow(ms, start=0):
    """Drive the first iteration by hand: every hop's incoming wire payload, in order, and the final actions."""
    acts = ms[start].on_start()
    hops, src = [], start
    while True:
        out = _sends(acts)
        if not out or (
            hops and any(isinstance(a, LedgerEntry) for a in acts)
        ):  # the destination updated
            return hops, acts
        (s,) = out
        hops.append((src, s.dst, s.payload))
        acts = _arrive(ms[s.dst], src, s.payload)
        src = s.dst


def test_onion_follows_the_sampled_walk_and_only_the_destination_opens(setup):
    ms, keys = build_walk(setup, _tasks(N), _params(), run_seed=3, secret_seed=5)
    assert all(isinstance(m, OnionWalk) for m in ms) and ms[0].l_max == onion_path_length_max(
        N, 3, 4
    )
    hops, last = _follow(ms)
    path, j = ms[0].paths[0], ms[0].chosen[0]
    # the packet travelled exactly the source-sampled simple walk, along edges, to the first visit of j
    assert [d for _, d, _ in hops] == path and path[-1] == j and j not in path[:-1]
    assert all(setup.adjacency[a, b] for a, b in zip([0] + path[:-1], path))
    assert setup.ell1 <= setup.dist[0, j] <= setup.ell2
    assert (
        any(isinstance(a, LedgerEntry) for a in last) and ms[j].updates == 1
    )  # only j opened and updated
    assert sum(m.updates for m in ms) == 2 and sum(m.relayed for m in ms) == len(path) - 1
    # fixed size whatever the path length; a hop's incoming and outgoing packets share no 16-byte substring
    # (the 5-byte version‖epoch prefix aside), and the sealed token never appears on the wire
    sizes = {len(p) for _, _, p in hops}
    assert sizes == {
        len(to_cells(bytes(1 + HOP_ID + packet_length(ms[0].l_max, ms[0].payload_len)), CELL))
    }
    pk = [bytes(from_cells(p, CELL))[1 + HOP_ID + 5 :] for _, _, p in hops]
    for a, b in zip(pk, pk[1:]):
        grams = {a[i : i + 16] for i in range(0, len(a) - 15)}
        assert not any(b[i : i + 16] in grams for i in range(0, len(b) - 15))
    ids = [v.to_bytes(4, "big") for v in (0, j)]
    for p in pk:  # no cleartext source/destination index in the header area a relay could read
        assert not any(p[: 32 + 16 + 64].count(i) for i in ids)


def test_simulated_run_hitting_times_and_ledger(setup):
    ms, _ = build_walk(setup, _tasks(N), _params(updates_per_node=2), run_seed=3, secret_seed=7)
    res = Simulator(ms).run()
    assert res.status == "finished" and not res.faults
    it = iterations(res.metrics, start=0)
    paths = {v: list(m.paths) for v, m in enumerate(ms)}
    for s, d, h in zip(it["source"], it["destination"], it["hops"]):
        p = paths[int(s)].pop(0)
        assert len(p) == h and p[-1] == d  # the recorded hitting time is the sampled walk's length
    assert sum(len(v) for v in res.ledgers.values()) == it["hops"].size
    assert res.finish.result["walk_mode"] == "B" and res.finish.result["l_max"] == ms[0].l_max


def test_mode_b_hitting_time_law_is_mode_a_law(setup):
    """Same first-hitting-time law as Mode A (docs/design/spec/anonymity.md §6.3): protocol hop counts vs exact E[T_ij]."""
    ms, _ = build_walk(
        setup,
        _tasks(N),
        _params(updates_per_node=10**6, reliable=False),
        run_seed=1,
        secret_seed=11,
    )
    res = Simulator(ms).run(max_events=6_000)
    it = iterations(res.metrics, start=0)
    assert it["hops"].size >= 60
    E = mean_hitting_times(setup.adjacency)
    pred = E[it["source"], it["destination"]]
    z = (it["hops"] - pred).mean() / (it["hops"].std() / np.sqrt(pred.size))
    assert abs(z) < 4.0, f"mean hops {it['hops'].mean():.1f} vs exact {pred.mean():.1f} (z={z:.2f})"


def test_tampered_replayed_misrouted_packets_refused(setup):
    ms, keys = build_walk(setup, _tasks(N), _params(updates_per_node=3), run_seed=3, secret_seed=5)
    hops, _ = _follow(
        build_walk(setup, _tasks(N), _params(updates_per_node=3), run_seed=3, secret_seed=5)[0]
    )
    assert len(hops) >= 2
    src, dst, wire = hops[1]  # the packet as the second hop receives it
    data = bytearray(from_cells(wire, CELL))
    for pos in (
        1 + HOP_ID + 5 + 40,
        len(data) - 7,
    ):  # a header bit, a payload bit: caught at this very hop
        bad = bytearray(data)
        bad[pos] ^= 1
        out = _arrive(ms[dst], src, to_cells(bytes(bad), CELL))
        assert _codes(out) == ["integrity"] and not _sends(out)
    assert _codes(_arrive(ms[dst], src, wire[:-1])) == ["bad-cell"]
    first = _arrive(ms[dst], src, wire)
    assert not _codes(first) and len(_sends(first)) == 1
    again = _arrive(ms[dst], src, wire)  # the same handoff: re-acknowledged, not forwarded
    assert _codes(again) == ["replay"] and not _sends(again)
    replay = bytearray(data)
    replay[1 : 1 + HOP_ID] = bytes(
        range(HOP_ID)
    )  # the same layer under a fresh hop id: the replay tag stops it
    out = _arrive(ms[dst], src, to_cells(bytes(replay), CELL))
    assert _codes(out) == ["replay"] and not _sends(out)
    epoch = bytearray(data)
    epoch[1 : 1 + HOP_ID] = bytes(range(1, HOP_ID + 1))
    epoch[1 + HOP_ID + 4] ^= 1  # a key epoch this node holds no key for
    assert _codes(_arrive(ms[dst], src, to_cells(bytes(epoch), CELL))) == ["unknown-epoch"]
    # a final layer whose token is sealed to someone else: refused at the final hop, nothing updated
    from hushnet.crypto.keys import simulation_directory, simulation_keypairs
    from hushnet.crypto.onion import build_packet

    m0 = ms[0]
    nb = int(setup.adjacency[0].indices[0])
    onion = simulation_directory(simulation_keypairs(3, N, "onion"), 0)
    token = seal_token(keys[5].public, bytes(8 * m0.dim), sealing_info("sim", 0))
    pkt = build_packet(
        [(nb, onion.public(nb))], token, epoch=0, slots=m0.l_max, payload_len=m0.payload_len
    )
    out = _arrive(ms[nb], 0, to_cells(bytes([KIND_ONION]) + bytes(HOP_ID) + pkt, CELL))
    assert (
        _codes(out) == ["integrity"]
        and ms[nb].updates == 0
        and not any(isinstance(a, LedgerEntry) for a in out)
    )


def test_silent_next_hop_is_retried_not_rerouted(setup):
    ms, _ = build_walk(setup, _tasks(N), _params(), run_seed=3, secret_seed=5)
    dead = _sends(ms[0].on_start())[0].dst
    ms, _ = build_walk(setup, _tasks(N), _params(), run_seed=3, secret_seed=5)
    sim = Simulator(ms)
    sim.kill(dead, 0.0)
    res = sim.run(max_events=200)
    assert (
        res.status != "finished" and not res.deviations
    )  # the path is fixed inside the onion: no detour
    assert (
        res.pauses
        and "onion's next hop" in res.pauses[0].reason
        and str(dead) in res.pauses[0].reason
    )


def test_registry_selects_the_mode():
    W = parse_graph("regular:24:3:1").adjacency
    ms = build_machines(
        "anon-walk-sgd",
        _tasks(24),
        run_seed=2,
        W=W,
        params={
            "updates_per_node": 1,
            "step_size": 0.1,
            "sigma": 1.0,
            "ell2": 4,
            "mode": "B",
            "cell_body": CELL,
            "secret_seed": 1,
        },
    )
    assert all(isinstance(m, OnionWalk) for m in ms)
    res = Simulator(ms).run()
    assert res.status == "finished" and not res.faults
    with pytest.raises(ValueError, match="walk mode"):
        build_machines(
            "anon-walk-sgd",
            _tasks(24),
            run_seed=2,
            W=W,
            params={"updates_per_node": 1, "step_size": 0.1, "sigma": 1.0, "ell2": 4, "mode": "C"},
        )


def test_walks_longer_than_l_max_are_resampled_and_counted(setup):
    """Spec §6.3: a trajectory beyond the header's L_max slots is rejected and resampled, never cut."""
    ms, _ = build_walk(
        setup, _tasks(N), _params(updates_per_node=2, l_max=8), run_seed=1, secret_seed=3
    )
    res = Simulator(ms).run()
    assert res.status == "finished" and not res.faults
    it = iterations(res.metrics, start=0)
    assert it["hops"].max() <= 8
    assert (
        sum(m.value for m in res.metrics if m.name == "anon-walk-resampled")
        == sum(m.resampled for m in ms)
        > 0
    )
    with pytest.raises(ValueError, match="l_max"):
        build_walk(
            setup, _tasks(N), _params(l_max=4), run_seed=1
        )  # cannot reach a destination at distance ℓ2 = 4


def test_paused_hop_reports_resumed_when_acknowledged(setup):
    """A next hop that acknowledges late (after the node reported itself paused) ends the pause: the
    driver leaves "paused" only on a ``resumed`` metric, so without one the node's status stayed
    "paused" for the rest of the run."""
    from hushnet.engine.actions import CancelTimer, Metric, Paused, SetTimer
    from hushnet.engine.events import TimerFired

    ms, _ = build_walk(setup, _tasks(N), _params(), run_seed=3, secret_seed=5)
    acts = ms[0].on_start()
    (s,) = _sends(acts)
    (t,) = [a for a in acts if isinstance(a, SetTimer) and a.delay > 0]
    paused = []
    for _ in range(ms[0].p.max_retries + 2):
        paused += [a for a in ms[0].handle(TimerFired(t.name)) if isinstance(a, Paused)]
    assert len(paused) == 1, paused
    (ack,) = [
        a
        for a in ms[s.dst].handle(MessageArrived(0, s.payload))
        if isinstance(a, Send) and a.payload[:1] == b"A"
    ]
    out = ms[0].handle(MessageArrived(s.dst, ack.payload))
    assert out[0] == CancelTimer(t.name)
    assert [(type(a), a.name) for a in out[1:]] == [(Metric, "resumed")], out
    assert ms[0].handle(MessageArrived(s.dst, ack.payload)) == []  # once
