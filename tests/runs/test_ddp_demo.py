"""The comparison of ``make demo-ddp`` puts every protocol at the same certified worst-pair ε (no simulation here)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hushnet.runs import demo
from hushnet.runs.demo_ddp import CENTRAL, bisect_sigma, ddp_spec, worst_central, worst_ddp


def test_secagg_and_central_are_calibrated_to_the_walks_certified_epsilon() -> None:
    _, _, _, rw = demo.prepare("breast-cancer", 16)
    target, _ = demo.projected_privacy(rw)
    s = bisect_sigma(lambda x: worst_ddp(ddp_spec(rw, x, 16)), target)
    assert worst_ddp(ddp_spec(rw, s, 16)) == pytest.approx(target, rel=1e-6)
    assert (
        worst_ddp(ddp_spec(rw, s * 0.99, 16)) > target
    )  # the smallest σ that fits, nothing tuned by hand
    cen = replace(rw, protocol="central-dpsgd", cap=None, run_id="", **CENTRAL)
    sc = bisect_sigma(lambda x: worst_central(replace(cen, sigma=x)), target)
    assert worst_central(replace(cen, sigma=sc)) == pytest.approx(target, rel=1e-6)
