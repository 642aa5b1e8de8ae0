"""The gossip run report's "paper" values: which theorem, computed by the privacy core's own functions.

The node report (``RunDriver.report``) shows the certified row and, labelled "paper", the published
bound through :func:`hushnet.runs.accounting.paper_bound` — the same path as the random walk's Thm 3.
Here the gossip paper rows are checked against the privacy modules' independent implementations
([M] Thm 1 all-pairs matrix, [M] Thm 6 via ``muffliato_gd_loss(bound="paper")``, [K] Thm 15 from the
spectrum), and the labels carry the spec's warning.  The networked report is checked in
``test_gossipnet_gd_stream.py`` (same network, no extra start-up).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers.gossipnet import spec  # noqa: E402

from hushnet.client.report import RunReport  # noqa: E402
from hushnet.families.gossip.accounting import paper_sensitivities  # noqa: E402
from hushnet.families.walk.accounting import RW_PAPER_LABEL  # noqa: E402
from hushnet.privacy.muffliato import muffliato_gd_loss, muffliato_loss_matrix  # noqa: E402
from hushnet.protocols.registry import transition_matrix  # noqa: E402
from hushnet.runs.accounting import paper_bound  # noqa: E402

GRAPH = "grid:3x4"
ALPHA, SIGMA = 3.0, 2.0


def _W(sp):
    return transition_matrix(sp.graph, sp.weights)


def test_muffliato_paper_row_is_theorem_1() -> None:
    sp = spec("muffliato", GRAPH, 5, 1, sigma=SIGMA, chebyshev=True)
    W = _W(sp)
    mat = muffliato_loss_matrix(W, 5, ALPHA, SIGMA, bound="paper").matrix  # row = source
    for v in (0, 5):
        np.testing.assert_allclose(
            paper_sensitivities(sp, v, W) * ALPHA / (2 * SIGMA**2), mat[v], rtol=1e-10, atol=1e-14
        )
    row, label = paper_bound(sp, 0, 1.0, W)
    assert (
        label.startswith("paper: [M] Theorem 1")
        and "NOT a guarantee" in label
        and "§1.3.9" in label
    )
    assert row[0] == 0.0 and np.all(row[1:] > 0)


def test_muffliato_gd_paper_row_is_theorem_6() -> None:
    sp = spec("muffliato-gd", GRAPH, 3, 2, sigma=SIGMA, task="logreg", K=2)
    W = _W(sp)
    mat = muffliato_gd_loss([W] * 3, 2, ALPHA, SIGMA, bound="paper").matrix
    np.testing.assert_allclose(
        paper_sensitivities(sp, 4, W) * ALPHA / (2 * SIGMA**2), mat[4], rtol=1e-10, atol=1e-14
    )
    assert "Theorem 6" in paper_bound(sp, 4, 3.0, W)[1]


def test_stream_paper_row_is_koskela_theorem_15() -> None:
    sp = spec("gossip-stream", GRAPH, 6, 3, sigma=SIGMA, task="logreg")
    W = _W(sp)
    Wd = W.toarray()
    n, T = Wd.shape[0], 6
    ev = np.sort(np.abs(np.linalg.eigvalsh(Wd)))
    rho = ev[-2]
    s = paper_sensitivities(sp, 0, W)
    for v in range(1, n):
        m = int(np.count_nonzero(Wd[v])) + (Wd[v, v] == 0)  # |closed neighbourhood of the observer|
        want = m * T / n + 2 / (1 - rho) ** 2 * math.sqrt(m * T / n) + 2 / (1 - rho) ** 4
        assert s[v] == pytest.approx(want, rel=1e-12)
    row, label = paper_bound(sp, 0, 6.0, W)
    assert "[K] Theorem 15" in label and "NOT a guarantee" in label
    assert np.all(np.isfinite(row[1:]))


def test_walk_keeps_its_label_and_client_report_shows_the_run_label() -> None:
    sp = spec("rw-dpsgd", "hypercube:3", 50, 4, sigma=2.0, task="logreg")
    out = paper_bound(sp, 0, 5.0, _W(sp))
    assert out is not None and out[1] == RW_PAPER_LABEL
    gsp = spec("muffliato", GRAPH, 5, 1, sigma=SIGMA)
    row, label = paper_bound(gsp, 0, 1.0, _W(gsp))
    per = {
        f"n{v}": {
            "vertex": v,
            "delta": 1e-5,
            "certified": {"n1" if v == 0 else "n0": 1.0},
            "paper": {"n1" if v == 0 else "n0": float(row[1])},
            "paper_bound": label,
        }
        for v in range(2)
    }
    rep = RunReport("run-x", per)
    assert rep.summary()["paper_bound"] == label
    text = rep.format_table()
    assert "Theorem 1" in text and "NOT a guarantee" in text and "certified" in text


def test_aggregate_view_paper_values_say_which() -> None:
    """Secure summation (S = e_iᵀ): [K] Thm 15 with one observer row; [M] has no such view (labelled)."""
    st = spec("gossip-stream", GRAPH, 6, 3, sigma=SIGMA, task="logreg", view="aggregate")
    W = _W(st)
    ev = np.sort(np.abs(np.linalg.eigvalsh(W.toarray())))
    rho, n, T = ev[-2], W.shape[0], 6
    want = T / n + 2 / (1 - rho) ** 2 * math.sqrt(T / n) + 2 / (1 - rho) ** 4
    np.testing.assert_allclose(paper_sensitivities(st, 0, W)[1:], want, rtol=1e-12)
    assert paper_bound(st, 0, 6.0, W)[1].endswith("aggregate view: [K] Thm 15 with m = 1")
    mu = spec("muffliato", GRAPH, 5, 1, sigma=SIGMA, view="aggregate")
    row, label = paper_bound(mu, 0, 1.0, W)
    assert "its neighbourhood value is shown" in label
    np.testing.assert_allclose(
        row, paper_bound(spec("muffliato", GRAPH, 5, 1, sigma=SIGMA), 0, 1.0, W)[0]
    )
