"""A run's privacy report as the operator sees it: a table, a heatmap, loss by graph distance.

Every number carries its bound: ``certified`` (what hushnet stands behind: the random-walk bound
per contribution, capped by the local-DP bound, composed on each node's ledger) or ``paper``
(the published bound — random-walk paper Theorem 3 as printed, Muffliato Theorem 1/6, Koskela Theorem 15 —
a labelled reproduction, not a guarantee; each node's report names it in ``paper_bound``).
Rows are contributors (whose data), columns observers (who learns), as in the papers.
"""

from __future__ import annotations

import math
import pathlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class RunReport:
    run_id: str
    per_node: dict[str, dict[str, Any]]
    graph: Any = None  # networkx graph from the directory (vertex → attribute id)
    #: matrices and distances computed once per report (a report is a snapshot: per_node is not changed)
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def ids(self) -> list[str]:
        ok = [(r.get("vertex", 0), i) for i, r in self.per_node.items() if "error" not in r]
        return [i for _, i in sorted(ok)]

    def matrix(self, bound: str = "certified") -> np.ndarray:
        """(n, n) ε matrix at the run's δ, row = contributor, column = observer; NaN where unknown."""
        key = ("matrix", bound)
        if key not in self._memo:
            self._memo[key] = self._matrix(bound)
        return self._memo[key].copy()

    def _matrix(self, bound: str) -> np.ndarray:
        ids = self.ids
        pos = {i: k for k, i in enumerate(ids)}
        M = np.full((len(ids), len(ids)), np.nan)
        for i in ids:
            row = self.per_node[i].get(bound) or {}
            for t, e in row.items():
                if t in pos:
                    M[pos[i], pos[t]] = e
            M[pos[i], pos[i]] = 0.0
        return M

    @property
    def paper_label(self) -> str | None:
        """Which published bound the "paper" values are (each node's report says; None: no paper value)."""
        for r in self.per_node.values():
            if r.get("paper_bound"):
                return str(r["paper_bound"])
        return None

    @property
    def delta(self) -> float:
        for r in self.per_node.values():
            if "delta" in r:
                return float(r["delta"])
        return math.nan

    def summary(self) -> dict[str, Any]:
        """Worst and mean pair (certified, and paper where available), contributions, wall time."""
        M = self.matrix("certified")
        off = M[~np.eye(M.shape[0], dtype=bool)] if M.size else np.array([])
        off = off[np.isfinite(off)]
        out: dict[str, Any] = {
            "run_id": self.run_id,
            "delta": self.delta,
            "bound": "certified",
            "worst_pair_epsilon": float(off.max()) if off.size else None,
            "mean_pair_epsilon": float(off.mean()) if off.size else None,
        }
        P = self.matrix("paper")
        poff = P[~np.eye(P.shape[0], dtype=bool)] if P.size else np.array([])
        poff = poff[np.isfinite(poff)]
        if poff.size:
            out["paper_worst_pair_epsilon"] = float(poff.max())
            out["paper_mean_pair_epsilon"] = float(poff.mean())
            out["paper_bound"] = self.paper_label
        out["contributions"] = {i: self.per_node[i].get("contributions") for i in self.ids}
        times = [r.get("timings", {}) for r in self.per_node.values() if "timings" in r]
        starts = [t["started"] for t in times if t.get("started")]
        ends = [t["finished"] for t in times if t.get("finished")]
        out["run_seconds"] = (max(ends) - min(starts)) if starts and ends else None
        out["deviations"] = [
            d for r in self.per_node.values() for d in r.get("deviations_list", [])
        ]
        # a deviation is accounted only when *every* node has topped up: a node that was down at the
        # close (or answers without the top-up) is named, with why, instead of being hidden by the others
        missing = {}
        for i, r in self.per_node.items():
            if "error" in r:
                missing[i] = f"no answer ({r['error'][:160]})"
            elif not r.get("deviation_accounted") and r.get("contributions"):
                missing[i] = f"not topped up yet (state {r.get('state', '?')})"
        out["deviation_unaccounted"] = missing if out["deviations"] else {}
        out["deviation_accounted"] = bool(out["deviations"]) and not missing
        out["errors"] = {i: r["error"] for i, r in self.per_node.items() if "error" in r}
        return out

    def rows(self) -> list[dict[str, Any]]:
        """One row per ordered pair: contributor, observer, ε certified, ε paper, δ, hops apart."""
        D = self.distance_matrix()
        pos = {i: k for k, i in enumerate(self.ids)}
        out = []
        for i in self.ids:
            r = self.per_node[i]
            for t, e in (r.get("certified") or {}).items():
                d = (
                    int(D[pos[i], pos[t]])
                    if D is not None and t in pos and D[pos[i], pos[t]] >= 0
                    else None
                )
                out.append(
                    {
                        "contributor": i,
                        "observer": t,
                        "epsilon_certified": e,
                        "epsilon_paper": (r.get("paper") or {}).get(t),
                        "delta": r.get("delta"),
                        "distance": d,
                        "contributions": r.get("contributions"),
                    }
                )
        return out

    def table(self):
        """The pairs as a pandas DataFrame when pandas is installed, else the list of dicts."""
        try:
            import pandas as pd
        except ImportError:
            return self.rows()
        return pd.DataFrame(self.rows())

    def distance_matrix(self) -> np.ndarray | None:
        """(n, n) shortest-path hops between the nodes of :attr:`ids` (-1: unreachable); None without a graph.

        Breadth-first search on the sparse adjacency (scipy.sparse.csgraph): at n = 2048 the all-pairs
        dictionary of networkx took tens of seconds and gigabytes; this takes well under a second.
        """
        if self.graph is None:
            return None
        if "distances" in self._memo:
            return self._memo["distances"]
        import networkx as nx
        from scipy.sparse.csgraph import shortest_path

        order = list(self.graph.nodes)
        name = nx.get_node_attributes(self.graph, "id")
        where = {name.get(u, str(u)): k for k, u in enumerate(order)}
        A = nx.to_scipy_sparse_array(self.graph, nodelist=order, format="csr")
        D = shortest_path(A, method="D", unweighted=True, directed=False)
        idx = np.array([where.get(i, -1) for i in self.ids])
        out = np.full((len(idx), len(idx)), -1, dtype=np.int64)
        ok = idx >= 0
        sub = D[np.ix_(idx[ok], idx[ok])]
        sub = np.where(np.isfinite(sub), sub, -1).astype(np.int64)
        out[np.ix_(ok, ok)] = sub
        out.setflags(write=False)
        self._memo["distances"] = out
        return out

    def loss_by_distance_stats(self, bound: str = "certified") -> dict[int, dict[str, float]]:
        """Per hop distance: mean, min, median, max ε over the ordered pairs at that distance, and the count."""
        D = self.distance_matrix()
        if D is None:
            return {}
        M = self.matrix(bound)
        off = ~np.eye(M.shape[0], dtype=bool)
        keep = off & np.isfinite(M) & (D >= 0)
        d, e = D[keep], M[keep]
        out: dict[int, dict[str, float]] = {}
        if not e.size:
            return out
        order = np.argsort(d, kind="stable")
        d, e = d[order], e[order]
        cuts = np.flatnonzero(np.diff(d)) + 1
        for dd, chunk in zip(d[np.r_[0, cuts]], np.split(e, cuts)):
            out[int(dd)] = {
                "mean": float(chunk.mean()),
                "min": float(chunk.min()),
                "median": float(np.median(chunk)),
                "max": float(chunk.max()),
                "pairs": int(chunk.size),
            }
        return out

    def loss_by_distance(self, bound: str = "certified") -> dict[int, float]:
        return {d: v["mean"] for d, v in self.loss_by_distance_stats(bound).items()}

    def pair_histogram(self, bound: str = "certified", bins: int = 60) -> dict[str, list[float]]:
        """Histogram of the off-diagonal pair losses (edges and counts); empty when there are none."""
        M = self.matrix(bound)
        e = M[~np.eye(M.shape[0], dtype=bool)] if M.size else np.array([])
        e = e[np.isfinite(e)]
        if not e.size:
            return {"edges": [], "counts": []}
        counts, edges = np.histogram(e, bins=bins)
        return {"edges": edges.tolist(), "counts": counts.tolist()}

    # ------------------------------------------------------------------ plots
    #: above this many nodes the heatmap shows blocks of consecutive vertices (their mean ε), not single pairs
    HEATMAP_MAX_CELLS = 256

    def heatmap_blocks(self, bound: str = "certified") -> tuple[np.ndarray, int]:
        """The ε matrix (diagonal blank) averaged over b×b blocks of consecutive vertices, and b.

        Why: at n = 2048 a pair is a tenth of a pixel at any printable size, so imshow drops most pairs
        and the image aliases; the block mean shows every pair's contribution.  Vertices are in id order
        (hypercube: a block is a sub-cube), and the worst pair stays visible in the histogram panel.
        """
        M = self.matrix(bound)
        np.fill_diagonal(M, np.nan)
        n = M.shape[0]
        b = max(1, math.ceil(n / self.HEATMAP_MAX_CELLS))
        if b == 1:
            return M, 1
        m = math.ceil(n / b)
        P = np.full((m * b, m * b), np.nan)
        P[:n, :n] = M
        blocks = P.reshape(m, b, m, b)
        with np.errstate(invalid="ignore"):
            fin = np.isfinite(blocks)
            total = np.where(fin, blocks, 0.0).sum(axis=(1, 3))
            count = fin.sum(axis=(1, 3))
            return np.where(count > 0, total / np.maximum(count, 1), np.nan), b

    def plot_heatmap(self, ax=None, bound: str = "certified"):
        """Pairwise ε heatmap (row = contributor, column = observer); block means above 256 nodes."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(5.2, 4.4))
        M, b = self.heatmap_blocks(bound)
        im = ax.imshow(M, cmap="viridis", interpolation="nearest")
        ids = self.ids
        cells = M.shape[0]
        step = max(1, cells // 16)
        labels = [ids[k * b] if b == 1 else f"{ids[k * b]}…" for k in range(0, cells, step)]
        ax.set_xticks(range(0, cells, step), labels, rotation=90, fontsize=7)
        ax.set_yticks(range(0, cells, step), labels, fontsize=7)
        blk = "" if b == 1 else f" (mean over blocks of {b}×{b} pairs)"
        ax.set_xlabel("observer" + ("" if b == 1 else f" (blocks of {b})"))
        ax.set_ylabel("contributor" + ("" if b == 1 else f" (blocks of {b})"))
        ax.set_title(f"{bound} ε at δ={self.delta:g}{blk} — {self.run_id}", fontsize=9)
        ax.figure.colorbar(im, ax=ax, label=f"ε ({bound})")
        return ax

    def plot_pair_histogram(self, ax=None, bound: str = "certified"):
        """Histogram of the pair losses (log counts): the whole distribution, worst pair included."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(5.0, 3.6))
        h = self.pair_histogram(bound)
        if h["counts"]:
            edges = np.asarray(h["edges"])
            ax.bar(edges[:-1], h["counts"], width=np.diff(edges), align="edge", label=bound)
            ax.set_yscale("log")
            s = self.summary()
            if s.get("worst_pair_epsilon") is not None and bound == "certified":
                ax.axvline(
                    s["mean_pair_epsilon"],
                    color="k",
                    ls="--",
                    lw=1,
                    label=f"mean {s['mean_pair_epsilon']:.3g}",
                )
                ax.axvline(
                    s["worst_pair_epsilon"],
                    color="r",
                    ls=":",
                    lw=1,
                    label=f"worst {s['worst_pair_epsilon']:.3g}",
                )
            ax.legend(fontsize=8)
        ax.set_xlabel(f"pair ε ({bound}) at δ={self.delta:g}")
        ax.set_ylabel("ordered pairs")
        ax.set_title(f"pair losses — {len(self.ids)} nodes", fontsize=9)
        return ax

    def plot_loss_by_distance(self, ax=None):
        """Mean pairwise ε by shortest-path distance: certified, and paper (labelled) where available."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(5.0, 3.6))
        stats = self.loss_by_distance_stats("certified")
        c = {d: v["mean"] for d, v in stats.items()}
        ax.plot(list(c), list(c.values()), "o-", label="certified (mean)")
        if stats:
            ax.fill_between(
                list(stats),
                [v["min"] for v in stats.values()],
                [v["max"] for v in stats.values()],
                alpha=0.2,
                label="certified (min–max)",
            )
        p = self.loss_by_distance("paper")
        if p:
            lab = (self.paper_label or "paper").split(" — ")[0].split(";")[0]
            ax.plot(list(p), list(p.values()), "s--", label=f"{lab} (not a guarantee)")
        ax.set_xticks(sorted(set(c) | set(p)))
        ax.set_xlabel("shortest-path distance (hops)")
        ax.set_ylabel(f"mean ε at δ={self.delta:g}")
        ax.set_title(f"privacy loss by distance — {self.run_id}", fontsize=9)
        ax.legend(fontsize=8)
        return ax

    def figure_data(self, bound: str = "certified") -> dict[str, Any]:
        """What the figure shows, as numbers (written beside the PNG): summary, loss by distance, histogram,
        and the heatmap's block size."""
        s = self.summary()
        M, b = self.heatmap_blocks(bound)
        return {
            "run_id": self.run_id,
            "bound": bound,
            "delta": self.delta,
            "n": len(self.ids),
            "worst_pair_epsilon": s["worst_pair_epsilon"],
            "mean_pair_epsilon": s["mean_pair_epsilon"],
            "paper_worst_pair_epsilon": s.get("paper_worst_pair_epsilon"),
            "paper_mean_pair_epsilon": s.get("paper_mean_pair_epsilon"),
            "paper_bound": s.get("paper_bound"),
            "loss_by_distance": {str(d): v for d, v in self.loss_by_distance_stats(bound).items()},
            "paper_loss_by_distance": {
                str(d): v for d, v in self.loss_by_distance_stats("paper").items()
            },
            "pair_histogram": self.pair_histogram(bound),
            "heatmap": {
                "block": b,
                "cells": int(M.shape[0]),
                "block_means": [[None if not np.isfinite(x) else float(x) for x in r] for r in M]
                if M.shape[0] <= 64
                else None,
            },
        }

    def save_heatmap(self, path, bound: str = "certified") -> pathlib.Path:
        """Write the PNG (heatmap, loss by distance, histogram of pair losses) and its numbers as JSON beside
        it (same name, ``.json``); returns the JSON path."""
        import json

        import matplotlib

        matplotlib.use(matplotlib.get_backend())
        import matplotlib.pyplot as plt

        path = pathlib.Path(path)
        fig, axes = plt.subplots(1, 3, figsize=(15.5, 4.4))
        self.plot_heatmap(axes[0], bound)
        self.plot_loss_by_distance(axes[1])
        self.plot_pair_histogram(axes[2], bound)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        out = path.with_suffix(".json")
        out.write_text(json.dumps(self.figure_data(bound), indent=1))
        return out

    def _views(self) -> set[tuple[str, str]]:
        """(observer view, certified bound) pairs the nodes reported: every ε in the table comes from one of them."""
        out = set()
        for r in self.per_node.values():
            v = r.get("accounting_view") or {}
            view = v.get("label") or (
                f"{v['view_model']} ({v.get('mechanism', '?')})" if v.get("view_model") else None
            )
            if view or r.get("certified_bound"):
                out.add((view or "?", str(r.get("certified_bound") or "?")))
        return out

    def format_table(self) -> str:
        """Text table for ``hushnet run report``: per contributor, worst and mean certified ε (and paper)."""
        s = self.summary()
        lines = [
            f"run {self.run_id}: privacy report at δ={self.delta:g} "
            f"(certified = what hushnet guarantees; paper = the published bound, not a guarantee)"
        ]
        for view, bound in sorted(self._views()):
            lines.append(f"view: {view}; certified bound: {bound}")
        hdr = (
            "NODE",
            "CONTRIB",
            "WORST ε (certified)",
            "MEAN ε (certified)",
            "WORST ε (paper)",
            "STATE",
        )
        rows = [hdr]
        for i in self.ids:
            r = self.per_node[i]
            cert = list((r.get("certified") or {}).values())
            pap = list((r.get("paper") or {}).values())
            rows.append(
                (
                    i,
                    str(r.get("contributions", "-")),
                    f"{max(cert):.4g}" if cert else "-",
                    f"{np.mean(cert):.4g}" if cert else "-",
                    f"{max(pap):.4g}" if pap else "-",
                    r.get("state", "?"),
                )
            )
        w = [max(len(r[k]) for r in rows) for k in range(len(hdr))]
        lines += ["  ".join(c.ljust(wk) for c, wk in zip(r, w)).rstrip() for r in rows]
        if s["worst_pair_epsilon"] is not None:
            lines.append(
                f"worst pair ε = {s['worst_pair_epsilon']:.4g}, mean pair ε = {s['mean_pair_epsilon']:.4g} "
                f"(certified, δ={self.delta:g})"
            )
        if s.get("paper_worst_pair_epsilon") is not None:
            lines.append(
                f"paper values: worst {s['paper_worst_pair_epsilon']:.4g}, mean {s['paper_mean_pair_epsilon']:.4g} "
                "(labelled reproduction, not a guarantee)"
            )
            if s.get("paper_bound"):
                lines.append(f"  {s['paper_bound']}")
        if s["deviations"]:
            if s["deviation_accounted"]:
                lines.append(
                    f"deviations: {len(s['deviations'])} (accounted with the local-DP bound: yes, every node)"
                )
            else:
                who = "; ".join(
                    f"{i}: {why}" for i, why in sorted(s["deviation_unaccounted"].items())
                )
                lines.append(
                    f"deviations: {len(s['deviations'])} (accounted with the local-DP bound: NOT YET at "
                    f"{len(s['deviation_unaccounted'])} node(s) — {who}; when they are back, "
                    f"'hushnet run close {self.run_id} --deviated' tops them up)"
                )
        if s["run_seconds"] is not None:
            lines.append(f"run time: {s['run_seconds']:.2f} s")
        for i, e in s["errors"].items():
            lines.append(f"{i}: {e}")
        return "\n".join(lines)
