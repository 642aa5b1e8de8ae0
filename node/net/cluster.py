"""A local hushnet network: one bootstrap and N nodes, one per process or many per process.

This is what ``hushnet up`` runs, and what the demo and the integration tests use. With one node
per process (``per_process=1``, up to 253 nodes) node ``i`` serves on ``127.0.0.{2+i}`` (Linux
routes all of 127/8 to loopback), so each node has its own address as it would on a real network,
and the bootstrap on ``127.0.0.1``. With ``per_process=K > 1`` (or more than 253 nodes) each
process hosts K complete nodes (:mod:`hushnet.net.host`) and node ``i`` serves on
``127.0.0.1:{P+i}``: addresses are host:port, so one host carries any number of nodes.

Layout of the state directory::

    cluster.json          supervisor pid, addresses, pids (rewritten when a child restarts)
    bootstrap/            bootstrap state (CA, operator certificate, join token, SQLite)
    nodes/<id>/           node state (keys, certificate, identity.json, node.sqlite)
    logs/<id>.log         stdout+stderr of each process (``bootstrap.log`` for the bootstrap,
                          ``host-<k>.log`` for a process hosting several nodes)

Children get ``PR_SET_PDEATHSIG`` so they die with the supervisor even if it is SIGKILLed; the
supervisor restarts a crashed child with backoff (unless ``restart=False``).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

from hushnet.net import pki

log = logging.getLogger("hushnet.cluster")

_PR_SET_PDEATHSIG = 1


#: set by a supervisor for its children: the child ends itself when that process dies
PARENT_ENV = "HUSHNET_PARENT_PID"


def die_with_parent() -> None:
    """In a child started by :class:`Child`: get SIGTERM when the supervisor dies (Linux PDEATHSIG).

    Called by the child itself at startup (``hushnet`` CLI), not between fork and exec: no Python may run
    there while the parent has gRPC threads (gRPC's fork handlers abort the child: "epoll_wait error:
    Bad file descriptor").  If the supervisor is already gone by then, the child stops at once."""
    want = os.environ.get(PARENT_ENV)
    if not want:
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        return
    if os.getppid() != int(want):  # the supervisor died before the child could ask
        os.kill(os.getpid(), signal.SIGTERM)


#: ``wait_healthy``: while more than REASK_ALL_BELOW nodes are not yet healthy, a node is re-asked at most
#: every REASK_S seconds
REASK_S = 2.0
REASK_ALL_BELOW = 128


def node_ip(i: int) -> str:
    if i >= 253:
        raise ValueError("at most 253 local nodes (127.0.0.2 .. 127.0.0.254)")
    return f"127.0.0.{2 + i}"


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def pick_port_range(host: str, count: int, start: int | None = None) -> int:
    """A first port P with P .. P+count-1 all free on ``host`` (hosted nodes: node i on P+i)."""
    import random

    rng = random.Random()
    for _ in range(200):
        port = start if start else rng.randint(20000, 60000 - count)
        start = None
        if port + count <= 65535 and all(_port_free(host, port + i) for i in range(count)):
            return port
    raise RuntimeError(f"no range of {count} free ports found on {host}")


def pick_port(hosts: list[str], start: int | None = None) -> int:
    """A port free on every host (nodes share one port number on distinct addresses)."""
    import random

    rng = random.Random()
    for _ in range(200):
        port = start if start else rng.randint(20000, 59000)
        start = None
        if all(_port_free(h, port) for h in hosts):
            return port
    raise RuntimeError("no free port found on the loopback addresses")


BLAS_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def blas_threads_for(processes: int) -> int:
    """BLAS threads per child so that ``processes`` children together use each core once."""
    return max(1, (os.cpu_count() or 1) // max(1, processes))


@dataclass
class Child:
    name: str
    argv: list[str]
    log_path: pathlib.Path
    proc: subprocess.Popen | None = None
    restarts: int = 0
    next_restart: float = 0.0
    address: str = ""
    state_dir: str = ""
    blas_threads: int = 1  # BLAS/OpenMP threads of the child unless the environment already says

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def spawn(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as logf:
            env = dict(os.environ, PYTHONUNBUFFERED="1", **{PARENT_ENV: str(os.getpid())})
            # numpy's BLAS starts one thread per core in every process: with a process per core (or more)
            # that oversubscribes the machine, and a dense projection ran 80x slower on a loaded 2-core box
            for var in BLAS_THREAD_VARS:
                env.setdefault(var, str(self.blas_threads))
            # process_group=0: its own process group (Ctrl-C in the terminal goes to the supervisor only, which
            # stops children in order), set by the C fork path — no preexec_fn (see die_with_parent)
            self.proc = subprocess.Popen(
                self.argv,
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                process_group=0,
                env=env,
            )


@dataclass
class LocalCluster:
    state_dir: pathlib.Path
    n_nodes: int
    topology: str
    log_json: bool = False
    restart: bool = True
    token: str | None = None
    max_message_mb: float | None = None
    python: str = sys.executable
    bootstrap: Child | None = None
    nodes: list[Child] = field(default_factory=list)
    bootstrap_address: str = ""
    supervisor: bool = False  # True in `hushnet up`: record our pid so `hushnet down` can signal us
    per_process: int = 1  # nodes hosted by each OS process (hushnet.net.host)
    processes: list[Child] = field(
        default_factory=list
    )  # what is spawned: the node children, or the hosts

    def __post_init__(self) -> None:
        self.state_dir = pathlib.Path(self.state_dir).resolve()
        if self.per_process < 1:
            raise ValueError(f"per_process must be at least 1, got {self.per_process}")

    @property
    def hosted(self) -> bool:
        return self.per_process > 1 or self.n_nodes > 253

    # ------------------------------------------------------------------ start
    def _cli(self, *args: str) -> list[str]:
        argv = [self.python, "-m", "hushnet.cli", *args]
        if self.log_json:
            argv.append("--log-json")
        return argv

    def start(self, timeout: float = 60.0) -> None:
        """Start the bootstrap, wait until it serves, then start the nodes."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        bdir = self.state_dir / "bootstrap"
        logs = self.state_dir / "logs"
        old = _read_json(self.state_dir / "cluster.json")
        bport = old.get("bootstrap_port") if old else None
        if not bport or not _port_free("127.0.0.1", bport):
            bport = pick_port(["127.0.0.1"])
        self.bootstrap_address = f"127.0.0.1:{bport}"
        bargs = [
            "bootstrap",
            "serve",
            "--state-dir",
            str(bdir),
            "--listen",
            self.bootstrap_address,
            "--topology",
            self.topology,
        ]
        if self.token:
            bargs += ["--token", self.token]
        self.bootstrap = Child(
            "bootstrap",
            self._cli(*bargs),
            logs / "bootstrap.log",
            address=self.bootstrap_address,
            state_dir=str(bdir),
        )
        self.bootstrap.spawn()
        self._write_state()
        self._wait_bootstrap(timeout)

        if self.hosted:
            self._start_hosts(old, bdir, logs)
            return
        ips = [node_ip(i) for i in range(self.n_nodes)]
        nport = old.get("node_port") if old else None
        if not nport or not all(_port_free(ip, nport) for ip in ips):
            nport = pick_port(ips)
        self.node_port = nport
        self.nodes = []
        for i, ip in enumerate(ips):
            node_id = f"n{i}"
            ndir = self.state_dir / "nodes" / node_id
            args = [
                "node",
                "serve",
                "--state-dir",
                str(ndir),
                "--listen",
                f"{ip}:{nport}",
                "--bootstrap",
                self.bootstrap_address,
                "--ca",
                str(bdir / "ca.pem"),
                "--token-file",
                str(bdir / "join_token"),
                "--node-id",
                node_id,
            ]
            if self.max_message_mb:
                args += ["--max-message-mb", str(self.max_message_mb)]
            child = Child(
                node_id,
                self._cli(*args),
                logs / f"{node_id}.log",
                address=f"{ip}:{nport}",
                state_dir=str(ndir),
                blas_threads=blas_threads_for(self.n_nodes),
            )
            child.spawn()
            self.nodes.append(child)
        self.processes = self.nodes
        self._write_state()

    def _start_hosts(self, old: dict, bdir: pathlib.Path, logs: pathlib.Path) -> None:
        """Hosted layout: node i on 127.0.0.1:P+i, ``per_process`` consecutive nodes per host process."""
        host = "127.0.0.1"
        nport = old.get("node_port") if old and old.get("per_process") == self.per_process else None
        if not nport or not all(_port_free(host, nport + i) for i in range(self.n_nodes)):
            nport = pick_port_range(host, self.n_nodes)
        self.node_port = nport
        self.nodes, self.processes = [], []
        for k, first in enumerate(range(0, self.n_nodes, self.per_process)):
            ids = [f"n{i}" for i in range(first, min(first + self.per_process, self.n_nodes))]
            args = [
                "node",
                "serve",
                "--listen",
                f"{host}:{nport + first}",
                "--bootstrap",
                self.bootstrap_address,
                "--ca",
                str(bdir / "ca.pem"),
                "--token-file",
                str(bdir / "join_token"),
            ]
            for node_id in ids:
                args += [
                    "--state-dir",
                    str(self.state_dir / "nodes" / node_id),
                    "--node-id",
                    node_id,
                ]
            if self.max_message_mb:
                args += ["--max-message-mb", str(self.max_message_mb)]
            proc = Child(
                f"host-{k:03d}",
                self._cli(*args),
                logs / f"host-{k:03d}.log",
                address=f"{host}:{nport + first}",
                state_dir=str(self.state_dir / "nodes"),
                blas_threads=blas_threads_for(-(-self.n_nodes // self.per_process)),
            )
            proc.spawn()
            self.processes.append(proc)
            for j, node_id in enumerate(ids):
                self.nodes.append(
                    Child(
                        node_id,
                        proc.argv,
                        proc.log_path,
                        proc=proc.proc,
                        address=f"{host}:{nport + first + j}",
                        state_dir=str(self.state_dir / "nodes" / node_id),
                    )
                )
        self._write_state()

    def _sync_views(self) -> None:
        """Point each hosted node's view at its host's current process (after a restart)."""
        if self.processes is self.nodes:
            return
        by_log = {p.log_path: p for p in self.processes}
        for view in self.nodes:
            host = by_log[view.log_path]
            view.proc, view.restarts = host.proc, host.restarts

    def _wait_bootstrap(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        info_path = self.state_dir / "bootstrap" / "bootstrap.json"
        while time.monotonic() < deadline:
            if not self.bootstrap.alive():
                raise RuntimeError(
                    f"bootstrap exited with code {self.bootstrap.proc.returncode}; "
                    f"see {self.bootstrap.log_path}:\n{_tail(self.bootstrap.log_path)}"
                )
            info = _read_json(info_path)
            if info.get("pid") == self.bootstrap.pid:
                return
            time.sleep(0.1)
        raise RuntimeError(
            f"bootstrap did not start within {timeout:.0f} s; see {self.bootstrap.log_path}"
        )

    def _write_state(self) -> None:
        doc = {
            "supervisor_pid": os.getpid() if self.supervisor else None,
            "supervisor_start": _proc_start(os.getpid()) if self.supervisor else None,
            "topology": self.topology,
            "n_nodes": self.n_nodes,
            "bootstrap_port": int(self.bootstrap_address.rsplit(":", 1)[1])
            if self.bootstrap_address
            else None,
            "node_port": getattr(self, "node_port", None),
            "per_process": self.per_process,
            "bootstrap": self._child_doc(self.bootstrap) if self.bootstrap else None,
            "nodes": [self._child_doc(c) for c in self.nodes],
            "processes": [self._child_doc(c) for c in self.processes],
        }
        pki.write_public(self.state_dir / "cluster.json", json.dumps(doc, indent=2).encode())

    @staticmethod
    def _child_doc(c: Child) -> dict:
        return {
            "id": c.name,
            "address": c.address,
            "pid": c.pid,
            "start": _proc_start(c.pid) if c.pid else None,
            "state_dir": c.state_dir,
            "log": str(c.log_path),
            "restarts": c.restarts,
            "argv": c.argv,
        }

    # ------------------------------------------------------------------ health
    def network_status(self, timeout: float = 3.0) -> dict:
        import uvloop

        from hushnet.net.operator import Operator, OperatorCredentials

        async def go() -> dict:
            async with Operator(OperatorCredentials.from_state_dir(self.state_dir)) as op:
                return await op.network_status(timeout=timeout)

        return uvloop.run(go())

    def wait_healthy(self, timeout: float = 90.0, should_stop=lambda: False, on_sweep=None) -> dict:
        """Poll until all nodes are members, healthy, and connected to every neighbour.

        ``should_stop()`` is polled too (Ctrl-C during start-up raises :class:`InterruptedError`).
        ``on_sweep(ready, members, n)``, if given, is called after every sweep (a start-up of a thousand
        nodes takes a minute: the caller can show how many are members and fully wired so far).
        One operator (one channel per node) serves every sweep: a sweep over fresh channels costs n
        TLS handshakes, which at n = 1024 made the sweep itself the slowest part of start-up.
        """
        import asyncio

        import grpc
        import uvloop

        from hushnet.net.operator import Operator, OperatorCredentials

        deadline = time.monotonic() + timeout
        last: dict | str = "no answer yet"

        entries: dict[str, dict] = {}  # node id -> its latest status entry
        seen_at: dict[str, float] = {}
        asked_with: dict[
            str, int
        ] = {}  # node id -> its neighbours among the members when it was asked
        degree: dict[str, int] = {}  # node id -> its neighbours among the members now
        full: dict[str, int] = {}  # node id -> its neighbours in the graph
        n_members = 0

        async def go() -> dict:
            nonlocal last, n_members, degree, full
            async with Operator(OperatorCredentials.from_state_dir(self.state_dir)) as op:
                while time.monotonic() < deadline:
                    if should_stop():
                        raise InterruptedError(
                            "interrupted while waiting for the network to become healthy"
                        )
                    for child in [self.bootstrap, *self.processes]:
                        if not child.alive() and not self.restart:
                            raise RuntimeError(
                                f"{child.name} exited with code {child.proc.returncode}; see "
                                f"{child.log_path}:\n{_tail(child.log_path)}"
                            )
                    if self.poll():  # restarted processes: every answer before that is stale
                        entries.clear()
                    # re-ask only the nodes not yet healthy (and any whose answer is older than 30 s): at
                    # n = 2048 a full sweep took 15-25 s, so sweeping everyone until the last link was up
                    # added most of a minute to start-up
                    now = time.monotonic()
                    waiting = {
                        i
                        for i, e in entries.items()
                        if not (e["healthy"] and e.get("all_neighbors_connected"))
                    }
                    # while many nodes are still coming up, each is re-asked at most every REASK_S (its
                    # Status calls compete with the start-up itself for the hosts' CPU); the last few are
                    # asked on every sweep, so the end of the start-up is seen at once
                    gap = REASK_S if len(waiting) > REASK_ALL_BELOW else 0.0
                    # a node some of whose neighbours have not joined yet cannot be wired: it is asked once
                    # they all have (or once every node has joined, for a graph with vertices left empty)
                    all_joined = n_members >= self.n_nodes
                    only = (
                        None
                        if not entries
                        else {
                            i
                            for i in entries
                            if (
                                i in waiting
                                and now - seen_at[i] >= gap
                                and (all_joined or degree.get(i) == full.get(i))
                            )
                            or now - seen_at[i] > 30.0
                            or (i not in waiting and asked_with.get(i) != degree.get(i))
                        }
                    )  # "wired" was judged against fewer neighbours (not: fewer members anywhere, which
                    # re-asked every node on every sweep of a join storm: ~2 000 Status calls a sweep)
                    try:
                        doc = await op.network_status(
                            timeout=max(3.0, self.n_nodes / 200), only=only, follow=True
                        )
                        members = doc["members"]
                        degree = doc.get("expected_degree", {})
                        full = doc.get("graph_degree", {})
                        for e in doc["nodes"]:
                            entries[e["id"]], seen_at[e["id"]], asked_with[e["id"]] = (
                                e,
                                now,
                                degree.get(e["id"]),
                            )
                        n_members = len(members)
                        for i in [i for i in entries if i not in members]:
                            del entries[i]
                        for i in (
                            members
                        ):  # a member we have not asked yet (joined since): ask next round
                            if i not in entries:
                                entries[i] = {"id": i, "healthy": False, "vertex": -1}
                                seen_at[i] = now
                        nodes = sorted(entries.values(), key=lambda e: e["vertex"])
                        doc = {
                            **doc,
                            "nodes": nodes,
                            "serving": bool(nodes) and all(n.get("serving") for n in nodes),
                            "wired": bool(nodes) and all(n.get("wired") for n in nodes),
                            "healthy": bool(nodes)
                            and all(n.get("serving") and n.get("wired") for n in nodes),
                        }
                        last = doc
                        if on_sweep is not None:
                            ready = sum(
                                1
                                for n in nodes
                                if n.get("serving")
                                and n.get("wired")
                                and n.get("all_neighbors_connected")
                            )
                            on_sweep(ready, n_members, self.n_nodes)
                        if (
                            len(nodes) == self.n_nodes
                            and doc["healthy"]
                            and all(n.get("all_neighbors_connected") for n in nodes)
                        ):
                            return doc
                    except (
                        grpc.aio.AioRpcError,
                        grpc.RpcError,
                        OSError,
                        ValueError,
                        KeyError,
                    ) as exc:
                        last = str(exc)
                    await asyncio.sleep(0.5)
            summary = (
                last
                if isinstance(last, str)
                else {
                    n["id"]: (n["healthy"], n.get("connected"), n.get("neighbors"))
                    for n in last["nodes"]
                    if not (n["healthy"] and n.get("all_neighbors_connected"))
                }
            )
            raise TimeoutError(f"network not healthy after {timeout:.0f} s: {summary}")

        return uvloop.run(go())

    # ------------------------------------------------------------------ supervision and stop
    def poll(self) -> list[str]:
        """Restart children that died (with backoff); returns the names restarted now."""
        restarted = []
        if not self.restart:
            return restarted
        now = time.monotonic()
        for child in [c for c in [self.bootstrap, *self.processes] if c is not None]:
            if child.proc is not None and child.proc.poll() is not None:
                if child.next_restart == 0.0:
                    delay = min(0.5 * (2 ** min(child.restarts, 5)), 10.0)
                    child.next_restart = now + delay
                    log.warning(
                        "%s exited with code %s; restarting in %.1f s",
                        child.name,
                        child.proc.returncode,
                        delay,
                        extra={"event": "child_exit", "child": child.name},
                    )
                elif now >= child.next_restart:
                    child.restarts += 1
                    child.next_restart = 0.0
                    child.spawn()
                    restarted.append(child.name)
                    log.info(
                        "restarted %s (pid %d)",
                        child.name,
                        child.pid,
                        extra={"event": "child_restart"},
                    )
        if restarted:
            self._sync_views()
            self._write_state()
        return restarted

    def signal_processes(self, sig: int) -> None:
        """Send ``sig`` to every node or host process still running (not the bootstrap)."""
        for child in self.processes:
            if child.alive():
                try:
                    child.proc.send_signal(sig)
                except ProcessLookupError:
                    pass

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM nodes (they leave the network), then the bootstrap; SIGKILL what lingers."""
        self.restart = False
        for group in (self.processes, [self.bootstrap] if self.bootstrap else []):
            for child in group:
                if child.alive():
                    child.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for child in group:
                if child.proc is None:
                    continue
                try:
                    child.proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
                except subprocess.TimeoutExpired:
                    log.warning("%s did not stop within %.0f s; killing it", child.name, timeout)
                    child.proc.kill()
                    child.proc.wait(timeout=5)


def stop_recorded(state_dir: pathlib.Path, timeout: float = 30.0) -> str:
    """``hushnet down``: ask the supervisor recorded in ``cluster.json`` to stop, and wait.

    If the supervisor is gone but children survived, they are terminated directly (only
    processes whose command line names this state directory).
    """
    state_dir = pathlib.Path(state_dir).resolve()
    doc = _read_json(state_dir / "cluster.json")
    if not doc:
        raise RuntimeError(
            f"no cluster.json in {state_dir}: nothing started there with 'hushnet up'"
        )
    sup = doc.get("supervisor_pid")
    if sup and _proc_start(sup) == doc.get("supervisor_start"):
        os.kill(sup, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _pid_alive(sup):
            time.sleep(0.2)
        if _pid_alive(sup):
            raise RuntimeError(f"supervisor {sup} did not stop within {timeout:.0f} s")
        return f"stopped the network in {state_dir} (supervisor pid {sup})"
    killed = []
    for child in [doc.get("bootstrap") or {}, *(doc.get("processes") or doc.get("nodes", []))]:
        pid = child.get("pid")
        if pid and child.get("start") and _proc_start(pid) == child.get("start"):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            killed.append(child["id"])
    return f"supervisor not running; terminated leftover processes: {', '.join(killed) or 'none'}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie counts as gone
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _proc_start(pid: int) -> int | None:
    """Kernel start time of ``pid`` (identifies a process even if its pid is later reused)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _read_json(path: pathlib.Path) -> dict:
    try:
        return json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError):
        return {}


def _tail(path: pathlib.Path, lines: int = 15) -> str:
    try:
        return "\n".join(pathlib.Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
