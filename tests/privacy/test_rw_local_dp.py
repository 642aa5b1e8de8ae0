"""Issue 10 §2(b): the certified random-walk value is ``min(walk bound, local-DP bound)`` at every entry point.

Every view of a walk is a post-processing of the noisy contributions, so ``N_u·α/(2σ²)`` (Gaussian RDP of
``N_u`` contributions seen in the clear) is valid too; the node's ledger charges that minimum per contribution
and per order.  The CLI and the library must certify the same number, and say which bound won.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from hushnet.cli import main
from hushnet.privacy.api import privacy_matrix, privacy_pair
from hushnet.privacy.conversions import DEFAULT_ORDERS, rdp_to_dp
from hushnet.privacy.graphs import metropolis_hastings, parse_graph
from hushnet.privacy.randomwalk import rw_single_loss_matrix

GRAPH, ALPHA, SIGMA, T = "ring:10", 2.0, 4.0, 1000
N_U = T / 10
LDP = N_U * ALPHA / (2 * SIGMA**2)  # 6.25


def walk_value(u: int, v: int) -> float:
    """The walk bound alone, from the per-contribution matrix (independent of the min)."""
    S = rw_single_loss_matrix(
        metropolis_hastings(parse_graph(GRAPH)), T, ALPHA, SIGMA, horizon="exact"
    )
    return float(N_U * S[u, v])


def test_cli_pair_takes_the_local_dp_bound(capsys):
    assert walk_value(0, 1) > 2 * LDP  # the walk bound alone: 14.76
    code = main(
        [
            "privacy",
            "pair",
            "--graph",
            GRAPH,
            "--protocol",
            "rw",
            "--alpha",
            "2",
            "--sigma",
            "4",
            "--steps",
            str(T),
            "--source",
            "0",
            "--observer",
            "1",
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["bound"] == "certified"
    assert out["rdp"] == pytest.approx(LDP, rel=1e-12)
    assert out["certified_by"] == "local-DP"
    assert out["components"]["random-walk"] == pytest.approx(walk_value(0, 1), rel=1e-9)


def test_cli_matrix_is_the_entrywise_minimum_and_counts_the_winners(capsys):
    code = main(
        [
            "privacy",
            "matrix",
            "--graph",
            GRAPH,
            "--protocol",
            "rw",
            "--alpha",
            "2",
            "--sigma",
            "4",
            "--steps",
            str(T),
            "--json",
        ]
    )
    rep = json.loads(capsys.readouterr().out)
    assert code == 0
    pm = privacy_matrix(GRAPH, "rw", alpha=ALPHA, sigma=SIGMA, steps=T)
    walk = np.array([[walk_value(u, v) if u != v else 0.0 for v in range(10)] for u in range(1)])
    np.testing.assert_allclose(
        pm.matrix[0], np.minimum(walk[0], np.where(np.arange(10) == 0, 0.0, LDP)), rtol=1e-9
    )
    assert rep["summary"]["max"] <= LDP + 1e-12
    won = rep["summary"]["certified_by"]
    assert won["local-DP"] > 0 and won["local-DP"] + won["random-walk"] == 90
    assert any("local-DP won on" in note for note in rep["notes"])


def test_walk_wins_far_away_unchanged_there():
    pm = privacy_matrix(GRAPH, "rw", alpha=ALPHA, sigma=SIGMA, steps=T)
    assert pm.certified_by(0, 5) == "random-walk" and pm.matrix[0, 5] < LDP
    short = privacy_pair(GRAPH, "rw", source=0, observer=4, alpha=ALPHA, sigma=SIGMA, steps=20)
    assert short["certified_by"] == "random-walk"
    assert short["rdp"] == pytest.approx(short["components"]["random-walk"], rel=1e-15)


def test_cli_and_node_ledger_certify_the_same_number():
    """The node's ledger charges min(walk, local-DP) per contribution and per order; N_u contributions at
    order α compose to exactly the CLI's value, and the node's projection converts the same curves."""
    from hushnet.families.walk.accounting import projected_row
    from hushnet.runs.accounting import contribution_cost
    from hushnet.runs.spec import Budget, RunSpec

    spec = RunSpec(
        protocol="rw-dpsgd",
        task="logreg",
        graph=GRAPH,
        steps=T,
        seed=1,
        budget=Budget(1e3, 1e-5),
        sigma=SIGMA,
        view_model="anonymous",
    ).with_run_id()
    ids = [f"n{i}" for i in range(10)]
    cost = contribution_cost(spec, 0, ids)
    k = int(np.argmin(np.abs(cost.orders - ALPHA)))
    assert cost.orders[k] == pytest.approx(ALPHA)
    per_target = N_U * cost.curves(SIGMA)[:, k]
    pm = privacy_matrix(GRAPH, "rw", alpha=ALPHA, sigma=SIGMA, steps=T, weights=spec.weights)
    np.testing.assert_allclose(per_target, np.delete(pm.matrix[0], 0), rtol=1e-9)
    row, det = projected_row(spec, 0)
    assert det["certified_by"][1] == "local-DP" and det["certified_by"][5] == "random-walk"
    ldp_eps = rdp_to_dp(DEFAULT_ORDERS, N_U * DEFAULT_ORDERS / (2 * SIGMA**2), 1e-5)[0]
    assert row[1] <= ldp_eps + 1e-6  # never above the local-DP conversion
    assert math.isfinite(row[5]) and row[5] < row[1]
