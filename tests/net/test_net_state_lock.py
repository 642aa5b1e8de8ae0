"""Two ``hushnet node serve`` on one state directory (issue 14, point 7), with real processes.

Before the lock, the second process was re-admitted by the bootstrap under the same identity,
shared the privacy ledger, and its ``Leave`` on exit removed the original from the directory.  Now
the state directory is locked (``flock`` on ``node.lock``, held for the process's life): the second
process exits 1 with one clear line naming the holder's pid, the first keeps serving and stays in
the directory; and a node killed with SIGKILL leaves no stale lock behind (its restart starts).
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
import uvloop

from hushnet.net.cluster import pick_port
from hushnet.net.operator import Operator, OperatorCredentials

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

REPO = pathlib.Path(__file__).resolve().parents[2]
HUSHNET = [sys.executable, "-m", "hushnet.cli"]


def _spawn(args: list[str], out: pathlib.Path) -> subprocess.Popen:
    return subprocess.Popen(
        [*HUSHNET, *args], cwd=REPO, stdout=open(out, "wb"), stderr=subprocess.STDOUT
    )


def _wait(pred, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _members(boot: pathlib.Path) -> dict[str, tuple[str, bool]]:
    async def go():
        async with Operator(OperatorCredentials.from_state_dir(boot)) as op:
            return {m.node_id: (m.address, m.alive) for m in (await op.directory()).members}

    return uvloop.run(go())


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def test_second_node_process_on_a_state_dir_is_refused(tmp_path: pathlib.Path) -> None:
    boot, state = tmp_path / "b", tmp_path / "n0"
    bport = pick_port(["127.0.0.1"])
    procs: list[subprocess.Popen] = []
    try:
        procs.append(
            _spawn(
                [
                    "bootstrap",
                    "serve",
                    "--state-dir",
                    str(boot),
                    "--listen",
                    f"127.0.0.1:{bport}",
                    "--topology",
                    "complete:2",
                    "--token",
                    "tok",
                ],
                tmp_path / "boot.out",
            )
        )
        _wait(lambda: (boot / "bootstrap.json").exists(), 60, "the bootstrap")
        common = [
            "node",
            "serve",
            "--state-dir",
            str(state),
            "--bootstrap",
            f"127.0.0.1:{bport}",
            "--ca",
            str(boot / "ca.pem"),
            "--token",
            "tok",
            "--node-id",
            "n0",
        ]
        first_addr = f"127.0.0.91:{pick_port(['127.0.0.91'])}"
        first = _spawn([*common, "--listen", first_addr], tmp_path / "first.out")
        procs.append(first)
        _wait(
            lambda: "serving on" in (tmp_path / "first.out").read_text(errors="replace"),
            60,
            "the first node",
        )
        assert _members(boot)["n0"] == (first_addr, True)

        second = subprocess.run(
            [*HUSHNET, *common, "--listen", f"127.0.0.92:{pick_port(['127.0.0.92'])}"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 1, (second.returncode, second.stdout, second.stderr)
        err = second.stderr + second.stdout
        assert "Traceback" not in err
        assert (
            f"is in use by another node process (pid {first.pid})" in err and str(state) in err
        ), err
        # the original is untouched: still running, still the directory's n0, at its own address
        assert first.poll() is None
        assert _members(boot)["n0"] == (first_addr, True)

        # SIGKILL leaves no stale lock: the restarted node starts on the same directory
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
        again = _spawn([*common, "--listen", first_addr], tmp_path / "again.out")
        procs.append(again)
        _wait(
            lambda: "serving on" in (tmp_path / "again.out").read_text(errors="replace"),
            60,
            "the restarted node",
        )
        assert (state / "node.lock").read_text().strip() == str(again.pid)
    finally:
        for p in reversed(procs):
            _stop(p)
