"""Each family's typed parameters refuse bad input with one line, before any machine is built."""

from __future__ import annotations

import numpy as np
import pytest

from hushnet.families.central.params import CentralParams
from hushnet.families.gossip.params import MUFFLIATO, GossipOptions
from hushnet.families.pad.params import (
    COMPLETE_HISTOGRAM,
    RING_SUM,
    CompleteHistogramParams,
    RingSumParams,
    parse_params,
)
from hushnet.protocols.registry import build_machines, transition_matrix
from hushnet.tasks.values import MeanTask, SumTask


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg, msg
    return msg


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"steps": 0, "step_size": 0.1, "noise_std": 1.0}, "steps"),
        ({"steps": 5, "step_size": -1.0, "noise_std": 1.0}, "step_size"),
        ({"steps": 5, "step_size": 0.1, "noise_std": float("nan")}, "noise_std"),
        ({"steps": 5, "step_size": 0.1, "noise_std": 1.0, "clip": 0.0}, "clip"),
    ],
)
def test_central_params_refuse_bad_values(kwargs, words) -> None:
    with pytest.raises(ValueError) as exc:
        CentralParams(**kwargs)
    assert words in _one_line(exc) and "central-dpsgd" in str(exc.value)


def test_pad_params_are_typed_and_checked() -> None:
    assert parse_params(RING_SUM, {"rounds": 2, "sigma_loc": 1.0}) == RingSumParams(2, 1.0)
    assert parse_params(COMPLETE_HISTOGRAM, {"steps": 9, "gamma": 0.3}) == CompleteHistogramParams(
        9, 0.3
    )
    for params, words in (
        ({"rounds": 0, "sigma_loc": 1.0}, "rounds"),
        ({"rounds": 2, "sigma_loc": -1.0}, "sigma_loc"),
        ({"rounds": 2}, "missing"),
        ({"rounds": 2, "sigma_loc": 1.0, "sigma": 3.0}, "unknown"),
    ):
        with pytest.raises(ValueError) as exc:
            parse_params(RING_SUM, params)
        assert words in _one_line(exc) and RING_SUM in str(exc.value)
    with pytest.raises(ValueError) as exc:
        parse_params(COMPLETE_HISTOGRAM, {"steps": 9, "gamma": 1.0})
    assert "gamma" in _one_line(exc)


def test_a_bad_parameter_stops_the_machine_build() -> None:
    tasks = [SumTask(np.array([0.5])) for _ in range(4)]
    with pytest.raises(ValueError, match="pad-ring-sum: rounds must be a positive integer"):
        build_machines(RING_SUM, tasks, run_seed=1, params={"rounds": -1, "sigma_loc": 1.0})


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"timeout": 0.0}, "timeout"),
        ({"max_ahead": 0}, "max_ahead"),
        ({"give_up_after": 0}, "give_up_after"),
        ({"ticks": 0}, "ticks"),
        ({"dropout": 1.0}, "dropout"),
    ],
)
def test_gossip_options_refuse_bad_values(kwargs, words) -> None:
    with pytest.raises(ValueError) as exc:
        GossipOptions(**kwargs)
    assert words in _one_line(exc) and str(exc.value).startswith("gossip:")


def test_a_bad_gossip_option_stops_the_machine_build() -> None:
    tasks = [MeanTask(np.array([float(i)])) for i in range(4)]
    with pytest.raises(ValueError, match="gossip: ticks must be >= 1, got 0"):
        build_machines(
            MUFFLIATO,
            tasks,
            run_seed=1,
            params={"rounds": 3, "sigma": 1.0, "ticks": 0},
            W=transition_matrix("ring:4"),
        )
