"""P-AD protocol machines (Alg. 1, 2, 3, 5): exact noise count, unbiased estimators (PART D 17–18)."""

import math

import numpy as np
import pytest

from hushnet.families.walk.walker import WalkOptions
from hushnet.privacy.amplification import rr_gamma, rr_gamma_for_batch
from hushnet.protocols.registry import build_machines
from hushnet.sim import Simulator
from hushnet.tasks import HistogramTask, MeanTask, SumTask

FAST = WalkOptions(reliable=False)


def _run(protocol, tasks, seed, **params):
    ms = build_machines(protocol, tasks, run_seed=seed, params=params, options=FAST)
    res = Simulator(ms, envelopes=False).run()
    assert res.status == "finished"
    return res


@pytest.mark.parametrize("n,K", [(3, 1), (5, 3), (7, 2)])
def test_ring_sum_noise_draws_exact(n, K):
    tasks = [SumTask(np.array([0.1 * u]), 0.0, 1.0) for u in range(n)]
    res = _run("pad-ring-sum", tasks, 1, rounds=K, sigma_loc=1.0)
    draws = sum(1 for led in res.ledgers.values() for e in led if e.noise_std > 0)
    assert draws == math.ceil(K * n / (n - 1)) == res.finish.result["noise_draws"]
    # noise at steps 1, n, 2n−1, … (0-based: multiples of n−1)
    noisy = sorted(e.step for led in res.ledgers.values() for e in led if e.noise_std > 0)
    assert noisy == list(range(0, K * n, n - 1))
    assert (
        sum(len(led) for led in res.ledgers.values()) == K * n
    )  # every contribution is on a ledger


def test_ring_sum_unbiased_with_theorem1_std():
    """PART D 17: unbiased (4σ band) and empirical std √⌈Kn/(n−1)⌉·σ_loc within ±5% over 10⁴ runs."""
    n, K, sigma, runs = 5, 2, 0.5, 10_000
    vals = np.linspace(0.1, 0.9, n)
    tasks = [SumTask(np.array([[vals[u]], [1 - vals[u]]]), 0.0, 1.0) for u in range(n)]
    truth = sum(t.true_total(K)[0] for t in tasks)
    est = np.array(
        [_run("pad-ring-sum", tasks, s, rounds=K, sigma_loc=sigma).model[0] for s in range(runs)]
    )
    std = math.sqrt(math.ceil(K * n / (n - 1))) * sigma
    assert abs(est.mean() - truth) < 4 * std / math.sqrt(runs)
    assert abs(est.std(ddof=1) / std - 1) < 0.05


def test_ring_sum_distributed_noise_remark1():
    n, K, sigma, runs = 6, 1, 1.0, 4000
    tasks = [MeanTask(np.array([0.5]), 0.0, 1.0) for _ in range(n)]
    est = np.array(
        [
            _run("pad-ring-sum", tasks, s, rounds=K, sigma_loc=sigma, distributed_noise=True).model[
                0
            ]
            for s in range(runs)
        ]
    )
    # first contribution σ_loc, the other Kn−1 σ_loc/√(n−1): total variance σ²(1 + (Kn−1)/(n−1))
    std = sigma * math.sqrt(1 + (K * n - 1) / (n - 1))
    assert abs(est.mean() - 0.5 * n) < 4 * std / math.sqrt(runs)
    assert abs(est.std(ddof=1) / std - 1) < 0.06


def test_complete_sum_unbiased():
    n, T, sigma, runs = 8, 40, 0.3, 1500
    tasks = [
        SumTask(np.array([1.0]), 0.0, 1.0) for _ in range(n)
    ]  # every contribution is 1: truth = T
    est = np.array(
        [_run("pad-complete-sum", tasks, s, steps=T, sigma_loc=sigma).model[0] for s in range(runs)]
    )
    std = math.sqrt(T) * sigma
    assert abs(est.mean() - T) < 4 * std / math.sqrt(runs)
    assert abs(est.std(ddof=1) / std - 1) < 0.06


def _hist_check(est: np.ndarray, truth: np.ndarray):
    se = est.std(axis=0, ddof=1) / math.sqrt(est.shape[0])
    assert np.all(np.abs(est.mean(axis=0) - truth) < 4 * se + 1e-9), (est.mean(axis=0), truth)


def test_ring_histogram_unbiased_after_corrected_debiasing():
    """PART D 18 with erratum 15: (τ − round(γn)/L − γKn/L)/(1 − γ) is unbiased; the printed form is not."""
    n, K, L, runs = 6, 2, 4, 1500
    values = [np.array([u % L, (u + 1) % L]) for u in range(n)]
    tasks = [HistogramTask(v, L) for v in values]
    truth = np.bincount(np.concatenate([np.resize(v, K) for v in values]), minlength=L).astype(
        float
    )
    gamma = rr_gamma(1.0, L)
    est, raw = [], []
    for s in range(runs):
        r = _run("pad-ring-histogram", tasks, s, rounds=K, gamma=gamma)
        est.append(r.finish.result["estimate"])
        raw.append(r.model)
    est = np.array(est)
    _hist_check(est, truth)
    printed = (np.array(raw) - gamma / L) / (1 - gamma)  # the printed debiasing: biased for counts
    assert np.abs(printed.mean(axis=0) - truth).max() > 1.0
    assert r.finish.result["dummies"] == round(gamma * n)


def test_complete_histogram_unbiased():
    n, T, L, runs = 5, 30, 3, 1500
    tasks = [HistogramTask(np.array([1]), L) for _ in range(n)]  # every report is bin 1
    truth = np.array([0.0, T, 0.0])
    gamma = rr_gamma(0.5, L)
    est = np.array(
        [
            _run("pad-complete-histogram", tasks, s, steps=T, gamma=gamma).finish.result["estimate"]
            for s in range(runs)
        ]
    )
    _hist_check(est, truth)


def test_rr_gamma_matches_eps0_exactly():
    """γ = L/(e^{ε₀}+L−1) makes RR_γ exactly ε₀-LDP; the ring γ inverts the shuffling bound (erratum 14)."""
    L, eps0 = 5, 0.8
    g = rr_gamma(eps0, L)
    assert math.isclose(math.log((1 - g + g / L) / (g / L)), eps0, rel_tol=1e-12)
    g2, e0 = rr_gamma_for_batch(0.1, 1e-6, 2000, L)
    assert math.isclose(e0, (0.1 / 12) * math.sqrt(2000 / math.log(1e6)), rel_tol=1e-12)
    assert g2 < 1  # not the printed γ → 1 (pure noise)
