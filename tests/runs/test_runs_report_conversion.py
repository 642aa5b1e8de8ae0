"""A report's certified row is converted once per distinct curve (issue 12), with the same numbers bit for bit.

At n = 2048 a report cost a host ~20 ms of event-loop CPU per node, much of it converting the node's run
row (2 047 curves of 159 orders) to ε; the curves repeat within a row.
:func:`hushnet.runs.accounting.dp_from_rdp_rows` now converts each distinct curve once.  The
certified row is a privacy claim: these tests compare it, bit for bit, with the conversion of every curve
(``rdp_epsilon``, the ledger's rule), on real walk rows, repeated and random rows, and when fingerprints
collide.
"""

from __future__ import annotations

import numpy as np

from hushnet.privacy import distinct
from hushnet.privacy.conversions import DEFAULT_ORDERS, rdp_epsilon
from hushnet.protocols.registry import transition_matrix
from hushnet.runs.accounting import contribution_cost, dp_from_rdp_rows
from hushnet.runs.spec import Budget, RunSpec


def _direct(orders, rdp, delta) -> np.ndarray:
    """The old path: every curve converted."""
    r = np.asarray(rdp, dtype=float)
    return np.where(np.any(r > 0, axis=-1), rdp_epsilon(orders, r, delta)[0], 0.0)


def test_walk_rows_of_a_hosts_nodes_equal_the_direct_conversion() -> None:
    n = 256
    spec = RunSpec(
        protocol="rw-dpsgd",
        task="logreg",
        graph="hypercube:8",
        steps=n,
        seed=5,
        budget=Budget(1e6, 1e-5),
        sigma=1.0,
        clip=1.0,
        step_size=0.1,
        cap=None,
    ).with_run_id()
    ids = [f"n{i}" for i in range(n)]
    W = transition_matrix(spec.graph, spec.weights)
    for v in (0, 1, 77, 200):
        cost = contribution_cost(spec, v, ids, W)
        for k in (1, 2, 3):
            rows = k * cost.rows(float(spec.sigma))
            got = dp_from_rdp_rows(cost.orders, rows, 1e-5)
            assert got.tobytes() == _direct(cost.orders, rows, 1e-5).tobytes(), (v, k)
        distinct = len({row.tobytes() for row in rows})
        assert distinct < n - 1  # curves repeat: what the conversion saves


def test_repeated_zero_infinite_and_random_rows() -> None:
    rng = np.random.default_rng(1)
    o = DEFAULT_ORDERS
    base = rng.random((40, o.size)) * rng.choice([1e-4, 1.0, 50.0], (40, 1))
    base[3] = 0.0
    base[5, 7:] = np.inf
    base[6, :] = np.inf
    rows = base[rng.integers(0, 40, 500)]
    for delta in (1e-5, 1e-9, 0.3):
        got = dp_from_rdp_rows(o, rows, delta)
        assert got.tobytes() == _direct(o, rows, delta).tobytes()
    few = rows[:10]  # below the size where curves are looked for: the direct path
    assert dp_from_rdp_rows(o, few, 1e-5).tobytes() == _direct(o, few, 1e-5).tobytes()
    assert dp_from_rdp_rows(o, np.zeros((0, o.size)), 1e-5).shape == (0,)


def test_rows_that_share_a_hash_are_each_converted(monkeypatch) -> None:
    rng = np.random.default_rng(2)
    o = DEFAULT_ORDERS
    # every hash equal: the rows collide, so every row is converted on its own
    monkeypatch.setattr(distinct, "_weights", lambda k: np.zeros(k, dtype=np.uint64))
    rows = rng.random((100, o.size))
    assert dp_from_rdp_rows(o, rows, 1e-5).tobytes() == _direct(o, rows, 1e-5).tobytes()
    # the hash is the first order's bits only: rows equal there, different elsewhere, still apart (the
    # sampled hash and the full one both collide)
    unit = np.zeros(o.size, dtype=np.uint64)
    unit[0] = 1
    monkeypatch.setattr(distinct, "_weights", lambda k: unit)
    rows[50:, 0] = rows[:50, 0]
    assert dp_from_rdp_rows(o, rows, 1e-5).tobytes() == _direct(o, rows, 1e-5).tobytes()
