"""docker-compose with a real engine: up --scale, private runs through the published port, a
node stopped mid-run (``deviate`` and ``pause``), identity and privacy ledger across a container
restart, bad input, and a quick ``down``.

One compose project (bootstrap + 4 nodes on ``ring:4``, each node with its own synthetic data
shard from ``HUSHNET_DATA_DIR``) lives for the whole module; the tests run in file order and each
checks one documented behaviour (deploy/README.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import shutil
import sys
import time

import pytest
from helpers.deploy import (
    REPO,
    TIMINGS,
    compose,
    container_ids,
    docker,
    docker_bin,
    free_loopback_port,
    inspect,
    make_data_dir,
    run,
    spec_toml,
    wait_for,
)

# generous: on a cold machine the first test also pays for apt, debootstrap and the image build
pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(900)]

N_NODES = 4
TOPOLOGY = "ring:4"
RING = {"n0": {"n1", "n3"}, "n1": {"n0", "n2"}, "n2": {"n1", "n3"}, "n3": {"n0", "n2"}}
NODE_BUDGET = 200.0
HUSHNET = str(pathlib.Path(sys.executable).parent / "hushnet")


def _client(op_dir: pathlib.Path, fn):
    from hushnet.client import AsyncClient

    async def go():
        async with await AsyncClient.connect(op_dir) as c:
            return await fn(c)

    return asyncio.run(go())


def _start_and_stop_mid_run(
    op_dir: pathlib.Path,
    spec: pathlib.Path,
    victim: str,
    at_step: int = 150,
    pause_timeout: float = 10.0,
):
    """Start a run, stop the ``victim`` container once the walk has made ``at_step`` steps, watch it."""

    async def go(c):
        run_id = await c.start_run(spec)
        deadline = time.monotonic() + 60
        while True:
            st = await c.statuses(run_id)
            step = max((s.get("step", 0) for s in st.values() if isinstance(s, dict)), default=0)
            if step >= at_step:
                break
            assert time.monotonic() < deadline, f"run {run_id} made no progress: {st}"
            await asyncio.sleep(0.2)
        t0 = time.monotonic()
        proc = await asyncio.create_subprocess_exec(docker_bin(), "stop", "--time", "10", victim)
        await proc.wait()
        stop_s = time.monotonic() - t0
        outcome = await c.watch(run_id, progress=False, pause_timeout=pause_timeout, timeout=180)
        return run_id, step, stop_s, outcome

    return _client(op_dir, go)


def _status(op_dir: pathlib.Path, timeout: float = 3.0) -> dict:
    from hushnet.net.operator import Operator, OperatorCredentials

    async def go() -> dict:
        async with Operator(OperatorCredentials.from_state_dir(op_dir)) as op:
            return await op.network_status(timeout=timeout)

    return asyncio.run(go())


def _all_connected(op_dir: pathlib.Path) -> dict | None:
    doc = _status(op_dir)
    ok = (
        len(doc["nodes"]) == N_NODES
        and doc["healthy"]
        and all(n.get("all_neighbors_connected") for n in doc["nodes"])
    )
    return doc if ok else None


def _control(op_dir: pathlib.Path, node_id: str, command: str, args: dict, timeout: float = 20.0):
    from hushnet.net.operator import Operator, OperatorCredentials

    async def go():
        async with Operator(OperatorCredentials.from_state_dir(op_dir)) as op:
            directory = await op.directory()
            address = {m.node_id: m.address for m in directory.members}[node_id]
            return await op.control(node_id, address, command, args, timeout=timeout)

    return asyncio.run(go())


def _exchange(op_dir: pathlib.Path, run_id: str) -> dict:
    from hushnet.demo import exchange_on_every_edge

    return asyncio.run(exchange_on_every_edge(op_dir, run_id=run_id, timeout=20.0))


def _identity(container: str) -> dict:
    return json.loads(docker("exec", container, "cat", "/var/lib/hushnet/identity.json").stdout)


@pytest.fixture(scope="module")
def net(hushnet_image, tmp_path_factory):
    """A compose project up and healthy; always brought down (volumes included) at the end."""
    project = f"hndeploy{os.getpid()}"
    port = free_loopback_port()
    data_dir = make_data_dir(N_NODES)  # bind-mounted read-only at /data in the node containers
    env = {
        "HUSHNET_IMAGE": hushnet_image,
        "HUSHNET_BOOTSTRAP_PORT": str(port),
        "HUSHNET_TOPOLOGY": TOPOLOGY,
        "HUSHNET_LOG_JSON": "1",
        "HUSHNET_DATA_DIR": str(data_dir),
        "HUSHNET_BUDGET_EPSILON": str(NODE_BUDGET),
    }
    state = {
        "project": project,
        "env": env,
        "port": port,
        "down": False,
        "specs": tmp_path_factory.mktemp("specs"),
    }
    try:
        t0 = time.monotonic()
        compose(project, "up", "-d", "--scale", f"node={N_NODES}", env=env, timeout=240)
        TIMINGS["compose_up_cmd_s"] = time.monotonic() - t0
        (boot,) = container_ids(project, "bootstrap")
        # the operator identity, fetched the way deploy/README.md tells users to
        op_dir = tmp_path_factory.mktemp("operator") / "op"
        run(
            [str(REPO / "deploy" / "scripts" / "compose-operator.sh"), str(op_dir)],
            timeout=90,
            env=dict(
                os.environ,
                COMPOSE_PROJECT_NAME=project,
                COMPOSE_FILE=str(REPO / "docker-compose.yml"),
                HUSHNET_BOOTSTRAP_PORT=str(port),
                DOCKER=docker_bin(),
            ),
            cwd=REPO,
        )
        assert oct((op_dir / "operator.key").stat().st_mode & 0o777) == "0o600"
        doc = wait_for(
            lambda: _all_connected(op_dir), 120, what="4 healthy nodes with all ring links up"
        )
        TIMINGS["compose_up_to_healthy_s"] = time.monotonic() - t0
        state.update(
            op_dir=op_dir,
            bootstrap=boot,
            first_status=doc,
            nodes={_identity(c)["node_id"]: c for c in container_ids(project, "node")},
        )
        yield state
    finally:
        if not state["down"]:
            logs = compose(
                project, "logs", "--no-color", "--tail", "40", env=env, check=False
            ).stdout
            compose(project, "down", "-v", "--timeout", "10", env=env, timeout=180, check=False)
            print(logs[-6000:])
        shutil.rmtree(data_dir, ignore_errors=True)


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
    assert [b["HostIp"] for b in bindings] == ["127.0.0.1"] and bindings[0]["HostPort"] == str(
        net["port"]
    )
    # the image runs as the unprivileged user, under tini as PID 1
    for cid in [net["bootstrap"], *net["nodes"].values()]:
        assert docker("exec", cid, "id", "-u").stdout.strip() == "10001"
        assert docker("exec", cid, "cat", "/proc/1/comm").stdout.strip() == "tini"


def test_healthchecks_report_healthy(net):
    cids = [net["bootstrap"], *net["nodes"].values()]
    wait_for(
        lambda: all(inspect(c)["State"]["Health"]["Status"] == "healthy" for c in cids),
        60,
        what="docker healthchecks",
    )
    out = inspect(net["nodes"]["n0"])["State"]["Health"]["Log"][-1]["Output"]
    assert "node n0 serving on" in out


def test_envelopes_cross_every_edge(net):
    result = _exchange(net["op_dir"], "deploy-ping-1")
    assert result["ok"], result
    assert result["directed_edges"] == 2 * N_NODES and result["delivered"] == 2 * N_NODES


def test_private_run_end_to_end_through_published_port(net):
    """`hushnet run start --watch` on the host, through 127.0.0.1:<port>, against the containers."""
    spec = net["specs"] / "run1.toml"
    spec.write_text(spec_toml(steps=400, sigma=10.0, seed=11, graph=TOPOLOGY, epsilon=NODE_BUDGET))
    t0 = time.monotonic()
    proc = run(
        [HUSHNET, "run", "start", str(spec), "--state-dir", str(net["op_dir"]), "--watch"],
        timeout=180,
    )
    TIMINGS["private_run_in_containers_s"] = time.monotonic() - t0
    assert "finished at step 400/400" in proc.stdout, proc.stdout
    run_id = proc.stdout.split("run ", 1)[1].split()[0]
    report = run(
        [HUSHNET, "run", "report", run_id, "--state-dir", str(net["op_dir"])], timeout=60
    ).stdout
    assert "certified" in report and "paper" in report  # every number says which bound produced it
    for node in RING:
        assert f"\n{node} " in report
    ledgers = _client(net["op_dir"], lambda c: c.ledgers())
    for node in RING:  # every node charged its own persistent ledger toward every other node
        spent = ledgers[node]["spent"]
        assert set(spent) == set(RING) - {node} and all(v["epsilon"] > 0 for v in spent.values()), (
            ledgers[node]
        )
    net["ledger_before"] = ledgers["n1"]


def test_node_refuses_a_run_over_its_budget(net):
    spec = net["specs"] / "greedy.toml"
    spec.write_text(spec_toml(steps=1500, sigma=1.0, seed=12, graph=TOPOLOGY, epsilon=NODE_BUDGET))
    proc = run(
        [HUSHNET, "run", "start", str(spec), "--state-dir", str(net["op_dir"])],
        timeout=60,
        check=False,
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text
    assert (
        "over budget" in text and f"budget is ε={NODE_BUDGET:g}" in text and "Traceback" not in text
    )


def test_bad_input_wrong_token_is_refused_clearly(net):
    project = net["project"]
    proc = docker(
        "run",
        "--rm",
        "--network",
        f"{project}_hushnet",
        "-v",
        f"{project}_join:/var/lib/hushnet-join:ro",
        "-e",
        "HUSHNET_TOKEN=not-the-token",
        "-e",
        "HUSHNET_JOIN_TIMEOUT=20",
        net["env"]["HUSHNET_IMAGE"],
        "node",
        timeout=60,
        check=False,
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text
    assert "wrong join token" in text and "Traceback" not in text


def test_stopping_a_node_mid_run_deviates(net):
    """Documented behaviour of ``on_peer_down = "deviate"``: the run goes on without the stopped
    node, the holders that found it down record a deviation naming it, and the run finishes.
    If the stopped node happened to hold the walk (about one chance in four on ``ring:4``: the
    walk mixes within the ~0.6 s a stop takes), the walk stops with it: ``watch`` reports the holder
    lost with its last durable copy (its hand-over was acknowledged) or the run paused with the node
    unreachable (it was not), and the operator cancels it. At the network level the node
    leaves (bootstrap: not alive) and its neighbours lose the link."""
    op_dir, victim = net["op_dir"], net["nodes"]["n1"]
    spec = net["specs"] / "deviate.toml"
    spec.write_text(
        spec_toml(
            steps=1200,
            sigma=10.0,
            seed=13,
            on_peer_down="deviate",
            graph=TOPOLOGY,
            epsilon=NODE_BUDGET,
        )
    )
    run_id, step, stop_s, outcome = _start_and_stop_mid_run(op_dir, spec, victim)
    TIMINGS["docker_stop_node_s"] = stop_s
    assert stop_s < 5.0, f"docker stop took {stop_s:.1f} s: SIGTERM is not reaching hushnet"
    assert inspect(victim)["State"]["ExitCode"] == 0
    if outcome.state == "finished":
        assert outcome.step == 1200 > step, outcome
        assert outcome.deviations and {d.get("dead_node") for d in outcome.deviations} == {"n1"}, (
            outcome.deviations
        )
        assert {d["node"] for d in outcome.deviations} <= {
            "n0",
            "n2",
        }  # only n1's neighbours hand to it
    else:  # n1 held the walk when it stopped
        # its neighbour's last hand-over to n1 was acknowledged (link receipts: the usual case) — the
        # walk is lost with its holder and the reason names the durable copy to resume from; or it was
        # not — the sender pauses on it with n1 unreachable
        if outcome.state == "holder-lost":
            assert outcome.lost_holder and outcome.lost_holder["holder"] == "n1", outcome
            assert outcome.lost_holder["copy_at"] in {"n0", "n2"}, outcome  # n1's ring neighbours
            assert "n1 holds the token" in outcome.reason, outcome
        else:
            assert outcome.state == "paused" and "unreachable: n1" in outcome.reason, outcome
        assert not outcome.deviations and outcome.step < 1200, outcome
        cancelled = _client(op_dir, lambda c: c.cancel(run_id))
        assert {cancelled[n] for n in ("n0", "n2", "n3")} == {"cancelled"}, cancelled

    by = {n["id"]: n for n in _status(op_dir)["nodes"]}
    assert not by["n1"]["alive_in_directory"] and not by["n1"]["healthy"]
    assert "n1" not in by["n0"]["connected"] and "n1" not in by["n2"]["connected"]
    assert "n3" in by["n0"]["connected"] and "n3" in by["n2"]["connected"]


def test_restarted_node_keeps_identity_and_ledger(net):
    op_dir, victim = net["op_dir"], net["nodes"]["n1"]
    docker("start", victim)
    doc = wait_for(lambda: _all_connected(op_dir), 90, what="n1 back and all ring links up")
    ident = _identity(victim)
    assert ident["node_id"] == "n1" and ident["vertex"] == 1
    assert next(n for n in doc["nodes"] if n["id"] == "n1")["cert_sha256"] == ident["cert_sha256"]
    first = {n["id"]: n for n in net["first_status"]["nodes"]}["n1"]
    assert first["x25519_public"] == ident["x25519_public"]  # same keys: the volume survived
    # the privacy ledger still holds what n1 spent before the restart (and after: the deviate run)
    after = _client(op_dir, lambda c: c.ledgers())["n1"]
    before = net["ledger_before"]
    assert after["entries"] >= before["entries"] > 0
    for peer, spent in before["spent"].items():
        assert after["spent"][peer]["epsilon"] >= spent["epsilon"] - 1e-9
    # and the transport inbox of the ping exchange too
    inbox = _control(op_dir, "n1", "inbox", {"protocol": "net.ping", "run_id": "deploy-ping-1"})[
        "inbox"
    ]
    assert sorted(row["sender"] for row in inbox) == ["n0", "n2"]


def test_stopping_a_node_mid_run_pauses(net):
    """Documented behaviour of ``on_peer_down = "pause"``: the holder keeps the token and retries;
    ``watch`` returns "paused" with the holder and the unreachable node; the operator cancels.
    When the stopped node held the walk itself, ``watch`` returns "holder-lost" naming it."""
    op_dir, victim = net["op_dir"], net["nodes"]["n3"]
    spec = net["specs"] / "pause.toml"
    spec.write_text(
        spec_toml(
            steps=1200,
            sigma=10.0,
            seed=14,
            on_peer_down="pause",
            graph=TOPOLOGY,
            epsilon=NODE_BUDGET,
        )
    )
    run_id, step, stop_s, outcome = _start_and_stop_mid_run(op_dir, spec, victim, pause_timeout=8.0)
    # progress is reported every few steps, so the last step seen may be a little before `step`
    assert outcome.step < 1200 and not outcome.deviations, outcome
    if outcome.state == "holder-lost":
        # the stopped node held the token (more likely on a slow machine): watch names it and the copy
        # the walk can resume from (issue 14), instead of waiting on a holder that does not answer
        assert outcome.lost_holder["holder"] == "n3", outcome
        assert outcome.lost_holder["copy_at"] in ("n0", "n1", "n2"), outcome
    else:
        assert outcome.state == "paused" and "unreachable: n3" in outcome.reason, outcome
    cancelled = _client(op_dir, lambda c: c.cancel(run_id))
    assert {cancelled[n] for n in ("n0", "n1", "n2")} == {"cancelled"}, cancelled
    docker("start", victim)
    wait_for(lambda: _all_connected(op_dir), 90, what="n3 back and all ring links up")


def test_token_rotation_with_a_recreated_bootstrap(net):
    """deploy/README.md "Join tokens", containers: a new HUSHNET_TOKEN and a re-created bootstrap.
    The CA and the membership survive in the bootstrap volume, running nodes keep their links, a
    restarted node re-joins with the new token from the join volume, the old token is refused."""
    op_dir, project = net["op_dir"], net["project"]
    (boot,) = container_ids(project, "bootstrap")
    old = docker("exec", boot, "cat", "/var/lib/hushnet-join/join_token").stdout.strip()
    new = "rotated-" + os.urandom(6).hex()
    net["env"]["HUSHNET_TOKEN"] = new
    compose(project, "up", "-d", "--no-deps", "bootstrap", env=net["env"], timeout=120)
    (boot2,) = container_ids(project, "bootstrap")
    assert boot2 != boot  # re-created
    wait_for(
        lambda: (
            docker("exec", boot2, "cat", "/var/lib/hushnet-join/join_token").stdout.strip() == new
        ),
        30,
        what="the new token in the join volume",
    )
    wait_for(
        lambda: _all_connected(op_dir),
        120,
        what="the network to be healthy under the new bootstrap",
    )
    docker("restart", "--time", "10", net["nodes"]["n2"], timeout=60)
    doc = wait_for(lambda: _all_connected(op_dir), 90, what="n2 re-joined with the new token")
    assert next(n for n in doc["nodes"] if n["id"] == "n2")["uptime_s"] < 60
    proc = docker(
        "run",
        "--rm",
        "--network",
        f"{project}_hushnet",
        "-e",
        f"HUSHNET_TOKEN={old}",
        "-e",
        "HUSHNET_JOIN_TIMEOUT=20",
        "-v",
        f"{project}_join:/var/lib/hushnet-join:ro",
        net["env"]["HUSHNET_IMAGE"],
        "node",
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1 and "wrong join token" in proc.stdout + proc.stderr


def test_down_is_quick_and_complete(net):
    t0 = time.monotonic()
    compose(net["project"], "down", "-v", "--timeout", "10", env=net["env"], timeout=120)
    TIMINGS["compose_down_s"] = time.monotonic() - t0
    net["down"] = True
    assert TIMINGS["compose_down_s"] < 30
    assert (
        container_ids(net["project"], "node") == []
        and container_ids(net["project"], "bootstrap") == []
    )
    vols = docker(
        "volume", "ls", "-q", "--filter", f"label=com.docker.compose.project={net['project']}"
    ).stdout
    assert vols.split() == []


@pytest.mark.parametrize(
    "case",
    [
        "no-join-volume",
        "no-topology",
        "unwritable-state",
        "nodes-per-container-not-a-number",
        "nodes-per-container-zero",
        "node-id-with-a-node-host",
    ],
)
def test_entrypoint_bad_input_is_one_clear_line(hushnet_image, case):
    """A compose file that forgets a volume or a variable: one readable error, no traceback."""
    argv = {
        "no-join-volume": ["-e", "HUSHNET_WAIT_FILES=1", hushnet_image, "node"],
        "no-topology": [hushnet_image, "bootstrap"],
        "unwritable-state": ["-e", "HUSHNET_STATE_DIR=/proc/hushnet", hushnet_image, "node"],
        "nodes-per-container-not-a-number": [
            "-e",
            "HUSHNET_NODES_PER_CONTAINER=four",
            hushnet_image,
            "node",
        ],
        "nodes-per-container-zero": ["-e", "HUSHNET_NODES_PER_CONTAINER=0", hushnet_image, "node"],
        "node-id-with-a-node-host": [
            "-e",
            "HUSHNET_NODES_PER_CONTAINER=4",
            "-e",
            "HUSHNET_NODE_ID=n3",
            hushnet_image,
            "node",
        ],
    }[case]
    expect = {
        "no-join-volume": "mount the bootstrap's join volume",
        "no-topology": "needs HUSHNET_TOPOLOGY",
        "unwritable-state": "mount a volume there",
        "nodes-per-container-not-a-number": "HUSHNET_NODES_PER_CONTAINER=four is not a whole number",
        "nodes-per-container-zero": "HUSHNET_NODES_PER_CONTAINER must be at least 1, got 0",
        "node-id-with-a-node-host": "HUSHNET_NODE_ID names one node",
    }[case]
    proc = docker("run", "--rm", *argv, timeout=60, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert expect in proc.stderr and "Traceback" not in proc.stderr
