"""``hushnet privacy matrix|pair``: the numbers others use to check hushnet, with their labels."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hushnet.cli import main


def run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def test_matrix_json_summary_and_npy(capsys, tmp_path):
    out = tmp_path / "m.npy"
    code, text = run(
        capsys,
        "privacy",
        "matrix",
        "--graph",
        "ring:12",
        "--protocol",
        "rw",
        "--alpha",
        "2",
        "--sigma",
        "2",
        "--steps",
        "120",
        "--out",
        str(out),
        "--json",
    )
    assert code == 0
    rep = json.loads(text)
    assert rep["bound"] == "certified" and rep["view"] == "anonymous" and rep["n"] == 12
    s = rep["summary"]
    assert s["pairs"] == 132 and 0 < s["min"] <= s["mean"] <= s["max"]
    by_d = s["mean_by_distance"]
    assert list(by_d) == [str(d) for d in range(1, 7)]
    assert all(
        a > b for a, b in zip(list(by_d.values()), list(by_d.values())[1:])
    )  # ring: decreasing in distance
    m = np.load(out)
    assert m.shape == (12, 12) and np.all(np.diag(m) == 0)
    np.testing.assert_allclose(m, m.T, atol=1e-12)
    assert m.max() == pytest.approx(s["max"])


def test_certified_refuses_noise_below_the_condition_paper_does_not(capsys):
    code, _ = run(
        capsys,
        "privacy",
        "matrix",
        "--graph",
        "ring:8",
        "--protocol",
        "rw",
        "--alpha",
        "2",
        "--sigma",
        "1",
        "--steps",
        "80",
    )
    assert code == 2
    code, text = run(
        capsys,
        "privacy",
        "matrix",
        "--graph",
        "ring:8",
        "--protocol",
        "rw",
        "--alpha",
        "2",
        "--sigma",
        "1",
        "--steps",
        "80",
        "--bound",
        "paper",
        "--json",
    )
    assert code == 0 and json.loads(text)["bound"] == "paper"


def test_pair_shows_the_hypercube_counter_example(capsys):
    common = (
        "privacy",
        "pair",
        "--graph",
        "hypercube:6",
        "--protocol",
        "muffliato",
        "--alpha",
        "2",
        "--sigma",
        "1",
        "--steps",
        "8",
        "--source",
        "0",
        "--observer",
        "63",
        "--delta",
        "1e-5",
        "--json",
    )
    code, text = run(capsys, *common)
    certified = json.loads(text)
    assert code == 0 and certified["bound"] == "certified"
    assert certified["rdp"] == pytest.approx(
        1.0, abs=1e-9
    )  # the antipode recovers the noisy input: LDP level
    assert certified["epsilon_classic"] == pytest.approx(
        1.0 + np.log(1e5), rel=1e-9
    )  # Mironov at α = 2
    assert certified["epsilon"] == pytest.approx(
        1.0 - np.log(2) + np.log(1e5 / 2), rel=1e-9
    )  # improved
    assert "improved" in certified["conversion"]
    assert certified["epsilon_tight_gdp"] < certified["epsilon"]
    code, text = run(capsys, *common, "--bound", "paper")
    paper = json.loads(text)
    assert paper["bound"] == "paper" and paper["rdp"] < 0.1 * certified["rdp"]


@pytest.mark.parametrize("protocol", ["rw-sender-known", "muffliato-aggregate", "gossip-stream"])
def test_every_protocol_reports_its_view(capsys, protocol):
    code, text = run(
        capsys,
        "privacy",
        "matrix",
        "--graph",
        "hypercube:3",
        "--protocol",
        protocol,
        "--alpha",
        "2",
        "--sigma",
        "2",
        "--steps",
        "8",
        "--json",
    )
    rep = json.loads(text)
    assert code == 0 and rep["view"] and rep["summary"]["min"] >= 0


@pytest.mark.parametrize(
    "argv",
    [
        ["--graph", "nope:3"],
        ["--graph", "er:30:0.01:1"],
        ["--alpha", "1"],
        ["--steps", "0"],
    ],
)
def test_bad_arguments_are_clear_errors(capsys, argv):
    base = {"--graph": "ring:6", "--alpha": "2", "--sigma": "2", "--steps": "10"}
    for k, v in zip(argv[::2], argv[1::2]):
        base[k] = v
    args = ["privacy", "matrix", "--protocol", "rw"] + [x for kv in base.items() for x in kv]
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert "error" in str(exc.value)


@pytest.mark.parametrize("command", ["matrix", "pair"])
def test_muffliato_aggregate_is_labelled_as_the_exact_sum_not_hushnets_secure_gossip(
    capsys, command
):
    """``muffliato-aggregate`` is the exact-sum mechanism (the observer sees Σ_j W_ij m_j in real
    arithmetic).  hushnet's secure gossip rounds each member's term to fixed point and is certified with
    the neighbourhood view (docs/design/spec/secagg.md §6): a reader must not take this value for it."""
    argv = ["privacy", command, "--graph", "hypercube:3", "--alpha", "2", "--sigma", "2"]
    argv += ["--steps", "8"] + (["--source", "0", "--observer", "7"] if command == "pair" else [])
    code, text = run(capsys, *argv, "--protocol", "muffliato-aggregate", "--json")
    rep = json.loads(text)
    assert code == 0
    label = rep["label"]
    assert "exact real-arithmetic aggregate" in label
    assert "not the certified value of hushnet's secure gossip" in label
    assert rep["hushnet_certified_protocol"] == "muffliato"  # where hushnet's certified value is
    code, text = run(capsys, *argv, "--protocol", "muffliato-aggregate")
    assert code == 0 and "not the certified value of hushnet's secure gossip" in text
    # the neighbourhood view (what hushnet certifies its gossip with) carries no such warning
    code, text = run(capsys, *argv, "--protocol", "muffliato", "--json")
    assert "hushnet_certified_protocol" not in json.loads(text)
