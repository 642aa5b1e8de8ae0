"""A node process for the shutdown-order tests (``python -m helpers.stopping``): one node, or a host of
several, each with the :class:`SlowStore` plugin, run through the same entry points as
``hushnet node serve`` (:func:`hushnet.net.node.run`, :func:`hushnet.net.host.run_host`), so SIGTERM
takes the real signal path.

Why a plugin of its own: it shows the order a stopping node closes things in.  Its first envelope is held
until the node has begun to stop, then committed to the plugin's own SQLite file; a node that closes its
plugins before its server stops accepting answers it with a closed database.
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import sqlite3
import sys

SLOW_PROTOCOL = "test.slow"
DB_FILE = "slow.sqlite"
HELD_MARK = "held"
RELEASE_MARK = "release"


class SlowStore:
    """``test.slow``: commits each envelope's payload to ``slow.sqlite`` in the node's state directory.

    A payload starting with ``hold`` is held (the file ``held`` is written so the test knows it is in
    flight) until the node is stopping and the test wrote the file ``release`` (it does once a Deliver
    sent during the stop was answered), then committed like the others."""

    protocol = SLOW_PROTOCOL

    def __init__(self, node) -> None:
        self.node = node
        self.db: sqlite3.Connection | None = None

    def _open(self) -> sqlite3.Connection:
        if self.db is None:
            self.db = sqlite3.connect(self.node.state_dir / DB_FILE)
            self.db.execute("CREATE TABLE IF NOT EXISTS got (payload BLOB PRIMARY KEY)")
            self.db.commit()
        return self.db

    async def handle(self, envelope) -> None:
        db = self._open()
        payload = bytes(envelope.payload)
        if payload.startswith(b"hold"):
            (self.node.state_dir / HELD_MARK).write_text("in flight")
            while not (self.node.stopping and (self.node.state_dir / RELEASE_MARK).exists()):
                await asyncio.sleep(0.01)
        db.execute("INSERT OR IGNORE INTO got VALUES (?)", (payload,))
        db.commit()
        return None

    def close(self) -> None:
        if self.db is not None:
            self.db.close()


def plugin(node) -> SlowStore:
    handler = SlowStore(node)
    node.register_handler(handler)
    return handler


def committed(state_dir: pathlib.Path) -> set[bytes]:
    """The payloads the plugin of the node in ``state_dir`` committed."""
    db = sqlite3.connect(state_dir / DB_FILE)
    try:
        return {bytes(r[0]) for r in db.execute("SELECT payload FROM got")}
    finally:
        db.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--ca", type=pathlib.Path, required=True)
    p.add_argument("--state-dir", type=pathlib.Path, action="append", required=True)
    p.add_argument("--node-id", action="append", required=True)
    args = p.parse_args(argv)
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from hushnet.net.host import hosted_configs, run_host
    from hushnet.net.node import NodeConfig, run

    common = dict(
        bootstrap=args.bootstrap,
        token="tok",
        ca_file=args.ca,
        probe_s=0.3,
        directory_refresh_s=0.3,
        plugins=(plugin,),
        stop_grace_s=60.0,  # the held handler waits for the test, whatever the machine's load
    )
    if len(args.state_dir) == 1:
        return run(NodeConfig(args.state_dir[0], "127.0.0.1:0", node_id=args.node_id[0], **common))
    return run_host(hosted_configs(args.state_dir, "127.0.0.1:0", args.node_id, **common))


if __name__ == "__main__":
    sys.exit(main())
