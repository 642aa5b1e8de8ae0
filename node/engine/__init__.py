"""The sans-IO protocol engine: every hushnet protocol is a pure state machine per node.

A machine consumes :mod:`events <node.engine.events>` (the run started, a message arrived,
a timer fired) and returns :mod:`actions <node.engine.actions>` (send bytes to a neighbour,
set a timer, record a ledger entry, emit a metric, finish).  It never touches a socket, a clock
or global randomness, which is what lets the in-process simulator (:mod:`node.sim`) and the gRPC
node driver run the *same* code and get bit-identical models from the same run seed.
"""
from node.engine.actions import (
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
from node.engine.errors import (
    MalformedMessage,
    ProtocolError,
    ReplayedMessage,
    UnexpectedSender,
    WrongDimension,
    WrongRun,
)
from node.engine.events import Event, MessageArrived, RunStarted, TimerFired
from node.engine.protocol import NodeContext, Protocol
from node.engine.rng import node_generators, node_seed_sequences
from node.engine.wire import Envelope

__all__ = [
    "Action", "CancelTimer", "Deviation", "Fault", "Finish", "LedgerEntry", "Metric", "Paused", "Send",
    "SetTimer", "MalformedMessage", "ProtocolError", "ReplayedMessage", "UnexpectedSender", "WrongDimension",
    "WrongRun", "Event", "MessageArrived", "RunStarted", "TimerFired", "NodeContext", "Protocol",
    "node_generators", "node_seed_sequences", "Envelope",
]
