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
import subprocess
import sys
import time

import pytest
from helpers.deploy import (
    HUSHNET,
    REPO,
    TIMINGS,
    UNITS,
    exec_start,
    hand_out_join_files,
    netns_status,
    parse_env,
    parse_unit,
    run,
    spec_toml,
    start_bootstrap,
    wait_for,
    write_node_policy,
)

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(240)]

LEASE_S = 5
HEALTHCHECK = REPO / "deploy" / "healthcheck.py"


@pytest.mark.parametrize(
    "unit,reference",
    [
        ("hushnet-bootstrap.service", "bootstrap.env"),
        ("hushnet-node@.service", "node.env"),
        ("hushnet-nodehost@.service", "nodehost.env"),
    ],
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


def test_units_on_separate_hosts_with_a_link_cut(hosts, tmp_path):
    addresses = {"boot": "10.77.0.1", "h0": "10.77.0.10", "h1": "10.77.0.11", "h2": "10.77.0.12"}
    hosts.setup(addresses)
    boot_state = start_bootstrap(hosts, tmp_path, "10.77.0.1:7400", "ring:3", lease_s=LEASE_S)

    # what the operator does on each machine: copy ca.pem and the join token to /etc/hushnet
    for i, host in enumerate(["h0", "h1", "h2"]):
        ca, token = hand_out_join_files(boot_state, tmp_path / "etc" / host)
        # the node owner's run policy: its own data shard and budget, in its state directory
        write_node_policy(tmp_path / host / "state", vertex=i)
        env = parse_env((UNITS / "node.env").read_text())
        env.update(
            HUSHNET_STATE_DIR=str(tmp_path / host / "state"),
            HUSHNET_LISTEN=f"{addresses[host]}:7500",
            HUSHNET_ADVERTISE=f"{addresses[host]}:7500",
            HUSHNET_BOOTSTRAP="10.77.0.1:7400",
            HUSHNET_CA_FILE=str(ca),
            HUSHNET_TOKEN_FILE=str(token),
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
        doc = netns_status(hosts, boot_state)
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
        by = {n["id"]: n for n in netns_status(hosts, boot_state)["nodes"]}
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
        by = {n["id"]: n for n in netns_status(hosts, boot_state)["nodes"]}
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


def _popcount_parity(v: int) -> int:
    return bin(v).count("1") % 2


def test_node_hosts_on_two_machines_carry_a_walk(hosts, tmp_path):
    """One network over two machines, each running ONE node-host process with K = 8 nodes.

    deploy/systemd/hushnet-nodehost@.service's command on two namespaces (h0, h1): the hosts
    listen on 0.0.0.0 and advertise their own address (node i at 7500+i). Host h0 requests the
    vertices of even popcount, h1 those of odd popcount, so every link of hypercube:4 (32 of 32)
    crosses machines and every hop of the walk goes from one host to the other.
    """
    k, n, topology = 8, 16, "hypercube:4"
    addresses = {"boot": "10.77.0.1", "h0": "10.77.0.10", "h1": "10.77.0.11"}
    hosts.setup(addresses)
    t0 = time.monotonic()
    boot_state = start_bootstrap(hosts, tmp_path, "10.77.0.1:7400", topology, lease_s=15)
    vertices = {
        h: [v for v in range(n) if _popcount_parity(v) == i] for i, h in enumerate(["h0", "h1"])
    }
    for host in ("h0", "h1"):
        ca, token = hand_out_join_files(boot_state, tmp_path / "etc" / host)
        base = tmp_path / host / "state"
        for i, v in enumerate(vertices[host]):  # each node owner's data shard and budget
            write_node_policy(base / f"node-{i:03d}", vertex=v)
        env = parse_env((UNITS / "nodehost.env").read_text())
        env.update(
            HUSHNET_NODES_PER_HOST=str(k),
            HUSHNET_STATE_DIR=str(base),
            HUSHNET_ADVERTISE=f"{addresses[host]}:7500",
            HUSHNET_BOOTSTRAP="10.77.0.1:7400",
            HUSHNET_CA_FILE=str(ca),
            HUSHNET_TOKEN_FILE=str(token),
            HUSHNET_MAX_NODES=str(k),
        )
        argv = exec_start(UNITS / "hushnet-nodehost@.service", env, instance=host)
        # pin the vertices: node i of this host asks for id n<vertex> (deploy/README.md)
        argv += [a for v in vertices[host] for a in ("--node-id", f"n{v}")]
        hosts.start(host, argv, f"nodehost-{host}")

    def network_up() -> dict | None:
        doc = netns_status(hosts, boot_state)
        ok = (
            len(doc["nodes"]) == n
            and doc["healthy"]
            and all(m.get("all_neighbors_connected") for m in doc["nodes"])
            and all(m["alive_in_directory"] for m in doc["nodes"])
        )
        return doc if ok else None

    doc = wait_for(network_up, 60, interval=1.0, what=f"{topology} up across two node hosts")
    TIMINGS["netns_two_hosts_healthy_s"] = time.monotonic() - t0
    host_of = {}
    for host in ("h0", "h1"):
        for i, v in enumerate(vertices[host]):
            host_of[f"n{v}"] = host
    by_id = {m["id"]: m for m in doc["nodes"]}
    assert set(by_id) == set(host_of)
    for node_id, host in host_of.items():  # advertised: the machine's address, its own port
        i = vertices[host].index(int(node_id[1:]))
        assert by_id[node_id]["address"] == f"{addresses[host]}:{7500 + i}", by_id[node_id]
        assert all(host_of[nb] != host for nb in by_id[node_id]["neighbors"])  # every link crosses

    # the container image's healthcheck, pointed at a node host: healthy when all K answer
    for count, code, says in [(k, 0, f"node host: {k}/{k} nodes serving"), (k + 1, 1, "node-008")]:
        check = run(
            ["ip", "netns", "exec", hosts.hosts["h1"], sys.executable, str(HEALTHCHECK)],
            env=dict(
                os.environ,
                HUSHNET_STATE_DIR=str(tmp_path / "h1" / "state"),
                HUSHNET_NODES_PER_CONTAINER=str(count),
            ),
            check=False,
            timeout=60,
        )
        assert check.returncode == code and says in check.stdout, check.stdout + check.stderr

    # a private walk across the machines, started by the operator on the bootstrap host
    steps = 200
    spec = tmp_path / "run.toml"
    spec.write_text(spec_toml(steps=steps, sigma=10.0, seed=41, graph=topology, epsilon=100.0))
    t_run = time.monotonic()
    proc = hosts.in_host(
        "boot",
        [str(HUSHNET), "run", "start", str(spec), "--state-dir", str(boot_state), "--watch"],
        timeout=90,
    )
    TIMINGS["netns_two_hosts_walk_s"] = time.monotonic() - t_run
    assert proc.returncode == 0 and f"finished at step {steps}/{steps}" in proc.stdout, (
        proc.stdout + proc.stderr
    )
    run_id = proc.stdout.split("run ", 1)[1].split()[0]
    status = json.loads(
        hosts.in_host(
            "boot",
            [str(HUSHNET), "run", "status", run_id, "--json", "--state-dir", str(boot_state)],
        ).stdout
    )
    ledgers = json.loads(
        hosts.in_host(
            "boot", [str(HUSHNET), "run", "ledger", "--json", "--state-dir", str(boot_state)]
        ).stdout
    )["nodes"]
    visits = {node_id: st["contributions"] for node_id, st in status["nodes"].items()}
    assert sum(visits.values()) == steps, visits  # one visit (a noisy gradient step) per step
    for host in ("h0", "h1"):  # the walk visited nodes of both machines
        assert sum(v for node_id, v in visits.items() if host_of[node_id] == host) > 0, visits
    for node_id, st in status["nodes"].items():
        passed_to = (st.get("token") or {}).get("passed_to")
        if passed_to:  # every hop crossed machines
            assert host_of[passed_to] != host_of[node_id], (node_id, st["token"])
    for node_id, ledger in ledgers.items():
        # each visit is one entry on the visited node's own ledger, charged (certified) toward
        # every other node of the network, on either machine, within the node's budget
        assert ledger["entries"] == visits[node_id], (node_id, ledger)
        if visits[node_id]:
            assert set(ledger["spent"]) == set(host_of) - {node_id}, ledger
            for spent in ledger["spent"].values():
                assert spent["bound"] == "certified" and 0 < spent["epsilon"] <= 100.0, ledger
