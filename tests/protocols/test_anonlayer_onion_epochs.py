"""Per-epoch onion keys (issue 11, finding 4's last part): rotation, deletion after the grace, replay
tags pruned with their key, and a clear reason for a packet whose key is gone — on the node's real
state directory (:mod:`hushnet.net.onion_keys`), without a network (tests/anonymity_net has those)."""

import os
import stat

import pytest

from hushnet.crypto.errors import UnknownEpoch
from hushnet.crypto.keys import KeyDirectory
from hushnet.crypto.onion import build_packet, peel
from hushnet.engine.errors import ReplayedMessage
from hushnet.net.onion_keys import OnionKeyStore, epoch_at, keys_digest

P, G = 100.0, 40.0  # period and grace, seconds (times below are explicit: no sleeping)


def _packet(store, epoch, run=b"run-A"):
    d = KeyDirectory(epoch, {1: store.pair(epoch).public})
    return build_packet([(1, d.public(1))], b"token", epoch=epoch, slots=4, payload_len=64, ad=run)


def test_rotation_schedule_files_and_forward_secrecy(tmp_path):
    s = OnionKeyStore(tmp_path, P, G)
    t0 = 50 * P + 10
    pub = s.maintain(t0)
    assert [e for e, _ in pub] == [50, 51]  # current and the pre-published next epoch
    f = tmp_path / "onion-keys" / "epoch-50.key"
    assert f.exists() and stat.S_IMODE(os.stat(f).st_mode) == 0o600
    pkt = _packet(s, 50)
    assert peel(s.keyring, pkt, slots=4, payload_len=64, ad=b"run-A").final
    # epoch 51 begins: 50 is still held (grace), 52 is made
    assert [e for e, _ in s.maintain(51 * P + 1)] == [50, 51, 52]
    assert s.keyring.replay.epochs == [50, 51, 52]
    with pytest.raises(ReplayedMessage):  # the tag of epoch 50 is still there
        peel(s.keyring, pkt, slots=4, payload_len=64, ad=b"run-A")
    # past (50+1)·P + grace: the key file and the epoch's replay tags are gone
    s.maintain(51 * P + G + 0.001)
    assert not f.exists() and 50 not in s.keys.pairs and 50 not in s.keyring.replay.epochs
    with pytest.raises(UnknownEpoch, match="deleted after its grace period"):
        peel(s.keyring, pkt, slots=4, payload_len=64, ad=b"run-A")
    with pytest.raises(UnknownEpoch, match="no onion key for epoch 99"):
        s.keys.get(99)


def test_restart_keeps_keys_and_replay_tags_and_prunes_a_stale_cache(tmp_path):
    s = OnionKeyStore(tmp_path, P, G)
    s.maintain(7 * P)
    pkt = _packet(s, 7)
    peel(s.keyring, pkt, slots=4, payload_len=64, ad=b"run-A")
    pub7 = s.pair(7).public
    s.close()
    again = OnionKeyStore(tmp_path, P, G)  # a restart: same state directory
    again.maintain(7 * P + 1)
    assert again.pair(7).public == pub7
    with pytest.raises(ReplayedMessage):
        peel(again.keyring, pkt, slots=4, payload_len=64, ad=b"run-A")
    again.close()
    # down through the whole grace: on the next start epoch 7's key and tags are deleted at once
    late = OnionKeyStore(tmp_path, P, G)
    late.maintain(9 * P)
    assert 7 not in late.keys.pairs and 7 not in late.keyring.replay.epochs
    with pytest.raises(UnknownEpoch, match="deleted"):
        peel(late.keyring, pkt, slots=4, payload_len=64, ad=b"run-A")


def test_bad_schedules_and_digest():
    with pytest.raises(ValueError, match="positive"):
        OnionKeyStore("/nonexistent-not-used", 0.0)
    with pytest.raises(ValueError, match="grace"):
        OnionKeyStore("/nonexistent-not-used", 10.0, 11.0)
    assert epoch_at(199.9, 100.0) == 1 and epoch_at(200.0, 100.0) == 2
    a = keys_digest([(2, b"b" * 32), (1, b"a" * 32)])
    assert (
        a
        == keys_digest([(1, b"a" * 32), (2, b"b" * 32)])
        != keys_digest([(1, b"a" * 32), (2, b"c" * 32)])
    )
