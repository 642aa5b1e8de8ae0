"""Inputs of a protocol machine.  A driver (simulator or gRPC node) turns the outside world into these."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RunStarted:
    """The run was accepted by the nodes it needs and may begin (delivered once to every machine)."""


@dataclass(frozen=True, slots=True)
class MessageArrived:
    """Opaque protocol bytes from a neighbour.

    ``src`` is what the transport tells the receiver about the sender: the neighbour's node id on a
    plain (sender-known) gRPC link.  Machines in the anonymous view model use it only to route the
    acknowledgement and never record it in their view.
    """

    src: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class TimerFired:
    """A timer the machine set earlier expired (virtual time in the simulator, wall time in the node)."""

    name: str


Event = RunStarted | MessageArrived | TimerFired
