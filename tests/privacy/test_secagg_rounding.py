"""Soundness of the secure sum's fixed-point rounding against its certified Gaussian view.

A member hands in the fixed-point words of its input plus its noise share; the accountant certifies
the release as the exact Gaussian sum ``Σx + N(0, Σs²)``.  If each member rounds its *noisy* share,
``Σ R(x_i + z_i)`` is not a post-processing of that sum: with shares whose std is well below the grid
step, each rounded share is nearly deterministic and the release shows the individual input.

The release's distribution is computed exactly (1-D, a coarse grid, a few honest members): each
member's encoded word is a non-decreasing step function of its noise ``z`` (checked), so its law
is given by the encoder's breakpoints — found by bisection on the *real* encoder — and Gaussian
tail masses (log scale), and the sum's law is their convolution.  The Rényi divergence of the
releases for neighbouring inputs is compared with what the accountant certifies.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import log_ndtr, logsumexp

from hushnet.crypto.masks import FixedPoint
from hushnet.families.secagg.machines import encode_input
from hushnet.privacy.secure_sum import (
    SecureSumError,
    effective_sensitivity,
    gaussian_rdp,
    share_std,
    view_sigma,
)

ORDERS = np.array([1.5, 2.0, 4.0, 8.0, 16.0, 32.0])


def _words(fp: FixedPoint, x: float, z: np.ndarray) -> np.ndarray:
    """The member's encoded input in grid units for each noise value in ``z`` (the machine's own encoder,
    one coordinate per noise value: it rounds every entry on its own)."""
    w = encode_input(fp, np.full(z.shape, float(x)), np.asarray(z, dtype=float), 1)
    return np.rint(fp.decode(w) * 2.0**fp.frac_bits).astype(np.int64)


def _log_mass(a: float, b: float) -> float:
    """log P(a < Z ≤ b), Z ~ N(0, 1), accurate far in either tail."""
    if a >= 0:  # mirror into the lower tail, where log_ndtr is accurate
        a, b = -b, -a
    la, lb = float(log_ndtr(a)), float(log_ndtr(b))
    if la == -math.inf:
        return lb
    return lb + math.log1p(-math.exp(la - lb)) if lb > la else -math.inf


def _law(word, s: float, k_lo: int, k_hi: int, q: float) -> dict[int, float]:
    """Exact log-pmf of ``clamp(word(z), k_lo, k_hi)`` for z ~ N(0, s²) (``word`` maps noise values to
    integers, non-decreasing in z — checked).  The clamp is a post-processing (so a divergence computed
    from it is a lower bound) and takes only mass far in the tails: the callers put ``[k_lo, k_hi]·q``
    beyond the region that carries any order's divergence."""
    lim = (max(abs(k_lo), abs(k_hi)) + 4) * q + 10.0
    ws = word(np.linspace(-lim, lim, 20001))
    assert np.all(np.diff(ws) >= 0), "the encoder is not monotone in the noise"
    assert ws[0] <= k_lo and ws[-1] >= k_hi
    # k -> inf{z : word(z) >= k}, by bisection on the encoder itself (all k at once)
    ks = np.arange(k_lo + 1, k_hi + 1)
    a, b = np.full(ks.shape, -lim), np.full(ks.shape, lim)
    for _ in range(64):
        mid = 0.5 * (a + b)
        up = word(mid) >= ks
        b, a = np.where(up, mid, b), np.where(up, a, mid)
    cuts = dict(zip(ks.tolist(), b.tolist()))
    return {
        k: _log_mass(cuts.get(k, -math.inf) / s, cuts.get(k + 1, math.inf) / s)
        for k in range(k_lo, k_hi + 1)
    }


def _convolve(laws: list[dict[int, float]]) -> dict[int, float]:
    """Law of the sum of independent integer variables, in log space (the tails matter at high orders)."""
    lo, out = 0, np.zeros(1)
    for law in laws:
        keys = sorted(law)
        b = np.array([law[k] for k in keys])
        n, m = out.size, b.size
        grid = np.full((n, n + m - 1), -np.inf)
        for i in range(n):
            grid[i, i : i + m] = out[i] + b
        out, lo = logsumexp(grid, axis=0), lo + keys[0]
    return {lo + i: float(v) for i, v in enumerate(out)}


def _renyi(p: dict[int, float], q: dict[int, float], alpha: float) -> float:
    """D_α(P ‖ Q) from log-pmfs (∞ if P puts mass where Q has none)."""
    terms = []
    for k, lp in p.items():
        if lp == -math.inf:
            continue
        lq = q.get(k, -math.inf)
        if lq == -math.inf:
            return math.inf
        terms.append(alpha * lp + (1.0 - alpha) * lq)
    return float(logsumexp(terms)) / (alpha - 1.0)


def _release(word_of, xs: list[float], s: float, k: int, q: float) -> dict[int, float]:
    """Law of the sum of the honest members' words (what a coalition sees after subtracting its own)."""
    laws = {x: _law(lambda z, x=x: word_of(x, z), s, -k, k, q) for x in set(xs)}
    return _convolve([laws[x] for x in xs])


def _divergence(word_of, xs, xs2, s, q: float = 1.0) -> np.ndarray:
    """max(D_α(P‖P'), D_α(P'‖P)) at every order of :data:`ORDERS`.  The grid window covers the inputs,
    40 share stds and ``α_max·(shift + q)``, where the highest order's divergence lives."""
    shift = max(abs(a - b) for a, b in zip(xs, xs2)) + q
    span = max(abs(v) for v in xs + xs2) + 40.0 * s + float(ORDERS.max()) * shift + 2.0
    k = int(math.ceil(span / q))
    a, b = _release(word_of, xs, s, k, q), _release(word_of, xs2, s, k, q)
    return np.array([max(_renyi(a, b, al), _renyi(b, a, al)) for al in ORDERS])


def _noisy_rounded(fp: FixedPoint):
    """The encoding that rounds the noisy share: ``R(x + z)`` (what the members did before the fix)."""
    return lambda x, z: np.rint((x + z) * 2.0**fp.frac_bits).astype(np.int64)


def _members_path(fp: FixedPoint):
    """The member's real encoder (:func:`hushnet.families.secagg.machines.encode_input`)."""
    return lambda x, z: _words(fp, x, z)


# t = 5, c = 1: the certified view counts t − c = 4 honest survivors' noise; q = 1 (frac_bits = 0)
T, C, DELTA = 5, 1, 0.5


def test_rounding_the_noisy_share_exceeds_the_certificate():
    """Shares with std 0.1 on a grid of step 1: the Gaussian view's multiplier is √4·0.1/0.5 = 0.4
    (RDP 3.125·α), but rounded noisy shares give the input away almost deterministically."""
    fp, s = FixedPoint(frac_bits=0, bits=16), 0.1
    xs, xs2 = [0.0] * 4, [DELTA, 0.0, 0.0, 0.0]  # neighbouring: |x_u − x'_u| = Δ
    exact_gaussian = gaussian_rdp(ORDERS, math.sqrt(T - C) * s / DELTA)  # Δ_eff = Δ: no grid charge
    old = _divergence(_noisy_rounded(fp), xs, xs2, s)
    assert old[1] > 12.0 and exact_gaussian[1] == pytest.approx(6.25)
    assert np.all(old > exact_gaussian)


def _certified(s: float, delta: float, t: int, c: int, fp: FixedPoint) -> np.ndarray:
    """The accountant's RDP of one round: the multiplier it recomputes from the share std (1-D)."""
    return gaussian_rdp(ORDERS, view_sigma(s, delta, t, c, dim=1, frac_bits=fp.frac_bits))


def test_members_encoding_stays_within_the_certificate():
    """The member's encoder (data and noise rounded apart) against the accountant's Δ_eff certificate,
    on the case that breaks the old encoding."""
    fp, s = FixedPoint(frac_bits=0, bits=16), 0.1
    cert = _certified(s, DELTA, T, C, fp)
    for xu, xu2 in ((0.1, 0.1 + DELTA), (-0.55, -0.05)):  # the data part moves by a whole grid step
        real = _divergence(_members_path(fp), [xu, 0.0, 0.0, 0.0], [xu2, 0.0, 0.0, 0.0], s)
        assert real[1] > 10.0  # the shift shows (D_2 ≈ 13.7) ...
        assert np.all(real <= cert), (xu, xu2, real, cert)  # ... within the Δ_eff certificate


@pytest.mark.parametrize(
    ("frac_bits", "s", "delta", "t", "c", "xs", "xs2"),
    [
        # shares about the grid step, inputs off the grid, Δ = 1
        (0, 0.6, 1.0, 4, 1, [0.2, -0.7, 0.45], [1.2, -0.7, 0.45]),
        # two honest shares, an input moving across a rounding boundary by less than q
        (1, 0.3, 0.3, 3, 1, [0.2, 0.1], [0.49, 0.1]),
        # one honest share (t − c = 1): the local-DP case, Δ_eff = Δ + q√d
        (0, 0.5, 0.4, 2, 1, [0.3], [0.7]),
        # many honest shares of small std: the split's residue term dominates
        (0, 0.2, 1.0, 7, 1, [0.0] * 6, [1.0, 0, 0, 0, 0, 0]),
    ],
)
def test_members_encoding_within_the_certificate_across_regimes(frac_bits, s, delta, t, c, xs, xs2):
    fp = FixedPoint(frac_bits=frac_bits, bits=16)
    assert len(xs) == t - c and abs(xs[0] - xs2[0]) <= delta + 1e-12
    real = _divergence(_members_path(fp), xs, xs2, s, 2.0**-frac_bits)
    cert = _certified(s, delta, t, c, fp)
    assert np.all(real <= cert), (real, cert)


def test_effective_sensitivity_limits():
    """No grid: Δ.  One honest share: Δ + q√d.  Never below Δ, never above the b = h bound."""
    assert effective_sensitivity(2.0, 5, dim=None, frac_bits=None) == 2.0
    q = 2.0**-3
    assert effective_sensitivity(2.0, 1, dim=16, frac_bits=3) == pytest.approx(2.0 + 4 * q)
    for h in (1, 2, 5, 40):
        for d in (1, 10, 1000):
            eff = effective_sensitivity(0.5, h, dim=d, frac_bits=4)
            q = 2.0**-4
            assert (
                0.5
                < eff
                <= math.sqrt((0.5 + q * math.sqrt(d)) ** 2 + d * q * q * h * h / 4) + 1e-12
            )
    # default grid, a large model: the fixed-point charge is a relative 3e-5 of Δ
    eff = effective_sensitivity(2.0, 10, dim=10**6, frac_bits=24)
    assert 0 < eff / 2.0 - 1 < 4e-5
    with pytest.raises(SecureSumError, match="dimension"):
        effective_sensitivity(1.0, 3, dim=None, frac_bits=24)


def test_share_std_and_view_sigma_are_inverse_with_the_grid():
    s = share_std(1.3, 2.0, 9, 2, dim=50, frac_bits=6)
    assert s > 1.3 * 2.0 / math.sqrt(7)  # the rounding's charge goes into the noise
    assert view_sigma(s, 2.0, 9, 2, dim=50, frac_bits=6) == pytest.approx(1.3)


def test_encode_input_rounds_data_and_noise_apart_and_wraps_the_noise():
    fp = FixedPoint(frac_bits=4, bits=16)
    x, z = np.array([0.03, -0.5, 1.0]), np.array([0.03, 0.26, -3.0])
    words = encode_input(fp, x, z, 2)
    want = (np.rint(x * 16) + np.rint(z * 16)).astype(np.int64)
    assert np.array_equal(fp.decode(words) * 16, want)  # 0.03 + 0.03 would round to 1/16 together
    # a noise draw beyond the range is encoded mod 2^bits, not refused (a refusal would depend on z)
    big = np.array([2.0**20 + 0.25, -(2.0**40), 3.0])
    w = encode_input(fp, np.zeros(3), big, 2)
    exact = [int(np.rint(v * 16)) % 2**16 for v in big]
    assert [int(v) for v in w] == exact
    # the data part is clipped into the range (public and 1-Lipschitz), never refused: a refusal would
    # make the member drop out because of its data, in view of the leader and every survivor
    lim = fp.max_abs(2)
    w = encode_input(fp, np.array([lim * 2, -lim * 3]), np.zeros(2), 2)
    assert np.array_equal(fp.decode(w), fp.decode(fp.encode(np.array([lim, -lim]), 2)))
    with pytest.raises(ValueError, match="NaN"):
        encode_input(fp, np.array([np.nan]), np.zeros(1), 2)


def test_encode_wrapping_is_exact_mod_2_to_the_64():
    fp = FixedPoint(frac_bits=24, bits=64)
    vals = np.array([0.0, -1.0, 2.0**39, -(2.0**39) - 0.5, 1e30, -1e30, 123.456])
    got = [int(v) for v in fp.encode_wrapping(vals)]
    want = [int(np.rint(v * 2.0**24)) % 2**64 for v in vals]
    assert got == want


def test_a_released_sum_is_exactly_the_rounded_data_plus_the_rounded_noise():
    """End to end through the real machines (simulator): the leader's decoded sum is Σ R(x_u) + Σ R(z_u)
    on the grid, bit for bit — not Σ R(x_u + z_u) — with each member's noise reproduced from its generator."""
    from hushnet.engine.rng import node_generators
    from hushnet.families.secagg.machines import build_round
    from hushnet.families.secagg.params import SecAggParams
    from hushnet.sim.simulator import Simulator

    n, dim, f, std = 6, 40, 3, 0.05  # shares far below the grid step 1/8
    rng = np.random.default_rng(7)
    vecs = {v: rng.uniform(-1, 1, size=dim) for v in range(n)}
    p = SecAggParams(
        members=tuple(range(n)), leader=0, threshold=4, dim=dim, frac_bits=f, noise_std=std
    )
    ms, _ = build_round(vecs, p, n, run_seed=11)
    res = Simulator(ms).run()
    assert res.finish.result["status"] == "released"
    gens = node_generators(11, n)
    z = {v: gens[v].standard_normal(dim) * std for v in range(n)}
    grid = 2.0**f
    apart = sum(np.rint(vecs[v] * grid) + np.rint(z[v] * grid) for v in range(n)) / grid
    joint = sum(np.rint((vecs[v] + z[v]) * grid) for v in range(n)) / grid
    assert np.array_equal(res.model, apart)
    assert not np.array_equal(res.model, joint)  # the old encoding would have released another sum
    assert np.abs(
        res.model - sum(vecs[v] + z[v] for v in range(n))
    ).max() <= p.fixed_point.error_bound(2 * n)
