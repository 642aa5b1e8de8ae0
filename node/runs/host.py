"""A node process that serves runs: ``hushnet node serve`` with the run service installed.

The network layer (:mod:`node.net`) has no plugin hook, and this package must not edit it, so the
run service is wired in here: :func:`serve` mirrors :func:`node.net.node.serve` but installs
:class:`~node.runs.service.RunService` on the :class:`~node.net.node.Node` before it starts, and
:func:`node.runs.cli.register` points the ``hushnet node serve`` sub-command (which ``hushnet up``
and the local cluster spawn) at :func:`cmd_node_serve` here.  Everything else — the options, the
config, the exit codes — is the network layer's own.

If ``node.net`` later grows a start hook (e.g. ``NodeConfig.plugins``), this module shrinks to
``install(node)``.
"""
from __future__ import annotations

import asyncio
import signal

from node.net.node import Node, NodeConfig, NodeError, log
from node.runs.service import RunService


async def serve(config: NodeConfig, stop: asyncio.Event | None = None) -> None:
    """Start a node with the run service and run it until ``stop`` is set (default: SIGINT/SIGTERM)."""
    if stop is None:
        stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    node = Node(config)
    service = RunService(node).install()
    start = loop.create_task(node.start())
    waiter = loop.create_task(stop.wait())
    done, _ = await asyncio.wait({start, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if start not in done:
        start.cancel()
        try:
            await start
        except (asyncio.CancelledError, NodeError):
            pass
        return
    waiter.cancel()
    start.result()
    await stop.wait()
    service.close()
    await node.stop()


def run(config: NodeConfig) -> int:
    import uvloop

    try:
        uvloop.run(serve(config))
    except NodeError as exc:
        log.error("%s", exc, extra={"event": "fatal"})
        return 1
    return 0


def cmd_node_serve(args) -> int:
    """``hushnet node serve`` with runs: the network layer's own handler, with :func:`run` swapped in."""
    import node.net.node as netnode
    from node import netcli

    original = netnode.run
    netnode.run = run  # cmd_node_serve imports `run` from node.net.node at call time
    try:
        return netcli.cmd_node_serve(args)
    finally:
        netnode.run = original
