"""``hushnet`` network commands: bootstrap serve, node serve, up, down, status.

Registered into the top-level parser by :mod:`hushnet.cli`. Every command returns an exit code;
user errors print one clear line (no traceback).
"""

from __future__ import annotations

import argparse
import json
import logging
import pathlib
import signal
import sys
import time
from typing import Any

DEFAULT_BOOTSTRAP = "127.0.0.1:7400"


def _add_logging(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--log-json", action="store_true", help="structured logs: one JSON object per line"
    )
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR (default INFO)")


def register(subparsers) -> None:
    """Add the network sub-commands to the top-level ``hushnet`` parser."""
    # bootstrap serve
    bp = subparsers.add_parser(
        "bootstrap",
        help="the bootstrap service (CA, membership, topology)",
        description="Bootstrap service commands.",
    )
    bsub = bp.add_subparsers(dest="bootstrap_command", metavar="COMMAND")
    bp.set_defaults(handler=lambda a: (bp.print_help(), 2)[1])
    bs = bsub.add_parser(
        "serve",
        help="run the bootstrap service",
        description="Run the bootstrap: creates the CA, operator certificate and join token in "
        "--state-dir on first start, then admits nodes.",
    )
    bs.add_argument(
        "--state-dir", required=True, type=pathlib.Path, help="bootstrap state directory"
    )
    bs.add_argument(
        "--listen",
        default=DEFAULT_BOOTSTRAP,
        help=f"HOST:PORT to serve on (default {DEFAULT_BOOTSTRAP})",
    )
    bs.add_argument(
        "--topology",
        help="graph SPEC (required on first start), e.g. ring:8, hypercube:3, "
        "grid:2x4, er:N:P:SEED, regular:N:K:SEED, geometric:N:R:SEED, edgelist:PATH",
    )
    bs.add_argument(
        "--token", help="join token (default: keep the stored one, or create a random one)"
    )
    bs.add_argument(
        "--lease", type=float, default=15.0, help="membership lease in seconds (default 15)"
    )
    bs.add_argument(
        "--onion-epoch",
        type=float,
        default=86400.0,
        help="onion-key rotation period in seconds, network wide (default one day; 0: no rotation)",
    )
    bs.add_argument(
        "--onion-grace",
        type=float,
        default=None,
        help="seconds a node keeps an onion key after its epoch (default: one period; at most one period)",
    )
    _add_logging(bs)
    bs.set_defaults(handler=cmd_bootstrap_serve)

    # node serve
    np_ = subparsers.add_parser("node", help="a hushnet node", description="Node commands.")
    nsub = np_.add_subparsers(dest="node_command", metavar="COMMAND")
    np_.set_defaults(handler=lambda a: (np_.print_help(), 2)[1])
    ns = nsub.add_parser(
        "serve",
        help="run a node (or host many in this process)",
        description="Join the network through the bootstrap (or re-join with the identity stored "
        "in --state-dir) and serve the peer API over mutual TLS. Several --state-dir "
        "(or --count N with one base directory) host several complete nodes in this "
        "process, each with its own identity, state and port.",
    )
    ns.add_argument(
        "--state-dir",
        required=True,
        type=pathlib.Path,
        action="append",
        help="node state directory (keys, certificate); repeat to host several nodes",
    )
    ns.add_argument(
        "--count",
        type=int,
        default=None,
        help="host COUNT nodes in BASE/node-000, BASE/node-001, ... (one --state-dir BASE)",
    )
    ns.add_argument(
        "--listen",
        required=True,
        help="HOST:PORT to serve on, e.g. 127.0.0.2:7500; with several nodes node i gets PORT+i "
        "(PORT 0: a free port each)",
    )
    ns.add_argument(
        "--advertise",
        help="HOST:PORT published in the directory, what peers dial (default: --listen); with "
        "several nodes node i is published at PORT+i (a bare HOST: each node's listen port)",
    )
    ns.add_argument(
        "--bootstrap",
        default=DEFAULT_BOOTSTRAP,
        help=f"bootstrap HOST:PORT (default {DEFAULT_BOOTSTRAP})",
    )
    ns.add_argument(
        "--ca",
        type=pathlib.Path,
        help="network CA certificate (the bootstrap's ca.pem); needed on first start",
    )
    tok = ns.add_mutually_exclusive_group()
    tok.add_argument("--token", help="join token")
    tok.add_argument("--token-file", type=pathlib.Path, help="file holding the join token")
    ns.add_argument(
        "--node-id",
        action="append",
        help="requested node id (default: assigned by the bootstrap, n<vertex>); with several nodes "
        "repeat it once per node, in --state-dir order",
    )
    ns.add_argument(
        "--max-message-mb",
        type=float,
        default=128.0,
        help="largest envelope payload accepted or sent, in MiB (default 128)",
    )
    ns.add_argument(
        "--join-timeout",
        type=float,
        default=None,
        help="give up joining after this many seconds (default: retry forever with backoff)",
    )
    ns.add_argument(
        "--max-nodes",
        type=int,
        default=None,
        help="refuse to host more nodes than this in the process (default: what descriptors and "
        "memory allow)",
    )
    ns.add_argument(
        "--fds-per-node",
        type=int,
        default=None,
        help="file descriptors reserved per hosted node (default 40: degree up to ~12)",
    )
    ns.add_argument(
        "--min-free-mb",
        type=float,
        default=None,
        help="refuse a new node when less memory than this would stay available (default 512)",
    )
    ns.add_argument(
        "--start-concurrency",
        type=int,
        default=16,
        help="hosted nodes joining at the same time (default 16)",
    )
    _add_logging(ns)
    ns.set_defaults(handler=cmd_node_serve)

    # up
    up = subparsers.add_parser(
        "up",
        help="start a local network (bootstrap + N nodes, K per process)",
        description="Start a bootstrap and N nodes (one process per node on distinct 127.0.0.x "
        "addresses, or K nodes per process on 127.0.0.1:PORT+i), "
        "wait until every node is healthy and connected to its neighbours, print "
        "a table, and stay in the foreground until Ctrl-C or "
        "'hushnet down --state-dir DIR'. Crashed processes are restarted.",
    )
    up.add_argument("--nodes", type=int, required=True, help="number of nodes")
    up.add_argument(
        "--per-process",
        type=int,
        default=None,
        help="nodes hosted by each OS process (default: chosen from cores, memory and the "
        "open-file limit; 1 for small networks)",
    )
    up.add_argument(
        "--topology", help="graph SPEC with the same number of vertices (default complete:N)"
    )
    up.add_argument(
        "--state-dir", required=True, type=pathlib.Path, help="directory for all state and logs"
    )
    up.add_argument(
        "--timeout", type=float, default=120.0, help="seconds to wait for health (default 120)"
    )
    up.add_argument("--no-restart", action="store_true", help="do not restart processes that exit")
    up.add_argument(
        "--max-message-mb", type=float, default=None, help="node message limit in MiB (default 128)"
    )
    up.add_argument(
        "--json", action="store_true", help="print the status as JSON instead of a table"
    )
    _add_logging(up)
    up.set_defaults(handler=cmd_up)

    # down
    down = subparsers.add_parser(
        "down",
        help="stop a network started with 'hushnet up'",
        description="Stop the network whose state lives in --state-dir.",
    )
    down.add_argument("--state-dir", required=True, type=pathlib.Path)
    down.add_argument("--timeout", type=float, default=30.0)
    down.set_defaults(handler=cmd_down)

    # status
    st = subparsers.add_parser(
        "status",
        help="show the nodes of a network",
        description="Query the bootstrap directory and every node's Status RPC with the "
        "operator certificate. --state-dir is a 'hushnet up' directory or a "
        "bootstrap state directory.",
    )
    st.add_argument("--state-dir", required=True, type=pathlib.Path)
    st.add_argument("--bootstrap", help="bootstrap HOST:PORT (default: from the state directory)")
    st.add_argument(
        "--json",
        action="store_true",
        help="JSON with a 'nodes' list (id, address, healthy, neighbors, ...)",
    )
    st.add_argument("--timeout", type=float, default=3.0)
    st.set_defaults(handler=cmd_status)


def _setup(args, identity: str) -> None:
    from hushnet.net.logs import setup_logging

    setup_logging(
        json_lines=getattr(args, "log_json", False),
        level=getattr(args, "log_level", "INFO"),
        identity=identity,
    )


def _fail(message: str) -> int:
    print(f"hushnet: error: {message}", file=sys.stderr)
    return 1


def cmd_bootstrap_serve(args) -> int:
    import uvloop

    from hushnet.bootstrap.service import BootstrapConfig, BootstrapError, serve

    _setup(args, "bootstrap")
    config = BootstrapConfig(
        state_dir=args.state_dir,
        listen=args.listen,
        topology=args.topology,
        token=args.token,
        lease_seconds=args.lease,
        onion_epoch_seconds=args.onion_epoch,
        onion_grace_seconds=args.onion_grace,
    )
    try:
        uvloop.run(serve(config))
    except BootstrapError as exc:
        logging.getLogger("hushnet.bootstrap").error("%s", exc, extra={"event": "fatal"})
        return 1
    return 0


def cmd_node_serve(args) -> int:
    from hushnet.net.node import MiB, NodeConfig, run
    from hushnet.net.plugins import load_plugins

    dirs, ids = list(args.state_dir), list(args.node_id or [])
    if args.count is not None:
        if args.count < 1:
            return _fail("--count must be at least 1")
        if len(dirs) != 1:
            return _fail(
                "--count takes exactly one --state-dir (the base directory of the hosted nodes)"
            )
        dirs = [dirs[0] / f"node-{i:03d}" for i in range(args.count)]
    hosted = len(dirs) > 1 or args.count is not None
    if ids and len(ids) != len(dirs):
        return _fail(f"{len(ids)} --node-id for {len(dirs)} nodes: give one per node or none")
    _setup(args, ids[0] if len(dirs) == 1 and ids else ("host" if hosted else "node"))
    token = args.token
    if args.token_file is not None:
        try:
            token = args.token_file.read_text().strip()
        except OSError as exc:
            return _fail(f"cannot read --token-file: {exc}")
    common = dict(
        bootstrap=args.bootstrap,
        token=token,
        ca_file=args.ca,
        max_message_bytes=int(args.max_message_mb * MiB),
        join_timeout_s=args.join_timeout,
        plugins=load_plugins(),
    )
    if not hosted:
        config = NodeConfig(
            state_dir=dirs[0],
            listen=args.listen,
            advertise=args.advertise,
            node_id=ids[0] if ids else None,
            **common,
        )
        return run(config)
    from hushnet.net.host import HostLimits, hosted_configs, run_host

    try:
        limits = HostLimits(
            **{
                k: v
                for k, v in (
                    ("max_nodes", args.max_nodes),
                    ("fds_per_node", args.fds_per_node),
                    ("min_free_mb", args.min_free_mb),
                )
                if v is not None
            }
        )
        configs = hosted_configs(dirs, args.listen, ids or None, advertise=args.advertise, **common)
        if args.start_concurrency < 1:
            raise ValueError("--start-concurrency must be at least 1")
    except ValueError as exc:
        return _fail(str(exc))
    return run_host(configs, limits=limits, concurrency=args.start_concurrency)


def _check_topology(nodes: int, spec: str | None) -> str:
    from hushnet.privacy.graphs import parse_graph

    spec = spec or f"complete:{nodes}"
    graph = parse_graph(spec)
    if graph.n != nodes:
        raise ValueError(f"topology {spec} has {graph.n} vertices but --nodes is {nodes}")
    return spec


def cmd_up(args) -> int:
    from hushnet.net.cluster import LocalCluster
    from hushnet.net.operator import format_table

    _setup(args, "up")
    if args.nodes < 1:
        return _fail("--nodes must be at least 1")
    try:
        spec = _check_topology(args.nodes, args.topology)
    except (ValueError, OSError) as exc:
        return _fail(str(exc))
    stop: dict[str, Any] = {"flag": False, "cluster": None}

    def on_signal(signum, frame):
        if stop["flag"] and stop["cluster"] is not None:
            # a second Ctrl-C / SIGTERM while the network stops: pass it on, so each host process exits
            # at once instead of finishing its orderly stop (hushnet.net.host: a host's second signal)
            stop["cluster"].signal_processes(signal.SIGTERM)
        stop["flag"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if args.per_process is not None and args.per_process < 1:
        return _fail("--per-process must be at least 1")
    from hushnet.net.host import default_per_process

    per_process = args.per_process or default_per_process(args.nodes)
    cluster = LocalCluster(
        args.state_dir,
        args.nodes,
        spec,
        log_json=args.log_json,
        restart=not args.no_restart,
        max_message_mb=args.max_message_mb,
        supervisor=True,
        per_process=per_process,
    )
    stop["cluster"] = cluster
    try:
        cluster.start()
        doc = cluster.wait_healthy(timeout=args.timeout, should_stop=lambda: stop["flag"])
        print(json.dumps(doc, indent=2) if args.json else format_table(doc), flush=True)
        print(
            f"network up: {args.nodes} nodes, logs in {cluster.state_dir / 'logs'}. "
            f"Stop with Ctrl-C or: hushnet down --state-dir {args.state_dir}",
            flush=True,
        )
        while not stop["flag"]:
            cluster.poll()
            time.sleep(0.3)
        print("stopping ...", flush=True)
        return 0
    except InterruptedError:
        print("stopping ...", flush=True)
        return 130
    except (RuntimeError, TimeoutError, ValueError) as exc:
        return _fail(str(exc))
    finally:
        cluster.stop()


def cmd_down(args) -> int:
    from hushnet.net.cluster import stop_recorded

    try:
        print(stop_recorded(args.state_dir, timeout=args.timeout))
    except (RuntimeError, OSError) as exc:
        return _fail(str(exc))
    return 0


def cmd_status(args) -> int:
    import grpc
    import uvloop

    from hushnet.net.operator import Operator, OperatorCredentials, OperatorError, format_table

    try:
        creds = OperatorCredentials.from_state_dir(args.state_dir, bootstrap=args.bootstrap)
    except (OperatorError, OSError, ValueError, KeyError) as exc:
        return _fail(str(exc))

    async def go() -> dict:
        async with Operator(creds) as op:
            return await op.network_status(timeout=args.timeout)

    try:
        doc = uvloop.run(go())
    except grpc.aio.AioRpcError as exc:
        return _fail(f"bootstrap {creds.bootstrap} unreachable: {exc.code().name}: {exc.details()}")
    print(json.dumps(doc, indent=2) if args.json else format_table(doc))
    return 0 if doc["healthy"] else 3
