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


def _deploy_env(image: str, **extra: str) -> dict[str, str]:
    return dict(
        os.environ,
        HUSHNET_IMAGE=image,
        HUSHNET_NODES="3",
        HUSHNET_TOPOLOGY="ring:3",
        HUSHNET_BOOTSTRAP_PORT=str(free_loopback_port()),
        HUSHNET_BOOTSTRAP_ADDRESS="tasks.bootstrap:7400",
        **extra,
    )


def _wait_ring(stack: str) -> tuple[str, dict]:
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
            and len(doc["nodes"]) == 3
            and doc["healthy"]
            and all(n.get("all_neighbors_connected") for n in doc["nodes"])
        )
        return doc if ok else None

    doc = wait_for(healthy, 150, interval=1.0, what="3 healthy swarm replicas in a ring")
    assert doc["topology"] == "ring:3"
    assert {n["id"]: sorted(n["neighbors"]) for n in doc["nodes"]} == {
        "n0": ["n1", "n2"],
        "n1": ["n0", "n2"],
        "n2": ["n0", "n1"],
    }
    assert len(_stack_containers(stack, "node", running=True)) == 3
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


def _remove_stack(stack: str) -> None:
    docker("stack", "rm", stack, check=False, timeout=60)
    wait_for(lambda: not _stack_containers(stack), 90, what="stack containers to go away")
    wait_for(
        lambda: stack not in docker("network", "ls", "--format", "{{.Name}}").stdout,
        60,
        what="the stack network to be removed",
    )

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
        run(
            [
                docker_bin(),
                "stack",
                "deploy",
                "--resolve-image",
                "never",
                "-c",
                str(REPO / "docker-compose.yml"),
                stack,
            ],
            env=_deploy_env(
                hushnet_image, HUSHNET_DATA_DIR=str(data_dir), HUSHNET_BUDGET_EPSILON="100"
            ),
            timeout=120,
        )
        boot, _ = _wait_ring(stack)
        TIMINGS["swarm_deploy_to_healthy_s"] = time.monotonic() - t0
        result = _exchange_inside(boot, "swarm-job")
        assert result["ok"] and result["delivered"] == 6, result

        spec = tmp_path / "swarm-run.toml"
        spec.write_text(spec_toml(steps=300, sigma=10.0, seed=31, graph="ring:3", epsilon=100.0))
        docker("cp", str(spec), f"{boot}:/tmp/swarm-run.toml")
        proc = docker(
            "exec",
            boot,
            "hushnet",
            "run",
            "start",
            "/tmp/swarm-run.toml",
            "--state-dir",
            "/var/lib/hushnet",
            "--bootstrap",
            "127.0.0.1:7400",
            "--watch",
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0 and "finished at step 300/300" in proc.stdout, (
            proc.stdout + proc.stderr
        )
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
        run(
            [
                docker_bin(),
                "stack",
                "deploy",
                "--resolve-image",
                "never",
                "-c",
                str(REPO / "docker-compose.yml"),
                "-c",
                str(REPO / "deploy" / "swarm-multihost.yml"),
                stack,
            ],
            env=_deploy_env(
                hushnet_image, HUSHNET_CA_SECRET=ca_secret, HUSHNET_TOKEN_SECRET=token_secret
            ),
            timeout=120,
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
