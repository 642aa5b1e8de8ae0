"""Shared helpers for the network tests: run the real CLI, start a real cluster, make TLS clients.

Everything started here is stopped by a finaliser, even when a test fails.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import grpc

REPO = pathlib.Path(__file__).resolve().parents[2]
HUSHNET = [sys.executable, "-m", "hushnet.cli"]


def cli(*args: str, timeout: float = 60.0, check: bool = False) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [*HUSHNET, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"hushnet {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


class UpProcess:
    """``hushnet up`` running in the background, stopped by :meth:`close` (always)."""

    def __init__(
        self, state_dir: pathlib.Path, nodes: int, topology: str, extra: tuple[str, ...] = ()
    ) -> None:
        self.state_dir = state_dir
        self.out_path = state_dir.parent / f"{state_dir.name}-up.out"
        self._out = open(self.out_path, "wb")
        self.proc = subprocess.Popen(
            [
                *HUSHNET,
                "up",
                "--nodes",
                str(nodes),
                "--topology",
                topology,
                "--state-dir",
                str(state_dir),
                *extra,
            ],
            cwd=REPO,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        return self.out_path.read_text(errors="replace")

    def wait_up(self, timeout: float = 150.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "network up:" in self.output():
                return
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"hushnet up exited with {self.proc.returncode}:\n{self.output()}"
                )
            time.sleep(0.3)
        raise AssertionError(f"hushnet up not ready after {timeout} s:\n{self.output()}")

    def cluster(self) -> dict:
        return json.loads((self.state_dir / "cluster.json").read_text())

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                cli("down", "--state-dir", str(self.state_dir), timeout=60)
                try:
                    self.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
            # children die with the supervisor (PDEATHSIG); make sure of it
            for child in _recorded_children(self.state_dir):
                _kill_if_alive(child)
            self._out.close()


def _recorded_children(state_dir: pathlib.Path) -> list[dict]:
    try:
        doc = json.loads((state_dir / "cluster.json").read_text())
    except (OSError, ValueError):
        return []
    return [c for c in [doc.get("bootstrap"), *doc.get("nodes", [])] if c]


def _kill_if_alive(child: dict) -> None:
    from hushnet.net.cluster import _proc_start

    pid = child.get("pid")
    if pid and child.get("start") and _proc_start(pid) == child["start"]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def pid_alive(pid: int) -> bool:
    from hushnet.net.cluster import _pid_alive

    return _pid_alive(pid)


def wait_for(predicate, timeout: float, interval: float = 0.3, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except Exception as exc:  # noqa: BLE001 - polled until the deadline
            last = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}; last: {last!r}")


# ------------------------------------------------------------------ TLS clients


def secure_channel(
    address: str,
    target_id: str,
    ca_pem: bytes,
    key_pem: bytes | None,
    cert_pem: bytes | None,
    max_bytes: int = 256 * 1024 * 1024,
) -> grpc.Channel:
    from hushnet.net import pki

    return grpc.secure_channel(
        address,
        pki.channel_credentials(ca_pem, key_pem, cert_pem),
        options=[
            ("grpc.ssl_target_name_override", pki.node_dns(target_id)),
            ("grpc.max_send_message_length", max_bytes),
            ("grpc.max_receive_message_length", max_bytes),
            ("grpc.use_local_subchannel_pool", 1),
        ],
    )


def node_creds(state_dir: pathlib.Path, node: str) -> tuple[bytes, bytes, bytes]:
    """(ca, key, cert) of node ``node`` from a ``hushnet up`` directory."""
    d = state_dir / "nodes" / node
    return (d / "ca.pem").read_bytes(), (d / "node.key").read_bytes(), (d / "node.pem").read_bytes()


def raw_deliver(channel: grpc.Channel, raw: bytes, timeout: float = 10.0) -> bytes:
    """Call Peer/Deliver with arbitrary bytes (to send malformed or hand-built envelopes)."""
    call = channel.unary_unary(
        "/hushnet.v1.Peer/Deliver", request_serializer=None, response_deserializer=None
    )
    return call(raw, timeout=timeout)


def log_text(state_dir: pathlib.Path, name: str) -> str:
    return (state_dir / "logs" / f"{name}.log").read_text(errors="replace")


async def inprocess_bootstrap(tmp: pathlib.Path, topology: str, **config):
    """A real bootstrap served on this test's event loop (state in ``tmp / "b"``, join token "tok"):
    ``(address, stop event, serving task)``; a bootstrap that fails to start raises here."""
    import asyncio

    from hushnet.bootstrap.service import BootstrapConfig
    from hushnet.bootstrap.service import serve as serve_bootstrap

    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(
        serve_bootstrap(
            BootstrapConfig(tmp / "b", "127.0.0.1:0", topology, "tok", **config), stop, ready
        )
    )
    await asyncio.wait(
        [task, asyncio.create_task(ready.wait())], return_when=asyncio.FIRST_COMPLETED
    )
    if task.done():
        task.result()
    return json.loads((tmp / "b" / "bootstrap.json").read_text())["address"], stop, task
