"""The ledger's cost per walk hop (issue 12): ``Ledger.charge`` of the entry a hop really charges.

A walk hop charges its holder toward every other node (the certified walk row,
:class:`hushnet.runs.accounting.ContributionCost`): before issue 12 each of the n targets was
validated, projected and converted RDP → (ε, δ) on its own in Python, and persisted as its own
SQLite row — 47 % of a host process's time at n = 512 (7.8 hops/s).  Measured here, per charge
(``report=False``, as the driver charges), for n = 16, 512, 2048 targets on a file ledger with the
node's budget, against :class:`_Scalar` — the scalar ledger as it was (per-target loop, one row per
target) — in the same run, on the same entries.  Ratios are reported, never asserted.
"""

from __future__ import annotations

import math
import sqlite3
import tempfile
import time
from pathlib import Path

import numpy as np

SIZES = (16, 512, 2048)
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
    res["load_average_end"] = os.getloadavg()[0]
    return res


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".")), indent=2))
