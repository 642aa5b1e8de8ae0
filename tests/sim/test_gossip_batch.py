"""The batch driver equals the per-node gossip machines (same noise, same rounds, same ledger entries)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.gossip import gossip_matrix, run, value_tasks

from hushnet.engine.actions import LedgerEntry
from hushnet.families.gossip.batch import BatchUnsupported, run_gossip_batch
from hushnet.tasks import LogisticRegressionTask


def _logreg_tasks(n: int, d: int = 3, seed: int = 1) -> list[LogisticRegressionTask]:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(d)
    out = []
    for _ in range(n):
        X = rng.standard_normal((6, d))
        X /= np.linalg.norm(X, axis=1, keepdims=True)
        out.append(LogisticRegressionTask(X, np.where(X @ w > 0, 1.0, -1.0), clip=0.5))
    return out


def _entries_from_sim(res, n: int) -> list[list[tuple]]:
    per: list[list[tuple]] = [[] for _ in range(n)]
    for v, led in res.sim.ledgers.items():
        for e in led:
            if isinstance(e, LedgerEntry) and e.uses_data:
                per[v].append((e.step, e.kind, e.sensitivity, e.noise_std, e.sigma, e.protocol))
    return per


def _entries_from_batch(b) -> list[list[tuple]]:
    return [
        [(e.step, e.kind, e.sensitivity, e.noise_std, e.sigma, e.protocol) for e in es]
        for es in b.entries
    ]


@pytest.mark.parametrize("graph", ["ring:9", "hypercube:4", "er:24:0.3:2"])
@pytest.mark.parametrize("gamma", [1.0, 1.3])
def test_muffliato_matches_machines(graph: str, gamma: float) -> None:
    W = gossip_matrix(graph)
    n = W.shape[0]
    tasks, _ = value_tasks(n, d=3, seed=4)
    params = dict(rounds=12, sigma=0.7, gamma=gamma)
    res, _ = run("muffliato", tasks, W, seed=11, **params)
    b = run_gossip_batch("muffliato", tasks, run_seed=11, params=params, W=W)
    np.testing.assert_allclose(b.models, res.models, rtol=0, atol=1e-12)
    assert _entries_from_batch(b) == _entries_from_sim(res, n)


def test_gossip_stream_values_and_gradients_match_machines() -> None:
    W = gossip_matrix("hypercube:3")
    tasks, _ = value_tasks(8, d=2, seed=2)
    res, _ = run("gossip-stream", tasks, W, seed=3, rounds=7, sigma=0.5)
    b = run_gossip_batch("gossip-stream", tasks, run_seed=3, params=dict(rounds=7, sigma=0.5), W=W)
    np.testing.assert_allclose(b.models, res.models, rtol=0, atol=1e-12)
    assert _entries_from_batch(b) == _entries_from_sim(res, 8)
    gt = _logreg_tasks(8)
    p = dict(rounds=6, sigma=0.8, step_size=0.3)
    res, _ = run("gossip-stream", gt, W, seed=9, **p)
    b = run_gossip_batch("gossip-stream", gt, run_seed=9, params=p, W=W)
    np.testing.assert_allclose(b.models, res.models, rtol=0, atol=1e-12)
    assert _entries_from_batch(b) == _entries_from_sim(res, 8)


@pytest.mark.parametrize("clip_after_noise", [False, True])
def test_muffliato_gd_matches_machines(clip_after_noise: bool) -> None:
    W = gossip_matrix("ring:10")
    tasks = _logreg_tasks(10)
    p = dict(
        steps=4, K=3, step_size=0.4, sigma=0.6, chebyshev=True, clip_after_noise=clip_after_noise
    )
    res, _ = run("muffliato-gd", tasks, W, seed=21, **p)
    b = run_gossip_batch("muffliato-gd", tasks, run_seed=21, params=p, W=W)
    assert b.rounds == 12
    np.testing.assert_allclose(b.models, res.models, rtol=0, atol=1e-12)
    assert _entries_from_batch(b) == _entries_from_sim(res, 10)


def test_what_needs_the_event_simulator_is_refused() -> None:
    W = gossip_matrix("ring:6")
    tasks, _ = value_tasks(6)
    with pytest.raises(BatchUnsupported, match="event simulator"):
        run_gossip_batch(
            "muffliato-randomized", tasks, run_seed=1, params=dict(rounds=3, sigma=1.0), W=W
        )
    with pytest.raises(BatchUnsupported, match="dropouts"):
        run_gossip_batch(
            "muffliato", tasks, run_seed=1, params=dict(rounds=3, sigma=1.0, dropout=0.1), W=W
        )
    with pytest.raises(BatchUnsupported, match="fresh"):
        run_gossip_batch(
            "muffliato",
            tasks,
            run_seed=1,
            params=dict(rounds=3, sigma=1.0, graph="er-per-round", q=0.5),
            W=W,
        )
