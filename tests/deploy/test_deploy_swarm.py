"""The same docker-compose.yml deployed as a Docker Swarm stack on a single-node swarm.

Two deployments:

* the plain stack (``docker stack deploy -c docker-compose.yml``): bootstrap + 3 node
  replicas on an overlay network form ``ring:3``, carry an envelope on every edge and a private
  run (rw-dpsgd) started with ``hushnet run start`` inside the bootstrap task;
* the multi-host recipe of deploy/swarm.md, followed literally on one host: the network's CA
  created beforehand in the bootstrap's volume, CA certificate and join token handed to the
  nodes as Swarm **secrets** (``deploy/swarm-multihost.yml``), the bootstrap pinned by a node
  label; the nodes must join with the secrets (checked on their command lines).

The swarm is initialised here (and left again) when the engine is not already part of one.
Nodes reach the bootstrap by ``tasks.bootstrap`` (DNS round robin to the task) instead of the
service VIP: VIPs need the kernel's IPVS, which some hosts (this CI machine) do not have; the
task name works on every kernel (deploy/swarm.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest
from helpers.deploy import (
    REPO,
    TIMINGS,
    docker,
    docker_bin,
    free_loopback_port,
    inspect,
    make_data_dir,
    run,
    spec_toml,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(900)]


def _stack_containers(stack: str, service: str | None = None, running: bool = False) -> list[str]:
    label = (
        f"com.docker.swarm.service.name={stack}_{service}"
        if service
        else f"com.docker.stack.namespace={stack}"
    )
    return docker(
        "ps", *([] if running else ["-a"]), "-q", "--filter", f"label={label}"
    ).stdout.split()


@pytest.fixture(scope="module")
def swarm(docker_engine):
    state = docker("info", "--format", "{{.Swarm.LocalNodeState}}").stdout.strip()
    initialised = False
    if state == "inactive":
        docker("swarm", "init", "--advertise-addr", "127.0.0.1", timeout=60)
        initialised = True
    elif state != "active":
        pytest.fail(
            f"this engine is in swarm state {state!r}; cannot deploy a stack", pytrace=False
        )
    yield docker("info", "--format", "{{.Swarm.NodeID}}").stdout.strip()
    if initialised:
        docker("swarm", "leave", "--force", timeout=60, check=False)


def _stack_deploy(stack: str, env: dict[str, str], *overrides: str) -> None:
    """``docker stack deploy`` of the top-level compose file (plus ``overrides`` under the repo),
    with the images already loaded (never resolved from a registry)."""
    files = ["docker-compose.yml", *overrides]
    cmd = [docker_bin(), "stack", "deploy", "--resolve-image", "never"]
    for f in files:
        cmd += ["-c", str(REPO / f)]
    run([*cmd, stack], env=env, timeout=120)


def _deploy_env(image: str, **extra: str) -> dict[str, str]:
    env = dict(
        os.environ,
        HUSHNET_IMAGE=image,
        HUSHNET_NODES="3",
        HUSHNET_TOPOLOGY="ring:3",
        HUSHNET_BOOTSTRAP_PORT=str(free_loopback_port()),
        HUSHNET_BOOTSTRAP_ADDRESS="tasks.bootstrap:7400",
    )
    env.update(extra)
    return env


def _wait_network(
    stack: str, n: int, topology: str, replicas: int, timeout: float = 150
) -> tuple[str, dict]:
    """The bootstrap task, once all ``n`` nodes (in ``replicas`` containers) are healthy and linked."""
    boot = wait_for(
        lambda: (_stack_containers(stack, "bootstrap", running=True) or [None])[0],
        90,
        what="the bootstrap task",
    )

    def healthy() -> dict | None:
        proc = docker(
            "exec",
            boot,
            "hushnet",
            "status",
            "--state-dir",
            "/var/lib/hushnet",
            "--bootstrap",
            "127.0.0.1:7400",
            "--json",
            check=False,
            timeout=30,
        )
        doc = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None
        ok = (
            doc
            and len(doc["nodes"]) == n
            and doc["healthy"]
            and all(m.get("all_neighbors_connected") for m in doc["nodes"])
        )
        return doc if ok else None

    doc = wait_for(healthy, timeout, interval=1.0, what=f"{n} healthy swarm nodes ({topology})")
    assert doc["topology"] == topology
    assert len(_stack_containers(stack, "node", running=True)) == replicas
    return boot, doc


def _wait_ring(stack: str) -> tuple[str, dict]:
    boot, doc = _wait_network(stack, 3, "ring:3", replicas=3)
    assert {n["id"]: sorted(n["neighbors"]) for n in doc["nodes"]} == {
        "n0": ["n1", "n2"],
        "n1": ["n0", "n2"],
        "n2": ["n0", "n1"],
    }
    return boot, doc


def _exchange_inside(boot: str, run_id: str) -> dict:
    """An envelope on every edge, driven by the operator inside the bootstrap task."""
    script = (
        "import asyncio, json, pathlib; from hushnet.demo import exchange_on_every_edge; "
        "print(json.dumps(asyncio.run(exchange_on_every_edge(pathlib.Path('/var/lib/hushnet'), "
        f"run_id='{run_id}', timeout=20))))"
    )
    return json.loads(
        docker("exec", boot, "python", "-c", script, timeout=60).stdout.strip().splitlines()[-1]
    )


def _run_inside(boot: str, tmp_path, steps: int, seed: int, graph: str) -> str:
    """A private walk (rw-dpsgd) started with ``hushnet run start --watch`` inside the bootstrap
    task, to ``finished``; returns the run id."""
    spec = tmp_path / f"swarm-run-{seed}.toml"
    spec.write_text(spec_toml(steps=steps, sigma=10.0, seed=seed, graph=graph, epsilon=100.0))
    docker("cp", str(spec), f"{boot}:/tmp/{spec.name}")
    proc = docker(
        "exec",
        boot,
        "hushnet",
        "run",
        "start",
        f"/tmp/{spec.name}",
        "--state-dir",
        "/var/lib/hushnet",
        "--bootstrap",
        "127.0.0.1:7400",
        "--watch",
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0 and f"finished at step {steps}/{steps}" in proc.stdout, (
        proc.stdout + proc.stderr
    )
    return proc.stdout.split("run ", 1)[1].split()[0]


def _remove_stack(stack: str) -> None:
    docker("stack", "rm", stack, check=False, timeout=60)
    wait_for(lambda: not _stack_containers(stack), 90, what="stack containers to go away")

    def networks_removed() -> bool:
        # `docker stack rm` removes the stack's networks right after its services, once: a network
        # whose tasks were still shutting down then is refused ("in use") and never removed by anyone
        # (a CI run waited 60 s for it).  Its tasks are gone now, so remove what is left ourselves.
        nets = [
            n
            for n in docker("network", "ls", "--format", "{{.Name}}").stdout.split()
            if n.startswith(f"{stack}_")
        ]
        for net in nets:
            docker("network", "rm", net, check=False)
        return not nets

    wait_for(networks_removed, 60, what="the stack network to be removed")

    def volumes_removed() -> bool:
        vols = [v for v in docker("volume", "ls", "-q").stdout.split() if v.startswith(f"{stack}_")]
        for vol in vols:
            docker("volume", "rm", vol, check=False)
        return not vols

    wait_for(volumes_removed, 60, what="the stack volumes to be removed")


def test_single_node_swarm_stack_deploy(swarm, hushnet_image, tmp_path):
    """The plain stack: ring up, an envelope on every edge, and a private run driven from inside
    the bootstrap task (the overlay network is not reachable from the host; deploy/swarm.md)."""
    stack = f"hnstack{os.getpid()}"
    data_dir = make_data_dir(3)
    t0 = time.monotonic()
    try:
        _stack_deploy(
            stack,
            _deploy_env(
                hushnet_image, HUSHNET_DATA_DIR=str(data_dir), HUSHNET_BUDGET_EPSILON="100"
            ),
        )
        boot, _ = _wait_ring(stack)
        TIMINGS["swarm_deploy_to_healthy_s"] = time.monotonic() - t0
        result = _exchange_inside(boot, "swarm-job")
        assert result["ok"] and result["delivered"] == 6, result

        _run_inside(boot, tmp_path, steps=300, seed=31, graph="ring:3")
    finally:
        _remove_stack(stack)
        shutil.rmtree(data_dir, ignore_errors=True)
    assert not _stack_containers(stack)


def test_multihost_recipe_with_secrets(swarm, hushnet_image):
    """deploy/swarm.md "Several hosts", step by step, on the single-node swarm."""
    stack = f"hnmulti{os.getpid()}"
    ca_secret, token_secret = f"{stack}_ca", f"{stack}_token"
    volume = f"{stack}_bootstrap-state"
    docker("node", "update", "--label-add", "hushnet.bootstrap=true", swarm)
    try:
        # 1. the network's identity, created once in the bootstrap's (pinned) volume
        docker("volume", "create", volume)
        docker(
            "run",
            "--rm",
            "-v",
            f"{volume}:/var/lib/hushnet",
            "--entrypoint",
            "/opt/hushnet/bin/python",
            hushnet_image,
            "-c",
            "from hushnet.bootstrap.authority import load_or_create; "
            "load_or_create(__import__('pathlib').Path('/var/lib/hushnet'))",
            timeout=60,
        )
        ca = docker(
            "run",
            "--rm",
            "-v",
            f"{volume}:/s:ro",
            "--entrypoint",
            "cat",
            hushnet_image,
            "/s/ca.pem",
        ).stdout
        token = docker(
            "run",
            "--rm",
            "-v",
            f"{volume}:/s:ro",
            "--entrypoint",
            "cat",
            hushnet_image,
            "/s/join_token",
        ).stdout.strip()
        assert "BEGIN CERTIFICATE" in ca and token
        for name, value in ((ca_secret, ca), (token_secret, token)):
            proc = subprocess.run(
                [docker_bin(), "secret", "create", name, "-"],
                input=value,
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert proc.returncode == 0, proc.stderr
        # 2. deploy with the override
        _stack_deploy(
            stack,
            _deploy_env(
                hushnet_image, HUSHNET_CA_SECRET=ca_secret, HUSHNET_TOKEN_SECRET=token_secret
            ),
            "deploy/swarm-multihost.yml",
        )
        boot, doc = _wait_ring(stack)
        # the nodes joined with the secrets, and the CA is the one created in step 1
        for cid in _stack_containers(stack, "node", running=True):
            cmdline = docker(
                "exec", cid, "sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"
            ).stdout
            assert (
                "--ca /run/secrets/hushnet_ca" in cmdline
                and "--token-file /run/secrets/hushnet_token" in cmdline
            )
            assert docker("exec", cid, "cat", "/var/lib/hushnet/ca.pem").stdout == ca
        assert _exchange_inside(boot, "swarm-multi-job")["ok"]
    finally:
        _remove_stack(stack)
        for name in (ca_secret, token_secret):
            docker("secret", "rm", name, check=False)
        docker("node", "update", "--label-rm", "hushnet.bootstrap", swarm, check=False)


def test_swarm_replicas_each_host_k_nodes(swarm, hushnet_image, tmp_path):
    """Node-host replicas: 2 containers x K = 4 nodes (HUSHNET_NODES_PER_CONTAINER) form
    hypercube:3; each node is published at its container's IP and port 7500+i, every container's
    healthcheck covers its 4 nodes, and a private walk crosses both containers."""
    stack = f"hnhost{os.getpid()}"
    replicas, k, topology = 2, 4, "hypercube:3"
    n = replicas * k
    data_dir = make_data_dir(n)
    t0 = time.monotonic()
    try:
        _stack_deploy(
            stack,
            _deploy_env(
                hushnet_image,
                HUSHNET_NODES=str(replicas),
                HUSHNET_NODES_PER_CONTAINER=str(k),
                HUSHNET_TOPOLOGY=topology,
                HUSHNET_DATA_DIR=str(data_dir),
                HUSHNET_BUDGET_EPSILON="100",
            ),
        )
        boot, doc = _wait_network(stack, n, topology, replicas=replicas)
        TIMINGS["swarm_node_hosts_healthy_s"] = time.monotonic() - t0
        # which container hosts which node: its overlay IP, node i on 7500+i
        containers = _stack_containers(stack, "node", running=True)
        ips = {}
        for cid in containers:
            nets = inspect(cid)["NetworkSettings"]["Networks"]
            ips[cid] = next(v["IPAddress"] for name, v in nets.items() if name.startswith(stack))
        host_of = {}
        for m in doc["nodes"]:
            ip, port = m["address"].rsplit(":", 1)
            assert 7500 <= int(port) < 7500 + k, m
            host_of[m["id"]] = next(cid for cid, a in ips.items() if a == ip)
        assert sorted(list(host_of.values()).count(c) for c in containers) == [k] * replicas
        # each container's healthcheck covers its K nodes
        wait_for(
            lambda: all(inspect(c)["State"]["Health"]["Status"] == "healthy" for c in containers),
            90,
            what="node-host healthchecks",
        )
        for cid in containers:
            out = inspect(cid)["State"]["Health"]["Log"][-1]["Output"]
            assert f"node host: {k}/{k} nodes serving" in out, out

        run_id = _run_inside(boot, tmp_path, steps=200, seed=33, graph=topology)
        status = json.loads(
            docker(
                "exec",
                boot,
                "hushnet",
                "run",
                "status",
                run_id,
                "--json",
                "--state-dir",
                "/var/lib/hushnet",
                "--bootstrap",
                "127.0.0.1:7400",
            ).stdout
        )["nodes"]
        visits = {node_id: st["contributions"] for node_id, st in status.items()}
        assert sum(visits.values()) == 200, visits
        for cid in containers:  # the walk visited nodes of both containers
            assert sum(v for node_id, v in visits.items() if host_of[node_id] == cid) > 0, visits
        TIMINGS["swarm_node_hosts_deploy_to_run_s"] = time.monotonic() - t0
    finally:
        _remove_stack(stack)
        shutil.rmtree(data_dir, ignore_errors=True)
    assert not _stack_containers(stack)
