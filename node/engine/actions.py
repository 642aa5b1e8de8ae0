"""Outputs of a protocol machine.  Drivers execute them; machines never perform I/O themselves."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hushnet.engine.errors import ProtocolError


@dataclass(frozen=True, slots=True)
class Send:
    """Deliver ``payload`` to neighbour ``dst`` (the driver wraps it in its transport's envelope: the
    engine's :class:`~hushnet.engine.wire.Envelope` in the simulator, the protobuf one on the network).

    ``receipt``: when non-empty, a driver whose transport confirms delivery (the node's gRPC
    ``Deliver`` answers only after the receiver's machine accepted the bytes) feeds
    :class:`~hushnet.engine.events.Delivered` ``(dst, receipt)`` back on success — so a protocol can
    use the transport's own response as its acknowledgement instead of a second message."""

    dst: int
    payload: bytes
    receipt: str = ""


@dataclass(frozen=True, slots=True)
class SetTimer:
    """Fire :class:`~hushnet.engine.events.TimerFired` ``name`` after ``delay`` seconds (re-setting replaces it)."""

    name: str
    delay: float


@dataclass(frozen=True, slots=True)
class CancelTimer:
    name: str


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One use of the node's private data (or one noise-only visit), for the node's privacy ledger.

    ``kind``: ``"gradient"`` (a clipped gradient entered the token), ``"value"`` (a bounded value was
    added), ``"rr"`` (a randomized-response report), ``"noise"`` (over-cap visit: noise only, no data),
    ``"schedule"`` (a gossip round's realised weights, recorded for the accountant's replay: no data).
    ``sensitivity`` is the L2 sensitivity of the data-dependent part, ``noise_std`` the std of the
    Gaussian noise added at this visit (``sigma`` = noise_std / sensitivity, the noise multiplier).
    """

    node: int
    step: int
    kind: str
    view_model: str
    sensitivity: float
    noise_std: float
    sigma: float
    protocol: str
    run_id: str
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def uses_data(self) -> bool:
        return self.kind not in ("noise", "schedule")

    @classmethod
    def of_noise(
        cls,
        ctx: Any,
        protocol: str,
        step: int,
        kind: str,
        sensitivity: float,
        noise_std: float,
        detail: dict[str, Any],
    ) -> "LedgerEntry":
        """The entry of a machine (``ctx``: its NodeContext) whose visit adds Gaussian noise of
        ``noise_std`` to data of L2 ``sensitivity``: the multiplier σ is derived here, once
        (∞ when no data entered)."""
        sigma = noise_std / sensitivity if sensitivity > 0 else float("inf")
        return cls(
            ctx.node,
            step,
            kind,
            ctx.view_model,
            sensitivity,
            noise_std,
            sigma,
            protocol,
            ctx.run_id,
            detail,
        )


@dataclass(frozen=True, slots=True)
class Metric:
    """Progress for subscribers (step, contributions, loss on a *public* evaluation set)."""

    name: str
    value: Any
    step: int
    node: int


@dataclass(frozen=True, slots=True)
class Deviation:
    """The run departed from the public protocol (e.g. a dead neighbour was skipped); the accountant must see it."""

    node: int
    step: int
    reason: str
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Paused:
    """The run cannot continue as specified (a neighbour stays down and the run option says pause)."""

    node: int
    step: int
    reason: str


@dataclass(frozen=True, slots=True)
class Fault:
    """A message was refused; the machine's state and ledger are untouched."""

    node: int
    error: ProtocolError


@dataclass(frozen=True, slots=True, eq=False)
class Finish:
    """The run is over at this node; ``model`` is the final token / model it holds (None if it holds nothing)."""

    node: int
    step: int
    model: np.ndarray | None
    result: dict[str, Any] = field(default_factory=dict)


Action = Send | SetTimer | CancelTimer | LedgerEntry | Metric | Deviation | Paused | Fault | Finish
