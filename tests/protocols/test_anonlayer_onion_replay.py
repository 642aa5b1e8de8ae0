"""Issue 11 finding 4: replay protection must span the key epoch, not one run.

Each run built a fresh replay cache over the node's one long-lived onion key, so a layer refused as a
replay in run A was accepted and forwarded in run B, or in run A again after a restart.  Now layers
are bound to their run id (in the MAC's associated data) and the replay cache is the node's, one per
key epoch, persisted in SQLite (:class:`hushnet.crypto.replay.PersistentReplayCache`)."""

import numpy as np
import pytest

from hushnet.crypto.keys import simulation_directory, simulation_keypairs
from hushnet.crypto.onion import OnionKeyring
from hushnet.engine.actions import Fault, Send
from hushnet.engine.events import MessageArrived
from hushnet.engine.protocol import NodeContext, Protocol
from hushnet.families.anonymity.onion import OnionLayer, OnionParams
from hushnet.privacy.graphs import parse_graph

N, GRAPH = 12, "regular:12:4:3"
PARAMS = OnionParams(hops=3, slots=6, payload_len=600, cell_body=256)


class Probe(Protocol):
    name = "probe"

    def on_start(self):
        return []

    def on_message(self, src, payload):
        return []


def _arrive(m, src, data):
    """``handle`` of an arrival plus the role work the layer deferred behind its hop ack (zero timers)."""
    from hushnet.engine.actions import SetTimer
    from hushnet.engine.events import TimerFired

    out = m.handle(MessageArrived(src, data))
    for a in [a for a in out if isinstance(a, SetTimer) and a.delay == 0.0]:
        out = [b for b in out if b is not a] + m.handle(TimerFired(a.name))
    return out


def _layer(v, run_id, keyring, g, d):
    ctx = NodeContext(v, N, run_id, np.random.default_rng(v))
    return OnionLayer(
        ctx, Probe(ctx), g.adjacency, keyring, d, PARAMS, path_rng=np.random.default_rng(100 + v)
    )


def _codes(out):
    return [a.error.code for a in out if isinstance(a, Fault)]


def _forwarded(out, prev):
    return [a for a in out if isinstance(a, Send) and a.dst != prev]


@pytest.fixture()
def first_hop():
    """A packet that node 0 sent in run A, and its first relay (which processed it in run A)."""
    g = parse_graph(GRAPH)
    kps = simulation_keypairs(5, N, "onion")
    d = simulation_directory(kps)
    sender = _layer(0, "run-A", OnionKeyring.single(kps[0]), g, d)
    path, acts = sender.wrap(7, b"token")
    data = next(a for a in acts if isinstance(a, Send)).payload
    return g, kps, d, path[0], data


def test_layer_of_run_a_is_refused_in_run_b(first_hop):
    g, kps, d, r1, data = first_hop
    run_a = _layer(r1, "run-A", OnionKeyring.single(kps[r1]), g, d)
    assert _forwarded(_arrive(run_a, 0, data), 0)
    assert _codes(run_a.handle(MessageArrived(0, data))) == ["replay"]
    # run B on the same node: a new machine (and, as each run builds it, a new keyring over the same key)
    run_b = _layer(r1, "run-B", OnionKeyring.single(kps[r1]), g, d)
    out = _arrive(run_b, 0, data)
    assert not _forwarded(out, 0), "a layer of run A was accepted and forwarded in run B"
    assert _codes(out) == ["integrity"]  # bound to run A: its MAC does not verify in run B


def test_layer_is_refused_after_a_restart(first_hop, tmp_path):
    """The same run after a restart: the node's replay cache is read back from its state directory."""
    from hushnet.crypto.replay import PersistentReplayCache

    g, kps, d, r1, data = first_hop
    cache = PersistentReplayCache(tmp_path / "replay.sqlite", {0})
    before = _layer(r1, "run-A", OnionKeyring.single(kps[r1], replay=cache), g, d)
    assert _forwarded(_arrive(before, 0, data), 0)
    cache.close()
    reopened = PersistentReplayCache(tmp_path / "replay.sqlite", {0})
    after = _layer(r1, "run-A", OnionKeyring.single(kps[r1], replay=reopened), g, d)
    out = _arrive(after, 0, data)
    assert not _forwarded(out, 0) and _codes(out) == ["replay"]


def test_persistent_cache_is_bounded_and_pruned_on_rotation(tmp_path):
    from hushnet.crypto.errors import UnknownEpoch
    from hushnet.crypto.replay import PersistentReplayCache, ReplayCacheFull
    from hushnet.engine.errors import ReplayedMessage

    c = PersistentReplayCache(tmp_path / "r.sqlite", {1}, max_per_epoch=3)
    for i in range(3):
        c.check_and_add(1, bytes([i]) * 16, b"d")
    with pytest.raises(ReplayedMessage):
        c.check_and_add(1, bytes([0]) * 16)
    with pytest.raises(ReplayCacheFull, match="rotate the key"):  # full: refused, never evicted
        c.check_and_add(1, b"\x09" * 16)
    with pytest.raises(UnknownEpoch):
        c.check_and_add(7, b"x" * 16)
    c.open_epoch(2)
    c.check_and_add(2, b"\x09" * 16)
    c.open_epoch(3)  # keep = 2: epoch 1's tags go (its key is deleted with them)
    assert c.epochs == [2, 3] and len(c) == 1
    c.close()
    again = PersistentReplayCache(tmp_path / "r.sqlite")
    assert again.epochs == [2, 3] and again.seen(2, b"\x09" * 16) == b""
    with pytest.raises(UnknownEpoch):
        again.seen(1, bytes([0]) * 16)


def test_persistent_cache_reopening_a_held_epoch_writes_nothing_and_still_prunes(tmp_path):
    """A secure-sum machine opens its epoch every round: a held epoch with nothing to prune is not a write
    transaction; a cache read back with more epochs than it keeps still prunes on the next open."""
    from hushnet.crypto.replay import PersistentReplayCache
    from hushnet.engine.errors import ReplayedMessage

    c = PersistentReplayCache(tmp_path / "r.sqlite", {1, 2, 3}, keep=3)
    c.check_and_add(
        1, b"a" * 16
    )  # empty digest: still a replay the second time (one-statement check)
    with pytest.raises(ReplayedMessage):
        c.check_and_add(1, b"a" * 16)
    writes = c._db.total_changes
    for _ in range(5):
        c.open_epoch(3)
    assert c._db.total_changes == writes and c.epochs == [1, 2, 3]
    c.close()
    again = PersistentReplayCache(tmp_path / "r.sqlite", keep=2)
    assert again.epochs == [1, 2, 3]
    again.open_epoch(3)  # held, but three epochs where two are kept: epoch 1 and its tags go
    assert again.epochs == [2, 3] and len(again) == 0
    with pytest.raises(ReplayedMessage):
        again.check_and_add(2, b"b" * 16) or again.check_and_add(2, b"b" * 16)
