"""Muffliato-GD's certified rows on the public schedule, once per process (issue 12).

The shared all-pairs computation (:mod:`hushnet.families.gossip.allpairs`) must give every node the row the
per-row exact accountant (:func:`~hushnet.families.gossip.realised.gd_sensitivity`) gives, never less; the
symmetry shortcut must be taken only where every round's matrix and messages are verified invariant, and
its filled values must be at least the directly computed ones (equal up to rounding: the exact values are
equal because the whole run commutes with the automorphism).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import scipy.sparse as sp
from helpers.gossipnet import spec

from hushnet.families.gossip import allpairs
from hushnet.families.gossip.accounting import certified_sensitivities, gossip_cost, project_gossip
from hushnet.families.gossip.allpairs import PublicGD, public_gd, translations
from hushnet.families.gossip.realised import gd_sensitivity
from hushnet.families.gossip.schedule import public_schedule
from hushnet.privacy.graphs import graph_from_edges, metropolis_hastings, parse_graph
from hushnet.protocols.registry import transition_matrix


def plan(R: int, K: int, gamma: float = 1.0):
    T = R * K
    phases = [list(range(r * K, (r + 1) * K)) for r in range(R)]
    gammas = []
    for r in range(R):
        g = np.ones(T)
        g[r * K : (r + 1) * K] = gamma
        gammas.append(g)
    return T, phases, gammas


def direct_rows(sched, phases, gammas, view, sources):
    n = sched.n
    out = {}
    for u in sources:
        row = np.zeros(n)
        for v in range(n):
            if v != u:
                row[v] = gd_sensitivity(sched, u, v, phases, gammas, view=view)["value"]
        out[u] = row
    return out


@pytest.mark.parametrize(
    "graph,R,K,gamma,view,kind",
    [
        ("hypercube:4", 3, 3, 1.0, "neighbourhood", "xor"),
        ("hypercube:4", 2, 3, 1.2, "aggregate", "xor"),
        ("hypercube:5", 2, 3, 1.0, "neighbourhood", "xor"),
        ("ring:12", 3, 3, 1.0, "neighbourhood", "shift"),
        ("ring:9", 2, 3, 1.3, "aggregate", "shift"),
    ],
)
def test_symmetric_fill_equals_full_computation_never_below(graph, R, K, gamma, view, kind):
    W = metropolis_hastings(parse_graph(graph))
    T, phases, gammas = plan(R, K, gamma)
    sched = public_schedule(W, T)
    sym = PublicGD(sched, phases, gammas, view)
    full = PublicGD(sched, phases, gammas, view, symmetry=False)
    assert sym.symmetric and sym.kind == kind and len(sym.blocks) == 1
    assert not full.symmetric and len(full.blocks) == sched.n
    A = np.array([sym.row(u) for u in range(sched.n)])
    B = np.array([full.row(u) for u in range(sched.n)])
    # the exact values are equal; the computed ones differ by rounding (≤ 4e-15 relative), which the
    # filled values' margin (SYMMETRY_RTOL) covers: never below the full computation
    assert np.all(A >= B)
    np.testing.assert_allclose(A, B, rtol=1e-9, atol=1e-14)
    # and the full computation is the per-row exact accountant's
    ref = direct_rows(sched, phases, gammas, view, [0, sched.n - 1])
    for u, row in ref.items():
        np.testing.assert_allclose(B[u], row, rtol=1e-12, atol=1e-15)
        assert np.all(A[u] >= row)


def test_one_edge_dropped_is_not_symmetric_and_gives_the_full_result():
    g = parse_graph("hypercube:4")
    edges = g.edges()
    edges = edges[~((edges[:, 0] == 0) & (edges[:, 1] == 1))]
    W = metropolis_hastings(graph_from_edges(16, edges))
    T, phases, gammas = plan(2, 3)
    sched = public_schedule(W, T)
    assert translations(sched) is None
    pg = PublicGD(sched, phases, gammas, "neighbourhood")
    assert not pg.symmetric and len(pg.blocks) == 16
    ref = direct_rows(sched, phases, gammas, "neighbourhood", [0, 5, 14])
    for u, row in ref.items():
        np.testing.assert_allclose(pg.row(u), row, rtol=1e-12, atol=1e-15)


def test_one_round_differing_or_a_node_down_is_not_symmetric():
    W = metropolis_hastings(parse_graph("hypercube:4"))
    T, phases, gammas = plan(2, 3)
    sched = public_schedule(W, T)
    assert translations(sched) is not None
    # round 4: one edge's weight moved to the diagonal on both ends (a timeout), messages unchanged
    W4 = sp.lil_matrix(W)
    w = W4[2, 3]
    W4[2, 3] = W4[3, 2] = 0.0
    W4[2, 2] += w
    W4[3, 3] += w
    sched.W[4] = sp.csr_matrix(W4)
    assert translations(sched) is None
    sched = public_schedule(W, T)
    sched.sent[1] = [p for p in sched.sent[1] if p != (6, 7)]  # one message lost, weights unchanged
    assert translations(sched) is None
    sched = public_schedule(W, T)
    sched.up[3, 9] = False
    assert translations(sched) is None


def test_gamma_and_phases_bind_the_cache_key():
    W = metropolis_hastings(parse_graph("ring:8"))
    T, phases, gammas = plan(2, 3)
    sched = public_schedule(W, T)
    k = allpairs.schedule_key(sched, phases, gammas, "neighbourhood")
    assert k == allpairs.schedule_key(public_schedule(W, T), phases, gammas, "neighbourhood")
    assert k != allpairs.schedule_key(sched, phases, plan(2, 3, 1.1)[2], "neighbourhood")
    assert k != allpairs.schedule_key(sched, [list(range(6))], [np.ones(6)], "neighbourhood")
    assert k != allpairs.schedule_key(sched, phases, gammas, "aggregate")
    W2 = metropolis_hastings(parse_graph("ring:8")) * 1.0
    W2 = sp.csr_matrix(W2)
    W2.data[0] += 1e-16 if W2.data[0] < 0.5 else -1e-16
    assert k != allpairs.schedule_key(public_schedule(W2, T), phases, gammas, "neighbourhood")


def test_nodes_of_a_process_share_one_computation(monkeypatch):
    """Every node's decision and cost read the same entry: one observer basis for all rows on the
    hypercube (symmetry), also when the hosted nodes decide in parallel threads."""
    allpairs.clear_cache()
    calls = []
    real = allpairs._gd_view_basis

    def counting(*a, **k):
        calls.append(a[1])
        return real(*a, **k)

    monkeypatch.setattr(allpairs, "_gd_view_basis", counting)
    sp_ = spec("muffliato-gd", "hypercube:4", 3, 1, sigma=1.0, task="logreg", K=2)
    W = transition_matrix("hypercube:4")
    rows = {}

    def decide(u):
        rows[u] = certified_sensitivities(sp_, u, W)[0]

    threads = [threading.Thread(target=decide, args=(u,)) for u in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dec = project_gossip(sp_, 3, None, W)
    cost = gossip_cost(sp_, 3, [f"n{i}" for i in range(16)], W)
    assert dec.accept and cost.phase_curves.shape[1] == 15
    assert calls == [0]  # one basis (observer 0) for 16 rows, 1 decision and 1 cost
    T, phases, gammas = plan(3, 2)
    pg = public_gd(public_schedule(W, T), phases, gammas, "neighbourhood")
    assert pg.symmetric
    ref = direct_rows(public_schedule(W, T), phases, gammas, "neighbourhood", [0, 7])
    for u, row in ref.items():
        assert np.all(rows[u] >= row)
        np.testing.assert_allclose(rows[u], row, rtol=1e-9, atol=1e-14)
    allpairs.clear_cache()


def test_the_cache_is_bounded():
    allpairs.clear_cache()
    W = metropolis_hastings(parse_graph("ring:6"))
    for K in range(1, allpairs.CACHE_MAX_ENTRIES + 3):
        T, phases, gammas = plan(2, K)
        public_gd(public_schedule(W, T), phases, gammas, "neighbourhood")
    assert len(allpairs._CACHE) == allpairs.CACHE_MAX_ENTRIES
    allpairs.clear_cache()


def test_the_larger_cap_needs_verified_symmetry(monkeypatch):
    """Over the dense cap (steps × n), Muffliato-GD is projected only when one observer's view serves all
    pairs (verified translations); a graph without them is refused with the cap's reason."""
    from hushnet.families.gossip import accounting

    monkeypatch.setattr(accounting, "STREAM_MAX_CELLS", 32)
    monkeypatch.setattr(accounting, "GD_SYMMETRIC_MAX_CELLS", 128)
    cube = spec("muffliato-gd", "hypercube:4", 3, 1, sigma=1.0, task="logreg", K=2)  # 48 cells
    dec = project_gossip(cube, 5, None, transition_matrix("hypercube:4"))
    assert dec.accept, dec.reason
    grid = spec("muffliato-gd", "grid:4x4", 3, 1, sigma=1.0, task="logreg", K=2)
    dec = project_gossip(grid, 5, None, transition_matrix("grid:4x4"))
    assert not dec.accept and "dense in steps×nodes (3×16 > 32)" in dec.reason
    long = spec("muffliato-gd", "hypercube:4", 9, 1, sigma=1.0, task="logreg", K=2)  # 144 cells
    dec = project_gossip(long, 5, None, transition_matrix("hypercube:4"))
    assert not dec.accept and "9×16" in dec.reason
