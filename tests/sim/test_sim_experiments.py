"""The figure harness (:mod:`hushnet.sim.experiments`) that benchmarks/figures build the papers'
houses curves with: a curve starts at the zero model, has a snapshot every ``eval_every`` steps,
is reproducible from its seed, and training moves the objective down.

Before this test only the figure scripts (``make figures``, not in the suite) ran these functions,
so a change to the protocol registry or the simulator could break every figure unnoticed (issue 13).
The houses data come from ../shared/data (tests/conftest.py); missing data fails, as in
tests/engine/test_engine_tasks.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from hushnet.protocols.registry import transition_matrix
from hushnet.sim.experiments import houses_setup, nonprivate_accuracy, sgd_curve


@pytest.fixture(scope="module")
def setup():
    return houses_setup(16, per_node=8)


def test_houses_setup_shapes(setup) -> None:
    assert len(setup.tasks) == 16 and len(setup.part.shards) == 16
    assert all(t.clip == 0.4 for t in setup.tasks)
    # the objective rows and the test set are intercept-augmented (8 features + 1)
    assert setup.X_obj.shape[1] == 9 and setup.X_test.shape[1] == 9
    assert setup.X_obj.shape[0] == min(1000, setup.part.X_train.shape[0])
    assert set(np.unique(setup.y_test)) <= {-1.0, 1.0}


@pytest.mark.parametrize("protocol", ["central-dpsgd", "rw-dpsgd"])
def test_curve_snapshots_reproducibility_and_progress(setup, protocol: str) -> None:
    W = None if protocol == "central-dpsgd" else transition_matrix("hypercube:4")
    kw = dict(steps=200, step_size=0.05, noise_std=0.01, W=W, eval_every=100)
    curve = sgd_curve(protocol, setup, seed=1, **kw)
    np.testing.assert_array_equal(curve["steps"], [0, 100, 200])
    # step 0 is the zero model: logistic loss log(1 + e^0) on every row
    assert curve["objective"][0] == pytest.approx(math.log(2.0), abs=1e-12)
    assert np.all(np.diff(curve["objective"]) < 0), curve["objective"]
    assert curve["accuracy"][-1] >= 0.8, curve["accuracy"]
    assert curve["gradients"] == 200  # one clipped gradient per step
    again = sgd_curve(protocol, setup, seed=1, **kw)
    np.testing.assert_array_equal(again["model"], curve["model"])
    np.testing.assert_array_equal(again["objective"], curve["objective"])
    other = sgd_curve(protocol, setup, seed=2, **{**kw, "eval_every": 50})
    np.testing.assert_array_equal(other["steps"], [0, 50, 100, 150, 200])
    assert not np.array_equal(other["model"], curve["model"])


def test_nonprivate_ceiling(setup) -> None:
    """Full-batch gradient descent on every training row: the ceiling the figures draw."""
    assert nonprivate_accuracy(setup, iters=500) >= 0.9
