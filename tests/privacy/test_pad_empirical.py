"""Fig. 1b empirical walk accountant (docs/design/spec/randomwalk.md A.6.2, PART D item 20, PART G)."""

from __future__ import annotations

import numpy as np
import pytest

from hushnet.privacy import amplification as A

# docs/design/spec/randomwalk.md §A.6.2 [COMPUTED] table: (eps0, n) -> (NDP mean, LDP mean), 10 runs; means within 5%
TABLE = {
    (0.1, 5): (2.378, 6.716),
    (0.1, 10): (1.329, 6.719),
    (0.1, 20): (0.774, 6.721),
    (0.1, 50): (0.399, 6.722),
    (0.1, 100): (0.254, 6.722),
    (0.4, 5): (11.40, 42.30),
    (0.4, 10): (6.200, 42.33),
    (0.4, 20): (3.543, 42.34),
    (0.4, 50): (1.787, 42.35),
    (0.4, 100): (1.121, 42.35),
}


def _run(eps0: float, n: int, seed: int = 0, runs: int = 10):
    rng = np.random.default_rng(seed)
    res = [A.empirical_walk_accountant(n, 100 * n, eps0, 1e-7, rng) for _ in range(runs)]
    ndp = np.concatenate([r.offdiag() for r in res])
    ldp = np.concatenate([r.ldp for r in res])
    return ndp, ldp, res


@pytest.fixture(scope="module")
def table():
    return {key: _run(*key) for key in TABLE}


@pytest.mark.parametrize("key", sorted(TABLE))
def test_fig1b_means_match_spec(table, key):
    ndp, ldp, res = table[key]
    assert ndp.mean() == pytest.approx(TABLE[key][0], rel=0.05)
    assert ldp.mean() == pytest.approx(TABLE[key][1], rel=0.05)
    assert all(r.bound == "paper" for r in res)
    assert np.all(ndp >= 0) and np.all(np.isfinite(ndp))


@pytest.mark.parametrize("eps0,ratio", [(0.1, 3.0), (0.4, 3.2)])
def test_fig1b_shape(table, eps0, ratio):
    means = [table[(eps0, n)][0].mean() for n in (5, 10, 20, 50, 100)]
    ldps = [table[(eps0, n)][1].mean() for n in (5, 10, 20, 50, 100)]
    assert all(a < b for a, b in zip(means, ldps))  # NDP < LDP for every n >= 5
    assert np.all(np.diff(means) < 0)  # decreasing in n
    assert means[2] / means[4] == pytest.approx(ratio, rel=0.1)  # about 1/sqrt(n) or faster
    assert max(ldps) / min(ldps) < 1.01  # LDP flat in n


def test_fig1b_ldp_is_advanced_composition_of_visit_counts(table):
    _, _, res = table[(0.1, 20)]
    r = res[0]
    assert r.visits.sum() == 100 * 20 - 1  # every step after the start is one arrival
    k = r.visits
    expected = np.sqrt(2 * k * np.log(1e7)) * 0.1 + k * 0.1 * np.expm1(0.1)
    np.testing.assert_allclose(r.ldp, expected)


def test_empirical_accountant_matches_a_literal_record_by_record_implementation():
    """The vectorised accountant equals a direct transcription of A.6.2 on a small walk."""
    n, T, eps0, delta = 6, 300, 0.3, 1e-7
    fast = A.empirical_walk_accountant(n, T, eps0, delta, np.random.default_rng(11))
    nxt = np.random.default_rng(11).integers(0, n, size=T - 1)
    records = {(o, x): [] for o in range(n) for x in range(n)}
    last_time = [0] * n
    last_send = [0] * n
    cur = 0
    for i in range(1, T):
        o = int(nxt[i - 1])
        m = i - last_time[o]
        known = [0] * n
        known[last_send[o]] += 1
        known[cur] += 1
        for x in range(n):
            mass = eps0 / np.sqrt(m)
            if known[x] == 0:
                e = np.log1p((1 - (1 - 1 / n) ** m) * np.expm1(mass))
            elif known[x] == 1:
                e = mass
            else:
                e = 2 * mass
            records[(o, x)].append(e)
        last_send[cur] = o
        last_time[o] = i
        cur = o
    for o in range(n):
        for x in range(n):
            if o != x:
                assert fast.ndp[o, x] == pytest.approx(
                    A.heterogeneous_composition(records[(o, x)], delta), rel=1e-10
                )
