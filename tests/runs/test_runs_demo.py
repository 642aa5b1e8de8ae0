"""``make demo``'s chosen configuration, checked in the simulator (no network: the parity test in
``test_runs_network.py`` already ties the simulator to the nodes' outcome seed for seed).

The demo promises a private model that is worth something: its configuration must reach the
accuracy it states (mean over seeds, not one draw) clearly above the majority class, with the
privacy loss that the unchanged certified accountant projects staying inside every node's budget.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from hushnet.families.walk.accounting import evaluate_policy
from hushnet.runs import demo
from hushnet.runs.spec import Budget

LAST_LINE = re.compile(
    r"^demo: accuracy=(?P<acc>[0-9.]+) nonprivate=(?P<nonpriv>[0-9.]+) localdp=(?P<ldp>[0-9.]+) "
    r"worst_pair_epsilon=(?P<eps>[0-9.]+) delta=(?P<delta>[0-9.e+-]+) seconds=(?P<sec>[0-9.]+) "
    r"mean_pair_epsilon=(?P<mean>[0-9.]+) localdp_epsilon=(?P<ldp_eps>[0-9.]+) amplification=(?P<amp>[0-9.]+)$"
)


@pytest.fixture(scope="module")
def breast_cancer():
    return demo.prepare("breast-cancer", 16)


def test_demo_configuration_reaches_stated_accuracy_over_seeds(breast_cancer):
    cfg, P, tasks, spec = breast_cancer
    accs = demo.simulate(spec, tasks, P, range(8))
    majority = demo.majority_accuracy(P)
    assert 0.60 < majority < 0.66  # 357 benign of 569, stratified split
    assert accs.mean() >= cfg.expected_accuracy, accs
    assert accs.mean() >= majority + 0.15, (accs, majority)
    assert np.median(accs) > majority + 0.1
    # the non-private model on the same features is the ceiling the private one is compared with
    assert demo.nonprivate_accuracy(P, intercept=False) > 0.93


def test_demo_privacy_comes_from_the_accountant_within_every_budget(breast_cancer):
    cfg, _, _, spec = breast_cancer
    worst, mean = demo.projected_privacy(spec)
    assert 0 < mean <= worst <= cfg.node_budget
    for node in range(spec.n):
        d = evaluate_policy(spec, node, Budget(cfg.node_budget, demo.DELTA))
        assert d.accept, d.reason
        assert d.bound == "certified"
    # a budget just below the projected worst pair is refused by some node: nothing is tuned by hand
    tight = Budget(worst * 0.99, demo.DELTA)
    assert not all(evaluate_policy(spec, v, tight).accept for v in range(spec.n))


def test_demo_last_line_is_machine_readable(capsys, breast_cancer):
    _, P, tasks, spec = breast_cancer
    assert demo.main(["--simulate", "--seeds", "2", "--no-progress"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    m = LAST_LINE.match(out[-1])
    assert m, out[-1]
    assert float(m["acc"]) == pytest.approx(demo.simulate(spec, tasks, P, [spec.seed])[0], abs=1e-4)
    assert float(m["eps"]) == pytest.approx(demo.projected_privacy(spec)[0], abs=1e-4)
    assert float(m["delta"]) == demo.DELTA
    assert 0.9 < float(m["nonpriv"]) <= 1.0 and 0.0 <= float(m["ldp"]) <= 1.0
    assert any("majority class" in line for line in out)
    assert any("certified" in line for line in out)


def test_houses_stays_selectable(capsys):
    assert demo.main(["--simulate", "--data", "houses", "--seeds", "0"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith("data: houses")
    assert LAST_LINE.match(out[-1]), out[-1]


def test_example_spec_is_the_demo_configuration(breast_cancer):
    from pathlib import Path

    from hushnet.runs.spec import parse_spec_toml

    _, _, _, spec = breast_cancer
    path = Path(__file__).resolve().parents[2] / "examples" / "rw_breast_cancer.toml"
    ex = parse_spec_toml(path.read_text())
    assert ex.run_id == spec.run_id  # same canonical contents, so the same run
