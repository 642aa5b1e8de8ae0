"""The ``hushnet run`` command line against a real network: same answers as the Python client.

One 6-node cluster (separate node processes, mutual TLS on 127.0.0.x) runs three protocols whose
result the operator receives — a random walk's model (rw-dpsgd), a P-AD ring sum and a secure sum
(secagg-sum) — and ``hushnet`` runs as a subprocess against it: ``run model`` (values, holder,
finish record; ``--out`` in every format), ``run status``, ``run ledger`` and ``--json`` on every
command a script parses; the values are checked against the client and, independently, against
the simulator (P-AD) and the plain noisy sum (secure sum).  Expected failures — unknown run, run
not finished, cancelled, a certificate that is not the operator's, a bad ``--out`` — end with one
line on stderr and exit 1; so does central-dpsgd's model asked from another process (the
aggregating client holds it).
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
from helpers.runs import cluster  # noqa: E402

from hushnet.client import Client  # noqa: E402
from hushnet.crypto.masks import FixedPoint  # noqa: E402
from hushnet.engine.rng import node_generator  # noqa: E402
from hushnet.privacy.secure_sum import effective_sensitivity  # noqa: E402
from hushnet.protocols.registry import build_from_spec  # noqa: E402
from hushnet.runs.policy import NodePolicy, load_task  # noqa: E402
from hushnet.runs.spec import Budget, RunSpec, parse_spec_toml  # noqa: E402
from hushnet.sim import Simulator  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

N = 6
VALUES = [
    0.0,
    3.0,
    1.0,
    2.5,
    2.0,
    1.0,
]  # node i's one value (sums) and one-feature example (the walk)
IDS = [f"n{i}" for i in range(N)]
REPO = pathlib.Path(__file__).resolve().parents[2]
WALK_SPEC = f"""
[run]
protocol = "rw-dpsgd"
graph = "complete:{N}"
steps = 24
sigma = 0.5
step_size = 0.1
seed = 11
[task]
name = "logreg"
[budget]
epsilon = 1000.0
delta = 1e-5
"""


def hush(state: pathlib.Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The real CLI in a fresh interpreter (``python -m hushnet.cli`` is the ``hushnet`` script)."""
    return subprocess.run(
        [sys.executable, "-m", "hushnet.cli", *args, "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def ok_json(r: subprocess.CompletedProcess):
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def one_line_error(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hushnet: error: "), r.stderr
    return lines[0]


def _sum_spec(protocol: str, seed: int, **kw) -> RunSpec:
    base: dict = dict(
        protocol=protocol,
        task="sum",
        task_params={"lo": 0.0, "hi": 4.0},
        seed=seed,
        budget=Budget(1e4, 1e-5),
        noise="public-seed",
    )
    base.update(kw)
    return RunSpec(**base).with_run_id()


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    """The cluster, with one finished run of each protocol (the walk started through the CLI)."""
    state = tmp_path_factory.mktemp("cli-net")
    shards = [(np.array([[v]]), np.array([1.0 if v >= 1.5 else -1.0])) for v in VALUES]
    with cluster(state, N, f"complete:{N}", shards, epsilon=1e4, delta=1e-5) as cl:
        client = Client(state)
        try:
            spec_path = state / "walk.toml"
            spec_path.write_text(WALK_SPEC)
            r = hush(state, "run", "start", str(spec_path), "--json")
            walk = ok_json(r)["run_id"]
            watched = ok_json(hush(state, "run", "watch", walk, "--json"))
            pad = _sum_spec("pad-ring-sum", 5, graph=f"ring:{N}", rounds=2, steps=0, sigma=1.5)
            sec = _sum_spec(
                "secagg-sum",
                6,
                graph=f"complete:{N}",
                steps=1,
                sigma=0.25,
                protocol_params={"round_timeout": 5.0},
            )
            for spec in (pad, sec):
                client.start_run(spec)
                out = client.watch(spec.run_id, progress=False, timeout=120)
                assert out.state == "finished", out
            yield {
                "state": state,
                "client": client,
                "walk": walk,
                "watched": watched,
                "pad": pad,
                "sec": sec,
                "cluster": cl,
            }
        finally:
            client.close()


def test_walk_model_matches_the_client_in_every_format(net, tmp_path):
    state, c, walk = net["state"], net["client"], net["walk"]
    watched = net["watched"]
    assert watched["state"] == "finished" and watched["step"] == 24 and watched["holder"] in IDS
    want = c.model(walk)
    meta = ok_json(hush(state, "run", "model", walk, "--json"))
    assert (
        meta["protocol"] == "rw-dpsgd"
        and meta["holder"] == watched["holder"] == c.result(walk).holder
    )
    assert (
        meta["step"] == 24
        and meta["dim"] == want.shape[0]
        and meta["holders"] == [watched["holder"]]
    )
    np.testing.assert_array_equal(np.array(meta["values"]), want)  # JSON floats round-trip exactly

    for name, load in (
        ("w.npy", np.load),
        ("w.txt", np.loadtxt),
        ("w.csv", np.loadtxt),
        ("w.json", lambda p: np.array(json.loads(p.read_text())["values"])),
    ):
        out = tmp_path / name
        r = hush(state, "run", "model", walk, "--out", str(out))
        assert (
            r.returncode == 0 and f"saved to {out}" in r.stdout and watched["holder"] in r.stdout
        ), r.stdout + r.stderr
        np.testing.assert_array_equal(np.atleast_1d(load(out)), want)
    m = ok_json(hush(state, "run", "model", walk, "--out", str(tmp_path / "x.npy"), "--json"))
    assert m["out"] == str(tmp_path / "x.npy") and "values" not in m

    err = one_line_error(hush(state, "run", "model", walk, "--out", str(tmp_path / "w.bin")))
    assert "unknown format '.bin'" in err and not (tmp_path / "w.bin").exists()
    err = one_line_error(hush(state, "run", "model", walk, "--node", "n99"))
    assert "no node 'n99'" in err


def test_pad_sum_equals_the_simulator(net):
    state, c, spec = net["state"], net["client"], net["pad"]
    meta = ok_json(hush(state, "run", "model", spec.run_id, "--json"))
    assert (
        meta["protocol"] == "pad-ring-sum" and meta["holder"] == f"n{N - 1}"
    )  # the ring ends at the last vertex
    tasks = [
        load_task(spec, NodePolicy(None, state / "nodes" / f"n{i}" / "data.npz")) for i in range(N)
    ]
    sim = Simulator(build_from_spec(spec, tasks)).run()
    np.testing.assert_allclose(np.array(meta["values"]), sim.model, rtol=0, atol=1e-12)
    np.testing.assert_allclose(
        np.array(meta["info"]["estimate"]),
        np.asarray(sim.finish.result["estimate"]),
        rtol=0,
        atol=1e-12,
    )
    np.testing.assert_array_equal(np.array(meta["values"]), c.model(spec.run_id))
    r = hush(state, "run", "model", spec.run_id)
    assert r.returncode == 0 and "pad-ring-sum" in r.stdout and f"from n{N - 1}" in r.stdout, (
        r.stdout + r.stderr
    )


def test_secure_sum_is_the_noisy_sum_to_the_fixed_point_bound(net):
    state, spec = net["state"], net["sec"]
    meta = ok_json(hush(state, "run", "model", spec.run_id, "--json"))
    assert meta["protocol"] == "secagg-sum" and meta["info"]["status"] == "released"
    assert meta["info"]["survivors"] == list(range(N)) and "n0" in meta["holders"]
    sens = 4.0  # SumTask on [0, 4], one value: (hi - lo) * sqrt(1)
    # local-DP calibration of a share R(x) + R(z) seen alone: σ(Δ + q√d) (docs/design/spec/secagg.md)
    std = 0.25 * effective_sensitivity(sens, 1, dim=1, frac_bits=FixedPoint().frac_bits)
    plain = sum(
        VALUES[u] + node_generator(spec.seed, N, u).standard_normal(1)[0] * std for u in range(N)
    )
    bound = FixedPoint().error_bound(2 * N)  # data and noise rounded apart
    assert abs(meta["values"][0] - plain) <= bound + 1e-9 * abs(plain)
    # a member the sum was broadcast to gives the same value
    other = [h for h in meta["holders"] if h != meta["holder"]]
    assert other, meta["holders"]
    m2 = ok_json(hush(state, "run", "model", spec.run_id, "--node", other[0], "--json"))
    assert m2["holder"] == other[0] and abs(m2["values"][0] - meta["values"][0]) <= 2 * bound
    r = hush(state, "run", "model", spec.run_id)
    assert r.returncode == 0 and "released: 6 contributions summed" in r.stdout, r.stdout + r.stderr


def test_status_list_report_json(net):
    state, c, walk = net["state"], net["client"], net["walk"]
    doc = ok_json(hush(state, "run", "status", walk, "--json"))
    assert doc["run_id"] == walk and sorted(doc["nodes"]) == IDS
    assert {s["state"] for s in doc["nodes"].values()} <= {"finished", "closed"}
    assert [i for i, s in doc["nodes"].items() if s["holds_model"]] == [net["watched"]["holder"]]
    assert sum(s["contributions"] for s in doc["nodes"].values()) == 24
    r = hush(state, "run", "status", walk)
    assert r.returncode == 0 and all(i in r.stdout for i in IDS) and "24/24" in r.stdout, (
        r.stdout + r.stderr
    )
    runs = {row["run_id"]: row for row in ok_json(hush(state, "run", "list", "--json"))}
    assert {walk, net["pad"].run_id, net["sec"].run_id} <= set(runs) and runs[walk][
        "protocol"
    ] == "rw-dpsgd"
    spec_path = state / "walk2.toml"
    spec_path.write_text(WALK_SPEC.replace("seed = 11", "seed = 13"))
    final = ok_json(
        hush(state, "run", "start", str(spec_path), "--watch", "--json")
    )  # one JSON document
    assert (
        final["state"] == "finished" and final["run_id"].startswith("run-") and final["step"] == 24
    )
    rep = ok_json(hush(state, "run", "report", net["pad"].run_id, "--json"))
    mine = c.report(net["pad"].run_id).per_node
    assert sorted(rep["nodes"]) == IDS and "summary" in rep
    assert all(
        rep["nodes"][i]["certified"] == mine[i]["certified"] and mine[i]["certified"] for i in IDS
    )


def test_ledger_matches_the_client(net):
    state, c = net["state"], net["client"]
    doc = ok_json(hush(state, "run", "ledger", "--json"))
    assert sorted(doc["nodes"]) == IDS and doc["delta"] is None
    mine = c.ledgers()
    for i in IDS:
        led = doc["nodes"][i]
        assert led["spent"] == mine[i]["spent"]  # the same certified totals, bit for bit
        assert led["budget"] == {"epsilon": 1e4, "delta": 1e-5}
        for spec in (net["pad"], net["sec"]):  # every node contributed to both sums
            assert (
                led["runs"][spec.run_id]["entries"] >= 1
                and led["runs"][spec.run_id]["protocol"] == spec.protocol
            )
        assert sum(r["entries"] for r in led["runs"].values()) == led["entries"]
        assert sorted(led["spent"]) == sorted(set(IDS) - {i})
        assert all(
            0 < s["epsilon"] <= 1e4 and s["bound"] == "certified" for s in led["spent"].values()
        )
    at = ok_json(hush(state, "run", "ledger", "--delta", "1e-3", "--json"))
    assert at["delta"] == 1e-3 and all(
        s["delta"] == 1e-3 for s in at["nodes"]["n0"]["spent"].values()
    )
    assert all(
        at["nodes"]["n0"]["spent"][t]["epsilon"] < doc["nodes"]["n0"]["spent"][t]["epsilon"]
        for t in at["nodes"]["n0"]["spent"]
    )  # a larger δ costs less ε
    r = hush(state, "run", "ledger")
    assert r.returncode == 0 and all(i in r.stdout for i in IDS) and "certified" in r.stdout, (
        r.stdout + r.stderr
    )
    r = hush(state, "run", "ledger", "--node", "n2")
    assert r.returncode == 0 and net["sec"].run_id in r.stdout and "n5" in r.stdout, (
        r.stdout + r.stderr
    )
    assert "no node 'n9'" in one_line_error(hush(state, "run", "ledger", "--node", "n9"))
    assert "--delta must be in (0, 1)" in one_line_error(
        hush(state, "run", "ledger", "--delta", "2")
    )


def test_clear_errors(net, tmp_path):
    state, c = net["state"], net["client"]
    for cmd in ("model", "status"):
        err = one_line_error(hush(state, "run", cmd, "run-nosuchrun"))
        assert err == "hushnet: error: no run run-nosuchrun on this network", err

    # accepted everywhere but never started: no model yet; then cancelled through the CLI
    spec, decisions = c.submit(parse_spec_toml(WALK_SPEC.replace("seed = 11", "seed = 12")))
    assert all(d["accept"] for d in decisions.values()), decisions
    err = one_line_error(hush(state, "run", "model", spec.run_id))
    assert f"run {spec.run_id} has not finished (accepted at step 0/24)" in err, err
    res = ok_json(hush(state, "run", "cancel", spec.run_id, "--json"))
    assert res == {i: "cancelled" for i in IDS}
    err = one_line_error(hush(state, "run", "model", spec.run_id))
    assert f"run {spec.run_id} was cancelled" in err, err

    # central-dpsgd: the operator process that aggregated holds the model; another process cannot fetch it
    cen = RunSpec(
        protocol="central-dpsgd",
        task="logreg",
        graph=f"complete:{N}",
        steps=6,
        seed=7,
        budget=Budget(1e4, 1e-5),
        sigma=0.05,
        clip=1.0,
        step_size=0.5,
        noise="public-seed",
    ).with_run_id()
    o = c.run_central(cen, progress=False)
    assert o.state == "finished", o
    r = c.result(cen.run_id)
    assert (
        r.holder == "operator"
        and r.protocol == "central-dpsgd"
        and np.array_equal(r.values, o.model)
    )
    err = one_line_error(hush(state, "run", "model", cen.run_id))
    assert "central-dpsgd" in err and "--model-out" in err, err

    # a node's own identity is not the operator's: the nodes refuse it, the CLI says so in one line
    fake = tmp_path / "not-operator"
    fake.mkdir()
    for f in ("bootstrap.json", "ca.pem"):
        shutil.copy(state / "bootstrap" / f, fake / f)
    shutil.copy(state / "nodes" / "n1" / "node.key", fake / "operator.key")
    shutil.copy(state / "nodes" / "n1" / "node.pem", fake / "operator.pem")
    err = one_line_error(hush(fake, "run", "model", net["walk"]))
    assert "not allowed" in err and "operator certificate" in err, err
