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


@dataclass(frozen=True, slots=True)
class Delivered:
    """The transport confirmed that neighbour ``dst`` accepted a ``Send`` that asked for ``receipt``.

    Only drivers whose transport answers each message after the receiver's machine processed it emit
    this (the networked node); a machine must not rely on it unless its driver said so.
    """

    dst: int
    receipt: str


Event = RunStarted | MessageArrived | TimerFired | Delivered
