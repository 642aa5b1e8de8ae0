"""A node stopped with SIGTERM stops accepting before it closes anything (real processes, real TLS).

The order a stopping node keeps: its server stops accepting (in-flight handlers get a grace period to
finish), then its services and plugins close, then its stores.  So a Deliver racing the stop either
succeeds — and what its handler committed is on disk after the process exits — or is answered
UNAVAILABLE; never INTERNAL from a handler that found its store closed under it.  Both process entry
points of ``hushnet node serve`` are covered: one node (:func:`hushnet.net.node.run`) and a host of
several (:func:`hushnet.net.host.run_host`).
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal
import subprocess
import sys
import time

import grpc
import pytest
import uvloop
from helpers.net import inprocess_bootstrap
from helpers.stopping import HELD_MARK, RELEASE_MARK, SLOW_PROTOCOL, committed

from hushnet.net.node import Node, NodeConfig
from hushnet.net.wire import encode_envelope
from hushnet.v1 import peer_pb2 as ppb

TESTS = pathlib.Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(120)


async def _bootstrap(tmp: pathlib.Path, spec: str):
    return await inprocess_bootstrap(tmp, spec)


async def _until(predicate, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("hosted", [False, True], ids=["node", "host"])
def test_deliver_racing_sigterm_succeeds_durably_or_is_unavailable(
    tmp_path: pathlib.Path, hosted: bool
) -> None:
    receivers = ["n1", "n2"] if hosted else ["n1"]

    async def go() -> None:
        addr, stop, btask = await _bootstrap(tmp_path, f"complete:{1 + len(receivers)}")
        argv = [sys.executable, "-m", "helpers.stopping", "--bootstrap", addr]
        argv += ["--ca", str(tmp_path / "b" / "ca.pem")]
        for r in receivers:
            argv += ["--state-dir", str(tmp_path / r), "--node-id", r]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        }
        log = open(tmp_path / "receiver.log", "wb")
        proc = subprocess.Popen(argv, cwd=TESTS, env=env, stdout=log, stderr=subprocess.STDOUT)
        sender = Node(
            NodeConfig(
                tmp_path / "n0",
                "127.0.0.1:0",
                addr,
                "tok",
                tmp_path / "b" / "ca.pem",
                node_id="n0",
                probe_s=0.3,
                directory_refresh_s=0.3,
            )
        )
        try:
            await sender.start()
            await _until(
                lambda: "n1" in sender.links and sender.links["n1"].healthy, 60, "n1 healthy"
            )
            # one Deliver in flight: its handler holds it until the node has begun to stop
            hold = asyncio.create_task(
                sender.send("n1", b"hold", protocol=SLOW_PROTOCOL, timeout=30)
            )
            await _until(lambda: (tmp_path / "n1" / HELD_MARK).exists(), 30, "the held Deliver")
            proc.send_signal(signal.SIGTERM)
            # more Delivers while it stops, one RPC at a time and no retries: each answer as it is.
            # ``draining``: answered while the held handler still ran (the node's own answers); ``after``:
            # once it was let go — the server then shuts down, and a stream that reaches it after that is
            # cancelled by gRPC core itself (CANCELLED; node.send retries it like UNAVAILABLE)
            link, draining, after, ok = sender.links["n1"], [], [], []
            end = time.monotonic() + 30
            while proc.poll() is None and time.monotonic() < end:
                payload = b"after-%d" % (len(draining) + len(after))
                seq = sender.next_seq(SLOW_PROTOCOL, "", "n1")
                wire = encode_envelope(SLOW_PROTOCOL, "", seq, payload, "n0", "n1")
                answers = after if (tmp_path / "n1" / RELEASE_MARK).exists() else draining
                try:
                    await link.deliver(wire, timeout=5.0)
                    answers.append((grpc.StatusCode.OK, ""))
                    ok.append(payload)
                except grpc.aio.AioRpcError as exc:
                    answers.append((exc.code(), exc.details() or ""))
                    if "stopping" in (exc.details() or "") and answers is draining:
                        # refused by the stopping node while the held handler still runs; so is any other
                        # RPC (a neighbour's probe sees the link go) — then let the handler finish
                        with pytest.raises(grpc.aio.AioRpcError) as probe:
                            await link.stub.Health(ppb.HealthRequest(), timeout=5.0)
                        draining.append((probe.value.code(), probe.value.details() or ""))
                        (tmp_path / "n1" / RELEASE_MARK).write_text("go")
                    await asyncio.sleep(0.005)
            try:
                ack = await hold
            except Exception as exc:  # noqa: BLE001 - reported with the other answers below
                ack = exc
            rc = await asyncio.to_thread(proc.wait, 30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
            await sender.stop(leave=False)
            stop.set()
            await btask
        out = (tmp_path / "receiver.log").read_text(errors="replace")
        assert not isinstance(ack, Exception) and ack.accepted, (
            f"held Deliver: {ack!r}\n{out[-3000:]}"
        )
        # while the held handler ran, every Deliver was served or refused by the node itself, clearly
        refused = [(c.name, d) for c, d in draining if c != grpc.StatusCode.OK]
        assert refused, draining
        assert all(c == "UNAVAILABLE" and "node n1 stopping" in d for c, d in refused), refused
        assert any("Health not served" in d for _, d in refused), refused
        late = {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}
        assert not [(c.name, d) for c, d in after if c not in late], after
        assert rc == 0, out[-3000:]
        # what was acknowledged was committed, and is on disk after the process exited
        assert {b"hold", *ok} <= committed(tmp_path / "n1")
        assert "Traceback" not in out, out[-3000:]

    uvloop.run(go())


def test_a_closed_run_service_answers_unavailable_and_reopens_nothing(
    tmp_path: pathlib.Path,
) -> None:
    """The run service closed under a serving node (the order a caller of ``RunService.close`` may still
    use): a run's Deliver is refused UNAVAILABLE "node stopping", not INTERNAL with a traceback, and
    neither the ledger nor the run store is opened again behind the close."""
    from hushnet.net.errors import NodeStopping
    from hushnet.runs.run_store import STORE_FILE
    from hushnet.runs.service import LEDGER_FILE, RUN_PROTOCOL, RunService

    async def go() -> None:
        addr, stop, btask = await _bootstrap(tmp_path, "complete:2")
        nodes = [
            Node(
                NodeConfig(
                    tmp_path / f"n{i}",
                    "127.0.0.1:0",
                    addr,
                    "tok",
                    tmp_path / "b" / "ca.pem",
                    node_id=f"n{i}",
                    probe_s=0.3,
                    directory_refresh_s=0.3,
                )
            )
            for i in range(2)
        ]
        svc = RunService(nodes[1]).install()
        try:
            await asyncio.gather(*(nd.start() for nd in nodes))
            await _until(lambda: "n1" in nodes[0].links and nodes[0].links["n1"].healthy, 60, "n1")
            svc.close()
            svc.close()  # once is enough; twice is harmless
            for what in ("ledger", "store"):
                with pytest.raises(NodeStopping, match="n1 stopping"):
                    getattr(svc, what)
            wire = encode_envelope(RUN_PROTOCOL, "r1", 1, b"{}", "n0", "n1")
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await nodes[0].links["n1"].deliver(wire, timeout=10.0)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value.details()
            assert "node n1 stopping" in info.value.details()
        finally:
            for nd in nodes:
                await nd.stop(leave=False)
            stop.set()
            await btask
        assert not (tmp_path / "n1" / LEDGER_FILE).exists()
        assert not (tmp_path / "n1" / STORE_FILE).exists()

    uvloop.run(go())


def test_a_host_stopped_while_starting_closes_the_nodes_it_was_starting(
    tmp_path: pathlib.Path,
) -> None:
    """SIGTERM while a host still starts: every node it had begun (store open, maybe its server) is
    stopped too — before, only nodes whose start had finished were, and the others' stores and servers
    outlived the host's event loop ("Server.__del__ … Event loop is closed")."""
    import socket

    from hushnet.net.host import hosted_configs, serve_host

    async def go():
        addr, bstop, btask = await _bootstrap(tmp_path, "complete:2")
        with socket.socket() as s:  # a bootstrap address nobody answers: n1's join retries forever
            s.bind(("127.0.0.1", 0))
            dead = f"127.0.0.1:{s.getsockname()[1]}"
        common = dict(token="tok", ca_file=tmp_path / "b" / "ca.pem", probe_s=0.3)
        configs = hosted_configs([tmp_path / "n0"], "127.0.0.1:0", ["n0"], bootstrap=addr, **common)
        configs += hosted_configs(
            [tmp_path / "n1"], "127.0.0.1:0", ["n1"], bootstrap=dead, **common
        )
        stop = asyncio.Event()
        hosting = asyncio.create_task(serve_host(configs, stop=stop))
        try:
            # n1 has its store (opened on first use; the start counted its incarnation) and is joining (and
            # stays so); n0 may or may not have started
            await _until(lambda: (tmp_path / "n1" / "incarnation").exists(), 30, "n1's store")
            stop.set()
            host = await hosting
        finally:
            bstop.set()
            await btask
        for e in host.entries:
            assert e.node.stopping and e.node.store is None, e.config.state_dir
            assert e.node._lock_fd is None, e.config.state_dir  # noqa: SLF001 - the state dir is free

    # serve_host installs SIGINT/SIGTERM handlers on its loop (a host process's): give this process its own back
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        uvloop.run(go())
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_a_call_gRPC_holds_does_not_keep_a_stopping_node_for_its_grace(
    tmp_path: pathlib.Path,
) -> None:
    """Once a stopping node's own handlers have finished, gRPC's server gets a short tail, not what is left
    of the node's grace: what is still open in gRPC then is no handler of the node's (those refuse at
    once) but a call gRPC holds — one whose request never came, or one its aio server matched while its
    serving loop was exiting (``_server_main_loop`` cancels its pending request futures on shutdown, and a
    call core matched to one of them is never handed to a handler).  It used to last until the grace ran
    out (60 s in the shutdown-order helper): in CI a Deliver sent while a node stopped timed out after 5 s
    (DEADLINE_EXCEEDED) instead of being answered UNAVAILABLE or CANCELLED.  Here the held call is a
    Deliver whose request is never sent (a client that opens the stream and goes quiet)."""

    async def go() -> None:
        from test_net_inprocess import _network, _shutdown

        nodes, stop, task = await _network(tmp_path, "complete:2", 2)
        try:
            n0, n1 = nodes
            n1.config.stop_grace_s = 60.0
            quiet = n0.links["n1"].channel.stream_unary(
                "/hushnet.v1.Peer/Deliver", response_deserializer=lambda b: b
            )
            requests: asyncio.Queue = asyncio.Queue()

            async def never():  # the request stream stays open and sends nothing
                yield await requests.get()

            call = quiet(never(), timeout=30.0)
            await asyncio.sleep(0.5)  # the call reached n1's server (headers only)
            await n1.stop(leave=False)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call
            # gRPC cancelled it when n1's server stopped (before: it ran into its own 30 s deadline)
            assert err.value.code() != grpc.StatusCode.DEADLINE_EXCEEDED, err.value
        finally:
            await _shutdown(nodes, stop, task)

    uvloop.run(go())
