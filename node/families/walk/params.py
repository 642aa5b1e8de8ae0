"""The walk's protocol names and typed machine parameters.

``rw-dpsgd`` (random-walk paper, Alg. 1), ``pad-complete-sgd`` (P-AD Alg. 4: the same machine on
``W = J/n``) and ``local-dp-sgd`` (the local-DP baseline: over-cap visits add nothing) share one
machine and one parameter class, :class:`RWParams`, checked at construction.
"""

from __future__ import annotations

from dataclasses import dataclass

RW_DPSGD = "rw-dpsgd"
PAD_COMPLETE_SGD = "pad-complete-sgd"
LOCAL_DP_SGD = "local-dp-sgd"
#: protocols charged with the random-walk bound (∧ local DP); the local-DP baseline is not
WALK_ACCOUNTED = (RW_DPSGD, PAD_COMPLETE_SGD)
#: protocols that walk the graph's public W (``pad-complete-sgd`` always walks J/n)
NEEDS_W = (RW_DPSGD, LOCAL_DP_SGD)
OVER_CAP = ("noise", "nothing")


@dataclass(frozen=True)
class RWParams:
    """Public parameters of a random-walk SGD run.

    ``sigma`` is the noise **multiplier** (noise std = ``sensitivity·sigma``, docs/design/spec/randomwalk.md §0 P-RW convention);
    ``cap`` the per-node contribution cap N_max (None = no cap); ``over_cap`` ``"noise"`` (RW/network
    DP-SGD) or ``"nothing"`` (local-DP baseline); ``clip_after_noise`` emulates the reference code
    (noisy update clipped to the task's clip norm, docs/design/spec/randomwalk.md §A.4.6) for figure reproductions only.
    ``record_view`` keeps this node's view ``(t, x_t, next)`` for audits and tests.
    """

    steps: int
    step_size: float
    sigma: float
    cap: int | None = None
    over_cap: str = "noise"
    start: int = 0
    x0: tuple[float, ...] | None = None
    clip_after_noise: bool = False
    record_view: bool = False

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError("steps must be >= 1")
        if not self.step_size > 0:
            raise ValueError("step_size must be > 0")
        if not self.sigma >= 0:
            raise ValueError("sigma must be >= 0")
        if self.cap is not None and self.cap < 0:
            raise ValueError("cap must be >= 0 or None")
        if self.over_cap not in OVER_CAP:
            raise ValueError(f"over_cap must be one of {OVER_CAP}")
