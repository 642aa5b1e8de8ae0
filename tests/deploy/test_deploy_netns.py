"""The systemd units' commands on "real machines": one network namespace per host.

The harness reads ``ExecStart`` from deploy/systemd/*.service, expands it the way systemd does
(``${VAR}`` from the unit's environment file, ``%i`` the instance name), and runs it inside a
network namespace with its own address (10.77.0.0/24, hosts joined by veth pairs to a bridge
that lives in a namespace of its own). Nothing is sent outside these namespaces.

Checked: the bootstrap and three nodes form ``ring:3`` and carry a private run (rw-dpsgd, started
by the operator on the bootstrap host); when one host's link is cut
(``ip link set … down``) its neighbours mark it unhealthy within seconds and the bootstrap
marks it not alive after the lease; when the link is restored the node renews its lease and
every link comes back — the behaviour documented in deploy/README.md ("A host drops off the
network").
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest
from helpers.deploy import REPO, TIMINGS, run, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(240)]

UNITS = REPO / "deploy" / "systemd"
HUSHNET = pathlib.Path(sys.executable).parent / "hushnet"
LEASE_S = 5


def parse_unit(path: pathlib.Path) -> dict[str, dict[str, str]]:
    """Sections → {key: value} of a systemd unit (continuation lines joined, comments dropped)."""
    sections: dict[str, dict[str, str]] = {}
    current = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, _, value = line.partition("=")
        assert current is not None, f"{path.name}: {line!r} outside a section"
        current[key.strip()] = value.strip()
    return sections


def parse_env(text: str) -> dict[str, str]:
    env = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip()
    return env


def exec_start(unit: pathlib.Path, env: dict[str, str], instance: str = "") -> list[str]:
    """ExecStart as systemd would run it, with the installed binary replaced by this venv's."""
    line = parse_unit(unit)["Service"]["ExecStart"].replace("%i", instance)
    missing = sorted(set(re.findall(r"\$\{(\w+)\}", line)) - set(env))
    assert not missing, f"{unit.name}: ExecStart uses {missing}, not set in its environment file"
    argv = shlex.split(re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], line))
    assert argv[0] == "/opt/hushnet/bin/hushnet"
    return [str(HUSHNET), *argv[1:]]


@pytest.mark.parametrize(
    "unit,reference",
    [("hushnet-bootstrap.service", "bootstrap.env"), ("hushnet-node@.service", "node.env")],
)
def test_units_are_complete(unit, reference):
    """Every variable a unit uses is in its reference file, and the command line parses."""
    sections = parse_unit(UNITS / unit)
    assert {"Unit", "Service", "Install"} <= set(sections)
    service = sections["Service"]
    assert service["KillSignal"] == "SIGTERM" and service["User"] == "hushnet"
    env = parse_env((UNITS / reference).read_text())
    argv = exec_start(UNITS / unit, env, instance="main")
    # the command line is accepted by the real CLI parser
    proc = subprocess.run([*argv[:3], "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for flag in [a for a in argv if a.startswith("--")]:
        assert flag in proc.stdout, f"{unit}: {flag} is not an option of '{' '.join(argv[1:3])}'"


RUN_SPEC = """[run]
protocol = "rw-dpsgd"
graph = "ring:3"
weights = "hamilton"
steps = 300
sigma = 10.0
clip = 1.0
step_size = 0.5
seed = 21
view_model = "sender-known"
on_peer_down = "deviate"
constraint = "strict"

[task]
name = "logreg"

[budget]
epsilon = 100.0
delta = 1e-5
"""


def write_node_policy(state_dir: pathlib.Path, vertex: int, per_node: int = 20, d: int = 4) -> None:
    """What a node's owner does before the first start: data shard + ``runs.toml`` (budget, data)."""
    import numpy as np

    from hushnet.runs.policy import NodePolicy

    rng = np.random.default_rng(100 + vertex)
    w = np.random.default_rng(99).standard_normal(d)
    X = rng.standard_normal((per_node, d))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    state_dir.mkdir(parents=True, exist_ok=True)
    np.savez(state_dir / "data.npz", X=X, y=np.where(X @ w > 0, 1.0, -1.0))
    NodePolicy.write(state_dir, epsilon=100.0, delta=1e-5, data_path="data.npz")


class Hosts:
    """Network namespaces joined by a bridge; every process started here is ended by its pid."""

    def __init__(self, tag: str, tmp: pathlib.Path) -> None:
        self.tag, self.tmp = tag, tmp
        self.switch = f"{tag}-sw"
        self.hosts: dict[str, str] = {}  # name -> namespace
        self.ports: dict[str, str] = {}  # name -> veth on the switch side
        self.procs: list[tuple[subprocess.Popen, object]] = []
        self.made: list[str] = []

    def ip(self, *args: str) -> None:
        run(["ip", *args], timeout=20)

    def setup(self, addresses: dict[str, str]) -> None:
        self.ip("netns", "add", self.switch)
        self.made.append(self.switch)
        self.ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        self.ip("-n", self.switch, "link", "set", "br0", "up")
        for i, (name, addr) in enumerate(addresses.items()):
            ns = f"{self.tag}-{name}"
            self.ip("netns", "add", ns)
            self.made.append(ns)
            port = f"sw{i}"
            self.ip(
                "-n",
                self.switch,
                "link",
                "add",
                port,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                ns,
            )
            self.ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
            self.ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            self.ip("-n", ns, "link", "set", "eth0", "up")
            self.ip("-n", ns, "link", "set", "lo", "up")
            self.hosts[name], self.ports[name] = ns, port

    def start(self, host: str, argv: list[str], log_name: str) -> subprocess.Popen:
        logf = open(self.tmp / f"{log_name}.log", "ab")
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.hosts[host], *argv],
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
        self.procs.append((proc, logf))
        return proc

    def in_host(
        self, host: str, argv: list[str], timeout: float = 30
    ) -> subprocess.CompletedProcess:
        return run(["ip", "netns", "exec", self.hosts[host], *argv], timeout=timeout, check=False)

    def set_link(self, host: str, up: bool) -> None:
        self.ip("-n", self.switch, "link", "set", self.ports[host], "up" if up else "down")

    def teardown(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, logf in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
            logf.close()
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)


@pytest.fixture()
def hosts(tmp_path):
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.fail("the network-namespace harness needs root and iproute2 ('ip')", pytrace=False)
    h = Hosts(f"hn{os.getpid() % 100000}", tmp_path)
    try:
        yield h
    finally:
        h.teardown()
        leftover = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert h.tag + "-" not in leftover, f"namespaces left behind: {leftover}"


def _status(hosts: Hosts, state: pathlib.Path) -> dict:
    proc = hosts.in_host(
        "boot", [str(HUSHNET), "status", "--state-dir", str(state), "--json", "--timeout", "2"]
    )
    if not proc.stdout.strip().startswith("{"):
        raise AssertionError(f"status failed: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout)


def test_units_on_separate_hosts_with_a_link_cut(hosts, tmp_path):
    addresses = {"boot": "10.77.0.1", "h0": "10.77.0.10", "h1": "10.77.0.11", "h2": "10.77.0.12"}
    hosts.setup(addresses)
    etc = tmp_path / "etc"
    etc.mkdir()
    boot_env = parse_env((UNITS / "bootstrap.env").read_text())
    boot_env.update(
        HUSHNET_STATE_DIR=str(tmp_path / "boot" / "state"),
        HUSHNET_LISTEN="10.77.0.1:7400",
        HUSHNET_TOPOLOGY="ring:3",
        HUSHNET_LEASE=str(LEASE_S),
    )
    boot_state = pathlib.Path(boot_env["HUSHNET_STATE_DIR"])
    hosts.start("boot", exec_start(UNITS / "hushnet-bootstrap.service", boot_env), "bootstrap")
    wait_for(
        lambda: (boot_state / "bootstrap.json").exists() and (boot_state / "join_token").exists(),
        60,
        what="the bootstrap to create its state",
    )

    # what the operator does on each machine: copy ca.pem and the join token to /etc/hushnet
    for i, host in enumerate(["h0", "h1", "h2"]):
        host_etc = etc / host
        host_etc.mkdir()
        shutil.copy(boot_state / "ca.pem", host_etc / "ca.pem")
        shutil.copy(boot_state / "join_token", host_etc / "join_token")
        # the node owner's run policy: its own data shard and budget, in its state directory
        write_node_policy(tmp_path / host / "state", vertex=i)
        env = parse_env((UNITS / "node.env").read_text())
        env.update(
            HUSHNET_STATE_DIR=str(tmp_path / host / "state"),
            HUSHNET_LISTEN=f"{addresses[host]}:7500",
            HUSHNET_ADVERTISE=f"{addresses[host]}:7500",
            HUSHNET_BOOTSTRAP="10.77.0.1:7400",
            HUSHNET_CA_FILE=str(host_etc / "ca.pem"),
            HUSHNET_TOKEN_FILE=str(host_etc / "join_token"),
        )
        hosts.start(
            host, exec_start(UNITS / "hushnet-node@.service", env, instance=host), f"node-{host}"
        )
        # join in vertex order so that host hN is node nN (ids are assigned by the bootstrap)
        wait_for(
            lambda: (tmp_path / host / "state" / "identity.json").exists(),
            60,
            what=f"{host} to join",
        )

    def ring_up() -> dict | None:
        doc = _status(hosts, boot_state)
        ok = (
            len(doc["nodes"]) == 3
            and doc["healthy"]
            and all(n.get("all_neighbors_connected") for n in doc["nodes"])
            and all(n["alive_in_directory"] for n in doc["nodes"])
        )
        return doc if ok else None

    doc = wait_for(ring_up, 60, what="ring:3 up across the namespaces")
    assert {n["id"]: n["address"] for n in doc["nodes"]} == {
        "n0": "10.77.0.10:7500",
        "n1": "10.77.0.11:7500",
        "n2": "10.77.0.12:7500",
    }

    # a private run across the hosts, started by the operator on the bootstrap machine
    spec = tmp_path / "run.toml"
    spec.write_text(RUN_SPEC)
    proc = hosts.in_host(
        "boot",
        [str(HUSHNET), "run", "start", str(spec), "--state-dir", str(boot_state), "--watch"],
        timeout=120,
    )
    assert proc.returncode == 0 and "finished at step 300/300" in proc.stdout, (
        proc.stdout + proc.stderr
    )

    # cut host h2 off the network
    hosts.set_link("h2", up=False)
    t_cut = time.monotonic()

    def neighbours_see_it() -> dict | None:
        by = {n["id"]: n for n in _status(hosts, boot_state)["nodes"]}
        ok = (
            not by["n2"]["healthy"]
            and by["n0"]["healthy"]
            and by["n1"]["healthy"]
            and set(by["n0"]["connected"]) == {"n1"}
            and set(by["n1"]["connected"]) == {"n0"}
        )
        return by if ok else None

    wait_for(neighbours_see_it, 20, what="n0 and n1 to mark n2 unhealthy")
    detect_s = time.monotonic() - t_cut

    def lease_expired() -> bool:
        by = {n["id"]: n for n in _status(hosts, boot_state)["nodes"]}
        return not by["n2"]["alive_in_directory"] and by["n0"]["alive_in_directory"]

    wait_for(lease_expired, LEASE_S + 15, what="the bootstrap to mark n2 not alive after the lease")
    assert time.monotonic() - t_cut >= LEASE_S - 1.0  # not before the lease ran out

    # restore the link: lease renewed, every link back, same identity
    hosts.set_link("h2", up=True)
    t_back = time.monotonic()
    doc = wait_for(ring_up, 45, what="n2 to come back and all links to reconnect")
    back_s = time.monotonic() - t_back
    assert {n["id"]: n["address"] for n in doc["nodes"]}["n2"] == "10.77.0.12:7500"
    log = (tmp_path / "node-h0.log").read_text()
    assert '"event": "link_down"' in log and "reconnected to neighbour n2" in log
    TIMINGS["netns_cut_detected_s"], TIMINGS["netns_restore_recovered_s"] = detect_s, back_s
