"""Gossip over secure sums: the fixed-point rounding of each member's term against the certified view.

In secure-summation gossip (``view = "aggregate"``) member j hands observer i the fixed-point word
``R(W_t[i,j]·m_j(t))``, and ``m_j(t)`` already mixes data and noise.  The released sum is therefore a
function of the individual messages, not of the exact ``Σ_j W_t[i,j] m_j`` the aggregate-view
accountant would certify.  Here, exactly (the release's law computed with the helpers of
``tests/privacy/test_secagg_rounding.py``, on the real SecAgg encoder with the spec's coarsest grid,
``frac_bits = 8``): on ``complete:5`` after one round the aggregate-view value of ``u → i`` is far
below the divergence of what ``i`` really receives, while the neighbourhood view (every release is a
function of the messages that view shows, so it is post-processing) covers it.  The family therefore
certifies secure gossip with the neighbourhood view and shows the aggregate value only as an
uncertified real-arithmetic figure.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers.gossipnet import spec
from test_secagg_rounding import ORDERS, _divergence  # noqa: E402

from hushnet.crypto.masks import FixedPoint
from hushnet.families.gossip.accounting import (
    certified_sensitivities,
    gossip_cost,
    project_gossip,
    real_arithmetic_sensitivities,
)
from hushnet.families.secagg.machines import encode_input
from hushnet.protocols.registry import transition_matrix

GRAPH, N, FRAC = "complete:5", 5, 8
SIGMA = 0.2  # noise multiplier: each member's term has std W·σΔ = Δ/25
OBS, SRC = 0, 1


def _member_words(fp: FixedPoint):
    """What a secure-gossip member hands in for its term ``a = W·m_j`` (its SecAgg sub-machine adds no
    noise: ``encode_input(fp, W·m_j, 0)``, as in :meth:`SecureNeighbourhood._machine`), in grid units."""

    def word(a: float, z: np.ndarray) -> np.ndarray:
        vals = np.full(z.shape, float(a)) + np.asarray(z, dtype=float)
        w = encode_input(fp, vals, np.zeros(z.shape), N)
        return np.rint(fp.decode(w) * 2.0**fp.frac_bits).astype(np.int64)

    return word


def _release_divergence() -> tuple[np.ndarray, float]:
    """Exact D_α of observer OBS's round-0 release for SRC's input moved by Δ (1-D).

    Every weight on ``complete:5`` is 1/5; Δ = 2.5 grid steps, so SRC's term moves by half a step and
    each term's noise std is a tenth of a step (σ = 0.2): the other three terms round to 0 almost surely,
    SRC's term to 0 or 1 — the sum shows SRC's term, not the exact sum's wider Gaussian."""
    fp = FixedPoint(frac_bits=FRAC, bits=32)
    q = 2.0**-FRAC
    w = 1.0 / N
    delta = 2.5 * q
    s = w * SIGMA * delta  # per-term noise std
    xs = [0.0] * (N - 1)  # the observer's own term is zero (it leads the sum)
    xs2 = [w * delta] + [0.0] * (N - 2)
    return _divergence(_member_words(fp), xs, xs2, s, q), delta


def _sp(view: str):
    return spec("muffliato", GRAPH, 1, 1, sigma=SIGMA, view=view, frac_bits=FRAC)


def test_rounded_terms_exceed_the_aggregate_view_value():
    """The measured failure: the aggregate-view value the family used to certify is below the release."""
    W = transition_matrix(GRAPH)
    real, _ = _release_divergence()
    agg = real_arithmetic_sensitivities(_sp("aggregate"), SRC, W)[0][OBS]
    assert agg == pytest.approx(0.25)  # 1/4 of the four terms' noise, own noise known
    agg_rdp = ORDERS * agg / (2 * SIGMA**2)  # 3.125·α
    assert real[1] > 12.0 and agg_rdp[1] == pytest.approx(6.25)
    assert np.all(real > agg_rdp)  # every order is breached (D_2 ≈ 12.3, D_32 ≈ 126 vs 100)


def test_secure_gossip_certifies_the_neighbourhood_view_which_covers_the_release():
    """After the fix: the certified row of a secure run is the neighbourhood view's (≥ the release)."""
    W = transition_matrix(GRAPH)
    real, _ = _release_divergence()
    sec = certified_sensitivities(_sp("aggregate"), SRC, W)
    plain = certified_sensitivities(_sp("neighbourhood"), SRC, W)
    np.testing.assert_array_equal(sec, plain)
    cert = ORDERS * sec[0][OBS] / (2 * SIGMA**2)
    assert np.all(real <= cert), (real, cert)


def test_secure_projection_accepts_charges_neighbourhood_and_labels_the_aggregate_uncertified():
    """A spec asking for the aggregate view is accepted (it is how secure summation is switched on),
    charged with the neighbourhood view, and says so; the aggregate value is shown uncertified."""
    W = transition_matrix(GRAPH)
    sec = project_gossip(_sp("aggregate"), SRC, None, W)
    plain = project_gossip(_sp("neighbourhood"), SRC, None, W)
    assert sec.accept and plain.accept
    np.testing.assert_array_equal(sec.epsilon_row, plain.epsilon_row)
    av = sec.details["accounting_view"]
    assert av["gossip_view"] == "aggregate" and av["certified_view"] == "neighbourhood"
    assert av["view_model"] == "neighbourhood"
    np.testing.assert_allclose(sec.details["sensitivity_sq"], plain.details["sensitivity_sq"])
    ra = sec.details["aggregate_real_arithmetic"]
    assert ra["bound"] == "uncertified" and "NOT certified" in ra["label"]
    assert ra["sensitivity_sq"][OBS] == pytest.approx(0.25)
    assert any("fixed-point" in n and "neighbourhood view" in n for n in sec.details["notes"])
    # the ledger cost of the secure run is the plain run's, entry labelled with the certified view
    c_sec = gossip_cost(_sp("aggregate"), SRC, [str(v) for v in range(N)], W)
    c_plain = gossip_cost(_sp("neighbourhood"), SRC, [str(v) for v in range(N)], W)
    np.testing.assert_array_equal(c_sec.phase_curves, c_plain.phase_curves)
    assert math.isfinite(float(c_sec.phase_curves.max()))
