"""A node's privacy ledger: what it has leaked to every other node, and its budget.

Pairwise network DP gives every (contributor, observer) pair its own loss, so a node cannot
keep one ε: it keeps one **per observer**.  Each contribution (or accounted release) becomes a
:class:`PrivacyEntry` whose cost toward each target is an RDP curve on a fixed grid of orders
(and, for linear-Gaussian views where it is exact, a μ-GDP value).  The ledger composes them
(RDP adds per order; GDP adds in quadrature), converts to (ε, δ) on demand, and refuses any
charge that would push the loss toward **any** target over the configured budget — the
refusal is atomic, so a refused charge leaves no trace.

Everything is persisted in SQLite (WAL mode) so that a node restarting mid-run still knows
what it has spent; a lock makes a ledger safe to share between threads of one process.

Every reported number says which conversion produced it (``"rdp"``: hushnet's one RDP → (ε, δ) rule over the orders — dp-accounting's improved conversion;
``"gdp"``: the tight Gaussian curve, used when every entry toward that target carries a μ)
and which bound label it inherits (``"certified"`` only if every entry it composes is).
"""
from __future__ import annotations

import json
import math
import sqlite3
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hushnet.privacy.conversions import DEFAULT_ORDERS, gdp_epsilon, rdp_to_dp

__all__ = [
    "BOUND_LABELS",
    "LedgerError",
    "BudgetExceeded",
    "PrivacyEntry",
    "LedgerBudget",
    "Spent",
    "Ledger",
]

BOUND_LABELS = ("certified", "paper")
_UNIFORM = "*"


class LedgerError(ValueError):
    """An entry or budget the ledger cannot accept (wrong orders, bad values, unknown label)."""


class BudgetExceeded(LedgerError):
    """A charge that would exceed the budget toward at least one node; nothing was recorded.

    ``target`` is the worst node (largest excess over its budget), ``epsilon`` the (ε, δ) loss
    toward it had the charge gone through, ``budget_epsilon``/``delta`` its budget.
    """

    def __init__(self, target: str, epsilon: float, budget_epsilon: float, delta: float, run_id: str,
                 method: str, violations: Mapping[str, float]):
        self.target = target
        self.epsilon = epsilon
        self.budget_epsilon = budget_epsilon
        self.delta = delta
        self.run_id = run_id
        self.method = method
        self.violations = dict(violations)
        more = f" (and {len(violations) - 1} other node(s))" if len(violations) > 1 else ""
        super().__init__(
            f"charge for run {run_id!r} refused: privacy loss toward node {target!r} would be "
            f"epsilon={epsilon:.6g} at delta={delta:g} ({method} conversion), over its budget "
            f"epsilon={budget_epsilon:.6g}{more}")


def _as_key(t) -> str:
    return str(t)


@dataclass(frozen=True)
class PrivacyEntry:
    """One contribution or accounted release of this node.

    ``rdp`` maps each target node id to its RDP curve on the ledger's orders (a vector of
    ``len(orders)``); ``gdp_mu`` optionally maps targets to an exact μ-GDP value (only for
    linear-Gaussian views).  ``view_model`` says what the observers are assumed to see
    ("anonymous", "sender-known", "neighbourhood", "aggregate", …) and ``bound`` is the label
    of the accountant that produced the costs.
    """

    run_id: str
    protocol: str
    view_model: str
    bound: str
    rdp: Mapping[str, np.ndarray]
    gdp_mu: Mapping[str, float] | None = None
    note: str = ""

    @classmethod
    def from_row(cls, run_id: str, protocol: str, view_model: str, bound: str, targets: Iterable,
                 rdp: np.ndarray, gdp_mu: Iterable[float] | None = None, note: str = "") -> "PrivacyEntry":
        """Build an entry from a contributor's row: ``rdp`` of shape (len(targets), len(orders))."""
        keys = [_as_key(t) for t in targets]
        arr = np.asarray(rdp, dtype=float)
        if arr.ndim != 2 or arr.shape[0] != len(keys):
            raise LedgerError("rdp must have shape (len(targets), len(orders))")
        mus = None if gdp_mu is None else {k: float(m) for k, m in zip(keys, gdp_mu, strict=True)}
        return cls(run_id, protocol, view_model, bound, {k: arr[i] for i, k in enumerate(keys)}, mus, note)

    @classmethod
    def gaussian(cls, run_id: str, protocol: str, view_model: str, bound: str, mu: Mapping,
                 orders=None, note: str = "") -> "PrivacyEntry":
        """Entry for a Gaussian view with sensitivity-to-noise ratio μ per target:
        RDP ``α μ²/2`` on the orders, and μ-GDP."""
        o = DEFAULT_ORDERS if orders is None else np.asarray(orders, dtype=float)
        m = {_as_key(k): float(v) for k, v in mu.items()}
        return cls(run_id, protocol, view_model, bound, {k: o * v * v / 2.0 for k, v in m.items()}, m, note)


@dataclass(frozen=True)
class LedgerBudget:
    """A budget: (ε, δ) toward every node, optionally overridden per node, and optionally RDP
    curves (on the ledger's orders; uniform and/or per node) that the composed RDP must stay
    under at **every** order (the conservative reading of an RDP budget)."""

    epsilon: float
    delta: float
    per_target: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    rdp_curve: np.ndarray | None = None
    per_target_rdp: Mapping[str, np.ndarray] = field(default_factory=dict)

    def for_target(self, target: str) -> tuple[float, float]:
        return self.per_target.get(_as_key(target), (self.epsilon, self.delta))

    def curve_for(self, target: str) -> np.ndarray | None:
        return self.per_target_rdp.get(_as_key(target), self.rdp_curve)


@dataclass(frozen=True)
class Spent:
    """The composed loss toward one target at δ, with how it was obtained."""

    target: str
    epsilon: float
    delta: float
    method: str  # "rdp" (improved conversion over the orders, conversions.rdp_to_dp) or "gdp" (tight Gaussian)
    best_order: float | None
    bound: str  # "certified" only if every composed entry is certified
    entries: int


class Ledger:
    """Persistent, thread-safe privacy ledger of one node (see the module docstring).

    ``path`` is an SQLite file (``":memory:"`` allowed).  ``orders`` defaults to
    :data:`DEFAULT_ORDERS`; a file remembers its orders and refuses to be reopened with others.
    A ``budget`` given here replaces the stored one; otherwise the stored one (if any) is used.
    """

    def __init__(self, path: str | Path, *, orders=None, budget: LedgerBudget | None = None, node_id: str = ""):
        self._lock = threading.RLock()
        self._path = str(path)
        self._db = sqlite3.connect(self._path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(
            """
            CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
            CREATE TABLE IF NOT EXISTS entries (
                id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, protocol TEXT NOT NULL,
                view_model TEXT NOT NULL, bound TEXT NOT NULL, note TEXT NOT NULL, created REAL NOT NULL);
            CREATE TABLE IF NOT EXISTS costs (
                entry_id INTEGER NOT NULL REFERENCES entries(id), target TEXT NOT NULL,
                rdp BLOB NOT NULL, gdp_mu REAL, PRIMARY KEY (entry_id, target));
            CREATE TABLE IF NOT EXISTS budget (
                target TEXT PRIMARY KEY, epsilon REAL, delta REAL, rdp_curve BLOB);
            """
        )
        with self._lock:
            stored = self._meta("orders")
            if stored is None:
                self.orders = np.asarray(DEFAULT_ORDERS if orders is None else orders, dtype=float)
                if self.orders.ndim != 1 or np.any(self.orders <= 1.0):
                    raise LedgerError("orders must be a 1-D array of values > 1")
                self._set_meta("orders", json.dumps(self.orders.tolist()))
                self._set_meta("node_id", node_id)
            else:
                self.orders = np.asarray(json.loads(stored), dtype=float)
                if orders is not None and not np.array_equal(np.asarray(orders, dtype=float), self.orders):
                    raise LedgerError("this ledger file was created with other Rényi orders")
            self.node_id = self._meta("node_id") or node_id
            self._load()
            if budget is not None:
                self.set_budget(budget)

    # ---------------------------------------------------------------- persistence helpers
    def _meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def _set_meta(self, key: str, value: str) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value))

    def _load(self) -> None:
        k = len(self.orders)
        self._rdp: dict[str, np.ndarray] = {}
        self._gdp_sq: dict[str, float] = {}
        self._n_entries: dict[str, int] = {}
        self._n_gdp: dict[str, int] = {}
        self._paper: dict[str, int] = {}
        rows = self._db.execute(
            "SELECT c.target, c.rdp, c.gdp_mu, e.bound FROM costs c JOIN entries e ON e.id = c.entry_id")
        for target, blob, mu, bound in rows:
            vec = np.frombuffer(blob, dtype=np.float64)
            if vec.size != k:
                raise LedgerError("stored RDP curve does not match the ledger's orders")
            self._add(target, vec, mu, bound)
        self._budget = self._read_budget()

    def _add(self, target: str, vec: np.ndarray, mu: float | None, bound: str) -> None:
        self._rdp[target] = self._rdp.get(target, 0.0) + vec
        self._n_entries[target] = self._n_entries.get(target, 0) + 1
        if mu is not None:
            self._gdp_sq[target] = self._gdp_sq.get(target, 0.0) + mu * mu
            self._n_gdp[target] = self._n_gdp.get(target, 0) + 1
        if bound != "certified":
            self._paper[target] = self._paper.get(target, 0) + 1

    def _read_budget(self) -> LedgerBudget | None:
        rows = self._db.execute("SELECT target, epsilon, delta, rdp_curve FROM budget").fetchall()
        if not rows:
            return None
        per, per_curve, uni, curve = {}, {}, (math.inf, 1e-6), None
        for target, e, d, blob in rows:
            c = None if blob is None else np.frombuffer(blob, dtype=np.float64).copy()
            if target == _UNIFORM:
                uni, curve = (e, d), c
            else:
                if e is not None:
                    per[target] = (e, d)
                if c is not None:
                    per_curve[target] = c
        return LedgerBudget(uni[0], uni[1], per, curve, per_curve)

    # ---------------------------------------------------------------- budget
    @property
    def budget(self) -> LedgerBudget | None:
        return self._budget

    def set_budget(self, budget: LedgerBudget) -> None:
        """Replace the stored budget (persisted).  Existing spending is not re-checked."""
        if not 0.0 < budget.delta < 1.0 or budget.epsilon < 0:
            raise LedgerError("budget needs epsilon >= 0 and delta in (0, 1)")
        def blob(c) -> bytes | None:
            if c is None:
                return None
            arr = np.asarray(c, dtype=np.float64)
            if arr.shape != self.orders.shape:
                raise LedgerError("budget RDP curves must be given on the ledger's orders")
            return arr.tobytes()

        rows: dict[str, list] = {_UNIFORM: [budget.epsilon, budget.delta, blob(budget.rdp_curve)]}
        for t, (e, d) in budget.per_target.items():
            if not 0.0 < d < 1.0 or e < 0:
                raise LedgerError(f"budget for {t!r} needs epsilon >= 0 and delta in (0, 1)")
            rows[_as_key(t)] = [e, d, None]
        for t, c in budget.per_target_rdp.items():
            rows.setdefault(_as_key(t), [None, None, None])[2] = blob(c)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("DELETE FROM budget")
                self._db.executemany("INSERT INTO budget VALUES (?, ?, ?, ?)", [(t, *r) for t, r in rows.items()])
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._budget = self._read_budget()

    # ---------------------------------------------------------------- conversion
    def _convert(self, target: str, rdp: np.ndarray, gdp_sq: float | None, delta: float) -> tuple[float, str, float | None]:
        eps, order = rdp_to_dp(self.orders, rdp, delta)
        if gdp_sq is not None:
            g = gdp_epsilon(math.sqrt(gdp_sq), delta)
            if g <= eps:
                return g, "gdp", None
        return eps, "rdp", order

    def _validate(self, entry: PrivacyEntry) -> dict[str, tuple[np.ndarray, float | None]]:
        if entry.bound not in BOUND_LABELS:
            raise LedgerError(f"bound must be one of {BOUND_LABELS}, got {entry.bound!r}")
        if not entry.rdp:
            raise LedgerError("an entry must cost something toward at least one target")
        mus = {_as_key(k): m for k, m in entry.gdp_mu.items()} if entry.gdp_mu is not None else {}
        out = {}
        for t, vec in entry.rdp.items():
            key = _as_key(t)
            if self.node_id and key == self.node_id:
                raise LedgerError("a node does not account a loss toward itself")
            v = np.asarray(vec, dtype=np.float64)
            if v.shape != self.orders.shape:
                raise LedgerError(f"RDP curve toward {key!r} has shape {v.shape}, expected {self.orders.shape}")
            if np.any(np.isnan(v)) or np.any(v < 0):
                raise LedgerError(f"RDP curve toward {key!r} must be non-negative (inf allowed)")
            mu = None
            if key in mus:
                mu = float(mus[key])
                if not mu >= 0:
                    raise LedgerError("gdp_mu must be >= 0")
            out[key] = (v, mu)
        return out

    def _projection(self, costs: Mapping[str, tuple[np.ndarray, float | None]]):
        """Per touched target: the would-be (ε, method, best order, budget ε, budget δ, curve violation)."""
        res = {}
        b = self._budget
        for t, (vec, mu) in costs.items():
            rdp = self._rdp.get(t, 0.0) + vec
            n_e = self._n_entries.get(t, 0) + 1
            n_g = self._n_gdp.get(t, 0) + (mu is not None)
            gdp_sq = (self._gdp_sq.get(t, 0.0) + (mu * mu if mu is not None else 0.0)) if n_g == n_e else None
            be, bd = b.for_target(t) if b is not None else (math.inf, 1e-6)
            eps, method, order = self._convert(t, rdp, gdp_sq, bd)
            curve = b.curve_for(t) if b is not None else None
            curve_bad = curve is not None and bool(np.any(rdp > curve * (1 + 1e-12)))
            res[t] = (eps, method, order, be, bd, curve_bad)
        return res

    # ---------------------------------------------------------------- public API
    def would_exceed(self, entry: PrivacyEntry) -> dict[str, float]:
        """Targets whose budget the entry would break, mapped to the would-be ε (empty: it fits)."""
        with self._lock:
            proj = self._projection(self._validate(entry))
        return {t: p[0] for t, p in proj.items() if p[0] > p[3] * (1 + 1e-12) or p[5]}

    def charge(self, entry: PrivacyEntry, *, enforce_budget: bool = True, report: bool = True) -> dict[str, Spent]:
        """Record the entry, or raise :class:`BudgetExceeded` (recording nothing) if it would exceed
        the budget toward any node.  Returns the new loss toward every target it touched (``report=False``:
        an empty dict — a run's per-hop charge skips converting every target's curve a second time).

        ``enforce_budget=False`` records spending that has already happened (e.g. the top-up after a
        walk deviated: the data were used, so the ledger must say so even past the budget).  It is
        never a way to release more; callers check :meth:`would_exceed` before any release."""
        with self._lock:
            costs = self._validate(entry)
            proj = self._projection(costs)
            bad = {t: p for t, p in proj.items() if p[0] > p[3] * (1 + 1e-12) or p[5]}
            if bad and enforce_budget:
                # worst = largest excess over budget (curve violations count as +inf excess)
                worst = max(bad, key=lambda t: (bad[t][5], bad[t][0] - bad[t][3]))
                e, method, _, be, bd, _ = bad[worst]
                raise BudgetExceeded(worst, e, be, bd, entry.run_id, method, {t: p[0] for t, p in bad.items()})
            self._db.execute("BEGIN IMMEDIATE")
            try:
                cur = self._db.execute(
                    "INSERT INTO entries(run_id, protocol, view_model, bound, note, created) VALUES (?,?,?,?,?,?)",
                    (entry.run_id, entry.protocol, entry.view_model, entry.bound, entry.note, time.time()))
                eid = cur.lastrowid
                self._db.executemany("INSERT INTO costs(entry_id, target, rdp, gdp_mu) VALUES (?,?,?,?)",
                                     [(eid, t, v.tobytes(), mu) for t, (v, mu) in costs.items()])
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            for t, (v, mu) in costs.items():
                self._add(t, v, mu, entry.bound)
            if not report:
                return {}
            return {t: self._spent(t, proj[t][4]) for t in costs}

    def _spent(self, t: str, delta: float) -> Spent:
        n_e = self._n_entries.get(t, 0)
        if n_e == 0:
            return Spent(t, 0.0, delta, "none", None, "certified", 0)
        gdp_sq = self._gdp_sq.get(t) if self._n_gdp.get(t, 0) == n_e else None
        eps, method, order = self._convert(t, self._rdp[t], gdp_sq, delta)
        bound = "paper" if self._paper.get(t, 0) else "certified"
        return Spent(t, eps, delta, method, order, bound, n_e)

    def spent(self, target=None, delta: float | None = None) -> Spent | dict[str, Spent]:
        """The composed (ε, δ) loss toward ``target`` (or every target), at ``delta`` (default:
        the budget's δ for that target, else 1e-6)."""
        with self._lock:
            targets = [_as_key(target)] if target is not None else sorted(self._rdp)
            out = {}
            for t in targets:
                d = delta if delta is not None else (self._budget.for_target(t)[1] if self._budget else 1e-6)
                out[t] = self._spent(t, d)
            return out[_as_key(target)] if target is not None else out

    def rdp(self, target) -> np.ndarray:
        """The composed RDP curve toward ``target`` (zeros if nothing was spent)."""
        with self._lock:
            return np.array(self._rdp.get(_as_key(target), np.zeros_like(self.orders)), dtype=float)

    def remaining(self, targets: Iterable | None = None) -> dict[str, float]:
        """ε left toward each target (budget ε − spent ε at the budget's δ; ∞ without a budget).

        Covers the targets with a per-node budget or spending, plus ``targets`` if given.
        """
        with self._lock:
            keys = set(self._rdp)
            if self._budget is not None:
                keys |= set(self._budget.per_target) | set(self._budget.per_target_rdp)
            if targets is not None:
                keys |= {_as_key(t) for t in targets}
            out = {}
            for t in sorted(keys):
                if self._budget is None:
                    out[t] = math.inf
                    continue
                be, bd = self._budget.for_target(t)
                out[t] = be - self._spent(t, bd).epsilon
            return out

    def entries(self, run_id: str | None = None) -> list[dict]:
        """The recorded entries (metadata and per-target costs), oldest first."""
        with self._lock:
            q = "SELECT id, run_id, protocol, view_model, bound, note, created FROM entries"
            args: tuple = ()
            if run_id is not None:
                q += " WHERE run_id = ?"
                args = (run_id,)
            out = []
            for eid, rid, proto, view, bound, note, created in self._db.execute(q + " ORDER BY id", args).fetchall():
                costs = self._db.execute("SELECT target, rdp, gdp_mu FROM costs WHERE entry_id = ?", (eid,)).fetchall()
                out.append({"id": eid, "run_id": rid, "protocol": proto, "view_model": view, "bound": bound,
                            "note": note, "created": created,
                            "rdp": {t: np.frombuffer(b, dtype=np.float64).copy() for t, b, _ in costs},
                            "gdp_mu": {t: mu for t, _, mu in costs if mu is not None}})
            return out

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
