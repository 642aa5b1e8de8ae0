"""A real Docker engine for the deployment tests, and small helpers around it.

Why not mocks: the deployment artefacts (Dockerfile, entry point, compose file, Swarm stack)
only prove anything when a real engine builds and runs them. This module makes that possible
on a bare CI machine: it installs Debian's ``docker.io``/``docker-compose``/``debootstrap``
when they are missing, starts ``dockerd`` when none answers (and stops it afterwards), builds
the base image from debootstrap when no registry is reachable, and builds the project image.
Any step that cannot be done raises :class:`EngineUnavailable` with the reason, and the tests
*fail* with it (they are never skipped silently).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[2]
IMAGE = "hushnet:test"
APT_PACKAGES = ["docker.io", "docker-compose", "debootstrap", "iptables"]
HOST_CA_BUNDLE = pathlib.Path("/etc/ssl/certs/ca-certificates.crt")
TIMINGS: dict[str, float] = {}  # seconds of the slow steps, printed in the terminal summary
UNITS = REPO / "deploy" / "systemd"
HUSHNET = pathlib.Path(sys.executable).parent / "hushnet"  # this venv's CLI


class EngineUnavailable(RuntimeError):
    """The Docker engine (or the image) cannot be made available; the message says why."""


def docker_bin() -> str:
    """Debian's client matches Debian's daemon (20.10); a newer client first on PATH also works."""
    return (
        "/usr/bin/docker"
        if pathlib.Path("/usr/bin/docker").exists()
        else (shutil.which("docker") or "docker")
    )


def run(
    argv: list[str],
    timeout: float = 120.0,
    check: bool = True,
    env: dict | None = None,
    cwd: pathlib.Path | None = None,
) -> subprocess.CompletedProcess:
    """Run a command, capture its output; on failure raise with the command's own words."""
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=str(cwd) if cwd else None,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"{' '.join(argv)} did not finish within {timeout:.0f} s; "
            f"output so far: {(exc.stdout or '')[-2000:]} {(exc.stderr or '')[-2000:]}"
        ) from None
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(argv)} failed with exit code {proc.returncode}:\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


def docker(*args: str, timeout: float = 120.0, check: bool = True) -> subprocess.CompletedProcess:
    return run([docker_bin(), *args], timeout=timeout, check=check)


def free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Engine:
    """The Docker engine the tests use; ``started_pid`` is set when we started ``dockerd``."""

    started_pid: int | None = None
    log_path: pathlib.Path | None = None
    timings: dict[str, float] = field(default_factory=dict)

    # ------------------------------------------------------------------ set-up
    def ensure_packages(self) -> None:
        missing = [
            p
            for p, exe in (
                ("docker.io", "dockerd"),
                ("docker-compose", "docker-compose"),
                ("debootstrap", "debootstrap"),
                ("iptables", "iptables"),
            )
            if shutil.which(exe) is None and not pathlib.Path(f"/usr/sbin/{exe}").exists()
        ]
        if not missing:
            return
        if os.geteuid() != 0:
            raise EngineUnavailable(
                f"missing {', '.join(missing)} and not root: cannot apt-get install them "
                f"(run the suite as root, or install: apt-get install {' '.join(APT_PACKAGES)})"
            )
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        t0 = time.monotonic()
        for argv in (
            ["apt-get", "update", "-qq"],
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *APT_PACKAGES],
        ):
            proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
            if proc.returncode != 0:
                raise EngineUnavailable(
                    f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr[-1500:]}"
                )
        self.timings["apt_install_s"] = time.monotonic() - t0

    def _answers(self) -> bool:
        try:
            return (
                subprocess.run(
                    [docker_bin(), "info", "--format", "{{.ServerVersion}}"],
                    capture_output=True,
                    timeout=20,
                ).returncode
                == 0
            )
        except (OSError, subprocess.TimeoutExpired):
            return False

    def start(self, log_dir: pathlib.Path) -> None:
        """Use the running engine, or start ``dockerd`` and wait until it answers."""
        self.ensure_packages()
        if self._answers():
            return
        dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
        if not pathlib.Path(dockerd).exists():
            raise EngineUnavailable("dockerd not found after installing docker.io")
        if os.geteuid() != 0:
            raise EngineUnavailable("no Docker engine answers and starting dockerd needs root")
        self.log_path = log_dir / "dockerd.log"
        with open(self.log_path, "ab") as logf:
            proc = subprocess.Popen(
                [dockerd],
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.started_pid = proc.pid
        self._proc = proc
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise EngineUnavailable(
                    f"dockerd exited with code {proc.returncode}:\n{self.log_tail()}"
                )
            if self._answers():
                return
            time.sleep(0.3)
        raise EngineUnavailable(f"dockerd did not answer within 60 s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """Stop ``dockerd`` if (and only if) we started it."""
        if self.started_pid is None:
            return
        proc = self._proc
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self.started_pid = None

    # ------------------------------------------------------------------ images
    def ensure_base_image(self) -> None:
        t0 = time.monotonic()
        proc = subprocess.run(
            [str(REPO / "deploy" / "scripts" / "build-base-image.sh")],
            capture_output=True,
            text=True,
            timeout=900,
            env=dict(os.environ, DOCKER=docker_bin()),
        )
        if proc.returncode != 0:
            raise EngineUnavailable(
                f"cannot provide the base image debian:bookworm-slim: {proc.stderr[-2000:]}"
            )
        if "imported" in proc.stdout:
            self.timings["base_image_s"] = time.monotonic() - t0

    def build_image(self, tag: str = IMAGE) -> None:
        """``docker build`` of deploy/Dockerfile; the host CA bundle is the build's extra CA input."""
        certs = REPO / "deploy" / "certs"
        if HOST_CA_BUNDLE.exists():
            target = certs / "host-ca-bundle.crt"
            data = HOST_CA_BUNDLE.read_bytes()
            if (
                not target.exists() or target.read_bytes() != data
            ):  # unchanged file: the layer cache holds
                target.write_bytes(data)
        t0 = time.monotonic()
        proc = subprocess.run(
            [docker_bin(), "build", "-f", "deploy/Dockerfile", "-t", tag, "."],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=1200,
            env=dict(os.environ, DOCKER_BUILDKIT="0"),
        )
        if proc.returncode != 0:
            raise EngineUnavailable(
                f"docker build failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                f"{proc.stderr[-2000:]}"
            )
        self.timings["image_build_s"] = time.monotonic() - t0


# ---------------------------------------------------------------------- compose helpers


def compose(
    project: str, *args: str, env: dict[str, str], timeout: float = 180.0, check: bool = True
) -> subprocess.CompletedProcess:
    exe = shutil.which("docker-compose") or "/usr/bin/docker-compose"
    return run(
        [exe, "-f", str(REPO / "docker-compose.yml"), "-p", project, *args],
        timeout=timeout,
        check=check,
        env=dict(os.environ, **env),
        cwd=REPO,
    )


def container_ids(project: str, service: str) -> list[str]:
    out = docker(
        "ps",
        "-a",
        "-q",
        "--filter",
        f"label=com.docker.compose.project={project}",
        "--filter",
        f"label=com.docker.compose.service={service}",
    ).stdout
    return [line for line in out.split() if line]


def inspect(container: str) -> dict:
    return json.loads(docker("inspect", container).stdout)[0]


def wait_for(predicate, timeout: float, interval: float = 0.5, what: str = "condition"):
    """Poll ``predicate`` (returns a truthy value or raises) until truthy; raise with the last state."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
            last = value
        except Exception as exc:  # keep polling; report the last failure
            last = exc
        time.sleep(interval)
    raise AssertionError(
        f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}"[:3000]
    )


# ---------------------------------------------------------------------- runs


def spec_toml(
    steps: int,
    sigma: float,
    seed: int,
    on_peer_down: str = "deviate",
    *,
    graph: str,
    epsilon: float,
) -> str:
    """A private logistic regression by random walk (rw-dpsgd) over ``graph`` (the network's topology)."""
    return f"""[run]
protocol = "rw-dpsgd"
graph = "{graph}"
weights = "hamilton"
steps = {steps}
sigma = {sigma}
clip = 1.0
step_size = 0.5
seed = {seed}
view_model = "sender-known"
on_peer_down = "{on_peer_down}"
constraint = "strict"

[task]
name = "logreg"

[budget]
epsilon = {epsilon}
delta = 1e-5
"""


def write_shards(
    data_dir: pathlib.Path, n: int, per_node: int = 20, d: int = 4, seed: int = 0
) -> None:
    """Planted, separable logistic data with unit-norm rows: node v reads node-v.npz."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(d)
    for v in range(n):
        X = rng.standard_normal((per_node, d))
        X /= np.linalg.norm(X, axis=1, keepdims=True)
        np.savez(data_dir / f"node-{v}.npz", X=X, y=np.where(X @ w > 0, 1.0, -1.0))
        (data_dir / f"node-{v}.npz").chmod(0o644)


def make_data_dir(n: int) -> pathlib.Path:
    """A temporary folder with one shard per vertex, readable by the containers' user (uid 10001)."""
    data_dir = pathlib.Path(tempfile.mkdtemp(prefix="hushnet-deploy-data-"))
    data_dir.chmod(0o755)
    write_shards(data_dir, n)
    return data_dir


# ---------------------------------------------------------------------- systemd units on "machines"


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


# ---------------------------------------------------------------------- network namespaces


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


def netns_status(hosts: Hosts, state: pathlib.Path) -> dict:
    """``hushnet status --json`` run by the operator on the bootstrap host."""
    proc = hosts.in_host(
        "boot", [str(HUSHNET), "status", "--state-dir", str(state), "--json", "--timeout", "2"]
    )
    if not proc.stdout.strip().startswith("{"):
        raise AssertionError(f"status failed: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout)


def start_bootstrap(
    hosts: Hosts, tmp: pathlib.Path, listen: str, topology: str, lease_s: float
) -> pathlib.Path:
    """hushnet-bootstrap.service's command on the ``boot`` host; returns its state directory once
    the CA and the join token exist (what the operator then copies to every machine)."""
    env = parse_env((UNITS / "bootstrap.env").read_text())
    state = tmp / "boot" / "state"
    env.update(
        HUSHNET_STATE_DIR=str(state),
        HUSHNET_LISTEN=listen,
        HUSHNET_TOPOLOGY=topology,
        HUSHNET_LEASE=str(lease_s),
    )
    hosts.start("boot", exec_start(UNITS / "hushnet-bootstrap.service", env), "bootstrap")
    wait_for(
        lambda: (state / "bootstrap.json").exists() and (state / "join_token").exists(),
        60,
        what="the bootstrap to create its state",
    )
    return state


def hand_out_join_files(
    boot_state: pathlib.Path, etc: pathlib.Path
) -> tuple[pathlib.Path, pathlib.Path]:
    """What the operator does on each machine: copy ca.pem and the join token to its /etc/hushnet."""
    etc.mkdir(parents=True, exist_ok=True)
    ca, token = etc / "ca.pem", etc / "join_token"
    shutil.copy(boot_state / "ca.pem", ca)
    shutil.copy(boot_state / "join_token", token)
    return ca, token
