"""Central DP-SGD's public parameters: the protocol name and the aggregator's typed parameters."""

from __future__ import annotations

import math
from dataclasses import dataclass

PROTOCOL = "central-dpsgd"
LABEL = "baseline: central DP-SGD with a trusted aggregator (NOT decentralized)"


@dataclass(frozen=True)
class CentralParams:
    """``noise_std`` is absolute (the aggregator adds N(0, noise_std²) to each sampled gradient).

    Checked at construction so that a bad spec fails with one line before any machine runs."""

    steps: int
    step_size: float
    noise_std: float
    clip_after_noise: bool = False
    clip: float | None = None
    snapshot_every: int = 0

    def __post_init__(self) -> None:
        if int(self.steps) != self.steps or self.steps < 1:
            raise ValueError(f"central-dpsgd: steps must be a positive integer, got {self.steps!r}")
        if not (math.isfinite(self.step_size) and self.step_size > 0):
            raise ValueError(f"central-dpsgd: step_size must be positive, got {self.step_size!r}")
        if not (math.isfinite(self.noise_std) and self.noise_std >= 0):
            raise ValueError(f"central-dpsgd: noise_std must be ≥ 0, got {self.noise_std!r}")
        if self.clip is not None and not self.clip > 0:
            raise ValueError(f"central-dpsgd: clip must be positive, got {self.clip!r}")
        if self.snapshot_every < 0:
            raise ValueError(
                f"central-dpsgd: snapshot_every must be ≥ 0, got {self.snapshot_every!r}"
            )
