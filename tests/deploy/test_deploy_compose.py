"""docker-compose with a real engine: up --scale, a job through the published port, a node
stopped mid-run, its ledger across a container restart, bad input, and a quick ``down``.

One compose project (bootstrap + 4 nodes on ``ring:4``) lives for the whole module; the tests
run in file order and each checks one documented behaviour (deploy/README.md).
"""
from __future__ import annotations

import asyncio
import json
import os
import pathlib
import time

import pytest

from deploy_support import (
    REPO,
    compose,
    container_ids,
    docker,
    docker_bin,
    free_loopback_port,
    inspect,
    run,
    TIMINGS,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(420)]

N_NODES = 4
TOPOLOGY = "ring:4"
RING = {"n0": {"n1", "n3"}, "n1": {"n0", "n2"}, "n2": {"n1", "n3"}, "n3": {"n0", "n2"}}


def _status(op_dir: pathlib.Path, timeout: float = 3.0) -> dict:
    from node.net.operator import Operator, OperatorCredentials

    async def go() -> dict:
        async with Operator(OperatorCredentials.from_state_dir(op_dir)) as op:
            return await op.network_status(timeout=timeout)

    return asyncio.run(go())


def _all_connected(op_dir: pathlib.Path) -> dict | None:
    doc = _status(op_dir)
    ok = (len(doc["nodes"]) == N_NODES and doc["healthy"]
          and all(n.get("all_neighbors_connected") for n in doc["nodes"]))
    return doc if ok else None


def _control(op_dir: pathlib.Path, node_id: str, command: str, args: dict, timeout: float = 20.0):
    from node.net.operator import Operator, OperatorCredentials

    async def go():
        async with Operator(OperatorCredentials.from_state_dir(op_dir)) as op:
            directory = await op.directory()
            address = {m.node_id: m.address for m in directory.members}[node_id]
            return await op.control(node_id, address, command, args, timeout=timeout)

    return asyncio.run(go())


def _exchange(op_dir: pathlib.Path, run_id: str) -> dict:
    from node.demo import exchange_on_every_edge

    return asyncio.run(exchange_on_every_edge(op_dir, run_id=run_id, timeout=20.0))


def _identity(container: str) -> dict:
    return json.loads(docker("exec", container, "cat", "/var/lib/hushnet/identity.json").stdout)


@pytest.fixture(scope="module")
def net(hushnet_image, tmp_path_factory):
    """A compose project up and healthy; always brought down (volumes included) at the end."""
    project = f"hndeploy{os.getpid()}"
    port = free_loopback_port()
    env = {"HUSHNET_IMAGE": hushnet_image, "HUSHNET_BOOTSTRAP_PORT": str(port), "HUSHNET_TOPOLOGY": TOPOLOGY,
           "HUSHNET_LOG_JSON": "1"}
    state = {"project": project, "env": env, "port": port, "down": False}
    try:
        t0 = time.monotonic()
        compose(project, "up", "-d", "--scale", f"node={N_NODES}", env=env, timeout=240)
        TIMINGS["compose_up_cmd_s"] = time.monotonic() - t0
        (boot,) = container_ids(project, "bootstrap")
        # the operator identity, fetched the way deploy/README.md tells users to
        op_dir = tmp_path_factory.mktemp("operator") / "op"
        run([str(REPO / "deploy" / "scripts" / "compose-operator.sh"), str(op_dir)], timeout=90,
            env=dict(os.environ, COMPOSE_PROJECT_NAME=project, COMPOSE_FILE=str(REPO / "docker-compose.yml"),
                     HUSHNET_BOOTSTRAP_PORT=str(port), DOCKER=docker_bin()), cwd=REPO)
        assert oct((op_dir / "operator.key").stat().st_mode & 0o777) == "0o600"
        doc = wait_for(lambda: _all_connected(op_dir), 120, what="4 healthy nodes with all ring links up")
        TIMINGS["compose_up_to_healthy_s"] = time.monotonic() - t0
        state.update(op_dir=op_dir, bootstrap=boot, first_status=doc,
                     nodes={_identity(c)["node_id"]: c for c in container_ids(project, "node")})
        yield state
    finally:
        if not state["down"]:
            logs = compose(project, "logs", "--no-color", "--tail", "40", env=env, check=False).stdout
            compose(project, "down", "-v", "--timeout", "10", env=env, timeout=180, check=False)
            print(logs[-6000:])


def test_compose_scale_brings_up_the_topology(net):
    doc = net["first_status"]
    assert doc["topology"] == TOPOLOGY and doc["n_vertices"] == N_NODES
    assert {n["id"]: set(n["neighbors"]) for n in doc["nodes"]} == RING
    assert sorted(net["nodes"]) == sorted(RING)
    # every node advertises its own container address on the private network
    addresses = {n["address"].rsplit(":", 1)[0] for n in doc["nodes"]}
    assert len(addresses) == N_NODES
    # the bootstrap is published on loopback only
    boot = inspect(net["bootstrap"])
    bindings = boot["NetworkSettings"]["Ports"]["7400/tcp"]
    assert [b["HostIp"] for b in bindings] == ["127.0.0.1"] and bindings[0]["HostPort"] == str(net["port"])
    # the image runs as the unprivileged user, under tini as PID 1
    for cid in [net["bootstrap"], *net["nodes"].values()]:
        assert docker("exec", cid, "id", "-u").stdout.strip() == "10001"
        assert docker("exec", cid, "cat", "/proc/1/comm").stdout.strip() == "tini"


def test_healthchecks_report_healthy(net):
    cids = [net["bootstrap"], *net["nodes"].values()]
    wait_for(lambda: all(inspect(c)["State"]["Health"]["Status"] == "healthy" for c in cids), 60,
             what="docker healthchecks")
    out = inspect(net["nodes"]["n0"])["State"]["Health"]["Log"][-1]["Output"]
    assert "node n0 serving on" in out


def test_job_end_to_end_through_published_port(net):
    t0 = time.monotonic()
    result = _exchange(net["op_dir"], "deploy-job-1")
    TIMINGS["demo_job_in_containers_s"] = time.monotonic() - t0
    assert result["ok"], result
    assert result["directed_edges"] == 2 * N_NODES and result["delivered"] == 2 * N_NODES


def test_bad_input_wrong_token_is_refused_clearly(net):
    project = net["project"]
    proc = docker("run", "--rm", "--network", f"{project}_hushnet", "-v", f"{project}_join:/var/lib/hushnet-join:ro",
                  "-e", "HUSHNET_TOKEN=not-the-token", "-e", "HUSHNET_JOIN_TIMEOUT=20", net["env"]["HUSHNET_IMAGE"],
                  "node", timeout=60, check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text
    assert "wrong join token" in text and "Traceback" not in text


def test_stopping_a_node_mid_run(net):
    """Documented behaviour: SIGTERM → the node leaves (bootstrap marks it not alive), its
    neighbours see the link unhealthy, and deliveries to it fail with an error reported to the
    operator while every other edge keeps working."""
    op_dir, victim = net["op_dir"], net["nodes"]["n1"]
    t0 = time.monotonic()
    docker("stop", "--time", "10", victim, timeout=30)
    stop_s = time.monotonic() - t0
    TIMINGS["docker_stop_node_s"] = stop_s
    assert stop_s < 5.0, f"docker stop took {stop_s:.1f} s: SIGTERM is not reaching hushnet"
    assert inspect(victim)["State"]["ExitCode"] == 0

    def n1_gone():
        doc = _status(op_dir)
        by = {n["id"]: n for n in doc["nodes"]}
        return (not by["n1"]["alive_in_directory"] and not by["n1"]["healthy"]
                and "n1" not in by["n0"]["connected"] and "n1" not in by["n2"]["connected"]
                and by["n0"]["healthy"] and by["n2"]["healthy"]) and by
    by = wait_for(n1_gone, 30, what="neighbours to see n1 gone")
    assert "n3" in by["n0"]["connected"] and "n3" in by["n2"]["connected"]

    report = _control(op_dir, "n0", "ping_neighbors", {"run_id": "deploy-job-2", "size": 256, "timeout": 5})
    assert report["sent"]["n3"]["ok"], report
    assert not report["sent"]["n1"]["ok"] and report["sent"]["n1"].get("error"), report
    inbox = _control(op_dir, "n3", "inbox", {"protocol": "net.ping", "run_id": "deploy-job-2"})["inbox"]
    assert [row["sender"] for row in inbox] == ["n0"]


def test_restarted_node_keeps_identity_and_ledger(net):
    op_dir, victim = net["op_dir"], net["nodes"]["n1"]
    docker("start", victim)
    doc = wait_for(lambda: _all_connected(op_dir), 90, what="n1 back and all ring links up")
    ident = _identity(victim)
    assert ident["node_id"] == "n1" and ident["vertex"] == 1
    assert next(n for n in doc["nodes"] if n["id"] == "n1")["cert_sha256"] == ident["cert_sha256"]
    first = {n["id"]: n for n in net["first_status"]["nodes"]}["n1"]
    assert first["x25519_public"] == ident["x25519_public"]  # same keys: the volume survived
    # the ledger (node.sqlite) still holds what n1 received before the restart
    inbox = _control(op_dir, "n1", "inbox", {"protocol": "net.ping", "run_id": "deploy-job-1"})["inbox"]
    assert sorted(row["sender"] for row in inbox) == ["n0", "n2"]
    assert _exchange(op_dir, "deploy-job-3")["ok"]


def test_down_is_quick_and_complete(net):
    t0 = time.monotonic()
    compose(net["project"], "down", "-v", "--timeout", "10", env=net["env"], timeout=120)
    TIMINGS["compose_down_s"] = time.monotonic() - t0
    net["down"] = True
    assert TIMINGS["compose_down_s"] < 30
    assert container_ids(net["project"], "node") == [] and container_ids(net["project"], "bootstrap") == []
    vols = docker("volume", "ls", "-q", "--filter", f"label=com.docker.compose.project={net['project']}").stdout
    assert vols.split() == []


@pytest.mark.parametrize("case", ["no-join-volume", "no-topology", "unwritable-state"])
def test_entrypoint_bad_input_is_one_clear_line(hushnet_image, case):
    """A compose file that forgets a volume or a variable: one readable error, no traceback."""
    argv = {"no-join-volume": ["-e", "HUSHNET_WAIT_FILES=1", hushnet_image, "node"],
            "no-topology": [hushnet_image, "bootstrap"],
            "unwritable-state": ["-e", "HUSHNET_STATE_DIR=/proc/hushnet", hushnet_image, "node"]}[case]
    expect = {"no-join-volume": "mount the bootstrap's join volume",
              "no-topology": "needs HUSHNET_TOPOLOGY",
              "unwritable-state": "mount a volume there"}[case]
    proc = docker("run", "--rm", *argv, timeout=60, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert expect in proc.stderr and "Traceback" not in proc.stderr
