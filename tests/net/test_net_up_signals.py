"""``hushnet up`` stops everything cleanly on Ctrl-C (SIGINT), and a second ``up`` on the same
state directory brings back the same identities."""

from __future__ import annotations

import json
import os
import pathlib
import signal

import pytest
from helpers.net import UpProcess, pid_alive, wait_for


@pytest.mark.timeout(240)
def test_ctrl_c_stops_all_and_up_again_keeps_identities(tmp_path: pathlib.Path) -> None:
    state = tmp_path / "net"
    up = UpProcess(state, 2, "complete:2", extra=("--log-json",))
    try:
        up.wait_up(timeout=150)
        first = json.loads((state / "cluster.json").read_text())
        keys = {
            n["id"]: json.loads((pathlib.Path(n["state_dir"]) / "identity.json").read_text())[
                "key_sha256"
            ]
            for n in first["nodes"]
        }
        os.kill(up.proc.pid, signal.SIGINT)
        assert up.proc.wait(timeout=60) == 0
        for child in [first["bootstrap"], *first["nodes"]]:
            wait_for(lambda: not pid_alive(child["pid"]), 20, what=f"{child['id']} gone")
        # structured logs: every line of a node log is JSON naming the node
        lines = [
            json.loads(l)
            for l in (state / "logs" / "n1.log").read_text().splitlines()
            if l.startswith("{")
        ]
        assert lines and all(l["node"] in ("n1", "-") for l in lines)
        assert any(l.get("event") == "stopped" for l in lines)
    finally:
        up.close()
    again = UpProcess(state, 2, "complete:2")
    try:
        again.wait_up(timeout=150)
        second = json.loads((state / "cluster.json").read_text())
        for n in second["nodes"]:
            ident = json.loads((pathlib.Path(n["state_dir"]) / "identity.json").read_text())
            assert ident["key_sha256"] == keys[n["id"]]
    finally:
        again.close()
