"""The ledger's cost per walk hop (issue 12): ``Ledger.charge`` of the entry a hop really charges.

A walk hop charges its holder toward every other node (the certified walk row,
:class:`hushnet.runs.accounting.ContributionCost`): before issue 12 each of the n targets was
validated, projected and converted RDP → (ε, δ) on its own in Python, and persisted as its own
SQLite row — 47 % of a host process's time at n = 512 (7.8 hops/s).  Measured here, per charge
(``report=False``, as the driver charges), for n = 16, 512, 2048 targets on a file ledger with the
node's budget, against :class:`_Scalar` — the scalar ledger as it was (per-target loop, one row per
target) — in the same run, on the same entries.  Ratios are reported, never asserted.

:func:`first_visit` is a walk receiver's hop at n = 1024 and 2048 (what a durable driver does when the
token arrives: ``RunDriver._charge`` — cost rows, the ledger's validation, budget check, block write and
totals — then the run store's checkpoint), for a node's **first** visit of a run against its later ones,
with the time of each part.  The first visit's budget check knows no best order toward any target and
its block is the run's whole (n − 1) × 159 row; nodes alternate between the ledger as it is and its
exact path (the pointwise-maximum bound and compact blocks switched off), so the ratio of the two is
paired under the same load.

Since session 24 a visit from the third on is charged by reference (``Ledger.charge_repeat``: no rows, no
check, no sums — the allowance the second visit proves), in both modes: the first / later ratio now
compares the exact first charge with a charge by reference, and the second visit carries the proof.
"""

from __future__ import annotations

import math
import sqlite3
import tempfile
import time
from pathlib import Path

import numpy as np

SIZES = (16, 512, 2048)
#: network sizes and receivers of :func:`first_visit`
FIRST_VISIT_SIZES = (1024, 2048)
FIRST_VISIT_NODES = 16
BUDGET_EPS, DELTA = 12.0, 1e-5
_RTOL = 1e-12


class _Scalar:
    """The scalar ledger before issue 12, reduced to what a hop's charge does (the reference)."""

    def __init__(self, path: Path, orders: np.ndarray, budget):
        from hushnet.privacy.conversions import gdp_epsilon, rdp_to_dp

        self.orders, self.budget = orders, budget
        self._rdp_to_dp, self._gdp_epsilon = rdp_to_dp, gdp_epsilon
        self._rdp: dict = {}
        self._n: dict = {}
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(
            "CREATE TABLE entries (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT, note TEXT);"
            "CREATE TABLE costs (entry_id INTEGER, target TEXT, rdp BLOB, gdp_mu REAL,"
            " PRIMARY KEY (entry_id, target));"
        )

    def charge(self, entry) -> None:
        costs = {}
        for t, vec in entry.rdp.items():
            v = np.asarray(vec, dtype=np.float64)
            if v.shape != self.orders.shape or np.any(np.isnan(v)) or np.any(v < 0):
                raise ValueError(t)
            costs[str(t)] = v
        bad = []
        for t, vec in costs.items():
            rdp = self._rdp.get(t, 0.0) + vec
            be, bd = self.budget.for_target(t)
            eps, _ = self._rdp_to_dp(self.orders, rdp, bd)
            if eps > be * (1 + _RTOL):
                bad.append(t)
        if bad:
            raise RuntimeError("refused")
        self._db.execute("BEGIN IMMEDIATE")
        eid = self._db.execute(
            "INSERT INTO entries(run_id, note) VALUES (?, ?)", (entry.run_id, entry.note)
        ).lastrowid
        self._db.executemany(
            "INSERT INTO costs VALUES (?,?,?,?)",
            [(eid, t, v.tobytes(), None) for t, v in costs.items()],
        )
        self._db.execute("COMMIT")
        for t, v in costs.items():
            self._rdp[t] = self._rdp.get(t, 0.0) + v
            self._n[t] = self._n.get(t, 0) + 1

    def close(self) -> None:
        self._db.close()


def _hop_entry(n: int, seed: int):
    """The entry a walk hop charges toward ``n`` targets (a drawn row of walk slopes)."""
    from hushnet.engine.actions import LedgerEntry
    from hushnet.privacy.conversions import DEFAULT_ORDERS
    from hushnet.runs.accounting import ContributionCost

    rng = np.random.default_rng(seed)
    ids = [f"node-{i:05d}" for i in range(n + 1)]
    slope = rng.uniform(2e-4, 4e-3, n)
    cost = ContributionCost(ids[1:], DEFAULT_ORDERS, slope, 40.0, "walk bound")
    ev = LedgerEntry(0, 1, "gradient", "anonymous", 1.0, 2.0, 2.0, "rw-dpsgd", "run-1")
    return cost.entry(ev, "run-1", ids[0]), ids[0]


def _time(charge, entry, reps: int) -> float:
    """Median seconds per charge over ``reps`` (after two warm-up charges)."""
    for _ in range(2):
        charge(entry)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        charge(entry)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


#: what :func:`first_visit` times inside a charge: (label, owner, method)
_PARTS = (
    ("cost_rows", "hushnet.runs.accounting:ContributionCost", "entry"),
    ("validate", "hushnet.privacy.ledger_math:LedgerState", "validate"),
    ("budget_check", "hushnet.privacy.ledger_math:LedgerState", "projection"),
    ("budget_check", "hushnet.privacy.ledger_math:Projections", "violations"),
    ("block_write", "hushnet.privacy.ledger_store:LedgerStore", "append"),
    ("totals", "hushnet.privacy.ledger_math:LedgerState", "add_costs"),
)


class _Timed:
    """Wraps the methods of :data:`_PARTS` with timers that add up into ``self.spent`` (the real code
    path runs: the driver's own charge, with its ledger and run store)."""

    def __init__(self):
        import importlib

        self.spent: dict[str, float] = {}
        self._undo = []
        for label, owner, name in _PARTS:
            mod, cls = owner.split(":")
            klass = getattr(importlib.import_module(mod), cls)
            orig = klass.__dict__[name]
            self._undo.append((klass, name, orig))
            setattr(klass, name, self._wrap(label, orig))

    def _wrap(self, label: str, orig):
        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return orig(*a, **k)
            finally:
                self.spent[label] = self.spent.get(label, 0.0) + time.perf_counter() - t0

        return timed

    def take(self) -> dict[str, float]:
        out, self.spent = self.spent, {}
        return out

    def close(self) -> None:
        for klass, name, orig in self._undo:
            setattr(klass, name, orig)


def first_visit(n: int, nodes: int, visits: int = 3) -> dict:
    """Median ms of a walk receiver's charge + checkpoint at its first and later visits, at size ``n``
    (``nodes`` receivers, alternately with the ledger as it is and its exact path), with parts.

    The process keeps one node's cost rows at a time (``HUSHNET_COST_ROWS_MB=0``): a host of 410 nodes
    at n = 2048 keeps ~24 nodes' rows in its default 64 MB, so a later visit builds its rows again."""
    import json
    import os

    import hushnet.privacy.ledger_math as lm
    import hushnet.privacy.ledger_store as ls
    from hushnet.engine.actions import LedgerEntry
    from hushnet.families import family_of
    from hushnet.privacy.ledger import Ledger, LedgerBudget
    from hushnet.protocols.registry import transition_matrix
    from hushnet.runs.accounting import contribution_cost
    from hushnet.runs.driver import RunDriver
    from hushnet.runs.net_experiments import prepare
    from hushnet.runs.run_store import RunStore

    old_env = os.environ.get("HUSHNET_COST_ROWS_MB")
    os.environ["HUSHNET_COST_ROWS_MB"] = "0"
    knobs = (lm._DOMINATING_MIN_ROWS, ls.COMPACT_MIN_ROWS)
    timed = _Timed()
    res: dict = {"n": n, "nodes": nodes, "load_average": os.getloadavg()[0]}
    try:
        spec, _ = prepare("rw-dpsgd", n, steps=23 * n)  # the amplified walk's spec at n
        ids = [f"n{i}" for i in range(n)]
        fam = family_of(spec.protocol)
        W = transition_matrix(spec.graph, spec.weights)
        modes = ("ledger", "exact path")
        per: dict = {m: {str(v + 1): [] for v in range(visits)} for m in modes}
        parts: dict = {m: {str(v + 1): [] for v in range(visits)} for m in modes}
        with tempfile.TemporaryDirectory(prefix="hushnet-firstvisit-") as tmp:
            held = []
            for k in range(nodes):  # acceptance, as the run service does it
                v = (k * n) // nodes
                d = Path(tmp) / f"n{v}"
                d.mkdir()
                ledger = Ledger(d / "privacy_ledger.sqlite", node_id=ids[v])
                ledger.set_budget(LedgerBudget(spec.budget.epsilon, spec.budget.delta))
                runs = RunStore(d / "runs.sqlite")
                dec = fam.project(spec, v, None, W)
                row = {ids[u]: float(dec.epsilon_row[u]) for u in range(n) if u != v}
                out = {"node": ids[v], "accept": True, "row": row}
                runs.accept(spec.run_id, json.dumps(spec.to_dict()).encode(), v, out)
                cost = contribution_cost(spec, v, ids, W, ledger.orders)
                drv = RunDriver(
                    spec, v, ids, None, None, ledger=ledger, cost=cost, W=W, decision=out
                )
                held.append((modes[k % 2], ledger, runs, drv))
            for visit in range(visits):
                for mode, _, runs, drv in held:
                    on = mode == "ledger"
                    lm._DOMINATING_MIN_ROWS = knobs[0] if on else 10**9
                    ls.COMPACT_MIN_ROWS = knobs[1] if on else 2**40
                    ev = LedgerEntry(
                        drv.vertex, visit, "gradient", spec.view_model, 2.0, 2.0 * spec.sigma,
                        spec.sigma, spec.protocol, spec.run_id,
                    )  # fmt: skip
                    timed.take()
                    t0 = time.perf_counter()
                    if not drv._charge(ev):  # noqa: SLF001 - the receiver's charge path itself
                        raise SystemExit(f"bench_ledger: {drv.node_id} refused: {drv.reason}")
                    t1 = time.perf_counter()
                    runs.checkpoint(spec.run_id, "running", "", drv.durable_state(), None)
                    t2 = time.perf_counter()
                    p = timed.take()
                    p["charge"], p["checkpoint"] = t1 - t0, t2 - t1
                    per[mode][str(visit + 1)].append(t2 - t0)
                    parts[mode][str(visit + 1)].append(p)
            for _, ledger, runs, _ in held:
                ledger.close()
                runs.close()
    finally:
        timed.close()
        lm._DOMINATING_MIN_ROWS, ls.COMPACT_MIN_ROWS = knobs
        if old_env is None:
            os.environ.pop("HUSHNET_COST_ROWS_MB", None)
        else:
            os.environ["HUSHNET_COST_ROWS_MB"] = old_env

    def ms(xs) -> float:
        return round(float(np.median(xs)) * 1e3, 3)

    for mode in per:
        res[mode] = {
            "hop_ms": {v: ms(xs) for v, xs in per[mode].items()},
            "parts_ms": {
                v: {k: ms([p.get(k, 0.0) for p in ps]) for k in ps[0]}
                for v, ps in parts[mode].items()
            },
        }
    first, later = (res[m]["hop_ms"] for m in modes)
    res["first_over_later"] = {
        m: round(res[m]["hop_ms"]["1"] / res[m]["hop_ms"][str(visits)], 2) for m in modes
    }
    res["first_visit_ledger_over_exact_path"] = round(first["1"] / later["1"], 2)
    res["load_average_end"] = os.getloadavg()[0]
    return res


def main(out_dir: Path) -> dict:
    import os

    from hushnet.privacy.conversions import DEFAULT_ORDERS
    from hushnet.privacy.ledger import Ledger, LedgerBudget

    budget = LedgerBudget(BUDGET_EPS, DELTA)
    res: dict = {"load_average": os.getloadavg()[0], "budget": [BUDGET_EPS, DELTA], "sizes": {}}
    for n in SIZES:
        entry, me = _hop_entry(n, seed=n)
        reps_scalar = max(3, min(50, int(2000 / n)))
        with tempfile.TemporaryDirectory() as d:
            ref = _Scalar(Path(d) / "scalar.sqlite", DEFAULT_ORDERS, budget)
            t_ref = _time(ref.charge, entry, reps_scalar)
            ref.close()
            with Ledger(Path(d) / "l.sqlite", budget=budget, node_id=me) as led:
                t_new = _time(lambda e: led.charge(e, report=False), entry, 5 * reps_scalar)
                nbytes = sum(p.stat().st_size for p in Path(d).glob("l.sqlite*"))
            rbytes = sum(p.stat().st_size for p in Path(d).glob("scalar.sqlite*"))
        row = {
            "scalar_us_per_charge": round(t_ref * 1e6, 1),
            "vectorised_us_per_charge": round(t_new * 1e6, 1),
            "speedup": round(t_ref / t_new, 1) if t_new > 0 else math.inf,
            # file (+ WAL) bytes per charge: the scalar ledger wrote a row per target per hop
            "bytes_per_charge_scalar": round(rbytes / (reps_scalar + 2)),
            "bytes_per_charge_vectorised": round(nbytes / (5 * reps_scalar + 2)),
        }
        res["sizes"][str(n)] = row
        print(f"   n={n}: {row}", flush=True)
    res["first_visit"] = {}
    for n in FIRST_VISIT_SIZES:
        row = first_visit(n, FIRST_VISIT_NODES)
        res["first_visit"][str(n)] = row
        print(f"   first visit n={n}: {row}", flush=True)
    res["load_average_end"] = os.getloadavg()[0]
    return res


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".")), indent=2))
