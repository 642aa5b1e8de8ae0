"""``make demo-large`` at a size CI affords: the demo's entry point on 64 hosted peers in 2 OS processes.

Real processes, real mutual TLS (``LocalCluster(per_process=32)``), the houses data, a short walk
(T = 10·n).  The privacy numbers on the last line come from the nodes' ledgers (the run report), the
local-DP ε from the same accountant at the same noise and contributions; the walk's certified
mean-pair ε must not exceed local DP (the walk bound is capped by it per pair, so a larger one would
be an accounting error), and the amplification field is their ratio.  No timing is asserted.
"""

from __future__ import annotations

import re

import pytest

from hushnet.runs import demo

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

LAST_LINE = re.compile(
    r"^demo: accuracy=(?P<acc>[0-9.]+) nonprivate=(?P<nonpriv>[0-9.]+) localdp=(?P<ldp>[0-9.]+) "
    r"worst_pair_epsilon=(?P<worst>[0-9.]+) delta=(?P<delta>[0-9.e+-]+) seconds=(?P<sec>[0-9.]+) "
    r"mean_pair_epsilon=(?P<mean>[0-9.]+) localdp_epsilon=(?P<ldp_eps>[0-9.]+) amplification=(?P<amp>[0-9.]+)$"
)

N, PER_PROCESS, STEPS_PER_NODE = 64, 32, 10


def test_demo_large_on_hosted_nodes_prints_certified_amplification(capsys) -> None:
    argv = [
        "--large",
        "--nodes",
        str(N),
        "--per-process",
        str(PER_PROCESS),
        "--steps-per-node",
        str(STEPS_PER_NODE),
        "--seeds",
        "0",
        "--no-progress",
    ]
    assert demo.main(argv) == 0
    out = capsys.readouterr().out.strip().splitlines()
    m = LAST_LINE.match(out[-1])
    assert m, out[-1]
    assert any("2 processes of 32 nodes" in line for line in out), out[:3]
    assert any("from the nodes' ledgers" in line for line in out)
    assert out[-2].startswith("walk on the network")

    _, _, _, spec = demo.prepare("houses", N, large=True, steps_per_node=STEPS_PER_NODE)
    assert spec.steps == STEPS_PER_NODE * N
    worst, mean, ldp_eps = float(m["worst"]), float(m["mean"]), float(m["ldp_eps"])
    assert 0 < mean <= worst
    # local DP at the contributions the nodes made: the walk's mean pair cannot exceed it (the walk
    # bound is capped by local DP per pair), and at most the cap's local DP
    assert mean <= ldp_eps + 1e-4
    assert ldp_eps <= demo.localdp_epsilon(spec)[1] + 1e-9
    assert float(m["amp"]) == pytest.approx(ldp_eps / mean, abs=2e-3)
    assert float(m["delta"]) == demo.DELTA
    assert 0.0 <= float(m["acc"]) <= 1.0 and 0.9 < float(m["nonpriv"]) <= 1.0


def test_large_rejects_a_data_set_without_a_large_configuration() -> None:
    with pytest.raises(SystemExit, match="--large has a configuration for"):
        demo.prepare("breast-cancer", 64, large=True)


def test_steps_per_node_needs_large() -> None:
    with pytest.raises(SystemExit, match="--steps-per-node needs --large"):
        demo.main(["--steps-per-node", "5", "--simulate"])


def test_localdp_at_the_contributions_made_not_the_cap() -> None:
    _, _, _, spec = demo.prepare("houses", 64, large=True, steps_per_node=STEPS_PER_NODE)
    at_cap = demo.localdp_epsilon(spec)
    assert at_cap[0] == at_cap[1] > 0
    worst, mean = demo.localdp_epsilon(spec, [0, spec.cap])
    assert worst == pytest.approx(at_cap[0]) and mean == pytest.approx(at_cap[0] / 2)
    few_worst, few_mean = demo.localdp_epsilon(spec, [STEPS_PER_NODE] * 64)
    assert few_mean == pytest.approx(few_worst)
    # a shorter walk is compared with a smaller local DP
    assert 0 < few_worst < at_cap[0]
