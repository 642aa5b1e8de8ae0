"""Onion relaying as a sans-IO wrapper: 3-hop relay, what each party sees, bad input, RW runs on it."""

import numpy as np
import pytest

from hushnet.crypto.cells import to_cells
from hushnet.crypto.keys import simulation_directory, simulation_keypairs
from hushnet.crypto.onion import OnionKeyring, build_packet
from hushnet.engine.actions import Fault, Send
from hushnet.engine.events import MessageArrived
from hushnet.engine.protocol import NodeContext, Protocol
from hushnet.families.anonymity.onion import OnionLayer, OnionParams, relay_path
from hushnet.families.anonymity.wire import KIND_PACKET
from hushnet.families.views import accounting_view
from hushnet.privacy.graphs import metropolis_hastings, parse_graph
from hushnet.protocols.registry import build_machines
from hushnet.sim.simulator import Simulator
from hushnet.tasks.logistic import LogisticRegressionTask

N = 12
GRAPH = "regular:12:4:3"


class Probe(Protocol):
    """A minimal real protocol: sends one message at start (node 0 only), records what arrives."""

    name = "probe"

    def __init__(self, ctx, dst=None, msg=b""):
        super().__init__(ctx)
        self.dst, self.msg, self.got = dst, msg, []

    def on_start(self):
        return [Send(self.dst, self.msg)] if self.dst is not None else []

    def on_message(self, src, payload):
        self.got.append((src, payload))
        return []


@pytest.fixture(scope="module")
def net():
    g = parse_graph(GRAPH)
    kps = simulation_keypairs(5, N, "onion")
    return g, kps, simulation_directory(kps)


def _arrive(m, src, data):
    """``handle`` of an arrival plus the role work the layer deferred behind its hop ack (zero timers)."""
    from hushnet.engine.actions import SetTimer
    from hushnet.engine.events import TimerFired

    out = m.handle(MessageArrived(src, data))
    for a in [a for a in out if isinstance(a, SetTimer) and a.delay == 0.0]:
        out = [b for b in out if b is not a] + m.handle(TimerFired(a.name))
    return out


def _layers(net, sender, dst, msg, params):
    g, kps, d = net
    out = []
    for v in range(N):
        ctx = NodeContext(v, N, "r", np.random.default_rng(v))
        inner = Probe(ctx, dst if v == sender else None, msg if v == sender else b"")
        out.append(
            OnionLayer(
                ctx,
                inner,
                g.adjacency,
                OnionKeyring.single(kps[v]),
                d,
                params,
                path_rng=np.random.default_rng(100 + v),
            )
        )
    return out


def test_relay_path_follows_edges_avoids_recipient():
    g = parse_graph(GRAPH)
    A = g.adjacency.toarray()
    rng = np.random.default_rng(0)
    for _ in range(200):
        s, t = rng.choice(N, 2, replace=False)
        path = relay_path(g.adjacency.tocsr(), int(s), int(t), 3, 11, rng)
        assert path is not None and len(path) >= 3
        full = [int(s)] + path + [int(t)]
        assert all(A[a, b] for a, b in zip(full[:-1], full[1:]))
        assert (
            t not in path
        )  # the last relay may be the sender itself: that is what makes it uninformative


def test_three_hop_relay_views(net):
    """Sender → r1 → r2 → r3 → receiver: each relay sees only prev (link) and next (slot); the
    receiver's peer is r3 and the message carries nothing about the sender."""
    msg = b"token-without-sender-field" * 4
    params = OnionParams(hops=3, slots=6, payload_len=600, cell_body=256)
    ms = _layers(net, sender=0, dst=7, msg=msg, params=params)
    sim = Simulator(ms, latency=1e-3)
    res = sim.run()
    assert not res.faults
    path = ms[0].paths[0]
    assert path[-1] == 7 and len(path) - 1 >= 3
    assert ms[7].inner.got == [(path[-2], msg)]  # peer = the last relay (drawn whatever the sender)
    for v in range(N):
        if v != 7:
            assert ms[v].inner.got == []  # relays never see the message
    assert sum(m.relayed for m in ms) == len(path) - 1
    assert all(not m._pending for m in ms)  # every hop was acknowledged


def test_relay_processing_step_by_step(net):
    g, kps, d = net
    params = OnionParams(hops=3, slots=6, payload_len=600, cell_body=256)
    ms = _layers(net, sender=0, dst=7, msg=b"m", params=params)
    path, acts = ms[0].wrap(7, b"m")
    hop_send = [a for a in acts if isinstance(a, Send)]
    assert [a.dst for a in hop_send] == [path[0]]
    prev, data = 0, hop_send[0].payload
    for k, v in enumerate(path[:-1]):
        out = _arrive(ms[v], prev, data)
        sends = [a for a in out if isinstance(a, Send)]
        # exactly: an ack to the previous hop and the packet to the next hop (nothing else, nobody else)
        assert sorted(a.dst for a in sends) == sorted([prev, path[k + 1]])
        fwd = next(a for a in sends if a.dst == path[k + 1])
        assert len(fwd.payload) == len(data)
        prev, data = v, fwd.payload
    out = _arrive(ms[7], prev, data)
    assert ms[7].inner.got == [(prev, b"m")]


def test_onion_bad_input_counted(net):
    g, kps, d = net
    params = OnionParams(hops=3, slots=6, payload_len=600, cell_body=256)
    ms = _layers(net, sender=0, dst=7, msg=b"m", params=params)
    path, acts = ms[0].wrap(7, b"m")
    data = next(a for a in acts if isinstance(a, Send)).payload
    r1 = ms[path[0]]

    def faults(out):
        return [a.error.code for a in out if isinstance(a, Fault)]

    tampered = bytearray(data)
    tampered[300] ^= 4
    assert faults(r1.handle(MessageArrived(0, bytes(tampered)))) == ["integrity"]
    assert faults(r1.handle(MessageArrived(0, data[:-1]))) == ["bad-cell"]  # truncated
    assert faults(r1.handle(MessageArrived(0, data + bytes(256)))) == ["bad-cell"]  # oversized
    non_nb = next(v for v in range(N) if v != path[0] and not g.adjacency[path[0], v])
    assert faults(r1.handle(MessageArrived(non_nb, data))) == ["unexpected-sender"]
    ok = _arrive(r1, 0, data)
    assert not faults(ok)
    again = r1.handle(MessageArrived(0, data))  # replay within the epoch
    assert faults(again) == ["replay"] and not any(
        isinstance(a, Send) and a.dst != 0 for a in again
    )
    e9 = build_packet([(path[0], kps[path[0]].public)], b"x", epoch=9, slots=6, payload_len=600)
    assert faults(r1.handle(MessageArrived(0, bytes([KIND_PACKET]) + to_cells(e9, 256)))) == [
        "unknown-epoch"
    ]
    assert r1.inner.got == []


def _tasks(n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        X = rng.standard_normal((6, 3))
        X /= np.linalg.norm(X, axis=1, keepdims=True)
        out.append(LogisticRegressionTask(X, np.where(rng.random(6) > 0.5, 1.0, -1.0)))
    return out


def test_rw_dpsgd_over_onion_same_model_anonymous_ledger():
    """The onion layer changes what nodes observe, not the learning: same seed, same model; the
    ledger says 'anonymous' only when the relay layer is really on."""
    W = metropolis_hastings(parse_graph(GRAPH))
    tasks = _tasks(N)
    par = dict(steps=60, step_size=0.1, sigma=1.0)
    plain = Simulator(build_machines("rw-dpsgd", tasks, run_seed=4, params=par, W=W)).run()
    onion = build_machines(
        "rw-dpsgd-onion",
        tasks,
        run_seed=4,
        W=W,
        params={**par, "onion_hops": 3, "onion_cell_body": 1024, "secret_seed": 1},
    )
    assert all(isinstance(m, OnionLayer) for m in onion)
    res = Simulator(onion).run()
    assert res.status == plain.status == "finished"
    assert np.array_equal(res.model, plain.model)
    assert {e.view_model for led in res.ledgers.values() for e in led} == {"anonymous"}
    assert {e.view_model for led in plain.ledgers.values() for e in led} == {"sender-known"}
    assert not res.faults
    # each delivery hides its sender, but relays see the walk's trajectory: charged at local DP
    assert res.finish.result["accounting_view"]["view_model"] == "local"
    lens = [m.value for m in res.metrics if m.name == "onion-path-length"]
    assert len(lens) > 0 and min(lens) >= 3


def test_accounting_views_follow_mechanisms():
    assert accounting_view("rw-dpsgd").view_model == "sender-known"
    onion = accounting_view("rw-dpsgd", onion_hops=3)
    assert onion.view_model == "local" and onion.dp_credit is False and "trajectory" in onion.reason
    assert accounting_view("muffliato").view_model == "neighbourhood"
    # gossip over secure sums: certified with the neighbourhood view (the members' fixed-point rounding)
    sec = accounting_view("muffliato", secure_summation=True)
    assert sec.view_model == "neighbourhood" and sec.mechanism == "secure-summation"
    assert accounting_view("secagg-sum").view_model == "aggregate"
    v = accounting_view("anon-walk-sgd")
    assert v.dp_credit is False and "no amplification" in v.accountant
    assert set(accounting_view("rw-dpsgd", onion_hops=1).as_dict()) == {
        "mechanism",
        "view_model",
        "accountant",
        "reason",
        "dp_credit",
    }


def test_registry_builds_the_anonymity_protocols():
    from hushnet.protocols.registry import PROTOCOLS
    from hushnet.tasks.values import SumTask

    assert {"rw-dpsgd-onion", "anon-walk-sgd", "secagg-sum"} <= set(PROTOCOLS)
    W = metropolis_hastings(parse_graph("regular:24:3:1"))
    ms = build_machines(
        "anon-walk-sgd",
        _tasks(24),
        run_seed=2,
        W=W,
        params=dict(updates_per_node=1, step_size=0.1, sigma=1.0, ell1=2, ell2=4, cell_body=512),
    )
    res = Simulator(ms).run()
    assert res.status == "finished" and not res.faults
    st = [SumTask(np.full(3, 0.1 * v)) for v in range(6)]
    res = Simulator(
        build_machines("secagg-sum", st, run_seed=2, params=dict(leader=0, threshold=4))
    ).run()
    assert res.finish.result["status"] == "released"
    assert np.abs(res.model - 1.5).max() <= res.finish.result["error_bound"]
