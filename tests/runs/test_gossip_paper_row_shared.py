"""Muffliato-GD's paper row from the parts a host's nodes share, bit for bit the row as it was (issue 12).

At n = 2048 a Muffliato-GD node's report spent ~140 ms on its "paper" row: four equal Theorem 1 terms (one
per step, K = 3 each), each rebuilding the row norms (an n × n product per round) and the adjacency, then a
golden-section conversion of each of the 2 048 entries.  Now each distinct K's term is computed once from
norms and an adjacency shared per process, and each distinct value is converted once.  The paper row is
labelled as no guarantee, but it is reported: the old computation (kept here) must give the same bits.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp

from hushnet.families.gossip.accounting import _public_eigh, paper_gossip, resolved
from hushnet.privacy.paper.muffliato import thm1_from_source, thm1_parts
from hushnet.protocols.registry import transition_matrix
from hushnet.runs.net_experiments import prepare
from hushnet.runs.spec import _best_order_dp


def _old_row(spec, vertex: int, W) -> np.ndarray:
    """``paper_gossip``'s row for Muffliato-GD as it was computed."""
    Wc = sp.csr_matrix(W, dtype=float)
    eig = _public_eigh(Wc)
    sens = sum(thm1_from_source(Wc, vertex, int(k), eig=eig) for k in resolved(spec, Wc)["ks"])
    sens = np.array(sens, dtype=float)
    sens[vertex] = 0.0
    row = _best_order_dp(sens / (2.0 * spec.sigma**2), math.inf, math.log(1.0 / spec.budget.delta))
    row[sens <= 0] = 0.0
    row[vertex] = 0.0
    return row


@pytest.mark.parametrize("n", [64, 256])
def test_muffliato_gd_paper_row_is_the_old_one(n: int) -> None:
    spec, _ = prepare("muffliato-gd", n)
    W = transition_matrix(spec.graph, spec.weights)
    for v in (0, 5, n - 1):
        row, label = paper_gossip(spec, v, W)
        assert row.tobytes() == _old_row(spec, v, W).tobytes(), v
        assert "NOT a guarantee" in label or "paper" in label


@pytest.mark.parametrize("convention", ["paper", "code"])
def test_theorem1_from_given_parts_is_the_same(convention: str) -> None:
    spec, _ = prepare("muffliato-gd", 128)
    Wc = sp.csr_matrix(transition_matrix(spec.graph, spec.weights), dtype=float)
    eig = _public_eigh(Wc)
    norms, adjacency = thm1_parts(Wc, 9, eig, convention=convention)
    for T in (1, 4, 9):
        for source in (0, 77):
            want = thm1_from_source(Wc, source, T, convention=convention, eig=eig)
            got = thm1_from_source(
                Wc, source, T, convention=convention, norms=norms, adjacency=adjacency
            )
            assert got.tobytes() == want.tobytes(), (T, source)
