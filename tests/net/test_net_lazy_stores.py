"""A node's SQLite stores open on first use (issue 12: 2048 hosted nodes healthy in ≤ 60 s).

A start wrote nothing into ``node.sqlite`` but the incarnation counter, and no onion packet into the onion
replay cache, yet created both files in WAL mode: ~4 ms of CPU a node in a host's worker threads.  Now the
counter is a file of its own, ``node.sqlite`` opens at its first read or write, and the replay cache at the
first packet — and everything a restart needs is still found."""

from __future__ import annotations

import asyncio
import json
import pathlib
import sqlite3

import pytest
import uvloop

from hushnet.bootstrap.service import BootstrapConfig
from hushnet.bootstrap.service import serve as serve_bootstrap
from hushnet.crypto.keys import KeyDirectory
from hushnet.crypto.onion import build_packet, peel
from hushnet.engine.errors import ReplayedMessage
from hushnet.net.node import Node, NodeConfig
from hushnet.net.onion_keys import OnionKeyStore
from hushnet.net.store import INCARNATION_FILE, NodeStore

P, G = 100.0, 40.0  # onion-key period and grace, seconds (times are explicit)
REPLAY = "replay-onion-epochs.sqlite"


def test_node_store_counts_incarnations_in_a_file_and_opens_sqlite_on_first_use(tmp_path):
    path = tmp_path / "node.sqlite"
    st = NodeStore(path)
    assert st.next_incarnation() == 1
    assert not path.exists() and not st.opened  # a start alone creates no SQLite file
    st.close()
    st = NodeStore(path)
    assert st.next_incarnation() == 2 and not path.exists()
    st.put("k", {"v": 1})  # the first write opens (creates) it
    assert st.opened and path.exists() and st.get("k") == {"v": 1}
    st.close()
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        st.get("k")
    again = NodeStore(path)
    assert again.next_incarnation() == 3 and again.get("k") == {"v": 1}
    again.close()


def test_an_older_state_directory_keeps_counting_from_its_sqlite_counter(tmp_path):
    path = tmp_path / "node.sqlite"
    db = sqlite3.connect(path)  # what a node before this change left: the counter in kv only
    db.execute("CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    db.execute("INSERT INTO kv VALUES ('incarnation', '7')")
    db.commit()
    db.close()
    st = NodeStore(path)
    assert st.next_incarnation() == 8  # never a number an earlier start used
    st.close()
    assert (tmp_path / INCARNATION_FILE).read_text().strip() == "8"
    (tmp_path / INCARNATION_FILE).write_text("x\n")
    with pytest.raises(ValueError, match="does not hold an incarnation number"):
        NodeStore(path).next_incarnation()


def _packet(store, epoch):
    d = KeyDirectory(epoch, {1: store.pair(epoch).public})
    return build_packet([(1, d.public(1))], b"token", epoch=epoch, slots=4, payload_len=64, ad=b"r")


def test_onion_replay_cache_opens_at_the_first_packet_and_survives_a_restart(tmp_path):
    s = OnionKeyStore(tmp_path, P, G)
    s.maintain(50 * P + 1)
    s.maintain(51 * P + 1)  # rotations before any packet: keys only
    assert not (tmp_path / REPLAY).exists() and not s.replay.opened
    pkt = _packet(s, 51)
    assert peel(s.keyring, pkt, slots=4, payload_len=64, ad=b"r").final
    # opened by the packet, with one tag set per epoch whose key is held
    assert (tmp_path / REPLAY).exists() and s.keyring.replay.epochs == [50, 51, 52]
    with pytest.raises(ReplayedMessage):
        peel(s.keyring, pkt, slots=4, payload_len=64, ad=b"r")
    s.close()
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        s.keyring.replay.seen(51, b"t")
    again = OnionKeyStore(tmp_path, P, G)  # a restart finds the file: opened at once, the tag held
    assert again.replay.opened
    again.maintain(51 * P + 2)
    with pytest.raises(ReplayedMessage):
        peel(again.keyring, pkt, slots=4, payload_len=64, ad=b"r")
    again.close()
    # down past epoch 51's grace: its key and its tags go at the first maintain after the restart
    late = OnionKeyStore(tmp_path, P, G)
    late.maintain(52 * P + G + 1)
    assert 51 not in late.keys.pairs and 51 not in late.keyring.replay.epochs
    late.close()


def test_a_key_deleted_before_the_first_packet_gets_no_tag_set(tmp_path):
    s = OnionKeyStore(tmp_path, P, G)
    s.maintain(50 * P + 1)
    s.maintain(51 * P + G + 1)  # epoch 50's key deleted; the cache never opened
    assert 50 not in s.keys.pairs and not s.replay.opened
    assert s.keyring.replay.epochs == [51, 52]  # opened now, in step with the keys held
    s.close()


async def _two_nodes(tmp: pathlib.Path):
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(
        serve_bootstrap(BootstrapConfig(tmp / "b", "127.0.0.1:0", "complete:2", "tok"), stop, ready)
    )
    await asyncio.wait(
        [task, asyncio.create_task(ready.wait())], return_when=asyncio.FIRST_COMPLETED
    )
    if task.done():
        task.result()
    addr = json.loads((tmp / "b" / "bootstrap.json").read_text())["address"]
    configs = [
        NodeConfig(
            tmp / f"n{i}",
            f"127.0.0.{40 + i}:0",
            addr,
            "tok",
            tmp / "b" / "ca.pem",
            node_id=f"n{i}",
            probe_s=0.3,
        )
        for i in range(2)
    ]
    return configs, stop, task


async def _healthy(nodes) -> None:
    for _ in range(300):
        if all(n.links and all(l.healthy for l in n.links.values()) for n in nodes):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("nodes not connected")


@pytest.mark.timeout(120)
def test_a_started_node_creates_its_stores_on_first_use_and_finds_them_after_a_restart(tmp_path):
    async def go():
        configs, stop, task = await _two_nodes(tmp_path)
        a, b = Node(configs[0]), Node(configs[1])
        try:
            await asyncio.gather(a.start(), b.start())
            await _healthy([a, b])
            assert a.onion_keys is not None and a.onion_keys.keys.pairs  # keys made and published
            for n in (a, b):
                assert not (n.state_dir / "node.sqlite").exists()
                assert not (n.state_dir / REPLAY).exists()
            first = a.incarnation
            await b.send("n0", b"hello", protocol="net.ping", run_id="r1")
            assert (a.state_dir / "node.sqlite").exists()  # the ping's inbox row opened it
            await a.stop(leave=False)
            a = Node(configs[0])
            await a.start()
            await _healthy([a, b])
            assert a.incarnation == first + 1  # counted on, never reused
            assert [r["sender"] for r in a.store.inbox("net.ping", "r1")] == ["n1"]
        finally:
            for n in (a, b):
                await n.stop()
            stop.set()
            await task

    uvloop.run(go())
