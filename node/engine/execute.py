"""The one place where a machine's actions become effects.

A machine returns :mod:`actions <hushnet.engine.actions>`; something has to carry them out — put
bytes on a wire, arm a timer, charge a ledger.  Every driver (the simulator, the loopback network,
the node's run driver, the operator's central aggregator) used to hold its own ``if Send … elif
Finish`` chain, so a new action kind or a change in the rules ("a refused charge drops the rest of
the batch") had to be made five times.  Now a driver only says *how* each effect happens, by
implementing :class:`Effects`, and :func:`execute` is the only code that says *which* effect an
action is and in what order they run (the model is aioquic's ``asyncio/protocol.py``, the only
place where a QUIC connection's output becomes I/O).

Rules :func:`execute` enforces for every driver:

* actions run in the order the machine returned them (a ledger charge precedes the ``Send`` that
  carries the contribution, so the data never leaves unaccounted);
* an effect that returns ``False`` stops the batch: nothing after it runs (a refused charge, a
  simulator that stops at a pause); any other return value (normally ``None``) continues;
* an object that is not an engine action is refused with a :class:`TypeError` naming it — a new
  action kind must be given an effect here, never silently dropped by some driver.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Protocol

from hushnet.engine.actions import (
    CancelTimer,
    Deviation,
    Fault,
    Finish,
    LedgerEntry,
    Metric,
    Paused,
    Send,
    SetTimer,
)

__all__ = ["Effects", "EFFECT_OF", "execute"]


class Effects(Protocol):
    """What a driver does with each action kind.  Return ``False`` to stop the rest of the batch.

    A driver implements every method (structurally, or by subclassing: an inherited one raises
    :class:`NotImplementedError`, so a forgotten action kind fails loudly instead of vanishing).
    """

    def send(self, act: Send) -> bool | None:
        """Transmit ``act.payload`` to vertex ``act.dst`` (wrapped in the driver's envelope, if any)."""
        raise NotImplementedError

    def set_timer(self, act: SetTimer) -> bool | None:
        """Arm timer ``act.name`` for ``act.delay`` seconds, replacing one of the same name."""
        raise NotImplementedError

    def cancel_timer(self, act: CancelTimer) -> bool | None:
        """Disarm timer ``act.name`` (no-op when it is not armed)."""
        raise NotImplementedError

    def charge(self, act: LedgerEntry) -> bool | None:
        """Record a use of the node's data; ``False`` = refused, so nothing after it may run."""
        raise NotImplementedError

    def metric(self, act: Metric) -> bool | None:
        """Report progress to subscribers."""
        raise NotImplementedError

    def deviation(self, act: Deviation) -> bool | None:
        """Record a departure from the public protocol (the accountant must see it)."""
        raise NotImplementedError

    def pause(self, act: Paused) -> bool | None:
        """The run cannot continue as specified at this node."""
        raise NotImplementedError

    def fault(self, act: Fault) -> bool | None:
        """A message was refused (the machine's state is untouched)."""
        raise NotImplementedError

    def finish(self, act: Finish) -> bool | None:
        """The run is over at ``act.node``; ``act.model`` is what it holds."""
        raise NotImplementedError


#: action class → name of the :class:`Effects` method that carries it out (every action kind)
EFFECT_OF: dict[type, str] = {
    Send: "send",
    SetTimer: "set_timer",
    CancelTimer: "cancel_timer",
    LedgerEntry: "charge",
    Metric: "metric",
    Deviation: "deviation",
    Paused: "pause",
    Fault: "fault",
    Finish: "finish",
}


def _effect_name(cls: type) -> str:
    """The effect of an action class, a subclass of an action included; a clear error otherwise."""
    for base in cls.__mro__:
        name = EFFECT_OF.get(base)
        if name is not None:
            return name
    known = ", ".join(c.__name__ for c in EFFECT_OF)
    raise TypeError(
        f"cannot execute {cls.__module__}.{cls.__qualname__}: not an engine action (known: {known})"
    )


# effects class → {action class → unbound effect function}; filled on first use of each pair, so
# the per-action cost is two dict lookups and one call (the simulator runs ~10⁵ actions a second)
_DISPATCH: dict[type, dict[type, Callable[[Any, Any], bool | None]]] = {}


def _effect_fn(effects_cls: type, table: dict, act_cls: type) -> Callable[[Any, Any], bool | None]:
    fn = getattr(effects_cls, _effect_name(act_cls))
    table[act_cls] = fn
    return fn


def execute(actions: Iterable[object], effects: Effects) -> bool:
    """Carry out ``actions`` in order through ``effects``.

    Returns ``True`` when every action ran, ``False`` when an effect returned ``False`` and the rest
    of the batch was dropped.  Raises :class:`TypeError` for an object that is not an engine action
    (before any later action runs; the earlier ones have taken effect, as a machine's would).
    """
    ecls = effects.__class__
    table = _DISPATCH.get(ecls)
    if table is None:
        table = _DISPATCH[ecls] = {}
    for act in actions:
        fn = table.get(act.__class__)
        if fn is None:
            fn = _effect_fn(ecls, table, act.__class__)
        if fn(effects, act) is False:
            return False
    return True
