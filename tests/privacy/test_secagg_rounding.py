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
from hushnet.privacy.secure_sum import gaussian_rdp, view_sigma

ORDERS = np.array([1.5, 2.0, 4.0, 8.0, 16.0, 32.0])


def _word(fp: FixedPoint, x: float, z: float) -> int:
    """The member's encoded input in grid units (the machine's own encoder)."""
    w = encode_input(fp, np.array([x]), np.array([z]), 1)
    return int(round(float(fp.decode(w)[0]) * 2.0**fp.frac_bits))


def _log_mass(a: float, b: float) -> float:
    """log P(a < Z ≤ b), Z ~ N(0, 1), accurate far in either tail."""
    if a >= 0:  # mirror into the lower tail, where log_ndtr is accurate
        a, b = -b, -a
    la, lb = float(log_ndtr(a)), float(log_ndtr(b))
    if la == -math.inf:
        return lb
    return lb + math.log1p(-math.exp(la - lb)) if lb > la else -math.inf


def _law(word, s: float, span: float = 40.0) -> dict[int, float]:
    """Exact log-pmf of ``word(z)`` (an integer, non-decreasing in z — checked) for z ~ N(0, s²)."""
    lo, hi = -span * s - 4.0, span * s + 4.0
    zs = np.linspace(lo, hi, 2001)
    ws = [word(float(z)) for z in zs]
    assert all(b >= a for a, b in zip(ws, ws[1:])), "the encoder is not monotone in the noise"
    k_lo, k_hi = ws[0], ws[-1]
    cuts: dict[int, float] = {}  # k -> inf{z : word(z) >= k}, by bisection on the encoder itself
    for k in range(k_lo + 1, k_hi + 1):
        a, b = lo, hi
        for _ in range(100):
            mid = 0.5 * (a + b)
            if word(mid) >= k:
                b = mid
            else:
                a = mid
        cuts[k] = b
    return {
        k: _log_mass(cuts.get(k, -math.inf) / s, cuts.get(k + 1, math.inf) / s)
        for k in range(k_lo, k_hi + 1)
    }


def _convolve(laws: list[dict[int, float]]) -> dict[int, float]:
    out = {0: 0.0}
    for law in laws:
        nxt: dict[int, list[float]] = {}
        for k1, l1 in out.items():
            for k2, l2 in law.items():
                nxt.setdefault(k1 + k2, []).append(l1 + l2)
        out = {k: float(logsumexp(v)) for k, v in nxt.items()}
    return out


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


def _release(word_of, xs: list[float], s: float) -> dict[int, float]:
    """Law of the sum of the honest members' words (what a coalition sees after subtracting its own)."""
    return _convolve([_law(lambda z, x=x: word_of(x, z), s) for x in xs])


def _divergence(word_of, xs, xs2, s) -> np.ndarray:
    """max(D_α(P‖P'), D_α(P'‖P)) at every order of :data:`ORDERS`."""
    a, b = _release(word_of, xs, s), _release(word_of, xs2, s)
    return np.array([max(_renyi(a, b, al), _renyi(b, a, al)) for al in ORDERS])


def _noisy_rounded(fp: FixedPoint):
    """The encoding that rounds the noisy share: ``R(x + z)`` (what the members did before the fix)."""
    return lambda x, z: int(np.rint((x + z) * 2.0**fp.frac_bits))


def _members_path(fp: FixedPoint):
    """The member's real encoder (:func:`hushnet.families.secagg.machines.encode_input`)."""
    return lambda x, z: _word(fp, x, z)


# t = 5, c = 1: the certified view counts t − c = 4 honest survivors' noise; q = 1 (frac_bits = 0)
T, C, DELTA = 5, 1, 0.5


def test_rounding_the_noisy_share_exceeds_the_certificate():
    """Shares with std 0.1 on a grid of step 1: the Gaussian view's multiplier is √4·0.1/0.5 = 0.4
    (RDP 3.125·α), but rounded noisy shares give the input away almost deterministically."""
    fp, s = FixedPoint(frac_bits=0, bits=16), 0.1
    xs, xs2 = [0.0] * 4, [DELTA, 0.0, 0.0, 0.0]  # neighbouring: |x_u − x'_u| = Δ
    exact_gaussian = gaussian_rdp(ORDERS, math.sqrt(T - C) * s / DELTA)
    old = _divergence(_noisy_rounded(fp), xs, xs2, s)
    assert old[1] > 12.0 and exact_gaussian[1] == pytest.approx(6.25)
    assert np.all(old > exact_gaussian)


@pytest.mark.xfail(strict=True, reason="the member rounds its noisy share (fixed next)")
def test_members_encoding_stays_within_the_certificate():
    fp, s = FixedPoint(frac_bits=0, bits=16), 0.1
    xs, xs2 = [0.0] * 4, [DELTA, 0.0, 0.0, 0.0]
    cert = gaussian_rdp(ORDERS, view_sigma(s, DELTA, T, C))
    real = _divergence(_members_path(fp), xs, xs2, s)
    assert np.all(real <= cert * (1 + 1e-9))
