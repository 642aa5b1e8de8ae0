"""A node's configuration and the transport constants the server and the channels agree on."""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

MiB = 1024 * 1024
DEFAULT_MAX_MESSAGE = 128 * MiB
ENVELOPE_SLACK = 64 * 1024  # room for the envelope's header fields around the payload
PEER_SERVICE = "hushnet.v1.Peer"
#: keepalive pings a node's *server* sends on each inbound connection.  Every link's dialing side pings on
#: its own (``NodeConfig.keepalive_s``) and sees a dead neighbour by that; the server's pings only free the
#: connections of clients that vanished silently, so they can be rare.  At 20 s on both sides a connection
#: carried two pings every 20 s: measured 10 µs of CPU per connection per second (896 mutual-TLS connections
#: in one process), 0.23 of a core for the 22 528 connections of a 2048-node hypercube.
SERVER_KEEPALIVE_S = 120.0


@dataclass
class NodeConfig:
    """Everything a node needs; paths are relative to the working directory."""

    state_dir: pathlib.Path
    listen: str = "127.0.0.1:0"
    bootstrap: str = "127.0.0.1:7400"
    token: str | None = None
    ca_file: pathlib.Path | None = None
    node_id: str | None = None
    advertise: str | None = None  # address published in the directory (default: listen address)
    max_message_bytes: int = DEFAULT_MAX_MESSAGE
    heartbeat_s: float = 3.0
    directory_refresh_s: float = 2.0
    probe_s: float = 2.0
    #: keepalive ping period on each channel to a neighbour: a connection that died silently (no FIN,
    #: e.g. a machine gone) leaves READY within this plus a 10 s ping timeout.  Hosts of many nodes
    #: stretch it with the probe period (see hushnet.net.host.NodeHost).
    keepalive_s: float = 20.0
    #: a healthy link whose channel is still connected (READY) gets a Health RPC at most this often; the
    #: probes in between only read the channel's state (no RPC). 0: every probe is an RPC.  Hosts of
    #: many nodes set it (see hushnet.net.host.NodeHost): their probe RPCs were most of their idle CPU.
    health_rpc_s: float = 0.0
    #: consecutive probe timeouts on a still-connected channel (no traffic from the neighbour meanwhile,
    #: this process's loop on time) before the link is called down: one timeout is a busy neighbour.
    #: Hosts of many nodes raise it (see hushnet.net.host.NodeHost): their loops are the busy ones.
    probe_misses: int = 2
    join_timeout_s: float | None = None  # None: retry forever
    max_backoff_s: float = 10.0
    builtin_handlers: bool = True
    #: refused/failed inbound messages are logged at most once per kind per this many seconds (with counts)
    log_interval_s: float = 10.0
    #: callables ``fn(node) -> object | None`` run before start (see :mod:`hushnet.net.plugins`)
    plugins: tuple = ()
    #: seconds a stopping node gives the Deliver/Control handlers already running to finish before its
    #: server cancels them (see :meth:`hushnet.net.node.Node.stop`); a run's handler commits in milliseconds
    stop_grace_s: float = 1.0
