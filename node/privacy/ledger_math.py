"""The maths of a node's privacy ledger: composition, conversion and budget checks, without storage.

Pairwise network DP gives every (contributor, observer) pair its own loss, so a node cannot
keep one ε: it keeps one **per observer**.  Each contribution (or accounted release) becomes a
:class:`PrivacyEntry` whose cost toward each target is an RDP curve on a fixed grid of orders
(and, for linear-Gaussian views where it is exact, a μ-GDP value).  :class:`LedgerState` composes
them (RDP adds per order; GDP adds in quadrature), converts to (ε, δ) on demand, and says which
targets a charge would push over the budget.

Every reported number says which conversion produced it (``"rdp"``: hushnet's one RDP → (ε, δ)
rule over the orders — dp-accounting's improved conversion; ``"gdp"``: the tight Gaussian curve,
used when every entry toward that target carries a μ) and which bound label it inherits
(``"certified"`` only if every entry it composes is).

This module is pure (no I/O, no locks) so that the accountant's arithmetic can be read, tested and
reused (simulator, operator-side projections) apart from the node's SQLite persistence, which lives
in :mod:`hushnet.privacy.ledger_store`; :class:`hushnet.privacy.ledger.Ledger` joins the two.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from hushnet.privacy.conversions import DEFAULT_ORDERS, gdp_epsilon, rdp_to_dp

__all__ = [
    "BOUND_LABELS",
    "DEFAULT_DELTA",
    "LedgerError",
    "BudgetExceeded",
    "PrivacyEntry",
    "LedgerBudget",
    "LedgerState",
    "Spent",
    "as_key",
    "check_budget",
    "check_orders",
]

BOUND_LABELS = ("certified", "paper")
#: δ at which a loss is reported toward a target without a budget
DEFAULT_DELTA = 1e-6
#: relative slack of every budget comparison (float noise of summing curves in another order)
_RTOL = 1e-12


class LedgerError(ValueError):
    """An entry or budget the ledger cannot accept (wrong orders, bad values, unknown label)."""


class BudgetExceeded(LedgerError):
    """A charge that would exceed the budget toward at least one node; nothing was recorded.

    ``target`` is the worst node (largest excess over its budget), ``epsilon`` the (ε, δ) loss
    toward it had the charge gone through, ``budget_epsilon``/``delta`` its budget.
    """

    def __init__(
        self,
        target: str,
        epsilon: float,
        budget_epsilon: float,
        delta: float,
        run_id: str,
        method: str,
        violations: Mapping[str, float],
    ):
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
            f"epsilon={budget_epsilon:.6g}{more}"
        )


def as_key(t) -> str:
    """Targets are node ids; the ledger keys them as strings whatever the caller passes."""
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
    def from_row(
        cls,
        run_id: str,
        protocol: str,
        view_model: str,
        bound: str,
        targets: Iterable,
        rdp: np.ndarray,
        gdp_mu: Iterable[float] | None = None,
        note: str = "",
    ) -> "PrivacyEntry":
        """Build an entry from a contributor's row: ``rdp`` of shape (len(targets), len(orders))."""
        keys = [as_key(t) for t in targets]
        arr = np.asarray(rdp, dtype=float)
        if arr.ndim != 2 or arr.shape[0] != len(keys):
            raise LedgerError("rdp must have shape (len(targets), len(orders))")
        mus = None if gdp_mu is None else {k: float(m) for k, m in zip(keys, gdp_mu, strict=True)}
        return cls(
            run_id, protocol, view_model, bound, {k: arr[i] for i, k in enumerate(keys)}, mus, note
        )

    @classmethod
    def gaussian(
        cls,
        run_id: str,
        protocol: str,
        view_model: str,
        bound: str,
        mu: Mapping,
        orders=None,
        note: str = "",
    ) -> "PrivacyEntry":
        """Entry for a Gaussian view with sensitivity-to-noise ratio μ per target:
        RDP ``α μ²/2`` on the orders, and μ-GDP."""
        o = DEFAULT_ORDERS if orders is None else np.asarray(orders, dtype=float)
        m = {as_key(k): float(v) for k, v in mu.items()}
        return cls(
            run_id, protocol, view_model, bound, {k: o * v * v / 2.0 for k, v in m.items()}, m, note
        )


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
        return self.per_target.get(as_key(target), (self.epsilon, self.delta))

    def curve_for(self, target: str) -> np.ndarray | None:
        return self.per_target_rdp.get(as_key(target), self.rdp_curve)


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


def check_orders(orders) -> np.ndarray:
    """The Rényi orders as a float vector, or a one-line :class:`LedgerError`."""
    o = np.asarray(DEFAULT_ORDERS if orders is None else orders, dtype=float)
    if o.ndim != 1 or np.any(o <= 1.0):
        raise LedgerError("orders must be a 1-D array of values > 1")
    return o


def check_budget(budget: LedgerBudget, orders: np.ndarray) -> None:
    """Refuse a budget the ledger cannot enforce (δ outside (0, 1), ε < 0, curves off the orders)."""
    if not 0.0 < budget.delta < 1.0 or budget.epsilon < 0:
        raise LedgerError("budget needs epsilon >= 0 and delta in (0, 1)")

    def check_curve(c) -> None:
        if c is not None and np.asarray(c, dtype=np.float64).shape != orders.shape:
            raise LedgerError("budget RDP curves must be given on the ledger's orders")

    check_curve(budget.rdp_curve)
    for t, (e, d) in budget.per_target.items():
        if not 0.0 < d < 1.0 or e < 0:
            raise LedgerError(f"budget for {t!r} needs epsilon >= 0 and delta in (0, 1)")
    for c in budget.per_target_rdp.values():
        check_curve(c)


#: per touched target: (would-be ε, method, best order, budget ε, budget δ, RDP-curve violated)
Projection = tuple[float, str, "float | None", float, float, bool]


class LedgerState:
    """The composed spending of one node toward every target, and the budget it answers to.

    Holds running sums (RDP curve, μ², entry counts, non-certified counts) per target; every
    query converts on demand.  Not thread-safe and not persistent: the caller (the node's
    :class:`~hushnet.privacy.ledger.Ledger`) serialises access and stores what it adds.
    """

    def __init__(self, orders: np.ndarray, node_id: str = "", budget: LedgerBudget | None = None):
        self.orders = orders
        self.node_id = node_id
        self.budget = budget
        self._rdp: dict[str, np.ndarray] = {}
        self._gdp_sq: dict[str, float] = {}
        self._n_entries: dict[str, int] = {}
        self._n_gdp: dict[str, int] = {}
        self._paper: dict[str, int] = {}

    def targets(self) -> list[str]:
        """Every target something was spent toward, sorted."""
        return sorted(self._rdp)

    def add(self, target: str, vec: np.ndarray, mu: float | None, bound: str) -> None:
        """Compose one validated cost toward ``target`` (RDP adds per order, μ² adds)."""
        self._rdp[target] = self._rdp.get(target, 0.0) + vec
        self._n_entries[target] = self._n_entries.get(target, 0) + 1
        if mu is not None:
            self._gdp_sq[target] = self._gdp_sq.get(target, 0.0) + mu * mu
            self._n_gdp[target] = self._n_gdp.get(target, 0) + 1
        if bound != "certified":
            self._paper[target] = self._paper.get(target, 0) + 1

    def convert(
        self, rdp: np.ndarray, gdp_sq: float | None, delta: float
    ) -> tuple[float, str, float | None]:
        """(ε, method, best order) at δ: the improved RDP conversion, or the tight GDP curve when
        every composed entry carries a μ and it is smaller."""
        eps, order = rdp_to_dp(self.orders, rdp, delta)
        if gdp_sq is not None:
            g = gdp_epsilon(math.sqrt(gdp_sq), delta)
            if g <= eps:
                return g, "gdp", None
        return eps, "rdp", order

    def validate(self, entry: PrivacyEntry) -> dict[str, tuple[np.ndarray, float | None]]:
        """The entry's costs keyed by target as float64 curves (and μ), or a :class:`LedgerError`."""
        if entry.bound not in BOUND_LABELS:
            raise LedgerError(f"bound must be one of {BOUND_LABELS}, got {entry.bound!r}")
        if not entry.rdp:
            raise LedgerError("an entry must cost something toward at least one target")
        mus = {as_key(k): m for k, m in entry.gdp_mu.items()} if entry.gdp_mu is not None else {}
        out = {}
        for t, vec in entry.rdp.items():
            key = as_key(t)
            if self.node_id and key == self.node_id:
                raise LedgerError("a node does not account a loss toward itself")
            v = np.asarray(vec, dtype=np.float64)
            if v.shape != self.orders.shape:
                raise LedgerError(
                    f"RDP curve toward {key!r} has shape {v.shape}, expected {self.orders.shape}"
                )
            if np.any(np.isnan(v)) or np.any(v < 0):
                raise LedgerError(f"RDP curve toward {key!r} must be non-negative (inf allowed)")
            mu = None
            if key in mus:
                mu = float(mus[key])
                if not mu >= 0:
                    raise LedgerError("gdp_mu must be >= 0")
            out[key] = (v, mu)
        return out

    def projection(
        self, costs: Mapping[str, tuple[np.ndarray, float | None]]
    ) -> dict[str, Projection]:
        """Per touched target: the would-be (ε, method, best order, budget ε, budget δ, curve violation)."""
        res = {}
        b = self.budget
        for t, (vec, mu) in costs.items():
            rdp = self._rdp.get(t, 0.0) + vec
            n_e = self._n_entries.get(t, 0) + 1
            n_g = self._n_gdp.get(t, 0) + (mu is not None)
            gdp_sq = (
                (self._gdp_sq.get(t, 0.0) + (mu * mu if mu is not None else 0.0))
                if n_g == n_e
                else None
            )
            be, bd = b.for_target(t) if b is not None else (math.inf, DEFAULT_DELTA)
            eps, method, order = self.convert(rdp, gdp_sq, bd)
            curve = b.curve_for(t) if b is not None else None
            curve_bad = curve is not None and bool(np.any(rdp > curve * (1 + _RTOL)))
            res[t] = (eps, method, order, be, bd, curve_bad)
        return res

    @staticmethod
    def violations(proj: Mapping[str, Projection]) -> dict[str, Projection]:
        """The projected targets over their (ε, δ) budget or their RDP curve."""
        return {t: p for t, p in proj.items() if p[0] > p[3] * (1 + _RTOL) or p[5]}

    @staticmethod
    def refusal(bad: Mapping[str, Projection], run_id: str) -> BudgetExceeded:
        """The error for a refused charge, naming the worst target (largest excess over budget;
        curve violations count as +inf excess)."""
        worst = max(bad, key=lambda t: (bad[t][5], bad[t][0] - bad[t][3]))
        e, method, _, be, bd, _ = bad[worst]
        return BudgetExceeded(worst, e, be, bd, run_id, method, {t: p[0] for t, p in bad.items()})

    def default_delta(self, target: str) -> float:
        """The δ a loss toward ``target`` is reported at: its budget's, else :data:`DEFAULT_DELTA`."""
        return self.budget.for_target(target)[1] if self.budget else DEFAULT_DELTA

    def spent(self, t: str, delta: float) -> Spent:
        """The composed (ε, δ) loss toward ``t`` at ``delta``."""
        n_e = self._n_entries.get(t, 0)
        if n_e == 0:
            return Spent(t, 0.0, delta, "none", None, "certified", 0)
        gdp_sq = self._gdp_sq.get(t) if self._n_gdp.get(t, 0) == n_e else None
        eps, method, order = self.convert(self._rdp[t], gdp_sq, delta)
        bound = "paper" if self._paper.get(t, 0) else "certified"
        return Spent(t, eps, delta, method, order, bound, n_e)

    def rdp(self, target: str) -> np.ndarray:
        """The composed RDP curve toward ``target`` (a copy; zeros if nothing was spent)."""
        return np.array(self._rdp.get(target, np.zeros_like(self.orders)), dtype=float)

    def remaining(self, targets: Iterable | None = None) -> dict[str, float]:
        """ε left toward each target (budget ε − spent ε at the budget's δ; ∞ without a budget)."""
        keys = set(self._rdp)
        if self.budget is not None:
            keys |= set(self.budget.per_target) | set(self.budget.per_target_rdp)
        if targets is not None:
            keys |= {as_key(t) for t in targets}
        out = {}
        for t in sorted(keys):
            if self.budget is None:
                out[t] = math.inf
                continue
            be, bd = self.budget.for_target(t)
            out[t] = be - self.spent(t, bd).epsilon
        return out
