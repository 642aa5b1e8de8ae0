"""A node host stops promptly: all its nodes at once, their files closed off the event loop, within a
bound, and at once on a second signal (issue 12: hosts of 410 nodes did not stop within 15 s of SIGTERM).

Real TLS on loopback, an in-process bootstrap or a bootstrap process, real host processes for the signals.
No assertion on speed: each test asserts the structure of the stop (which thread closed the files, that a
stuck node does not hold the host, the exit code of a second signal); the timeouts only detect a hang.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import pathlib
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import uvloop
from helpers.net import REPO, inprocess_bootstrap
from test_net_host import _configs, _healthy, _start_bootstrap_process

from hushnet.net.host import NodeHost
from hushnet.net.store import NodeStore
from hushnet.privacy.ledger import Ledger
from hushnet.runs import service as runs_service
from hushnet.runs.run_store import RunStore

pytestmark = pytest.mark.timeout(180)


def test_a_hosts_nodes_close_their_files_in_worker_threads(
    tmp_path: pathlib.Path, monkeypatch
) -> None:
    """Every hosted node's SQLite files (its store, its ledger, its run store) are closed in a worker thread,
    never on the event loop.  Why: closing a WAL file checkpoints and fsyncs it; a 410-node host did that for
    each node in turn on its loop, so the last node stopped after all the others' disk writes (py-spy of a
    stopping host: the samples in ``sqlite3WalCheckpoint`` → ``fdatasync`` under ``RunService.close``)."""
    closed_in: dict[str, list[int]] = {"store": [], "ledger": [], "runs": []}
    for cls, what in ((NodeStore, "store"), (Ledger, "ledger"), (RunStore, "runs")):
        real = cls.close

        def close(self, _real=real, _what=what) -> None:
            closed_in[_what].append(threading.get_ident())
            _real(self)

        monkeypatch.setattr(cls, "close", close)

    async def go() -> None:
        addr, bstop, btask = await inprocess_bootstrap(tmp_path, "hypercube:3")
        ids = [f"n{i}" for i in range(8)]
        configs = [
            dataclasses.replace(c, plugins=(runs_service.install,))
            for c in _configs(tmp_path, addr, ids)
        ]
        host = NodeHost(configs)
        loop_thread = threading.get_ident()
        try:
            await host.start()
            await _healthy(host.running, 8)
            for e in host.entries:  # every file open, as after a run
                svc = e.installed[0]
                svc.ledger, svc.store  # noqa: B018 - opened on first use
                e.node.store.put("touched", 1)
            late = await asyncio.wait_for(host.stop(), 60)  # hang detector, not a speed bound
        finally:
            bstop.set()
            await btask
        for what, threads in closed_in.items():
            assert len(threads) == 8, (what, threads)
            assert loop_thread not in threads, f"a {what} file was closed on the event loop"
        assert late == 0
        for e in host.entries:
            assert e.node.store is None and e.node._lock_fd is None  # noqa: SLF001
        assert host.last_stop_s is not None

    uvloop.run(go())


class _Hang:
    """A plugin whose close never ends (a store stuck in its disk, say)."""

    def close(self) -> None:
        pass

    async def aclose(self) -> None:
        await asyncio.Event().wait()


def test_a_stuck_node_does_not_hold_its_hosts_stop(tmp_path: pathlib.Path, caplog) -> None:
    """The host's stop is bounded: a node whose stop never ends is abandoned after the host's stop timeout,
    named in one ``host_stopped`` line; the other nodes stopped (files closed, state directories free)."""

    async def go() -> None:
        addr, bstop, btask = await inprocess_bootstrap(tmp_path, "complete:4")
        ids = [f"n{i}" for i in range(4)]
        configs = _configs(tmp_path, addr, ids)
        configs[2] = dataclasses.replace(configs[2], plugins=(lambda node: _Hang(),))
        # long enough for the three others to stop on a loaded machine; only n2 may be late
        host = NodeHost(configs, stop_timeout_s=15.0)
        try:
            await host.start()
            await _healthy(host.running, 4)
            with caplog.at_level(logging.INFO, logger="hushnet.host"):
                late = await asyncio.wait_for(host.stop(), 60)  # hang detector
        finally:
            bstop.set()
            await btask
        assert late == 1
        for e in host.entries:
            if e.config.node_id == "n2":
                continue
            assert e.node.store is None and e.node._lock_fd is None, e.config.node_id  # noqa: SLF001
        lines = [r for r in caplog.records if getattr(r, "event", "") == "host_stopped"]
        assert len(lines) == 1 and lines[0].late == 1 and lines[0].nodes == 4
        assert "n2" in lines[0].getMessage()

    uvloop.run(go())


def test_a_host_out_of_time_in_its_leaves_has_closed_every_file(
    tmp_path: pathlib.Path, monkeypatch, caplog
) -> None:
    """A node's files close before its Leave: when the bootstrap does not answer the host's leaves and the
    host's stop runs out of time, every node's store, ledger and run store is closed and its state directory
    free.  Why: at n = 512 (a 410-node host, load 11) every node was still waiting for the leave batch when
    the 10 s bound ran out — with the Leave before the closes, all 410 nodes' files were left open."""
    from hushnet.net import shared

    async def never(self, leaves):  # a bootstrap that takes the call and never answers
        await asyncio.Event().wait()

    monkeypatch.setattr(shared.HostLeaves, "_one_call", never)

    async def go() -> None:
        addr, bstop, btask = await inprocess_bootstrap(tmp_path, "complete:4")
        ids = [f"n{i}" for i in range(4)]
        configs = [
            dataclasses.replace(c, plugins=(runs_service.install,))
            for c in _configs(tmp_path, addr, ids)
        ]
        host = NodeHost(configs, stop_timeout_s=5.0)
        try:
            await host.start()
            await _healthy(host.running, 4)
            services = [e.installed[0] for e in host.entries]
            for svc in services:
                svc.ledger, svc.store  # noqa: B018 - opened on first use
            with caplog.at_level(logging.INFO, logger="hushnet.host"):
                late = await asyncio.wait_for(host.stop(), 60)  # hang detector
        finally:
            bstop.set()
            await btask
        assert late == 4  # all stuck in the leave
        for e, svc in zip(host.entries, services):
            assert e.node.store is None and e.node._lock_fd is None, e.config.node_id  # noqa: SLF001
            assert svc._ledger is None and svc._store is None, e.config.node_id  # noqa: SLF001
        (line,) = [r for r in caplog.records if getattr(r, "event", "") == "host_stopped"]
        assert line.late == 4 and line.files_open == 0

    uvloop.run(go())


def test_bad_host_stop_timeout_is_one_clear_line(monkeypatch) -> None:
    monkeypatch.setenv("HUSHNET_HOST_STOP_S", "soon")
    with pytest.raises(
        ValueError, match="HUSHNET_HOST_STOP_S must be a number of seconds, got 'soon'"
    ):
        NodeHost([])
    monkeypatch.delenv("HUSHNET_HOST_STOP_S")
    with pytest.raises(ValueError, match="stop timeout must be positive"):
        NodeHost([], stop_timeout_s=0)


_HOST = textwrap.dedent(
    """
    import asyncio, logging, pathlib, sys
    from hushnet.net.host import hosted_configs, run_host

    logging.basicConfig(level=logging.INFO, stream=sys.stdout)

    class Hang:  # every node's stop hangs in its plugin's close: only a forced exit ends the process
        def close(self):
            pass

        async def aclose(self):
            print("closing", flush=True)
            await asyncio.Event().wait()

    tmp, addr, n = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    ids = [f"n{i}" for i in range(n)]
    configs = hosted_configs(
        [tmp / i for i in ids], "127.0.0.1:0", ids, bootstrap=addr, token="tok",
        ca_file=tmp / "b" / "ca.pem", plugins=(lambda node: Hang(),),
    )
    sys.exit(run_host(configs))
    """
)


def _host_process(
    tmp: pathlib.Path, addr: str, n: int, **env: str
) -> tuple[subprocess.Popen, pathlib.Path]:
    log = tmp / "host.log"
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOST, str(tmp), addr, str(n)],
        cwd=REPO,
        env={**os.environ, **env},
        stdout=open(log, "wb"),  # noqa: SIM115 - closed with the process
        stderr=subprocess.STDOUT,
    )
    return proc, log


def _wait_for(log: pathlib.Path, text: str, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if text in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise AssertionError(
                f"host exited ({proc.returncode}) before {text!r}: {log.read_text()[-2000:]}"
            )
        time.sleep(0.1)
    raise AssertionError(f"no {text!r} in the host's log: {log.read_text()[-2000:]}")


def _stores_intact(tmp: pathlib.Path, ids: list[str]) -> None:
    """Every SQLite file the nodes left opens and passes its integrity check (WAL recovered on open)."""
    files = [f for i in ids for f in (tmp / i).glob("*.sqlite")]
    for f in files:
        with sqlite3.connect(f) as db:
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok", f


def test_a_second_sigterm_ends_a_stopping_host_at_once(tmp_path: pathlib.Path) -> None:
    """SIGTERM starts the orderly stop; a second SIGTERM while it runs (here: it never ends) exits the
    process at once with 128 + 15 and one ``forced_exit`` line; the nodes' files are intact."""
    bproc, addr = _start_bootstrap_process(tmp_path, "complete:4")
    try:
        host, log = _host_process(tmp_path, addr, 4, HUSHNET_HOST_STOP_S="600")
        try:
            _wait_for(log, "hosting 4 nodes", host)
            host.send_signal(signal.SIGTERM)
            _wait_for(log, "closing", host)  # the orderly stop reached the hanging close
            host.send_signal(signal.SIGTERM)
            rc = host.wait(timeout=60)  # hang detector
        finally:
            if host.poll() is None:
                host.kill()
                host.wait()
        text = log.read_text(errors="replace")
        assert rc == 128 + signal.SIGTERM, text[-2000:]
        assert "SIGTERM again while stopping: exiting now" in text
        _stores_intact(tmp_path, [f"n{i}" for i in range(4)])
    finally:
        bproc.terminate()
        bproc.wait(timeout=30)


def test_a_host_whose_nodes_do_not_stop_exits_after_its_stop_timeout(
    tmp_path: pathlib.Path,
) -> None:
    """One SIGTERM, nodes that never finish stopping: the process exits 1 once the host's stop timeout
    (``HUSHNET_HOST_STOP_S``) is over, instead of waiting for its stuck tasks at the loop's shutdown."""
    bproc, addr = _start_bootstrap_process(tmp_path, "complete:2")
    try:
        host, log = _host_process(tmp_path, addr, 2, HUSHNET_HOST_STOP_S="1")
        try:
            _wait_for(log, "hosting 2 nodes", host)
            host.send_signal(signal.SIGTERM)
            rc = host.wait(timeout=60)  # hang detector
        finally:
            if host.poll() is None:
                host.kill()
                host.wait()
        text = log.read_text(errors="replace")
        assert rc == 1, text[-2000:]
        assert "did not stop within 1 s and were abandoned" in text
        _stores_intact(tmp_path, ["n0", "n1"])
    finally:
        bproc.terminate()
        bproc.wait(timeout=30)


def test_a_second_ctrl_c_on_up_reaches_the_host_processes(tmp_path: pathlib.Path) -> None:
    """``hushnet up`` passes a second Ctrl-C on to its node/host processes (each then exits at once, as
    above) through :meth:`LocalCluster.signal_processes`: every process still running gets the signal."""
    from hushnet.net.cluster import Child, LocalCluster

    cluster = LocalCluster(tmp_path, 2, "complete:2", restart=False)
    code = (
        "import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(7)); "
        "pathlib.Path(sys.argv[1]).touch(); time.sleep(120)"
    )
    for i in range(2):
        ready = tmp_path / f"p{i}.ready"
        child = Child(f"p{i}", [sys.executable, "-c", code, str(ready)], tmp_path / f"p{i}.log")
        child.spawn()
        cluster.processes.append(child)
    try:
        end = time.monotonic() + 60  # hang detector
        while not all((tmp_path / f"p{i}.ready").exists() for i in range(2)):
            assert time.monotonic() < end, "the children did not start"
            time.sleep(0.05)
        cluster.signal_processes(signal.SIGTERM)
        assert [c.proc.wait(timeout=60) for c in cluster.processes] == [7, 7]
        cluster.signal_processes(signal.SIGTERM)  # nothing left to signal: no error
    finally:
        for c in cluster.processes:
            if c.proc.poll() is None:
                c.proc.kill()
                c.proc.wait()
