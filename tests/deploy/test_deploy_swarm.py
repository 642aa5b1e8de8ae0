"""The same docker-compose.yml deployed as a Docker Swarm stack on a single-node swarm.

Checks that ``docker stack deploy`` accepts the file, starts the bootstrap and 3 node replicas
on an overlay network, that they form the ring and carry an envelope on every edge, and that
``docker stack rm`` removes everything. The swarm is initialised here (and left again) when
the engine is not already part of one.

Nodes reach the bootstrap by ``tasks.bootstrap`` (DNS round robin to the task) instead of the
service VIP: VIPs need the kernel's IPVS, which some hosts (this CI machine) do not have; the
task name works on every kernel (deploy/swarm.md).
"""
from __future__ import annotations

import json
import os
import time

import pytest

from deploy_support import REPO, TIMINGS, docker, docker_bin, free_loopback_port, run, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(900)]


def _stack_containers(stack: str, service: str | None = None) -> list[str]:
    label = f"com.docker.swarm.service.name={stack}_{service}" if service else f"com.docker.stack.namespace={stack}"
    return docker("ps", "-a", "-q", "--filter", f"label={label}").stdout.split()


@pytest.fixture()
def swarm(docker_engine):
    state = docker("info", "--format", "{{.Swarm.LocalNodeState}}").stdout.strip()
    initialised = False
    if state == "inactive":
        docker("swarm", "init", "--advertise-addr", "127.0.0.1", timeout=60)
        initialised = True
    elif state != "active":
        pytest.fail(f"this engine is in swarm state {state!r}; cannot deploy a stack", pytrace=False)
    yield
    if initialised:
        docker("swarm", "leave", "--force", timeout=60, check=False)


def test_single_node_swarm_stack_deploy(swarm, hushnet_image):
    stack = f"hnstack{os.getpid()}"
    env = dict(os.environ, HUSHNET_IMAGE=hushnet_image, HUSHNET_NODES="3", HUSHNET_TOPOLOGY="ring:3",
               HUSHNET_BOOTSTRAP_PORT=str(free_loopback_port()), HUSHNET_BOOTSTRAP_ADDRESS="tasks.bootstrap:7400")
    t0 = time.monotonic()
    try:
        run([docker_bin(), "stack", "deploy", "--resolve-image", "never", "-c",
             str(REPO / "docker-compose.yml"), stack], env=env, timeout=120)

        def bootstrap_container() -> str | None:
            found = _stack_containers(stack, "bootstrap")
            return found[0] if found else None
        boot = wait_for(bootstrap_container, 60, what="the bootstrap task")

        def healthy() -> dict | None:
            proc = docker("exec", boot, "hushnet", "status", "--state-dir", "/var/lib/hushnet", "--bootstrap",
                          "127.0.0.1:7400", "--json", check=False, timeout=30)
            doc = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None
            ok = doc and len(doc["nodes"]) == 3 and doc["healthy"] and all(
                n.get("all_neighbors_connected") for n in doc["nodes"])
            return doc if ok else None
        doc = wait_for(healthy, 150, interval=1.0, what="3 healthy swarm replicas in a ring")
        TIMINGS["swarm_deploy_to_healthy_s"] = time.monotonic() - t0
        assert doc["topology"] == "ring:3"
        assert {n["id"]: sorted(n["neighbors"]) for n in doc["nodes"]} == {
            "n0": ["n1", "n2"], "n1": ["n0", "n2"], "n2": ["n0", "n1"]}
        assert len(_stack_containers(stack, "node")) == 3

        # an envelope on every edge, driven by the operator inside the bootstrap task
        script = ("import asyncio, json, pathlib; from node.demo import exchange_on_every_edge; "
                  "print(json.dumps(asyncio.run(exchange_on_every_edge(pathlib.Path('/var/lib/hushnet'), "
                  "run_id='swarm-job', timeout=20))))")
        result = json.loads(docker("exec", boot, "python", "-c", script, timeout=60).stdout.strip().splitlines()[-1])
        assert result["ok"] and result["delivered"] == 6, result
    finally:
        docker("stack", "rm", stack, check=False, timeout=60)
        wait_for(lambda: not _stack_containers(stack), 90, what="stack containers to go away")
        wait_for(lambda: stack not in docker("network", "ls", "--format", "{{.Name}}").stdout, 60,
                 what="the stack network to be removed")

        def volumes_removed() -> bool:
            vols = [v for v in docker("volume", "ls", "-q").stdout.split() if v.startswith(f"{stack}_")]
            for vol in vols:
                docker("volume", "rm", vol, check=False)
            return not vols
        wait_for(volumes_removed, 60, what="the stack volumes to be removed")
    assert not _stack_containers(stack)

