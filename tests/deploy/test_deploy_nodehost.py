"""Node-host containers on engines that share no network: K nodes per container, reached only
through the container's published port range.

This is how a machine that is not part of a swarm adds K nodes to a network (deploy/README.md,
"Growing a network from one machine to several"): ``docker run -p P..P+K-1:7500..7500+K-1`` with
``HUSHNET_NODES_PER_CONTAINER=K`` and ``HUSHNET_ADVERTISE=<machine address>:P``. Here the two
"machines" are two containers on one engine, each publishing its own range on the Docker bridge's
gateway address, and the bootstrap is a process on the host: every node dials every other node,
including the ones in its own container, through a published port, as it would across machines.

Checked: both containers' healthchecks cover their K nodes; the directory lists node i of each
container at ``gateway:P+i``; a private walk (rw-dpsgd) over hypercube:3 finishes with visits in
both containers, each node's run policy (data shard, budget) written per hosted node.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socket
import subprocess
import time

import pytest
from helpers.deploy import (
    HUSHNET,
    TIMINGS,
    docker,
    inspect,
    make_data_dir,
    run,
    spec_toml,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(400)]

K, REPLICAS, TOPOLOGY = 4, 2, "hypercube:3"


def _free_range(host: str, count: int, start: int = 21000) -> int:
    """The first port P >= start such that P .. P+count-1 are all free on ``host``."""
    port = start
    while port + count < 65000:
        socks = []
        try:
            for p in range(port, port + count):
                s = socket.socket()
                socks.append(s)
                s.bind((host, p))
            return port
        except OSError:
            port += count
        finally:
            for s in socks:
                s.close()
    raise AssertionError(f"no {count} consecutive free ports on {host}")


def bridge_gateway() -> str:
    """The host's address on Docker's default bridge, which the containers reach it at.  An engine just
    started may list the bridge's subnet without its gateway (CI: ``KeyError: 'Gateway'``): then it is
    the address of the bridge's own interface in that subnet."""
    net = json.loads(docker("network", "inspect", "bridge").stdout)[0]
    cfg = net["IPAM"]["Config"][0]
    if cfg.get("Gateway"):
        return cfg["Gateway"]
    dev = net.get("Options", {}).get("com.docker.network.bridge.name", "docker0")
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "dev", dev], capture_output=True, text=True, check=True
    ).stdout
    subnet = ipaddress.ip_network(cfg["Subnet"])
    for word in out.split():
        if "/" in word and ipaddress.ip_interface(word).ip in subnet:
            return str(ipaddress.ip_interface(word).ip)
    raise AssertionError(f"no address of {dev} in Docker's bridge subnet {subnet}: {out!r}")


def test_node_host_containers_reached_through_published_ports(hushnet_image, tmp_path):
    gateway = bridge_gateway()
    n = K * REPLICAS
    boot_port = _free_range(gateway, 1, start=20400)
    boot_state = tmp_path / "bootstrap"
    logf = open(tmp_path / "bootstrap.log", "ab")
    boot = subprocess.Popen(
        [
            str(HUSHNET),
            "bootstrap",
            "serve",
            "--state-dir",
            str(boot_state),
            "--listen",
            f"{gateway}:{boot_port}",
            "--topology",
            TOPOLOGY,
        ],
        stdout=logf,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    data_dir = make_data_dir(n)
    containers: list[str] = []
    t0 = time.monotonic()
    try:
        wait_for(
            lambda: (
                (boot_state / "bootstrap.json").exists() and (boot_state / "join_token").exists()
            ),
            60,
            what="the bootstrap to create its state",
        )
        # what the operator hands to each machine: the CA certificate and the join token
        etc = tmp_path / "etc"
        etc.mkdir()
        etc.chmod(0o755)
        for name in ("ca.pem", "join_token"):
            (etc / name).write_bytes((boot_state / name).read_bytes())
            (etc / name).chmod(0o644)  # readable by the image's user (a test; use secrets)
        bases = {}
        for r in range(REPLICAS):
            base = _free_range(gateway, K, start=21000 + 100 * r)
            bases[r] = base
            cid = docker(
                "run",
                "-d",
                "--label",
                f"hushnet-test=nodehost-{os.getpid()}",
                "-p",
                f"{gateway}:{base}-{base + K - 1}:7500-{7500 + K - 1}",
                "-e",
                f"HUSHNET_NODES_PER_CONTAINER={K}",
                "-e",
                f"HUSHNET_ADVERTISE={gateway}:{base}",
                "-e",
                f"HUSHNET_BOOTSTRAP={gateway}:{boot_port}",
                "-e",
                "HUSHNET_CA_FILE=/etc/hushnet/ca.pem",
                "-e",
                "HUSHNET_TOKEN_FILE=/etc/hushnet/join_token",
                "-e",
                "HUSHNET_DATA_PATH=/data/node-<vertex>.npz",
                "-e",
                "HUSHNET_BUDGET_EPSILON=100",
                "-v",
                f"{etc}:/etc/hushnet:ro",
                "-v",
                f"{data_dir}:/data:ro",
                hushnet_image,
                "node",
            ).stdout.strip()
            containers.append(cid)

        def network_up() -> dict | None:
            proc = run(
                [str(HUSHNET), "status", "--state-dir", str(boot_state), "--json"],
                check=False,
                timeout=60,
            )
            doc = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None
            ok = (
                doc
                and len(doc["nodes"]) == n
                and doc["healthy"]
                and all(m.get("all_neighbors_connected") for m in doc["nodes"])
            )
            return doc if ok else None

        doc = wait_for(network_up, 120, interval=1.0, what=f"{n} nodes in two node-host containers")
        TIMINGS["nodehost_containers_healthy_s"] = time.monotonic() - t0
        # every node is published at the gateway, in its container's range
        host_of = {}
        for m in doc["nodes"]:
            ip, port = m["address"].rsplit(":", 1)
            assert ip == gateway, m
            host_of[m["id"]] = next(r for r, b in bases.items() if b <= int(port) < b + K)
        assert sorted(list(host_of.values()).count(r) for r in bases) == [K] * REPLICAS
        wait_for(
            lambda: all(inspect(c)["State"]["Health"]["Status"] == "healthy" for c in containers),
            90,
            what="node-host healthchecks",
        )
        for cid in containers:
            out = inspect(cid)["State"]["Health"]["Log"][-1]["Output"]
            assert f"node host: {K}/{K} nodes serving" in out, out

        steps = 160
        spec = tmp_path / "run.toml"
        spec.write_text(spec_toml(steps=steps, sigma=10.0, seed=51, graph=TOPOLOGY, epsilon=100.0))
        proc = run(
            [str(HUSHNET), "run", "start", str(spec), "--state-dir", str(boot_state), "--watch"],
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0 and f"finished at step {steps}/{steps}" in proc.stdout, (
            proc.stdout + proc.stderr
        )
        run_id = proc.stdout.split("run ", 1)[1].split()[0]
        status = json.loads(
            run(
                [str(HUSHNET), "run", "status", run_id, "--json", "--state-dir", str(boot_state)]
            ).stdout
        )["nodes"]
        visits = {node_id: st["contributions"] for node_id, st in status.items()}
        assert sum(visits.values()) == steps, visits
        for r in bases:  # the walk visited nodes of both containers
            assert sum(v for node_id, v in visits.items() if host_of[node_id] == r) > 0, visits
    finally:
        for cid in containers:
            docker("rm", "-f", "-v", cid, check=False, timeout=60)
        boot.terminate()
        try:
            boot.wait(timeout=30)
        except subprocess.TimeoutExpired:
            boot.kill()
            boot.wait(timeout=10)
        logf.close()
        shutil.rmtree(data_dir, ignore_errors=True)
    assert not docker(
        "ps", "-aq", "--filter", f"label=hushnet-test=nodehost-{os.getpid()}"
    ).stdout.split()
