"""Node hosting: many complete peers in one OS process (real TLS on loopback, real processes).

Checks: a misbehaving hosted node (handler that raises, handler that never returns, a background
task that dies, a node that cannot start) leaves its neighbours on the same host serving; the
host refuses nodes past its descriptor, memory or count limits with a clear error; each hosted
node's log records carry its own id; bad input to the hosting CLI is one clear line; a walk node
process loads neither networkx nor scipy.stats.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import subprocess
import sys
import time

import grpc
import pytest
import uvloop
from helpers.net import HUSHNET, REPO, cli, inprocess_bootstrap  # noqa: E402

from hushnet.net.host import (  # noqa: E402
    HostLimitError,
    HostLimits,
    NodeHost,
    default_per_process,
    hosted_configs,
)
from hushnet.net.node import DeliveryError, NodeConfig  # noqa: E402

pytestmark = pytest.mark.timeout(150)


class Boom:
    protocol = "test.boom"

    def handle(self, envelope):
        raise RuntimeError("boom in a hosted node's handler")


class Stuck:
    protocol = "test.stuck"

    async def handle(self, envelope):
        await asyncio.Event().wait()  # never returns


async def _bootstrap(tmp: pathlib.Path, spec: str):
    return await inprocess_bootstrap(tmp, spec)


def _configs(tmp: pathlib.Path, addr: str, ids: list[str]) -> list[NodeConfig]:
    return hosted_configs(
        [tmp / i for i in ids],
        "127.0.0.1:0",
        ids,
        bootstrap=addr,
        token="tok",
        ca_file=tmp / "b" / "ca.pem",
    )


async def _healthy(nodes, n: int, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if all(
            len(x.members) >= n
            and x.links
            and len(x.links) == len(x.neighbors)
            and all(link.healthy for link in x.links.values())
            for x in nodes
        ):
            return
        await asyncio.sleep(0.1)
    raise AssertionError("hosted nodes not healthy")


def test_misbehaving_hosted_node_is_contained(tmp_path: pathlib.Path) -> None:
    """Raise, hang, crash a background task, fail to start: the other hosted nodes keep serving."""

    async def go():
        addr, stop, btask = await _bootstrap(tmp_path, "complete:4")
        configs = _configs(tmp_path, addr, ["n0", "n1", "n2", "n3"])
        for c in configs:
            c.probe_s = c.directory_refresh_s = 0.3
        bad = hosted_configs(
            [tmp_path / "n3"],
            "127.0.0.1:0",
            ["not-n3"],
            bootstrap=addr,
            token="tok",
            ca_file=tmp_path / "b" / "ca.pem",
        )[0]
        host = NodeHost(configs, watchdog_s=0.2)
        try:
            await host.start()
            a, b, c, d = host.running
            await _healthy([a, b, c, d], 4)
            a.register_handler(Boom())
            a.register_handler(Stuck())
            with pytest.raises(DeliveryError) as info:
                await b.send("n0", b"x", protocol="test.boom")
            assert info.value.code == grpc.StatusCode.INTERNAL and "boom" in info.value.details
            with pytest.raises(DeliveryError) as info:
                await b.send("n0", b"x", protocol="test.stuck", timeout=1.0)
            assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
            # the node that raised and hung still serves, and so do its neighbours on the same host
            for src, dst in (("n1", "n0"), ("n2", "n1"), ("n0", "n3"), ("n3", "n2")):
                node = {x.node_id: x for x in host.running}[src]
                assert (await node.send(dst, b"ping", protocol="net.ping", timeout=10)).accepted

            # a background task of n3 dies: the watchdog stops n3 only, and says why
            async def dies():
                raise RuntimeError("probe loop bug")

            d._tasks.append(asyncio.get_running_loop().create_task(dies(), name="probe"))
            for _ in range(100):
                if str(configs[3].state_dir) in host.failed:
                    break
                await asyncio.sleep(0.1)
            assert "probe loop bug" in host.failed[str(configs[3].state_dir)]
            assert {x.node_id for x in host.running} == {"n0", "n1", "n2"}
            assert (await a.send("n1", b"ping", protocol="net.ping", timeout=10)).accepted

            # a node that cannot start (its state directory belongs to n3) is refused; the host keeps going
            with pytest.raises(Exception, match="belongs to node n3"):
                await host.add(bad)
            assert "belongs to node n3" in host.failed[str(bad.state_dir)] or any(
                "belongs to node n3" in r for r in host.failed.values()
            )
            assert (await c.send("n0", b"ping", protocol="net.ping", timeout=10)).accepted
            assert host.summary()["running"] == 3
        finally:
            await host.stop()
            stop.set()
            await btask

    uvloop.run(go())


def test_host_refuses_nodes_past_its_node_limit(tmp_path: pathlib.Path) -> None:
    async def go():
        addr, stop, btask = await _bootstrap(tmp_path, "complete:3")
        configs = _configs(tmp_path, addr, ["n0", "n1", "n2"])
        host = NodeHost(configs[:2], limits=HostLimits(max_nodes=2))
        try:
            await host.start()
            assert len(host.running) == 2
            with pytest.raises(
                HostLimitError, match=r"node host is full: 2 nodes hosted, the limit is 2"
            ):
                await host.add(configs[2])
            assert len(host.running) == 2
        finally:
            await host.stop()
            stop.set()
            await btask

    uvloop.run(go())


def _start_bootstrap_process(tmp: pathlib.Path, spec: str) -> tuple[subprocess.Popen, str]:
    bdir = tmp / "b"
    proc = subprocess.Popen(
        [
            *HUSHNET,
            "bootstrap",
            "serve",
            "--state-dir",
            str(bdir),
            "--listen",
            "127.0.0.1:0",
            "--topology",
            spec,
            "--token",
            "tok",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(300):
        try:
            info = json.loads((bdir / "bootstrap.json").read_text())
            if info.get("pid") == proc.pid:
                return proc, info["address"]
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("bootstrap did not start")


def _limit_fds(n: int) -> list[str]:
    """A command prefix that runs the rest of the command with an open-file limit of ``n``.

    Not ``preexec_fn``: that makes subprocess fork without exec in between, and a fork of this process —
    which runs gRPC in other tests — restarts gRPC's poller thread in the child, where it found its
    epoll descriptor closed and aborted before the exec (CI: ``epoll_wait error: Bad file descriptor``,
    the host "exited" with -6 before it ran).  Here the child is a fresh interpreter that sets the
    limit and execs."""
    return [
        sys.executable,
        "-c",
        "import os, resource, sys; "
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({n}, {n})); "
        "os.execv(sys.argv[1], sys.argv[1:])",
    ]


def test_descriptor_limit_refuses_the_nodes_that_do_not_fit(tmp_path: pathlib.Path) -> None:
    """A process allowed 400 descriptors hosts what fits and refuses the rest, one clear line each."""
    boot, addr = _start_bootstrap_process(tmp_path, "complete:6")
    out = tmp_path / "host.log"
    try:
        with open(out, "wb") as fh:
            host = subprocess.Popen(
                [
                    *_limit_fds(400),
                    *HUSHNET,
                    "node",
                    "serve",
                    "--state-dir",
                    str(tmp_path / "h"),
                    "--count",
                    "6",
                    "--listen",
                    "127.0.0.1:0",
                    "--bootstrap",
                    addr,
                    "--ca",
                    str(tmp_path / "b" / "ca.pem"),
                    "--token",
                    "tok",
                    "--start-concurrency",
                    "1",
                    "--log-json",
                ],
                cwd=REPO,
                stdout=fh,
                stderr=subprocess.STDOUT,
            )
        try:
            for _ in range(600):
                text = out.read_text(errors="replace")
                if "host_serving" in text or host.poll() is not None:
                    break
                time.sleep(0.1)
            records = [
                json.loads(line) for line in out.read_text().splitlines() if line.startswith("{")
            ]
            assert host.poll() is None, out.read_text()
            failed = [r for r in records if r.get("event") == "host_node_failed"]
            serving = [r for r in records if r.get("event") == "serving"]
            assert failed and serving and len(failed) + len(serving) == 6, out.read_text()
            assert all("file descriptors" in r["msg"] and "of 400" in r["msg"] for r in failed)
            # each node's records are signed with its own id, not the last one to start
            assert all(
                r["msg"].startswith(f"node {r['node']} serving on {r['address']}") for r in serving
            )
            assert len({r["node"] for r in serving}) == len(serving)
            summary = next(r for r in records if r.get("event") == "host_serving")
            assert summary["running"] == len(serving)
        finally:
            host.terminate()
            host.wait(timeout=30)
    finally:
        boot.terminate()
        boot.wait(timeout=30)


def test_memory_limit_and_bad_hosting_input_are_one_clear_line(tmp_path: pathlib.Path) -> None:
    boot, addr = _start_bootstrap_process(tmp_path, "complete:2")
    try:
        common = [
            "--listen",
            "127.0.0.1:0",
            "--bootstrap",
            addr,
            "--ca",
            str(tmp_path / "b" / "ca.pem"),
            "--token",
            "tok",
            "--join-timeout",
            "20",
        ]
        proc = cli(
            "node",
            "serve",
            "--state-dir",
            str(tmp_path / "h"),
            "--count",
            "2",
            "--min-free-mb",
            "1e9",
            *common,
        )
        assert proc.returncode == 1
        assert (
            "no hosted node started (2 tried)" in proc.stderr and "memory available" in proc.stderr
        )
        assert "Traceback" not in proc.stderr
    finally:
        boot.terminate()
        boot.wait(timeout=30)
    cases = [
        (
            ["--state-dir", "a", "--state-dir", "b", "--count", "2"],
            "--count takes exactly one --state-dir",
        ),
        (["--state-dir", "a", "--state-dir", "b", "--node-id", "n0"], "1 --node-id for 2 nodes"),
        (["--state-dir", "a", "--state-dir", "a"], "the same state directory is given twice"),
        (["--state-dir", "a", "--count", "0"], "--count must be at least 1"),
        (["--state-dir", "a", "--count", "2", "--max-nodes", "0"], "max_nodes must be at least 1"),
        (
            ["--state-dir", "a", "--count", "2", "--advertise", "x:1"],
            "--advertise with several nodes needs a fixed --listen port",
        ),
    ]
    for args, message in cases:
        p = cli(
            "node",
            "serve",
            "--listen",
            "127.0.0.1:0",
            *[str(tmp_path / a) if a in ("a", "b") else a for a in args],
        )
        assert p.returncode == 1 and message in p.stderr and "Traceback" not in p.stderr, (
            args,
            p.stderr,
        )
    p = cli("up", "--nodes", "4", "--per-process", "0", "--state-dir", str(tmp_path / "u"))
    assert p.returncode == 1 and "--per-process must be at least 1" in p.stderr


def test_hosted_nodes_advertise_their_own_ports(tmp_path) -> None:
    """A container or NAT'd machine listens on 0.0.0.0 and publishes its address: node i at PORT+i."""
    dirs = [tmp_path / f"node-{i:03d}" for i in range(3)]
    addrs = lambda adv: [c.advertise for c in hosted_configs(dirs, "0.0.0.0:7500", advertise=adv)]  # noqa: E731
    assert addrs("10.0.0.5:9000") == ["10.0.0.5:9000", "10.0.0.5:9001", "10.0.0.5:9002"]
    assert addrs("10.0.0.5") == ["10.0.0.5:7500", "10.0.0.5:7501", "10.0.0.5:7502"]
    assert addrs("host.example:7600")[2] == "host.example:7602"
    assert addrs("fd00::5")[1] == addrs("[fd00::5]")[1] == "[fd00::5]:7501"
    assert addrs("[fd00::5]:9000")[2] == "[fd00::5]:9002"
    assert addrs(None) == [None, None, None]
    assert [c.listen for c in hosted_configs(dirs, "0.0.0.0:7500", advertise="h")] == [
        "0.0.0.0:7500",
        "0.0.0.0:7501",
        "0.0.0.0:7502",
    ]
    for listen, adv, message in [
        ("0.0.0.0:0", "10.0.0.5:9000", "needs a fixed --listen port"),
        ("0.0.0.0:7500", "10.0.0.5:65534", "advertised ports 65534..65536"),
        ("0.0.0.0:7500", "10.0.0.5:x", "is not HOST or HOST:PORT"),
    ]:
        with pytest.raises(ValueError, match=message):
            hosted_configs(dirs, listen, advertise=adv)


def test_default_per_process_follows_the_machine() -> None:
    # small networks: a process per node while that is cheap
    assert default_per_process(8, cores=2, nofile=20000, mem_mb=20000) == 1
    # larger: one process per core, capped by the descriptors a process may hold
    assert (
        default_per_process(1024, cores=2, nofile=20000, mem_mb=20000) == 342
    )  # 3 processes, not 493+493+38
    assert default_per_process(1024, cores=8, nofile=20000, mem_mb=20000) == 128
    assert (
        default_per_process(1024, cores=2, nofile=4096, mem_mb=20000) == 94
    )  # ≤ (4096-256)//40 = 96, 11 processes
    # little memory: no process per node even for a small network
    assert default_per_process(8, cores=2, nofile=20000, mem_mb=1000) == 4
    with pytest.raises(ValueError):
        default_per_process(0)


def test_walk_node_process_loads_neither_networkx_nor_scipy_stats() -> None:
    code = (
        "import sys, hushnet.net.node, hushnet.net.host, hushnet.runs.service\n"
        "from hushnet.runs.spec import RunSpec, Budget\n"
        "from hushnet.runs.accounting import contribution_cost\n"
        "s = RunSpec(protocol='rw-dpsgd', task='logreg', graph='hypercube:6', steps=50, seed=1, "
        "budget=Budget(1e6, 1e-5), sigma=2.0, clip=1.0, step_size=0.1, cap=None).with_run_id()\n"
        "contribution_cost(s, 3, [f'n{i}' for i in range(64)]).curves(s.sigma)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'networkx' or m.startswith('scipy.stats') "
        "or m.startswith('scipy.optimize')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_host_process_loads_no_scipy_before_its_first_run() -> None:
    """The node, the host and every node plugin (the run service with its families, tasks and machine
    registry) import without scipy: a host process started ~0.25 s of imports sooner per host (scipy.sparse,
    its graph tools and scipy.special, 190 modules) at the 2048-node start-up, and needs them only when a
    run is submitted; a walk's hop rule and the logistic task still work on what they get."""
    code = (
        "import sys\n"
        "import hushnet.net.node, hushnet.net.host\n"
        "from hushnet.net.plugins import load_plugins\n"
        "from hushnet.net.node import Node, NodeConfig\n"
        "node = Node(NodeConfig('unused-state-dir'))\n"
        "for plugin in load_plugins():\n"
        "    plugin(node)\n"  # each plugin installed on a node, as a host does before the node starts
        "assert 'run.schedule' in node.controls.commands()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'scipy'))\n"
        "import numpy as np\n"
        "from hushnet.families.walk.hops import TransitionRow\n"
        "from hushnet.protocols.registry import transition_matrix\n"
        "from hushnet.tasks.logistic import LogisticRegressionTask\n"
        "W = transition_matrix('ring:4')\n"
        "print(type(W).__module__.split('.')[0], TransitionRow.from_matrix(W, 1).cols.tolist())\n"
        "X = np.array([[1.0, 0.0], [0.0, 1.0]]); y = np.array([1.0, -1.0])\n"
        "print((LogisticRegressionTask(X, y).raw_gradient(np.zeros(3)) + 0.0).tolist())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["[]", "scipy [0, 1, 2]", "[-0.25, 0.25, 0.0]"], out.stdout


def test_node_and_bootstrap_commands_do_not_import_the_privacy_tools() -> None:
    """``hushnet node serve`` / ``bootstrap serve`` build only the network commands' parser (the privacy
    tools import numpy and scipy: seconds of CPU per process when ``hushnet up`` starts several at once);
    an unknown or absent command still gets every area's parser."""
    code = (
        "import sys\n"
        "from hushnet.cli import build_parser\n"
        "for cmd in ('node', 'bootstrap', 'up', 'status'):\n"
        "    assert cmd in build_parser(cmd)._subparsers._group_actions[0].choices, cmd\n"
        "print(sorted(m for m in ('numpy', 'scipy', 'hushnet.privacy.cli') if m in sys.modules))\n"
        "full = build_parser(None)._subparsers._group_actions[0].choices\n"
        "print('privacy' in full and 'node' in full, "
        "'privacy' in build_parser('privacy')._subparsers._group_actions[0].choices)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[]", "True True"], out.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "hushnet.cli", "nosuchcommand"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "invalid choice: 'nosuchcommand'" in bad.stderr, bad.stderr


def test_records_of_plain_loggers_in_a_hosted_handler_name_their_node(
    tmp_path: pathlib.Path,
) -> None:
    """A feature's own logger (not the node's adapter) inside a handler still signs with the hosting node's id."""
    import logging

    from hushnet.net.logs import _IdentityFilter, set_identity

    seen: list[tuple[str, str]] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append((record.getMessage(), record.node))

    class Loud:
        protocol = "test.loud"

        def __init__(self, me: str) -> None:
            self.me = me

        def handle(self, envelope) -> None:
            logging.getLogger("hushnet.feature").warning("handled at %s", self.me)

    cap = Capture()
    cap.addFilter(_IdentityFilter())
    feature = logging.getLogger("hushnet.feature")
    feature.addHandler(cap)
    set_identity("host")

    async def go():
        addr, stop, btask = await _bootstrap(tmp_path, "complete:3")
        host = NodeHost(_configs(tmp_path, addr, ["n0", "n1", "n2"]))
        try:
            await host.start()
            nodes = {x.node_id: x for x in host.running}
            await _healthy(list(nodes.values()), 3)
            for name, node in nodes.items():
                node.register_handler(Loud(name))
            await nodes["n0"].send("n1", b"x", protocol="test.loud")
            await nodes["n1"].send("n2", b"x", protocol="test.loud")
            await nodes["n2"].send("n0", b"x", protocol="test.loud")
        finally:
            await host.stop()
            stop.set()
            await btask

    try:
        uvloop.run(go())
    finally:
        feature.removeHandler(cap)
        set_identity("-")
    assert sorted(seen) == [
        ("handled at n0", "n0"),
        ("handled at n1", "n1"),
        ("handled at n2", "n2"),
    ]


def test_probe_period_stretches_with_the_number_of_hosted_nodes(tmp_path: pathlib.Path) -> None:
    """Health probes cost a host the same whatever K: each node probes every max(probe_s, K / rate) s."""
    configs = hosted_configs(
        [tmp_path / f"d{i}" for i in range(300)], "127.0.0.1:0", bootstrap="127.0.0.1:1"
    )
    host = NodeHost(configs, limits=HostLimits(probe_rounds_per_s=50.0))
    assert {(e.config.probe_s, e.config.heartbeat_s) for e in host.entries} == {(6.0, 6.0)}
    assert {e.config.health_rpc_s for e in host.entries} == {
        96.0
    }  # Health RPC every 16 probe periods on a connected link
    assert {e.config.keepalive_s for e in host.entries} == {24.0}  # keepalive: 4 probe periods
    assert {e.config.probe_misses for e in host.entries} == {3}  # one more miss than a lone node
    fewer = NodeHost(configs, limits=HostLimits(health_rpc_every=4))
    assert {e.config.health_rpc_s for e in fewer.entries} == {24.0}
    assert configs[0].probe_s == 2.0  # the caller's configs are left as they were
    small = NodeHost(configs[:8])
    assert {e.config.probe_s for e in small.entries} == {2.0}
    assert {e.config.health_rpc_s for e in small.entries} == {
        0.0
    }  # small hosts: every probe an RPC
    assert {e.config.keepalive_s for e in small.entries} == {20.0}
    assert {e.config.probe_misses for e in small.entries} == {2}
    with pytest.raises(ValueError, match="probe_rounds_per_s must be positive"):
        HostLimits(probe_rounds_per_s=0)
    with pytest.raises(ValueError, match="health_rpc_every must be at least 1"):
        HostLimits(health_rpc_every=0.5)
    with pytest.raises(ValueError, match="probe_misses must be at least 1"):
        HostLimits(probe_misses=0)


def test_wait_healthy_paces_its_questions_while_many_nodes_come_up(
    tmp_path: pathlib.Path, monkeypatch
) -> None:
    """Real host processes (2 × 8 nodes): with the pacing on from the first node (``REASK_ALL_BELOW = 0``: a node
    not yet wired is re-asked at most every ``REASK_S``), ``wait_healthy`` still asks every node and returns only
    once every node serves and is connected to every neighbour."""
    from hushnet.net import cluster as cluster_mod
    from hushnet.net.hostcontrol import HostBatchClient
    from hushnet.net.operator import Operator

    monkeypatch.setattr(cluster_mod, "REASK_ALL_BELOW", 0)
    monkeypatch.setattr(cluster_mod, "REASK_S", 1.0)
    asked: list[tuple[str, float]] = []
    real = Operator.status

    async def counted(self, node_id, address, timeout=3.0):
        asked.append((node_id, time.monotonic()))
        return await real(self, node_id, address, timeout=timeout)

    monkeypatch.setattr(Operator, "status", counted)
    # most nodes are asked through their host process's batch (one call per host, each answer the node's own)
    real_ask = HostBatchClient.ask

    async def batched(self, members, command, args, ids, *a, **kw):
        asked.extend((i, time.monotonic()) for i in ids)
        return await real_ask(self, members, command, args, ids, *a, **kw)

    monkeypatch.setattr(HostBatchClient, "ask", batched)
    c = cluster_mod.LocalCluster(tmp_path, 16, "hypercube:4", restart=False, per_process=8)
    try:
        c.start(timeout=60)
        doc = c.wait_healthy(timeout=120)
        # the host processes run numpy's BLAS with one thread per core between them, not one per core each
        want = str(cluster_mod.blas_threads_for(2))
        for proc in c.processes:
            env = dict(
                kv.split("=", 1)
                for kv in pathlib.Path(f"/proc/{proc.pid}/environ").read_text().split("\0")
                if "=" in kv
            )
            for var in cluster_mod.BLAS_THREAD_VARS:
                assert env.get(var) == os.environ.get(var, want), var
    finally:
        c.stop()
    assert len(doc["nodes"]) == 16 and doc["healthy"]
    assert all(n["all_neighbors_connected"] and len(n["connected"]) == 4 for n in doc["nodes"])
    assert {node_id for node_id, _ in asked} == {f"n{i}" for i in range(16)}


def test_tune_gc_raises_the_young_threshold_and_freezes_the_imports() -> None:
    """A host process collects cycles every 10 000 allocations, not 700, and leaves the imports' objects out."""
    import gc

    from hushnet.net.host import tune_gc

    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_threshold() == (10_000, before[1], before[2])
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_a_host_logs_its_loop_lag_and_rpc_rates(tmp_path: pathlib.Path, caplog) -> None:
    """Every ``load_log_s`` a host logs one ``host_load`` line: its loop's lag (a blocked loop shows), the
    CPU per second by thread kind and the RPCs per second by kind (here Deliver served and probe RPCs) —
    what was missing when host loops stalled at n = 1024 and nobody could say on what."""
    import logging

    from hushnet.net.load import host_load_lines

    caplog.set_level(logging.INFO, logger="hushnet.host")

    async def go():
        addr, stop, btask = await _bootstrap(tmp_path, "complete:3")
        configs = _configs(tmp_path, addr, ["n0", "n1", "n2"])
        for c in configs:
            c.probe_s = 0.3
        host = NodeHost(configs, watchdog_s=0.2, load_log_s=1.5)
        try:
            await host.start()
            nodes = {x.node_id: x for x in host.running}
            await _healthy(list(nodes.values()), 3)
            for _ in range(3):
                await nodes["n0"].send("n1", b"x", protocol="net.discard")
            time.sleep(0.8)  # the whole loop blocked: the next line's lag shows it
            for _ in range(40):
                if [r for r in caplog.records if getattr(r, "event", "") == "host_load"][1:]:
                    break
                await asyncio.sleep(0.2)
        finally:
            await host.stop()
            stop.set()
            await btask

    uvloop.run(go())
    recs = [r for r in caplog.records if getattr(r, "event", "") == "host_load"]
    assert recs, "no host_load line"
    assert max(r.lag_max_s for r in recs) >= 0.5
    rates: dict[str, float] = {}
    for r in recs:
        for k, v in r.rates.items():
            rates[k] = rates.get(k, 0.0) + v
    assert rates.get("deliver_served", 0) > 0 and rates.get("probe_rpc", 0) > 0, rates
    assert set(recs[0].cpu_per_s) <= {"loop", "grpc", "other"}
    parsed = host_load_lines("\n".join(r.getMessage() for r in recs))  # what the benchmark reads
    assert len(parsed) == len(recs) and parsed[0]["rates"] == recs[0].rates
    assert parsed[0]["rss_mb"] == pytest.approx(recs[0].rss_mb, abs=1.0) and recs[0].rss_mb > 10
    with pytest.raises(ValueError, match="HUSHNET_HOST_LOAD_S must be a number"):
        os.environ["HUSHNET_HOST_LOAD_S"] = "soon"
        try:
            NodeHost([])
        finally:
            del os.environ["HUSHNET_HOST_LOAD_S"]
