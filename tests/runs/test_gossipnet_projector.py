"""The node-side gossip projector against the privacy core's independent accountants (no network).

What a node projects before accepting (the recorded-schedule accountant on the public schedule)
must equal the privacy core's exact Muffliato matrix (plain and Chebyshev) and Koskela's streaming
matrix on the public W; the networked protocols refuse what they cannot account.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers.gossipnet import spec  # noqa: E402

from hushnet.families.gossip.accounting import certified_sensitivities, gossip_cost, project_gossip  # noqa: E402
from hushnet.families.gossip.build import code_gap  # noqa: E402
from hushnet.families.gossip.secure import ACCOUNTING_LABEL  # noqa: E402
from hushnet.privacy.graphs import chebyshev_gamma  # noqa: E402
from hushnet.privacy.koskela import gossip_stream_loss_matrix  # noqa: E402
from hushnet.privacy.muffliato import muffliato_gd_loss, muffliato_loss_matrix  # noqa: E402
from hushnet.protocols.registry import transition_matrix  # noqa: E402

ALPHA, SIGMA = 4.0, 1.5


@pytest.mark.parametrize(
    "graph,T,cheb", [("ring:8", 5, False), ("grid:3x4", 4, False), ("grid:3x4", 6, True)]
)
def test_muffliato_projection_equals_exact_matrix(graph: str, T: int, cheb: bool) -> None:
    sp = spec("muffliato", graph, T, 1, sigma=SIGMA, chebyshev=cheb)
    W = transition_matrix(graph)
    if cheb:  # the Chebyshev γ the machines derive from the code's spectral gap
        assert chebyshev_gamma(gap=code_gap(W)) > 1.0
    ref = muffliato_loss_matrix(W, T, ALPHA, SIGMA, chebyshev=cheb)
    n = W.shape[0]
    for u in (0, n // 2, n - 1):
        S = certified_sensitivities(sp, u, W)[0]
        np.testing.assert_allclose(ALPHA * S / (2 * SIGMA**2), ref.matrix[u], rtol=1e-7, atol=1e-10)


def test_stream_projection_equals_koskela_matrix() -> None:
    """Equal to Koskela's matrix where its value is valid for vector models (M ≥ 0: c = 1 optimal), and
    never below it elsewhere: the node uses min(spectral, 1ᵀ|M|1), not the scalar vertex enumeration."""
    graph, T = "ring:6", 4
    sp = spec("gossip-stream", graph, T, 1, sigma=SIGMA)
    W = transition_matrix(graph)
    ref = gossip_stream_loss_matrix(W, T, ALPHA, SIGMA)
    box = gossip_stream_loss_matrix(W, T, ALPHA, SIGMA, exact_limit=0)  # what is valid for d > 1
    for u in (0, 3):
        S = certified_sensitivities(sp, u, W)[0]
        np.testing.assert_allclose(ALPHA * S / (2 * SIGMA**2), box.matrix[u], rtol=1e-6, atol=1e-9)
        assert np.all(ALPHA * S / (2 * SIGMA**2) >= ref.matrix[u] * (1 - 1e-9))


def test_gd_is_one_joint_view_and_cost_charges_it_once() -> None:
    """Muffliato-GD steps share state (earlier noise is carried on), so the node accounts the whole run as
    one linear-Gaussian view — the privacy core's certified Muffliato-GD matrix — never per-step sums."""
    sp = spec("muffliato-gd", "ring:8", 3, 1, sigma=SIGMA, task="logreg", K=2)
    W = transition_matrix("ring:8")
    ref = muffliato_gd_loss([W] * 3, 2, ALPHA, SIGMA, chebyshev=False)
    for u in (0, 5):
        sens = certified_sensitivities(sp, u, W)
        assert sens.shape == (1, 8)
        np.testing.assert_allclose(
            ALPHA * sens[0] / (2 * SIGMA**2), ref.matrix[u], rtol=1e-9, atol=1e-12
        )
    comp = muffliato_gd_loss([W] * 3, 2, ALPHA, SIGMA, bound="composed", chebyshev=False)
    assert not np.allclose(
        ref.matrix, comp.matrix
    )  # per-step composition would be a different (invalid) number
    cost = gossip_cost(sp, 0, [f"n{i}" for i in range(8)], W)
    np.testing.assert_allclose(cost.curves(SIGMA), cost.phase_curves[0], rtol=1e-12)


def test_refusals_name_the_reason() -> None:
    W = transition_matrix("ring:8")
    cases = [
        (spec("muffliato", "ring:8", 4, 1, view="aggregate", frac_bits=60), "frac_bits"),
        (spec("muffliato-randomized", "ring:8", 4, 1, view="aggregate"), "no neighbourhood sum"),
        (
            replace(
                spec("muffliato-gd", "ring:8", 2, 1, task="logreg"),
                protocol_params={"graph": "er-per-step"},
            ),
            "needs a complete network topology",
        ),
        (
            replace(
                spec("muffliato", "ring:8", 2, 1),
                protocol_params={"graph": "er-per-round", "q": 0.5},
            ),
            "simulator-only",
        ),
        (spec("muffliato", "ring:8", 4, 1, sigma=0.0), "sigma > 0"),
        (spec("muffliato", "ring:8", 4, 1, epsilon=0.5), "over budget"),
    ]
    for sp, why in cases:
        dec = project_gossip(sp, 0, None, W)
        assert not dec.accept and why in dec.reason, (sp.protocol, dec.reason)
    ok = project_gossip(spec("muffliato", "ring:8", 4, 1), 0, None, W)
    assert (
        ok.accept
        and ok.bound == "certified"
        and ok.details["accounting_view"]["gossip_view"] == "neighbourhood"
    )
    assert ok.epsilon_row[0] == 0.0 and np.all(ok.epsilon_row[1:] > 0)
    # secure neighbourhood summation: accepted, certified with the neighbourhood view (the members'
    # fixed-point rounding, tests/privacy/test_gossip_secure_rounding.py); the aggregate view's lower
    # value is shown only as an uncertified real-arithmetic figure
    agg = project_gossip(spec("muffliato", "ring:8", 4, 1, view="aggregate"), 0, None, W)
    av = agg.details["accounting_view"]
    assert (
        agg.accept and av["label"] == ACCOUNTING_LABEL and av["certified_view"] == "neighbourhood"
    )
    assert np.array_equal(agg.epsilon_row, ok.epsilon_row)
    real = np.array(agg.details["aggregate_real_arithmetic"]["epsilon"])
    assert agg.details["aggregate_real_arithmetic"]["bound"] == "uncertified"
    assert np.all(real <= ok.epsilon_row + 1e-12) and np.any(real < ok.epsilon_row)
