"""A run's privacy report as the operator sees it: a table, a heatmap, loss by graph distance.

Every number carries its bound: ``certified`` (what hushnet stands behind: the random-walk bound
per contribution, capped by the local-DP bound, composed on each node's ledger) or ``paper``
(the published bound — random-walk paper Theorem 3 as printed, Muffliato Theorem 1/6, Koskela Theorem 15 —
a labelled reproduction, not a guarantee; each node's report names it in ``paper_bound``).
Rows are contributors (whose data), columns observers (who learns), as in the papers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class RunReport:
    run_id: str
    per_node: dict[str, dict[str, Any]]
    graph: Any = None  # networkx graph from the directory (vertex → attribute id)

    @property
    def ids(self) -> list[str]:
        ok = [(r.get("vertex", 0), i) for i, r in self.per_node.items() if "error" not in r]
        return [i for _, i in sorted(ok)]

    def matrix(self, bound: str = "certified") -> np.ndarray:
        """(n, n) ε matrix at the run's δ, row = contributor, column = observer; NaN where unknown."""
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
        out: dict[str, Any] = {"run_id": self.run_id, "delta": self.delta, "bound": "certified",
                               "worst_pair_epsilon": float(off.max()) if off.size else None,
                               "mean_pair_epsilon": float(off.mean()) if off.size else None}
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
        out["deviations"] = [d for r in self.per_node.values() for d in r.get("deviations_list", [])]
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
        dist = self._distances()
        out = []
        for i in self.ids:
            r = self.per_node[i]
            for t, e in (r.get("certified") or {}).items():
                out.append({"contributor": i, "observer": t, "epsilon_certified": e,
                            "epsilon_paper": (r.get("paper") or {}).get(t), "delta": r.get("delta"),
                            "distance": dist.get((i, t)), "contributions": r.get("contributions")})
        return out

    def table(self):
        """The pairs as a pandas DataFrame when pandas is installed, else the list of dicts."""
        try:
            import pandas as pd
        except ImportError:
            return self.rows()
        return pd.DataFrame(self.rows())

    def _distances(self) -> dict[tuple[str, str], int]:
        if self.graph is None:
            return {}
        import networkx as nx

        name = nx.get_node_attributes(self.graph, "id")
        out = {}
        for u, lengths in nx.all_pairs_shortest_path_length(self.graph):
            for v, d in lengths.items():
                out[(name.get(u, str(u)), name.get(v, str(v)))] = d
        return out

    def loss_by_distance(self, bound: str = "certified") -> dict[int, float]:
        key = "epsilon_certified" if bound == "certified" else "epsilon_paper"
        acc: dict[int, list[float]] = {}
        for r in self.rows():
            if r["distance"] is not None and r[key] is not None:
                acc.setdefault(int(r["distance"]), []).append(float(r[key]))
        return {d: float(np.mean(v)) for d, v in sorted(acc.items())}

    # ------------------------------------------------------------------ plots
    def plot_heatmap(self, ax=None, bound: str = "certified"):
        """Pairwise ε heatmap (row = contributor, column = observer)."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(5.2, 4.4))
        M = self.matrix(bound)
        np.fill_diagonal(M, np.nan)  # no loss toward oneself: left blank so the colour scale shows the pairs
        im = ax.imshow(M, cmap="viridis")
        ids = self.ids
        step = max(1, len(ids) // 16)
        ax.set_xticks(range(0, len(ids), step), ids[::step], rotation=90, fontsize=7)
        ax.set_yticks(range(0, len(ids), step), ids[::step], fontsize=7)
        ax.set_xlabel("observer")
        ax.set_ylabel("contributor")
        ax.set_title(f"{bound} ε at δ={self.delta:g} — {self.run_id}", fontsize=9)
        ax.figure.colorbar(im, ax=ax, label=f"ε ({bound})")
        return ax

    def plot_loss_by_distance(self, ax=None):
        """Mean pairwise ε by shortest-path distance: certified, and paper (labelled) where available."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(5.0, 3.6))
        c = self.loss_by_distance("certified")
        ax.plot(list(c), list(c.values()), "o-", label="certified")
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

    def save_heatmap(self, path, bound: str = "certified") -> None:
        import matplotlib

        matplotlib.use(matplotlib.get_backend())
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(10.5, 4.4))
        self.plot_heatmap(axes[0], bound)
        self.plot_loss_by_distance(axes[1])
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)

    def _views(self) -> set[tuple[str, str]]:
        """(observer view, certified bound) pairs the nodes reported: every ε in the table comes from one of them."""
        out = set()
        for r in self.per_node.values():
            v = r.get("accounting_view") or {}
            view = v.get("label") or (f"{v['view_model']} ({v.get('mechanism', '?')})" if v.get("view_model") else None)
            if view or r.get("certified_bound"):
                out.add((view or "?", str(r.get("certified_bound") or "?")))
        return out

    def format_table(self) -> str:
        """Text table for ``hushnet run report``: per contributor, worst and mean certified ε (and paper)."""
        s = self.summary()
        lines = [f"run {self.run_id}: privacy report at δ={self.delta:g} "
                 f"(certified = what hushnet guarantees; paper = the published bound, not a guarantee)"]
        for view, bound in sorted(self._views()):
            lines.append(f"view: {view}; certified bound: {bound}")
        hdr = ("NODE", "CONTRIB", "WORST ε (certified)", "MEAN ε (certified)", "WORST ε (paper)", "STATE")
        rows = [hdr]
        for i in self.ids:
            r = self.per_node[i]
            cert = list((r.get("certified") or {}).values())
            pap = list((r.get("paper") or {}).values())
            rows.append((i, str(r.get("contributions", "-")), f"{max(cert):.4g}" if cert else "-",
                         f"{np.mean(cert):.4g}" if cert else "-", f"{max(pap):.4g}" if pap else "-", r.get("state", "?")))
        w = [max(len(r[k]) for r in rows) for k in range(len(hdr))]
        lines += ["  ".join(c.ljust(wk) for c, wk in zip(r, w)).rstrip() for r in rows]
        if s["worst_pair_epsilon"] is not None:
            lines.append(f"worst pair ε = {s['worst_pair_epsilon']:.4g}, mean pair ε = {s['mean_pair_epsilon']:.4g} "
                         f"(certified, δ={self.delta:g})")
        if s.get("paper_worst_pair_epsilon") is not None:
            lines.append(f"paper values: worst {s['paper_worst_pair_epsilon']:.4g}, mean {s['paper_mean_pair_epsilon']:.4g} "
                         "(labelled reproduction, not a guarantee)")
            if s.get("paper_bound"):
                lines.append(f"  {s['paper_bound']}")
        if s["deviations"]:
            if s["deviation_accounted"]:
                lines.append(f"deviations: {len(s['deviations'])} (accounted with the local-DP bound: yes, every node)")
            else:
                who = "; ".join(f"{i}: {why}" for i, why in sorted(s["deviation_unaccounted"].items()))
                lines.append(f"deviations: {len(s['deviations'])} (accounted with the local-DP bound: NOT YET at "
                             f"{len(s['deviation_unaccounted'])} node(s) — {who}; when they are back, "
                             f"'hushnet run close {self.run_id} --deviated' tops them up)")
        if s["run_seconds"] is not None:
            lines.append(f"run time: {s['run_seconds']:.2f} s")
        for i, e in s["errors"].items():
            lines.append(f"{i}: {e}")
        return "\n".join(lines)
