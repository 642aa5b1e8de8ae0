"""The papers' experiments runner (``python -m hushnet.runs.net_experiments``, issue 12) at a size CI affords.

Real processes and real mutual TLS: 32 hosted nodes in 2 OS processes on the hypercube, the houses
split, public-seed noise.  For Muffliato-GD and the random walk the runner's network result must equal
its simulator result (every node's model to 1e-12, contributions, every node's certified row replayed
from the simulator's ledger entries), and the JSON's fields must agree with each other: the ratio is
local DP over certified, local DP is at the contributions the nodes made and never below the certified
ε (the certified bound is capped by local DP per order).  No timing is asserted.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from hushnet.runs import net_experiments as nx

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

N, PER_PROCESS = 32, 16


def _run(tmp_path: pathlib.Path, protocol: str, *extra: str) -> dict:
    argv = [
        "--protocol",
        protocol,
        "--nodes",
        str(N),
        "--per-process",
        str(PER_PROCESS),
        "--ledger-check",
        str(N),
        "--baseline-seeds",
        "1",
        "--out",
        str(tmp_path),
        *extra,
    ]
    assert nx.main(argv) == 0
    path = tmp_path / f"net_{protocol}_{N}.json"
    assert (tmp_path / f"net_{protocol}_{N}.png").stat().st_size > 0
    return json.loads(path.read_text())


def _consistent(res: dict, protocol: str) -> None:
    assert res["protocol"] == protocol and res["n"] == N and res["graph"] == "hypercube:5"
    assert res["processes"] == 2 and res["spec"]["noise"] == "public-seed"
    par = res["parity"]
    assert par["ok"], par
    assert par["max_abs_model_diff"] <= nx.MODEL_ATOL
    assert par["contributions_equal"]
    assert par["ledger_checked_vertices"] == list(range(N))
    assert par["ledger_max_rel_eps_diff"] <= nx.EPS_RTOL
    pr = res["privacy"]
    mean, worst = pr["certified_mean_pair_epsilon"], pr["certified_worst_pair_epsilon"]
    ldp_mean, ldp_worst = pr["localdp_mean_pair_epsilon"], pr["localdp_worst_pair_epsilon"]
    assert 0 < mean <= worst
    # the certified bound is capped by local DP per order on the same ledger orders: never above it
    assert mean <= ldp_mean * (1 + 1e-12) and worst <= ldp_worst * (1 + 1e-12)
    assert pr["ratio_mean_pair"] == pytest.approx(ldp_mean / mean, rel=1e-12)
    assert pr["ratio_worst_pair"] == pytest.approx(ldp_worst / worst, rel=1e-12)
    c = pr["contributions"]
    # local DP at the contributions made: the largest count gives the worst pair
    assert ldp_worst == pytest.approx(
        nx.localdp_row([c["max"]], res["spec"]["sigma"], pr["delta"])[0]
    )
    acc = res["accuracy"]
    assert acc["network"] == acc["simulator"]  # the same model(s)
    assert 0.9 < acc["nonprivate"] <= 1.0
    assert all(
        0.0 <= acc[k] <= 1.0
        for k in (
            "private_over_seeds",
            "localdp_same_worst_pair_epsilon",
            "localdp_same_mean_pair_epsilon",
        )
    )
    # a smaller target ε needs at least as much noise
    assert acc["localdp_sigma_mean"] >= acc["localdp_sigma_worst"] * (1 - 1e-9)


def test_muffliato_gd_network_equals_simulator(tmp_path: pathlib.Path) -> None:
    saved = tmp_path / "network.json"
    res = _run(tmp_path, "muffliato-gd", "--steps", "3", "--K", "2", "--save-network", str(saved))
    _consistent(res, "muffliato-gd")
    # the simulator side redone from the saved network run gives the same result
    again = _run(
        tmp_path / "again", "muffliato-gd", "--steps", "3", "--K", "2", "--from-network", str(saved)
    )
    for key in ("parity", "privacy", "accuracy", "spec"):
        assert again[key] == res[key], key
    assert res["parity"]["models_compared"] == N  # every node holds its own model
    c = res["privacy"]["contributions"]
    assert c["min"] == c["max"] == 3  # one noisy gradient step per GD step
    # the neighbours see the noisy iterate itself: the worst pair is local DP's (to float precision)
    assert res["privacy"]["certified_worst_pair_epsilon"] == pytest.approx(
        res["privacy"]["localdp_worst_pair_epsilon"], rel=1e-2
    )
    assert res["privacy"]["ratio_mean_pair"] > 1.0


def test_random_walk_network_equals_simulator(tmp_path: pathlib.Path) -> None:
    res = _run(tmp_path, "rw-dpsgd")
    _consistent(res, "rw-dpsgd")
    assert res["parity"]["models_compared"] == 1  # the holder of the last hop
    assert res["privacy"]["contributions"]["total"] == res["spec"]["steps"] == 2 * N


def test_localdp_row_is_the_ledger_charge_of_clear_contributions() -> None:
    from hushnet.privacy.conversions import DEFAULT_ORDERS
    from hushnet.runs.accounting import dp_from_rdp, local_dp_cost

    cost = local_dp_cost(0, ["a", "b"])
    want = dp_from_rdp(np.asarray(DEFAULT_ORDERS, float), 5 * cost.curves(2.0)[0], 1e-5)
    assert nx.localdp_row([5, 0], 2.0, 1e-5).tolist() == [want, 0.0]


def test_bad_arguments_are_one_line_errors() -> None:
    with pytest.raises(SystemExit, match="power of two"):
        nx.prepare("rw-dpsgd", 48)
    with pytest.raises(SystemExit, match="--K .* needs muffliato-gd"):
        nx.prepare("rw-dpsgd", 32, K=2)
    with pytest.raises(SystemExit, match="--steps must be positive"):
        nx.prepare("muffliato-gd", 32, steps=0)
    with pytest.raises(SystemExit, match="--network-only needs --save-network"):
        nx.main(["--protocol", "rw-dpsgd", "--nodes", "32", "--network-only"])


def test_recorded_command_keeps_no_directory_of_this_machine(tmp_path: pathlib.Path) -> None:
    argv = ["--nodes", "64", "--out", str(tmp_path / "o"), f"--from-network={tmp_path / 'n.json'}"]
    assert nx.public_argv(argv) == ["--nodes", "64", "--out", "o", "--from-network=n.json"]


def test_walk_sweep_certifies_what_the_nodes_ledgers_would() -> None:
    """The sweep's certified ε (per distinct slope, summed as a driver sums) equals each node's row
    replayed from the simulator's ledger entries (what the parity check compares the nodes' reports
    with), so choosing T in the simulator chooses what the network run will certify."""
    n = 16
    spec, P = nx.prepare("rw-dpsgd", n, steps=6 * n)
    sim = nx.run_simulator(spec, nx.make_tasks(spec, P.shards))
    counts = [nx.contributions(sim.entries.get(v, [])) for v in range(n)]
    assert sum(counts) == 6 * n and min(counts) > 0
    mean, worst, node_mean = nx.walk_certified_from_counts(spec, counts)
    ids = [f"v{v}" for v in range(n)]
    rows = [nx.replay_row(spec, v, ids, sim.entries.get(v, [])) for v in range(n)]
    want = np.array([[e for t, e in r.items()] for r in rows])
    assert np.allclose(node_mean, want.mean(axis=1), rtol=nx.EPS_RTOL, atol=0)
    assert worst == pytest.approx(want.max(), rel=nx.EPS_RTOL)
    assert mean == pytest.approx(want.mean(), rel=nx.EPS_RTOL)
    # capped by local DP per order: never above local DP at the same contributions
    assert worst <= nx.localdp_row(counts, spec.sigma, spec.budget.delta).max() * (1 + 1e-12)


def test_walk_sweep_command_writes_its_rows(tmp_path: pathlib.Path) -> None:
    argv = ["--protocol", "rw-dpsgd", "--nodes", "16", "--sweep", "1,4", "--out", str(tmp_path)]
    assert nx.main(argv) == 0
    doc = json.loads((tmp_path / "sweep_rw-dpsgd_16.json").read_text())
    assert [r["steps"] for r in doc["rows"]] == [16, 64]
    assert str(tmp_path) not in doc["command"]
    for r in doc["rows"]:
        assert r["contributions"]["mean"] == r["steps"] / 16
        assert 0 < r["certified_mean_pair_epsilon"] <= r["certified_worst_pair_epsilon"]
        assert r["ratio_mean_pair"] >= 1 - 1e-12 and r["ratio_worst_pair"] >= 1 - 1e-12
    for bad, msg in (
        (["--sweep", "x"], "--sweep takes numbers"),
        (["--sweep", "0,4"], "--sweep needs positive numbers"),
        (["--sweep", "4", "--steps", "64"], "--sweep chooses T itself"),
    ):
        with pytest.raises(SystemExit, match=msg):
            nx.main(["--protocol", "rw-dpsgd", "--nodes", "16", *bad])
    with pytest.raises(SystemExit, match="--sweep needs --protocol rw-dpsgd"):
        nx.main(["--protocol", "muffliato-gd", "--nodes", "16", "--sweep", "4"])


class _Statuses:
    """The operator's per-node run states, one poll after another (what ``Client.statuses`` returns)."""

    def __init__(self, polls: list[dict]) -> None:
        self.polls, self.calls = polls, 0

    def statuses(self, run_id: str) -> dict:
        got = self.polls[min(self.calls, len(self.polls) - 1)]
        self.calls += 1
        return got


def test_gossip_runner_waits_for_every_node_to_end_its_rounds_before_watch_closes(
    monkeypatch,
) -> None:
    """At n = 1024, 22 nodes still waiting for their last round's message were closed by ``watch`` (which
    closes a run once one node finished) and held no model; the runner now waits for all of them first."""
    monkeypatch.setattr(nx.time, "sleep", lambda s: None)
    run = {"a": {"state": "running"}, "b": {"state": "running"}}
    one = {"a": {"state": "finished"}, "b": {"state": "running"}}
    both = {"a": {"state": "finished"}, "b": {"state": "finished"}}
    client = _Statuses([run, one, one, both, both])
    nx._wait_rounds_done(client, "r", 2, 1e9, lambda m: None)
    assert client.calls == 4  # returned at the first poll where both had finished
    # a node that is gone does not hold the run forever: one round timeout after the first finished
    clock = iter(float(t) for t in range(100))
    monkeypatch.setattr(nx.time, "monotonic", lambda: next(clock))
    said: list[str] = []
    client = _Statuses([one])
    nx._wait_rounds_done(client, "r", 2, 5.0, said.append)
    assert said == ["1 of 2 nodes still in their rounds 5 s after the first finished"]
    # a stopped node ends the wait at once (watch reports it)
    client = _Statuses([{"a": {"state": "stopped"}, "b": {"state": "running"}}])
    nx._wait_rounds_done(client, "r", 2, 1e9, lambda m: None)
    assert client.calls == 1
