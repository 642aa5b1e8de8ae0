"""Onion hop acks carried by the transport's receipt (``link_receipts``, the networked node).

The profile of ``rw-dpsgd-onion`` over the network showed two RPCs per link hop: the packet and a
separate hop-ack message.  The node's ``Deliver`` answers only after the receiving machine accepted
the packet, so that answer is the ack (the driver feeds it back as ``Delivered``).  What must not
change: every role still answers at the same point (the arrival returns the same actions whatever the
role, the role's work comes out of a zero timer after the handler returned), and an unacknowledged
hop is still retransmitted.
"""

from __future__ import annotations

import numpy as np

from hushnet.crypto.keys import simulation_directory, simulation_keypairs
from hushnet.crypto.onion import OnionKeyring
from hushnet.engine.actions import CancelTimer, Metric, Paused, Send, SetTimer
from hushnet.engine.events import Delivered, MessageArrived, RunStarted, TimerFired
from hushnet.engine.protocol import NodeContext, Protocol
from hushnet.families.anonymity.onion import OnionLayer, OnionParams
from hushnet.privacy.graphs import parse_graph

GRAPH, N, RECEIVER, FIRST = "regular:12:4:1", 12, 0, 3


class _Once(Protocol):
    name = "once"

    def __init__(self, ctx, dst=None):
        super().__init__(ctx)
        self.dst, self.got = dst, []

    def on_start(self):
        return [Send(self.dst, b"token")] if self.dst is not None else []

    def on_message(self, src, payload):
        self.got.append(payload)
        return []


def _layers(receipts: bool) -> list[OnionLayer]:
    g = parse_graph(GRAPH)
    kps = simulation_keypairs(5, N, "onion")
    d = simulation_directory(kps)
    par = OnionParams(hops=2, slots=10, payload_len=64, cell_body=4096, link_receipts=receipts)
    out = []
    for v in range(N):
        ctx = NodeContext(v, N, "r", np.random.default_rng(v))
        out.append(
            OnionLayer(
                ctx,
                _Once(ctx, FIRST if v == RECEIVER else None),
                g.adjacency,
                OnionKeyring.single(kps[v]),
                d,
                par,
                path_rng=np.random.default_rng(40 + v),
            )
        )
    return out


def test_receipt_is_the_hop_ack_and_every_role_answers_alike():
    layers = _layers(True)
    acts, src, roles = layers[RECEIVER].handle(RunStarted()), RECEIVER, []
    while True:
        (s,) = [a for a in acts if isinstance(a, Send)]
        assert s.receipt, "a hop packet must ask for the transport's receipt"
        (t,) = [a for a in acts if isinstance(a, SetTimer)]
        sender = layers[src]
        m = layers[s.dst]
        out = m.handle(MessageArrived(src, s.payload))
        # no ack message any more, and the same single deferral whatever the role
        assert [type(a) for a in out] == [SetTimer] and out[0].delay == 0.0, out
        assert (
            sender.handle(Delivered((s.dst + 1) % N, s.receipt)) == []
        )  # a receipt from another peer
        assert sender.handle(Delivered(s.dst, s.receipt)) == [CancelTimer(t.name)]
        assert sender.handle(TimerFired(t.name)) == []  # acknowledged: no retransmission
        assert sender.handle(Delivered(s.dst, s.receipt)) == []  # a second receipt: harmless
        acts = m.handle(TimerFired(out[0].name))
        if m.inner.got:
            roles.append("receiver")
            assert m.inner.got == [b"token"] and not [a for a in acts if isinstance(a, Send)]
            break
        roles.append("relay")
        src = s.dst
    assert roles[-1] == "receiver" and roles.count("relay") >= 2, roles


def test_hop_without_receipt_is_retransmitted_with_the_same_receipt():
    layers = _layers(True)
    acts = layers[RECEIVER].handle(RunStarted())
    (s,) = [a for a in acts if isinstance(a, Send)]
    (t,) = [a for a in acts if isinstance(a, SetTimer)]
    again = layers[RECEIVER].handle(TimerFired(t.name))
    (s2,) = [a for a in again if isinstance(a, Send)]
    assert (s2.dst, s2.payload, s2.receipt) == (s.dst, s.payload, s.receipt)
    assert layers[RECEIVER].handle(Delivered(s.dst, s.receipt)) == [CancelTimer(t.name)]


def test_message_acks_unchanged_without_link_receipts():
    layers = _layers(False)
    acts = layers[RECEIVER].handle(RunStarted())
    (s,) = [a for a in acts if isinstance(a, Send)]
    assert s.receipt == ""
    out = layers[s.dst].handle(MessageArrived(RECEIVER, s.payload))
    assert [type(a) for a in out] == [Send, SetTimer] and out[0].payload[:1] == b"A"


def _pause(layer: OnionLayer, timer: str) -> None:
    """Let a hop go unacknowledged until the layer reports itself paused (once)."""
    paused = []
    for _ in range(layer.p.max_retries + 2):
        paused += [a for a in layer.handle(TimerFired(timer)) if isinstance(a, Paused)]
    assert len(paused) == 1, paused


def test_paused_hop_reports_resumed_when_its_receipt_comes():
    """A slow neighbour's late receipt ends the pause: without a ``resumed`` the node's run status
    said "paused" for the rest of the run (the driver leaves "paused" only on a ``resumed`` metric)."""
    layers = _layers(True)
    acts = layers[RECEIVER].handle(RunStarted())
    (s,) = [a for a in acts if isinstance(a, Send)]
    (t,) = [a for a in acts if isinstance(a, SetTimer)]
    _pause(layers[RECEIVER], t.name)
    out = layers[RECEIVER].handle(Delivered(s.dst, s.receipt))
    assert out[0] == CancelTimer(t.name)
    assert [(type(a), a.name) for a in out[1:]] == [(Metric, "resumed")], out
    assert layers[RECEIVER].handle(Delivered(s.dst, s.receipt)) == []  # once


def test_paused_hop_reports_resumed_when_its_ack_message_comes():
    layers = _layers(False)
    acts = layers[RECEIVER].handle(RunStarted())
    (s,) = [a for a in acts if isinstance(a, Send)]
    (t,) = [a for a in acts if isinstance(a, SetTimer)]
    _pause(layers[RECEIVER], t.name)
    (ack,) = [
        a for a in layers[s.dst].handle(MessageArrived(RECEIVER, s.payload)) if isinstance(a, Send)
    ]
    out = layers[RECEIVER].handle(MessageArrived(s.dst, ack.payload))
    assert out[0] == CancelTimer(t.name)
    assert [(type(a), a.name) for a in out[1:]] == [(Metric, "resumed")], out
