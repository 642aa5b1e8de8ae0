"""The sans-IO protocol engine: every hushnet protocol is a pure state machine per node.

A machine consumes :mod:`events <hushnet.engine.events>` (the run started, a message arrived,
a timer fired) and returns :mod:`actions <hushnet.engine.actions>` (send bytes to a neighbour,
set a timer, record a ledger entry, emit a metric, finish).  It never touches a socket, a clock
or global randomness, which is what lets the in-process simulator (:mod:`hushnet.sim`) and the gRPC
node driver run the *same* code and get bit-identical models from the same run seed.

Driving a machine (what :mod:`hushnet.sim` does, and what the gRPC node driver must do):

1. build it with :func:`hushnet.protocols.registry.machine_for_spec` (its own generator, from the run seed);
2. deliver :class:`RunStarted` once, then every incoming :class:`~hushnet.engine.wire.Envelope` whose
   ``(protocol, run_id)`` match as :class:`MessageArrived` ``(src, payload)`` — ``src`` is the peer the
   transport authenticated — and every expired timer as :class:`TimerFired`;
3. execute the returned actions in order with :func:`hushnet.engine.execute.execute` — the one place
   where actions become effects; the driver only implements :class:`~hushnet.engine.execute.Effects`:
   ``Send`` → wrap in its transport's envelope (per-destination sequence numbers) and transmit;
   ``SetTimer``/``CancelTimer`` → the driver's clock; ``LedgerEntry`` → the node's ledger (a refused
   charge stops the batch); ``Metric`` → subscribers; ``Deviation``/``Paused``/``Fault`` → the run's
   report; ``Finish`` → the final model and (first Finish or every live node, the driver's rule) the
   end of the run.
"""

from hushnet.engine.actions import (
    Action,
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
from hushnet.engine.errors import (
    MalformedMessage,
    ProtocolError,
    ReplayedMessage,
    UnexpectedSender,
    WrongDimension,
    WrongRun,
)
from hushnet.engine.events import Delivered, Event, MessageArrived, RunStarted, TimerFired
from hushnet.engine.protocol import NodeContext, Protocol
from hushnet.engine.rng import node_generators, node_seed_sequences
from hushnet.engine.wire import Envelope

__all__ = [
    "Action",
    "CancelTimer",
    "Deviation",
    "Fault",
    "Finish",
    "LedgerEntry",
    "Metric",
    "Paused",
    "Send",
    "SetTimer",
    "MalformedMessage",
    "ProtocolError",
    "ReplayedMessage",
    "UnexpectedSender",
    "WrongDimension",
    "WrongRun",
    "Event",
    "Delivered",
    "MessageArrived",
    "RunStarted",
    "TimerFired",
    "NodeContext",
    "Protocol",
    "node_generators",
    "node_seed_sequences",
    "Envelope",
]
