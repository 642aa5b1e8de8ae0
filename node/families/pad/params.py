"""P-AD's protocol names and typed machine parameters (one frozen dataclass per algorithm).

The spec gives plain dicts (:meth:`hushnet.runs.spec.RunSpec.machine_params`); :func:`parse_params`
turns one into the algorithm's dataclass, refusing a missing, unknown or out-of-range field with one
line before any machine is built.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, fields
from typing import Any, Mapping

RING_SUM = "pad-ring-sum"
RING_HISTOGRAM = "pad-ring-histogram"
COMPLETE_SUM = "pad-complete-sum"
COMPLETE_HISTOGRAM = "pad-complete-histogram"
#: real summations (Gaussian noise) and histograms (randomized response)
SUMS = (RING_SUM, COMPLETE_SUM)
HISTOGRAMS = (RING_HISTOGRAM, COMPLETE_HISTOGRAM)
#: the directed-ring algorithms (length in rounds of n steps); the others run on the complete graph
RING = (RING_SUM, RING_HISTOGRAM)
ALL = SUMS + HISTOGRAMS


def _positive_int(protocol: str, name: str, value: Any) -> None:
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"{protocol}: {name} must be a positive integer, got {value!r}")


def _start(protocol: str, value: Any) -> None:
    if isinstance(value, bool) or int(value) != value or value < 0:
        raise ValueError(f"{protocol}: start must be a vertex (integer ≥ 0), got {value!r}")


def _sigma(protocol: str, value: Any) -> None:
    if not (math.isfinite(float(value)) and float(value) >= 0):
        raise ValueError(f"{protocol}: sigma_loc must be a finite number ≥ 0, got {value!r}")


def _gamma(protocol: str, value: Any) -> None:
    if not 0.0 <= float(value) < 1.0:
        raise ValueError(f"{protocol}: gamma must lie in [0, 1), got {value!r}")


@dataclass(frozen=True)
class RingSumParams:
    """Alg. 1: ``rounds`` laps of the directed ring; noise std ``sigma_loc`` (absolute units) once
    every n−1 hops, or spread over every hop (Remark 1) with ``distributed_noise``."""

    rounds: int
    sigma_loc: float
    distributed_noise: bool = False

    def __post_init__(self) -> None:
        _positive_int(RING_SUM, "rounds", self.rounds)
        _sigma(RING_SUM, self.sigma_loc)


@dataclass(frozen=True)
class CompleteSumParams:
    """Alg. 3: ``steps`` visits on the complete graph from vertex ``start``; every visit adds N(0, σ_loc²)."""

    steps: int
    sigma_loc: float
    start: int = 0

    def __post_init__(self) -> None:
        _positive_int(COMPLETE_SUM, "steps", self.steps)
        _sigma(COMPLETE_SUM, self.sigma_loc)
        _start(COMPLETE_SUM, self.start)


@dataclass(frozen=True)
class RingHistogramParams:
    """Alg. 2: ``rounds`` laps of the directed ring, randomized response with probability ``gamma``."""

    rounds: int
    gamma: float

    def __post_init__(self) -> None:
        _positive_int(RING_HISTOGRAM, "rounds", self.rounds)
        _gamma(RING_HISTOGRAM, self.gamma)


@dataclass(frozen=True)
class CompleteHistogramParams:
    """Alg. 5: ``steps`` visits on the complete graph, randomized response with probability ``gamma``."""

    steps: int
    gamma: float
    start: int = 0

    def __post_init__(self) -> None:
        _positive_int(COMPLETE_HISTOGRAM, "steps", self.steps)
        _gamma(COMPLETE_HISTOGRAM, self.gamma)
        _start(COMPLETE_HISTOGRAM, self.start)


PadParams = RingSumParams | CompleteSumParams | RingHistogramParams | CompleteHistogramParams

_CLASSES: dict[str, type] = {
    RING_SUM: RingSumParams,
    COMPLETE_SUM: CompleteSumParams,
    RING_HISTOGRAM: RingHistogramParams,
    COMPLETE_HISTOGRAM: CompleteHistogramParams,
}


def parse_params(protocol: str, params: Mapping[str, Any]) -> PadParams:
    """The typed parameters of ``protocol`` from a plain dict (one-line ``ValueError`` on bad input)."""
    cls = _CLASSES[protocol]
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"{protocol}: unknown parameter(s) {unknown}; expected {sorted(known)}")
    missing = sorted(f.name for f in fields(cls) if f.name not in params and f.default is MISSING)
    if missing:
        raise ValueError(f"{protocol}: missing parameter(s) {missing}")
    return cls(**params)
