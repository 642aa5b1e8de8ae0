"""The privacy report stays readable and fast at n = 2048 (issue 12): heatmap as block means, loss by
graph distance from a sparse BFS, a histogram of pair losses; PNG + JSON written.

The pair losses are built from a known function of the hop distance (plus a per-pair term), so the
numbers the report prints can be checked exactly, not just "a file exists".
"""

from __future__ import annotations

import json
import pathlib
import time

import networkx as nx
import numpy as np

from hushnet.client.report import RunReport


def _hypercube(d: int) -> nx.Graph:
    g = nx.Graph()
    n = 2**d
    for v in range(n):
        g.add_node(v, id=f"n{v}")
    g.add_edges_from((v, v ^ (1 << b)) for v in range(n) for b in range(d) if v < v ^ (1 << b))
    return g


def _report(d: int, with_paper: bool = False) -> tuple[RunReport, np.ndarray, np.ndarray]:
    n = 2**d
    v = np.arange(n)
    hops = np.array([bin(x).count("1") for x in range(n)])[
        v[:, None] ^ v[None, :]
    ]  # hypercube distance
    rng = np.random.default_rng(0)
    eps = 2.0 / (1 + hops) + 0.01 * rng.random((n, n))
    ids = [f"n{x}" for x in range(n)]
    per = {}
    for u in range(n):
        row = {ids[t]: float(eps[u, t]) for t in range(n) if t != u}
        per[ids[u]] = {"vertex": u, "delta": 1e-5, "certified": row, "contributions": 3}
        if with_paper:
            per[ids[u]]["paper"] = {k: 0.5 * e for k, e in row.items()}
    return RunReport("run-big", per, _hypercube(d)), eps, hops


def test_report_at_2048_nodes_is_fast_and_exact(tmp_path: pathlib.Path) -> None:
    rep, eps, hops = _report(11)
    n = 2048
    t0 = time.perf_counter()
    stats = rep.loss_by_distance_stats()
    off = ~np.eye(n, dtype=bool)
    for dist in range(1, 12):
        sel = off & (hops == dist)
        assert stats[dist]["pairs"] == int(sel.sum())
        np.testing.assert_allclose(stats[dist]["mean"], eps[sel].mean(), rtol=1e-12)
        np.testing.assert_allclose(stats[dist]["max"], eps[sel].max(), rtol=1e-12)
    assert sorted(stats) == list(range(1, 12))
    blocks, b = rep.heatmap_blocks()
    assert b == 8 and blocks.shape == (256, 256)
    E = eps.copy()
    np.fill_diagonal(E, np.nan)
    np.testing.assert_allclose(blocks[3, 17], np.nanmean(E[24:32, 136:144]), rtol=1e-12)
    np.testing.assert_allclose(
        blocks[5, 5], np.nanmean(E[40:48, 40:48]), rtol=1e-12
    )  # diagonal block: no self pairs
    h = rep.pair_histogram()
    assert sum(h["counts"]) == n * (n - 1)
    np.testing.assert_allclose(h["edges"][-1], eps[off].max(), rtol=1e-12)
    png = tmp_path / "report.png"
    out = rep.save_heatmap(png)
    elapsed = time.perf_counter() - t0
    assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads(out.read_text())
    assert out == tmp_path / "report.json" and doc["n"] == n and doc["heatmap"]["block"] == 8
    np.testing.assert_allclose(doc["worst_pair_epsilon"], eps[off].max(), rtol=1e-12)
    np.testing.assert_allclose(
        doc["loss_by_distance"]["11"]["mean"], eps[off & (hops == 11)].mean(), rtol=1e-12
    )
    assert sum(doc["pair_histogram"]["counts"]) == n * (n - 1)
    # the loss falls with distance, as constructed: the figure's second panel shows it
    means = [doc["loss_by_distance"][str(k)]["mean"] for k in range(1, 12)]
    assert all(a > b for a, b in zip(means, means[1:]))
    assert elapsed < 60, elapsed


def test_small_report_keeps_single_pairs_and_paper_values(tmp_path: pathlib.Path) -> None:
    rep, eps, hops = _report(4, with_paper=True)
    blocks, b = rep.heatmap_blocks()
    assert b == 1 and blocks.shape == (16, 16) and np.isnan(blocks[2, 2])
    np.testing.assert_allclose(blocks[2, 9], eps[2, 9])
    assert rep.loss_by_distance() == {k: v["mean"] for k, v in rep.loss_by_distance_stats().items()}
    rows = rep.rows()
    assert {r["distance"] for r in rows} == set(range(1, 5))
    assert all(
        r["distance"] == hops[int(r["contributor"][1:]), int(r["observer"][1:])] for r in rows
    )
    doc = json.loads(rep.save_heatmap(tmp_path / "small.png").read_text())
    assert doc["heatmap"]["block_means"][2][9] == eps[2, 9]
    np.testing.assert_allclose(
        doc["paper_loss_by_distance"]["1"]["mean"],
        0.5 * eps[~np.eye(16, dtype=bool) & (hops == 1)].mean(),
        rtol=1e-12,
    )
