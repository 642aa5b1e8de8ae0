"""Starting order and start-up errors with real processes: a node started before its bootstrap
retries with backoff and a clear message (no traceback) and joins once the bootstrap is up;
user errors at start exit with one readable line."""

from __future__ import annotations

import pathlib
import subprocess

import pytest
from helpers.net import HUSHNET, REPO, cli, wait_for

from hushnet.bootstrap.authority import load_or_create
from hushnet.net.cluster import pick_port


def _spawn(args: list[str], out: pathlib.Path) -> tuple[subprocess.Popen, object]:
    fh = open(out, "wb")
    return subprocess.Popen([*HUSHNET, *args], cwd=REPO, stdout=fh, stderr=subprocess.STDOUT), fh


def _stop(proc: subprocess.Popen, fh) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    fh.close()


@pytest.mark.timeout(180)
def test_node_waits_for_unreachable_bootstrap_then_joins(tmp_path: pathlib.Path) -> None:
    bdir = tmp_path / "b"
    load_or_create(
        bdir, token="tok"
    )  # the operator prepared the CA; the service is not running yet
    bport = pick_port(["127.0.0.1"])
    nport = pick_port(["127.0.0.40"])
    node_log = tmp_path / "node.log"
    node, nfh = _spawn(
        [
            "node",
            "serve",
            "--state-dir",
            str(tmp_path / "n"),
            "--listen",
            f"127.0.0.40:{nport}",
            "--bootstrap",
            f"127.0.0.1:{bport}",
            "--ca",
            str(bdir / "ca.pem"),
            "--token",
            "tok",
            "--node-id",
            "n0",
            "--log-json",
        ],
        node_log,
    )
    boot = None
    bfh = None
    try:
        wait_for(
            lambda: node_log.read_text().count("unreachable") >= 2, 60, what="two retry messages"
        )
        text = node_log.read_text()
        assert "retrying in" in text and "Traceback" not in text
        assert (
            '"event": "bootstrap_unreachable"' in text and '"node": "n0"' in text
        )  # structured JSON lines
        boot, bfh = _spawn(
            [
                "bootstrap",
                "serve",
                "--state-dir",
                str(bdir),
                "--listen",
                f"127.0.0.1:{bport}",
                "--topology",
                "ring:3",
            ],
            tmp_path / "boot.log",
        )
        wait_for(
            lambda: "joined as n0" in node_log.read_text() and "serving on" in node_log.read_text(),
            90,
            what="node joined after the bootstrap came up",
        )
        assert node.poll() is None
        assert "Traceback" not in node_log.read_text()
    finally:
        _stop(node, nfh)
        if boot is not None:
            _stop(boot, bfh)
    assert node.returncode == 0  # SIGTERM is a clean stop


@pytest.mark.timeout(120)
def test_start_errors_are_one_clear_line(tmp_path: pathlib.Path) -> None:
    bdir = tmp_path / "b"
    load_or_create(bdir, token="tok")
    dead = pick_port(["127.0.0.1"])
    # give up after --join-timeout: exit 1, readable message, no traceback
    p = cli(
        "node",
        "serve",
        "--state-dir",
        str(tmp_path / "n1"),
        "--listen",
        "127.0.0.41:0",
        "--bootstrap",
        f"127.0.0.1:{dead}",
        "--ca",
        str(bdir / "ca.pem"),
        "--token",
        "tok",
        "--join-timeout",
        "2",
        timeout=60,
    )
    assert p.returncode == 1
    assert "unreachable after" in p.stderr and "Traceback" not in p.stderr
    # no CA on first start
    p = cli(
        "node",
        "serve",
        "--state-dir",
        str(tmp_path / "n2"),
        "--listen",
        "127.0.0.41:0",
        "--token",
        "t",
        timeout=60,
    )
    assert p.returncode == 1 and "--ca" in p.stderr and "Traceback" not in p.stderr
    # bad topology / changing the topology of an existing bootstrap
    p = cli(
        "bootstrap",
        "serve",
        "--state-dir",
        str(tmp_path / "b2"),
        "--listen",
        "127.0.0.1:0",
        "--topology",
        "ring:x",
        timeout=60,
    )
    assert p.returncode == 1 and "bad topology" in p.stderr and "Traceback" not in p.stderr
    # `up` with a mismatched topology
    p = cli(
        "up", "--nodes", "4", "--topology", "ring:5", "--state-dir", str(tmp_path / "u"), timeout=60
    )
    assert p.returncode == 1 and "has 5 vertices" in p.stderr
    # status of a directory that holds no network
    p = cli("status", "--state-dir", str(tmp_path / "nothing"), timeout=60)
    assert p.returncode == 1 and "Traceback" not in p.stderr


@pytest.mark.timeout(120)
def test_wrong_join_token_exits_with_clear_error(tmp_path: pathlib.Path) -> None:
    bdir = tmp_path / "b"
    load_or_create(bdir, token="right")
    bport = pick_port(["127.0.0.1"])
    boot, bfh = _spawn(
        [
            "bootstrap",
            "serve",
            "--state-dir",
            str(bdir),
            "--listen",
            f"127.0.0.1:{bport}",
            "--topology",
            "complete:2",
        ],
        tmp_path / "boot.log",
    )
    try:
        wait_for(
            lambda: "bootstrap serving" in (tmp_path / "boot.log").read_text(),
            60,
            what="bootstrap up",
        )
        p = cli(
            "node",
            "serve",
            "--state-dir",
            str(tmp_path / "n"),
            "--listen",
            "127.0.0.42:0",
            "--bootstrap",
            f"127.0.0.1:{bport}",
            "--ca",
            str(bdir / "ca.pem"),
            "--token",
            "wrong",
            timeout=60,
        )
        assert p.returncode == 1
        assert (
            "refused to admit" in p.stderr
            and "wrong join token" in p.stderr
            and "Traceback" not in p.stderr
        )
        wait_for(
            lambda: "refused: wrong join token" in (tmp_path / "boot.log").read_text(),
            10,
            what="bootstrap log line",
        )
        assert boot.poll() is None
    finally:
        _stop(boot, bfh)
    # the topology is part of the persisted state
    p = cli(
        "bootstrap",
        "serve",
        "--state-dir",
        str(bdir),
        "--listen",
        "127.0.0.1:0",
        "--topology",
        "ring:4",
        timeout=60,
    )
    assert p.returncode == 1 and "refusing" in p.stderr
