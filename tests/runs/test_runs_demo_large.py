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
    assert mean <= ldp_eps and worst <= ldp_eps + 1e-4
    assert float(m["amp"]) == pytest.approx(ldp_eps / mean, abs=2e-3)
    # local DP from the accountant at the spec's σ and cap (the same whatever the walk length)
    assert ldp_eps == pytest.approx(demo.localdp_epsilon(spec), abs=1e-4)
    assert float(m["delta"]) == demo.DELTA
    assert 0.0 <= float(m["acc"]) <= 1.0 and 0.9 < float(m["nonpriv"]) <= 1.0


def test_large_rejects_a_data_set_without_a_large_configuration() -> None:
    with pytest.raises(SystemExit, match="--large has a configuration for"):
        demo.prepare("breast-cancer", 64, large=True)


def test_steps_per_node_needs_large() -> None:
    with pytest.raises(SystemExit, match="--steps-per-node needs --large"):
        demo.main(["--steps-per-node", "5", "--simulate"])
