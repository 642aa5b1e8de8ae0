"""Issue 10 §3: secagg-dpsgd beside local DP, the random walk and central DP-SGD (trusted aggregator) at the
same certified worst-pair ε on the demo's 16-node houses data — see :mod:`hushnet.runs.demo_ddp`."""

from __future__ import annotations

import pathlib


def main(out_dir: pathlib.Path) -> dict:
    from hushnet.runs.demo_ddp import compare, save_figure

    result = compare("houses", 16, seeds=8)
    save_figure(result, out_dir)
    return result
