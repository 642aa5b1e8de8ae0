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
import numbers
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hushnet.privacy import distinct as _distinct
from hushnet.privacy.conversions import (
    _IMPROVED_MIN_ORDER,
    DEFAULT_ORDERS,
    _rule,
    gdp_epsilon,
    rdp_epsilon,
    rdp_epsilon_dominating,
    rdp_to_dp,
)

__all__ = [
    "BOUND_LABELS",
    "FrozenCurves",
    "RepeatKey",
    "REPEAT_CAP",
    "DEFAULT_DELTA",
    "LedgerError",
    "StoredBudgetError",
    "BudgetExceeded",
    "PrivacyEntry",
    "LedgerBudget",
    "LedgerState",
    "Spent",
    "SpentColumns",
    "as_key",
    "check_budget",
    "check_orders",
]

BOUND_LABELS = ("certified", "paper")
#: δ at which a loss is reported toward a target without a budget
DEFAULT_DELTA = 1e-6
#: relative slack of every budget comparison (float noise of summing curves in another order)
_RTOL = 1e-12
#: how far under its budget a target's quick upper bound must be for its exact conversion to be
#: skipped (:meth:`Projections.violations`): targets closer than this are converted exactly
_MARGIN = 1e-9
#: from this many targets left to convert, :meth:`Projections.violations` first tries to clear them
#: all with one conversion of their pointwise maximum (below it the exact conversion is as cheap)
_DOMINATING_MIN_ROWS = 16


def sealed(a: np.ndarray) -> np.ndarray:
    """A read-only copy of ``a`` backed by immutable ``bytes``.

    ``flags.writeable = False`` alone can be undone by anyone holding an array that owns its memory; a
    cached certified matrix shared by every node of a process, or a cost row the ledger takes as
    validated when it comes again, must not change under it, so those are sealed instead.
    """
    a = np.ascontiguousarray(a)
    return np.frombuffer(a.tobytes(), dtype=a.dtype).reshape(a.shape)


def is_sealed(a: np.ndarray) -> bool:
    """True when no holder of ``a`` (or of an array it views) can make its memory writeable again."""
    b: object = a
    while isinstance(b, np.ndarray):
        if b.flags.writeable:
            return False
        b = b.base
    return isinstance(b, bytes)


def sealed_bytes(a: np.ndarray) -> bytes | None:
    """The ``bytes`` a sealed, C-contiguous array is a view of in full (no copy), else ``None``.

    Why: a store that sees the same ``bytes`` object again (by identity) neither hashes nor writes it
    again, so a sealed row checkpointed at every step costs no megabyte copy and no hash."""
    b: object = a
    while isinstance(b, np.ndarray) and not b.flags.writeable:
        b = b.base
    if isinstance(b, bytes) and a.flags.c_contiguous and len(b) == a.nbytes:
        return b
    return None


class FrozenCurves(Mapping[str, np.ndarray]):
    """A read-only ``target → curve`` map over one sealed (targets × orders) matrix: row i is the curve
    toward ``keys[i]``.

    What a run's per-σ cost rows are charged as.  Nothing can change it: the keys are a tuple, the
    matrix is sealed (:func:`sealed`), attributes cannot be set — so the ledger may take the very map it
    checked last as validated (:meth:`LedgerState.validate`).  Unlike a ``MappingProxyType`` over a
    dict of row views it can be referred to weakly: the ledger's memo does not keep the matrix alive
    (issue 12: at n = 2048 the matrix is 2.6 MB, and a memo per hosted node kept one per node)."""

    __slots__ = ("_keys", "_rows", "_index", "__weakref__")

    def __init__(self, keys: tuple[str, ...], rows: np.ndarray):
        if not isinstance(keys, tuple) or not is_sealed(rows) or rows.ndim != 2:
            raise ValueError("FrozenCurves needs a tuple of keys and a sealed 2-D matrix")
        if rows.shape[0] != len(keys) or len(set(keys)) != len(keys):
            raise ValueError("FrozenCurves needs one distinct key per row")
        object.__setattr__(self, "_keys", keys)
        object.__setattr__(self, "_rows", rows)
        object.__setattr__(self, "_index", None)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("FrozenCurves cannot be changed")

    @property
    def rows(self) -> np.ndarray:
        """The sealed (targets × orders) matrix, rows in key order."""
        return self._rows

    def __getitem__(self, key: str) -> np.ndarray:
        if self._index is None:
            object.__setattr__(self, "_index", {k: i for i, k in enumerate(self._keys)})
        return self._rows[self._index[key]]

    def __iter__(self):
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


class RepeatKey:
    """A caller's promise that every charge made with this key costs the same, bit for bit (targets,
    curves, no μ, one bound label): what a run's contribution charges at every visit of a walk.

    Why: a walk hop charges its holder toward every other node, and checking and composing n − 1
    targets' totals at every hop made the charge O(n) (issue 12: ~4 ms of a hop at n = 2048).  With a
    key the ledger proves once how many more identical charges fit every target's budget
    (:meth:`LedgerState.repeat_allowance`) and records each of them as a reference to the stored block,
    composing the totals when something reads them.  The ledger holds the key weakly and compares it by
    identity: a key that is gone, or another key, takes the full path.  ``label`` is for messages."""

    __slots__ = ("label", "__weakref__")

    def __init__(self, label: str = ""):
        self.label = label

    def __repr__(self) -> str:
        return f"RepeatKey({self.label!r})"


#: most charges one repeat allowance covers (the float slack its bound allows for grows with it)
REPEAT_CAP = 1 << 20
#: the float slack of k sequential additions: a sum of k additions of ``B`` to ``T`` (all ≥ 0) rounds to
#: at most ``(T + k·B)·(1 + u)^k`` (u = 2⁻⁵³); the bound multiplies by ``1 + (k + 4)·2⁻⁵⁰`` (= 1 + 8(k + 4)u,
#: exact in binary), which covers that and the three roundings of computing it, for k ≤ REPEAT_CAP
_REPEAT_ULP = 2.0**-50


class LedgerError(ValueError):
    """An entry or budget the ledger cannot accept (wrong orders, bad values, unknown label)."""


class StoredBudgetError(LedgerError):
    """The budget stored in a ledger file cannot be read as one (a NaN ε an older build wrote, …).

    Its own class so that a node can replace it with the budget of its policy on open (the spending is
    all kept); without one to replace it with, the ledger refuses to open rather than enforce nothing."""


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


def _refuse_repeated(keys: Iterable[str], what: str = "an entry") -> None:
    """Raise a one-line :class:`LedgerError` naming the first key that occurs twice in ``keys``.

    Why: two targets that differ but map to one ledger key (``1`` and ``"1"``) would collapse into one
    dict entry, and whichever curve (or budget) came last would win — an entry stating a larger cost
    first would be charged the smaller one (an under-count), a tighter per-node budget be dropped.
    Refused, never resolved: the ledger cannot know which one the caller meant."""
    seen: set[str] = set()
    for k in keys:
        if k in seen:
            raise LedgerError(f"{what} names target {k!r} twice (keys are compared as strings)")
        seen.add(k)


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
    #: the same curves as one (targets × orders) matrix, rows in ``rdp``'s order — set by
    #: :meth:`from_row` only, so the ledger takes a hop's n curves without restacking them
    rows: np.ndarray | None = field(default=None, compare=False, repr=False)

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
        curves = {k: arr[i] for i, k in enumerate(keys)}
        if len(curves) != len(keys):  # a dict would keep one of the rows: refuse, never pick one
            _refuse_repeated(keys)
        mus = None if gdp_mu is None else {k: float(m) for k, m in zip(keys, gdp_mu, strict=True)}
        return cls(run_id, protocol, view_model, bound, curves, mus, note, arr)

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
        if len(m) != len(mu):
            _refuse_repeated([as_key(k) for k in mu])
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


@dataclass(frozen=True)
class SpentColumns:
    """:class:`Spent` toward many targets as columns: ``keys[j]``'s loss is row ``j`` of each array.

    What a report or a ledger answer serialises: at n = 2048 building 2 047 :class:`Spent` objects (and
    reading them back field by field) cost as much as converting the curves (issue 12).  The numbers
    are those :meth:`LedgerState.spent` gives, bit for bit; :meth:`as_spent` builds the objects."""

    keys: list[str]
    epsilon: np.ndarray  # float64
    delta: np.ndarray  # float64
    gdp: np.ndarray  # bool: method "gdp" (else "rdp")
    best_order: np.ndarray  # float64, NaN where there is none (GDP, or a curve infinite everywhere)
    paper: np.ndarray  # bool: bound "paper" (else "certified")
    entries: np.ndarray  # int64

    def methods(self) -> list[str]:
        """The conversion of each row, ``"rdp"`` or ``"gdp"``."""
        return np.where(self.gdp, "gdp", "rdp").tolist()

    def bounds(self) -> list[str]:
        """The bound label of each row, ``"certified"`` or ``"paper"``."""
        return np.where(self.paper, "paper", "certified").tolist()

    def as_spent(self) -> dict[str, Spent]:
        """One :class:`Spent` per target (best order ``None`` for GDP, as :meth:`LedgerState.convert`)."""
        orders = self.best_order.tolist()
        return {
            k: Spent(k, e, d, m, None if g else o, b, n)
            for k, e, d, m, g, o, b, n in zip(
                self.keys,
                self.epsilon.tolist(),
                self.delta.tolist(),
                self.methods(),
                self.gdp.tolist(),
                orders,
                self.bounds(),
                self.entries.tolist(),
            )
        }


def check_orders(orders) -> np.ndarray:
    """The Rényi orders as a float vector, or a one-line :class:`LedgerError`."""
    o = np.asarray(DEFAULT_ORDERS if orders is None else orders, dtype=float)
    if o.ndim != 1 or np.any(o <= 1.0):
        raise LedgerError("orders must be a 1-D array of values > 1")
    return o


def check_budget(budget: LedgerBudget, orders: np.ndarray) -> None:
    """Refuse a budget the ledger cannot enforce, in one line: δ outside (0, 1) or NaN, ε negative or
    NaN (+∞ is allowed: no (ε, δ) limit, e.g. beside an RDP curve), RDP curves off the orders or with a
    NaN or negative value (+∞ at an order: no limit there), and per-node budgets that name one node
    twice once keys are strings.

    Why: every comparison with NaN is false, so a NaN budget would refuse nothing — a ledger that
    silently enforces nothing; and of two per-node budgets for one key, the store would keep one."""

    def check_pair(e, d, who: str) -> None:
        ok = (
            isinstance(e, numbers.Real)
            and isinstance(d, numbers.Real)
            and 0.0 < float(d) < 1.0
            and float(e) >= 0.0  # False for NaN
        )
        if not ok:
            raise LedgerError(
                f"budget{who} needs epsilon >= 0 (not NaN) and delta in (0, 1), got "
                f"epsilon={e!r}, delta={d!r}"
            )

    def check_curve(c, who: str) -> None:
        if c is None:
            return
        try:
            v = np.asarray(c, dtype=np.float64)
        except (TypeError, ValueError):
            raise LedgerError(
                f"budget RDP curve{who} must be numbers on the ledger's orders"
            ) from None
        if v.shape != orders.shape:
            raise LedgerError("budget RDP curves must be given on the ledger's orders")
        if np.isnan(v).any() or (v < 0).any():
            raise LedgerError(
                f"budget RDP curve{who} must be >= 0 at every order (inf allowed, not NaN)"
            )

    check_pair(budget.epsilon, budget.delta, "")
    check_curve(budget.rdp_curve, "")
    if len({as_key(t) for t in budget.per_target}) != len(budget.per_target):
        _refuse_repeated([as_key(t) for t in budget.per_target], "a per-node budget")
    if len({as_key(t) for t in budget.per_target_rdp}) != len(budget.per_target_rdp):
        _refuse_repeated([as_key(t) for t in budget.per_target_rdp], "a per-node RDP budget")
    for t, pair in budget.per_target.items():
        try:
            e, d = pair
        except (TypeError, ValueError):
            raise LedgerError(f"budget for {t!r} must be an (epsilon, delta) pair") from None
        check_pair(e, d, f" for {t!r}")
    for t, c in budget.per_target_rdp.items():
        check_curve(c, f" for {t!r}")


#: per touched target: (would-be ε, method, best order, budget ε, budget δ, RDP-curve violated)
Projection = tuple[float, str, "float | None", float, float, bool]


class Costs(Mapping[str, tuple[np.ndarray, "float | None"]]):
    """A validated entry's costs: target keys in the entry's order, their RDP curves as one
    (targets × orders) float64 matrix and their μ (``has_mu`` marks which carry one).

    A mapping ``target → (curve, μ or None)`` like the dict it replaces, so callers that iterate it
    keep working; the ledger itself works on the arrays — a walk hop charges every other node at
    once, and a Python loop over n targets per hop was most of a node's time (issue 12).
    """

    __slots__ = ("keys_", "rdp", "mu", "has_mu", "_index")

    def __init__(self, keys: list[str], rdp: np.ndarray, mu: np.ndarray, has_mu: np.ndarray):
        self.keys_ = keys
        self.rdp = rdp
        self.mu = mu
        self.has_mu = has_mu
        self._index: dict[str, int] | None = None

    @classmethod
    def from_mapping(
        cls, costs: Mapping[str, tuple[np.ndarray, float | None]], orders: np.ndarray
    ) -> "Costs":
        """Costs from a ``target → (curve, μ)`` mapping (already validated)."""
        if isinstance(costs, Costs):
            return costs
        keys = list(costs)
        rdp = np.empty((len(keys), orders.size), dtype=np.float64)
        mu = np.zeros(len(keys), dtype=np.float64)
        has = np.zeros(len(keys), dtype=bool)
        for i, k in enumerate(keys):
            v, m = costs[k]
            rdp[i] = v
            if m is not None:
                mu[i], has[i] = m, True
        return cls(keys, rdp, mu, has)

    def index(self) -> dict[str, int]:
        """Target key → row (built on first use)."""
        if self._index is None:
            self._index = {k: i for i, k in enumerate(self.keys_)}
        return self._index

    def __getitem__(self, t: str) -> tuple[np.ndarray, float | None]:
        i = self.index()[t]
        return self.rdp[i], (float(self.mu[i]) if self.has_mu[i] else None)

    def __iter__(self):
        return iter(self.keys_)

    def __len__(self) -> int:
        return len(self.keys_)


class LedgerState:
    """The composed spending of one node toward every target, and the budget it answers to.

    Holds running sums per target as arrays (one row per target: the RDP curve, μ², entry counts,
    non-certified counts), so that one charge toward all n targets is a few array operations;
    every query converts on demand.  Not thread-safe and not persistent: the caller (the node's
    :class:`~hushnet.privacy.ledger.Ledger`) serialises access and stores what it adds.
    """

    def __init__(self, orders: np.ndarray, node_id: str = "", budget: LedgerBudget | None = None):
        self.orders = orders
        self.node_id = node_id
        self.budget = budget
        self._row: dict[str, int] = {}
        self._keys: list[str] = []
        k = orders.size
        self._rdp = np.zeros((0, k), dtype=np.float64)
        self._gdp_sq = np.zeros(0, dtype=np.float64)
        self._n_entries = np.zeros(0, dtype=np.int64)
        self._n_gdp = np.zeros(0, dtype=np.int64)
        self._paper = np.zeros(0, dtype=np.int64)
        #: per row, the order index where the last exact conversion was best, or where the bound that
        #: last cleared it without one was (-1: none yet) — only a hint for the quick budget check (any
        #: order's value bounds the minimum), never a number that is reported
        self._hint = np.zeros(0, dtype=np.int64)
        self._grow(16)
        #: bumped by every add: a projection made at another version cannot be added as computed
        self.version = 0
        #: the rows of the last keys looked up (a walk charges the same targets hop after hop)
        self._last: tuple[list[str], np.ndarray] = ([], np.zeros(0, dtype=np.int64))
        #: the last :class:`FrozenCurves` entry validated (a weak reference: the memo keeps no matrix
        #: alive) with its keys, μ and μ mask (see :meth:`validate`)
        self._valid: tuple[weakref.ref, list[str], np.ndarray, np.ndarray] | None = None

    def targets(self) -> list[str]:
        """Every target something was spent toward, sorted."""
        return sorted(self._keys)

    # ---------------------------------------------------------------- rows
    def _rows(self, keys: list[str], create: bool) -> np.ndarray:
        """Row of each key (-1 for an unknown key unless ``create``, which appends zero rows)."""
        last_keys, last_rows = self._last
        if keys is last_keys or keys == last_keys:  # every key known (only those are kept)
            return last_rows
        if self._row:
            get = self._row.get
            rows = np.fromiter((get(k, -1) for k in keys), dtype=np.int64, count=len(keys))
        else:  # nothing stored yet (a node's first charge): every key is new
            rows = np.full(len(keys), -1, dtype=np.int64)
        if create and (rows < 0).any():
            unknown = rows < 0
            new = list(keys) if unknown.all() else [keys[i] for i in np.flatnonzero(unknown)]
            n0, n1 = len(self._keys), len(self._keys) + len(new)
            if n1 > self._rdp.shape[0]:
                self._grow(max(n1, 2 * self._rdp.shape[0], 16))
            self._row.update(zip(new, range(n0, n1)))
            self._keys.extend(new)
            if len(self._row) == n1:  # the new keys are distinct: rows n0, n0 + 1, … in key order
                rows[unknown] = np.arange(n0, n1)
            else:
                rows = np.fromiter((self._row[k] for k in keys), dtype=np.int64, count=len(keys))
        if rows.size and rows.min() >= 0:
            rows.flags.writeable = False
            self._last = (list(keys), rows)
        return rows

    def _grow(self, cap: int) -> None:
        # never below a row any array holds (the running sums may be a shared array of exactly the
        # rows in use, see add_costs, while the others keep their capacity)
        cap = max(cap, self._rdp.shape[0], self._n_entries.shape[0])

        def grow(a: np.ndarray, fill=0) -> np.ndarray:
            # zeros: pages the sums never write stay untouched (a fresh ledger's sums become the first
            # charge's sealed rows, add_costs, and the 2.6 MB at n = 2048 would be filled for nothing)
            shape = (cap,) + a.shape[1:]
            out = np.zeros(shape, a.dtype) if fill == 0 else np.full(shape, fill, a.dtype)
            out[: a.shape[0]] = a
            return out

        self._rdp = grow(self._rdp)
        self._gdp_sq = grow(self._gdp_sq)
        self._n_entries = grow(self._n_entries)
        self._n_gdp = grow(self._n_gdp)
        self._paper = grow(self._paper)
        self._hint = grow(self._hint, -1)

    def add(self, target: str, vec: np.ndarray, mu: float | None, bound: str) -> None:
        """Compose one validated cost toward ``target`` (RDP adds per order, μ² adds)."""
        self.add_costs(
            Costs(
                [target],
                np.asarray(vec, dtype=np.float64).reshape(1, -1),
                np.array([0.0 if mu is None else mu]),
                np.array([mu is not None]),
            ),
            bound,
        )

    def add_costs(self, costs: Costs, bound: str, proj: "Projections | None" = None) -> None:
        """Compose every cost of one validated entry (each target once: RDP adds per order, μ² adds).

        The running sums are not copied where they would be a copy of something nobody can change:
        the first entry of an empty state whose curves are sealed (a run's charged row, shared by the
        cost, the driver and the ledger's recent block) *is* the sums until a later entry adds
        something (``0.0 + c`` is ``c`` bit for bit for every ``c ≥ +0.0``, and ``-0.0`` is never
        taken); an all-zero entry adds nothing (``x + 0.0`` is ``x`` for every sum here, all ``≥ +0.0``)
        — Muffliato-GD's steps after its first.  Why: at n = 2048 the sums are 2.6 MB a node, the same
        numbers as the run's charged row while a ledger has one run (issue 12)."""
        fresh = not self._keys
        rows = self._rows(costs.keys_, create=True)
        m = len(costs.keys_)
        if (
            fresh
            and costs.rdp.shape == (m, self.orders.size)
            and is_sealed(costs.rdp)
            and (m == 0 or (int(rows[0]) == 0 and int(rows[-1]) == m - 1))
            and not np.signbit(costs.rdp).any()
        ):
            self._rdp = costs.rdp  # read-only: the next entry that adds something copies it first
        elif not self._rdp.flags.writeable and not costs.rdp.any():
            pass  # adds +0.0 to shared sums that are all >= +0.0: nothing changes, bit for bit
        else:
            if not self._rdp.flags.writeable:
                self._rdp = np.array(self._rdp)  # copy on write (the same numbers)
            if proj is not None and proj.version == self.version and proj.costs is costs:
                self._rdp[_span(rows)] = proj.rdp  # the sum the projection made: stored + cost
            else:
                self._rdp[rows] += costs.rdp
        self.version += 1
        self._n_entries[rows] += 1
        if costs.has_mu.any():
            r = rows[costs.has_mu]
            m = costs.mu[costs.has_mu]
            self._gdp_sq[r] += m * m
            self._n_gdp[r] += 1
        if bound != "certified":
            self._paper[rows] += 1
        if proj is not None:
            h = proj.hints
            known = h >= 0
            self._hint[rows[known]] = h[known]

    # ---------------------------------------------------------------- conversion
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

    def convert_rows(
        self, rdp: np.ndarray, gdp_sq: np.ndarray, gdp_ok: np.ndarray, delta: np.ndarray
    ) -> tuple[np.ndarray, list[str], list[float | None], np.ndarray]:
        """:meth:`convert` for many curves at once — the same numbers, curve for curve.

        ``rdp`` (m × orders), ``gdp_sq``/``gdp_ok`` (μ² and whether every composed entry carried
        one), ``delta`` per row.  One vectorised RDP conversion per distinct δ; the GDP curve
        (a root search) once per distinct (μ², δ).  Returns ε, methods, best orders and the best
        order's index per row (-1 where none or GDP)."""
        m = rdp.shape[0]
        eps = np.empty(m)
        alpha = np.empty(m)
        for d in np.unique(delta):
            sel = np.flatnonzero(delta == d)
            e, a = rdp_epsilon(self.orders, rdp[sel], float(d))
            eps[sel], alpha[sel] = e, a
        hint = np.where(
            np.isnan(alpha), -1, np.argmax(self.orders[None, :] == alpha[:, None], axis=1)
        )
        methods = ["rdp"] * m
        orders: list[float | None] = [float(a) for a in alpha]
        cache: dict[tuple[float, float], float] = {}
        for i in np.flatnonzero(gdp_ok):
            key = (float(gdp_sq[i]), float(delta[i]))
            g = cache.get(key)
            if g is None:
                g = cache[key] = gdp_epsilon(math.sqrt(key[0]), key[1])
            if g <= eps[i]:
                eps[i], methods[i], orders[i], hint[i] = g, "gdp", None, -1
        return eps, methods, orders, hint

    # ---------------------------------------------------------------- validation
    def validate(self, entry: PrivacyEntry) -> Costs:
        """The entry's costs (target keys, curves as one float64 matrix, μ), or a :class:`LedgerError`."""
        if entry.bound not in BOUND_LABELS:
            raise LedgerError(f"bound must be one of {BOUND_LABELS}, got {entry.bound!r}")
        if not entry.rdp:
            raise LedgerError("an entry must cost something toward at least one target")
        memo = self._valid
        if (
            memo is not None
            and type(entry.rdp) is FrozenCurves
            and entry.rdp is memo[0]()
            and entry.rows is entry.rdp.rows
            and entry.gdp_mu is None
        ):
            # the very curves validated last time, and they cannot have changed (a frozen map over a
            # sealed matrix, still alive): a walk charges the same n curves every hop, and re-checking
            # n keys and an (n × orders) matrix was most of a hop's charge at n = 2048
            return Costs(memo[1], entry.rows, memo[2], memo[3])
        keys = [as_key(k) for k in entry.rdp]
        try:
            mat = entry.rows
            if mat is None or mat.dtype != np.float64 or mat.shape != (len(keys), self.orders.size):
                mat = np.array(list(entry.rdp.values()), dtype=np.float64)
            fast = (
                mat.shape == (len(keys), self.orders.size)
                and self.orders.ndim == 1
                and len(set(keys)) == len(keys)
                and not (self.node_id and self.node_id in set(keys))
                and not np.isnan(mat).any()
                and not (mat < 0).any()
            )
            mu = np.zeros(len(keys))
            has = np.zeros(len(keys), dtype=bool)
            if fast and entry.gdp_mu is not None:
                mus = {as_key(k): m for k, m in entry.gdp_mu.items()}
                for i, k in enumerate(keys):
                    if k in mus:
                        mu[i], has[i] = float(mus[k]), True
                # a μ key repeated as a string (1 and "1"): the slow path refuses it
                fast = len(mus) == len(entry.gdp_mu) and bool(np.all(mu[has] >= 0))
        except (ValueError, TypeError):
            fast = False
        if not fast:  # find the first bad target in the entry's order, with its one-line error
            return Costs.from_mapping(self._validate_each(entry), self.orders)
        costs = Costs(keys, mat, mu, has)
        if type(entry.rdp) is FrozenCurves and mat is entry.rdp.rows and entry.gdp_mu is None:
            self._valid = (weakref.ref(entry.rdp), keys, mu, has)
        return costs

    def _validate_each(self, entry: PrivacyEntry) -> dict[str, tuple[np.ndarray, float | None]]:
        """Target by target (the path that names the first bad target)."""
        mus = {as_key(k): m for k, m in entry.gdp_mu.items()} if entry.gdp_mu is not None else {}
        if entry.gdp_mu is not None and len(mus) != len(entry.gdp_mu):
            _refuse_repeated([as_key(k) for k in entry.gdp_mu], "an entry's gdp_mu")
        out: dict[str, tuple[np.ndarray, float | None]] = {}
        for t, vec in entry.rdp.items():
            key = as_key(t)
            if key in out:  # a dict would keep the last curve: refuse, never pick one
                _refuse_repeated([key, key])
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

    # ---------------------------------------------------------------- budget checks
    def projection(self, costs: Mapping[str, tuple[np.ndarray, float | None]]) -> "Projections":
        """Per touched target: the would-be (ε, method, best order, budget ε, budget δ, curve
        violation), as a lazy mapping (see :class:`Projections`)."""
        return Projections(self, Costs.from_mapping(costs, self.orders))

    @staticmethod
    def violations(proj: Mapping[str, Projection]) -> dict[str, Projection]:
        """The projected targets over their (ε, δ) budget or their RDP curve."""
        if isinstance(proj, Projections):
            return proj.violations()
        return {t: p for t, p in proj.items() if p[0] > p[3] * (1 + _RTOL) or p[5]}

    @staticmethod
    def refusal(bad: Mapping[str, Projection], run_id: str) -> BudgetExceeded:
        """The error for a refused charge, naming the worst target (largest excess over budget;
        curve violations count as +inf excess)."""
        worst = max(bad, key=lambda t: (bad[t][5], bad[t][0] - bad[t][3]))
        e, method, _, be, bd, _ = bad[worst]
        return BudgetExceeded(worst, e, be, bd, run_id, method, {t: p[0] for t, p in bad.items()})

    def budget_arrays(self, costs: Costs) -> tuple[np.ndarray, ...]:
        """Per key: budget ε, budget δ, and the budget RDP curve's rows (``None``: no curve
        anywhere) with a mask of the keys that have one."""
        m = len(costs)
        b = self.budget
        if b is None:
            return np.full(m, math.inf), np.full(m, DEFAULT_DELTA), None, None
        be = np.full(m, float(b.epsilon))
        bd = np.full(m, float(b.delta))
        index = costs.index() if b.per_target or b.per_target_rdp else {}
        for t, (e, d) in b.per_target.items():
            i = index.get(t)  # as for_target: a budget key matches the target's string key only
            if i is not None:
                be[i], bd[i] = e, d
        curves = None
        has_curve = None
        if b.rdp_curve is not None or b.per_target_rdp:
            curves = np.zeros((m, self.orders.size))
            has_curve = np.zeros(m, dtype=bool)
            if b.rdp_curve is not None:
                curves[:] = np.asarray(b.rdp_curve, dtype=np.float64)
                has_curve[:] = True
            for t, c in b.per_target_rdp.items():
                i = index.get(t)
                if i is not None:
                    curves[i] = np.asarray(c, dtype=np.float64)
                    has_curve[i] = True
        return be, bd, curves, has_curve

    # ---------------------------------------------------------------- repeated charges
    def repeat_allowance(self, costs: Costs, cap: int = REPEAT_CAP) -> int:
        """How many more charges of exactly ``costs`` (after what is stored now) are **proven** within
        every target's budget — 0 when none can be proven, ``cap`` when nothing limits them.

        Soundness.  k more charges make the sum toward target t a float sum ``S`` of k additions of
        ``B_t`` to the current ``T_t`` (all ≥ 0, +∞ allowed), so ``S ≤ R = (T_t + k·B_t)·g`` elementwise
        with ``g = 1 + (k + 4)·2⁻⁵⁰`` (:data:`_REPEAT_ULP`).  (ε, δ) budget: the improved rule's ε is a
        minimum over the orders of per-order values that are monotone in the curve's value
        (:func:`~hushnet.privacy.conversions.rdp_epsilon_dominating`), so ``S ≤ R`` bounds ε(S) by R's
        per-order value at **one** order α*: k is allowed for t when that value, plus the same 1e-9
        rounding margin as the pointwise-maximum clearance, is within t's budget ε.  RDP budget curve:
        ``R ≤ curve`` at every order.  A target with neither (ε = ∞, no curve) never limits.  The answer
        is the minimum over the targets; every candidate k is checked by that evaluation, never taken
        from the closed form that proposed it.  A GDP conversion could only lower ε (the ledger takes
        the smaller); entries with μ are not repeated (the caller's key promises none).
        """
        m = len(costs)
        if m == 0 or costs.has_mu.any():
            return 0
        rows = self._rows(costs.keys_, create=False)
        if rows.size == 0:
            return 0
        known = rows >= 0
        if known.all():
            T = self._rdp[_span(rows)]
        else:  # targets nothing was spent toward yet (a run prepared before its first charge): 0
            T = np.where(known[:, None], self._rdp[np.where(known, rows, 0)], 0.0)
        B = costs.rdp
        be, bd, curves, has_curve = self.budget_arrays(costs)
        if curves is None and m >= _DOMINATING_MIN_ROWS:
            # the answer is a minimum over rows: rows equal in every bit (totals, cost, budget) count
            # once — a walk's row repeats its curves (~460 distinct of 2 047 at n = 2048)
            found = _distinct.distinct_rows(np.hstack([T, B]), be, bd)
            if found is not None:
                first = found[0]
                T, B, be, bd, m = T[first], B[first], be[first], bd[first], first.size
        k = np.full(m, float(cap))
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            fin = np.isfinite(be)
            for d in np.unique(bd[fin]):
                sel = np.flatnonzero(fin & (bd == d))
                k[sel] = np.minimum(k[sel], self._eps_allowance(T[sel], B[sel], be[sel], d, cap))
            if curves is not None:
                sel = np.flatnonzero(has_curve)
                k[sel] = np.minimum(k[sel], _curve_allowance(T[sel], B[sel], curves[sel], cap))
        return int(max(0.0, float(k.min())))

    def _eps_allowance(
        self, T: np.ndarray, B: np.ndarray, be: np.ndarray, delta: float, cap: int
    ) -> np.ndarray:
        """Per row, the largest k ≤ cap proven by :meth:`repeat_allowance`'s (ε, δ) argument (0: none)."""
        a = self.orders
        c = math.log(1.0 / delta) / (a - 1.0)  # _rule's and rdp_epsilon_dominating's expressions
        lo = np.log1p(-1.0 / a)
        hi = np.log(delta * a) / (a - 1.0)
        # per order, the value is r + K(α) up to rounding: propose k = (budget − K − T)/B at each
        # order, take each row's best order, then check that k (and smaller ones) by the evaluation
        K = np.where(a > _IMPROVED_MIN_ORDER, np.minimum(c, lo - hi), c)
        room = be[:, None] * (1.0 - 1e-7) - K[None, :] - T
        prop = np.where(B > 0.0, room / B, np.where(room >= 0.0, float(cap), -1.0))
        prop = np.where(np.isfinite(T) & np.isfinite(B) & ~np.isnan(prop), prop, -1.0)
        j = np.argmax(prop, axis=1)
        i = np.arange(T.shape[0])
        k = np.clip(np.floor(prop[i, j]), 0.0, float(cap))
        t, b = T[i, j], B[i, j]
        ok = np.zeros(T.shape[0], dtype=bool)
        for _ in range(64):  # shrink the rows whose proposal the evaluation does not confirm
            r = np.maximum((t + k * b) * (1.0 + (k + 4.0) * _REPEAT_ULP), 0.0)
            eps = r + c[j]
            better = r + lo[j] - hi[j]
            eps = np.where(a[j] > _IMPROVED_MIN_ORDER, np.minimum(eps, better), eps)
            scale = r + np.abs(c[j]) + np.abs(lo[j]) + np.abs(hi[j])
            ok = np.isfinite(eps) & (np.maximum(eps, 0.0) + _MARGIN * scale <= be)
            if ok.all() or not (k[~ok] > 0).any():
                break
            k = np.where(ok, k, np.floor(k * 0.5))
        return np.where(ok, k, 0.0)

    # ---------------------------------------------------------------- queries
    def default_delta(self, target: str) -> float:
        """The δ a loss toward ``target`` is reported at: its budget's, else :data:`DEFAULT_DELTA`."""
        return self.budget.for_target(target)[1] if self.budget else DEFAULT_DELTA

    def spent(self, t: str, delta: float) -> Spent:
        """The composed (ε, δ) loss toward ``t`` at ``delta``."""
        i = self._row.get(t)
        if i is None or self._n_entries[i] == 0:
            return Spent(t, 0.0, delta, "none", None, "certified", 0)
        n_e = int(self._n_entries[i])
        gdp_sq = float(self._gdp_sq[i]) if self._n_gdp[i] == n_e else None
        eps, method, order = self.convert(self._rdp[i], gdp_sq, delta)
        bound = "paper" if self._paper[i] else "certified"
        return Spent(t, eps, delta, method, order, bound, n_e)

    def spent_many(self, keys: list[str], deltas: np.ndarray) -> dict[str, Spent]:
        """:meth:`spent` for many targets that have spending (one vectorised conversion)."""
        rows = self._rows(keys, create=False)
        ne = self._n_entries[rows]
        eps, methods, orders, _ = self.convert_rows(
            self._rdp[rows], self._gdp_sq[rows], self._n_gdp[rows] == ne, deltas
        )
        paper = self._paper[rows]
        return {
            k: Spent(
                k,
                float(eps[j]),
                float(deltas[j]),
                methods[j],
                orders[j],
                "paper" if paper[j] else "certified",
                int(ne[j]),
            )
            for j, k in enumerate(keys)
        }

    def deltas(self, keys: list[str], delta: float | None = None) -> np.ndarray:
        """:meth:`default_delta` of each key (``delta`` for all if given), as one array."""
        b = self.budget
        if delta is not None or b is None:
            return np.full(len(keys), DEFAULT_DELTA if delta is None else float(delta))
        out = np.full(len(keys), float(b.delta))
        if b.per_target:
            get = b.per_target.get
            for j, k in enumerate(keys):
                pt = get(k)
                if pt is not None:
                    out[j] = pt[1]
        return out

    def spent_columns(
        self, keys: list[str], deltas: np.ndarray, known: _distinct.Converted | None = None
    ) -> SpentColumns:
        """:meth:`spent_many` as columns, converting each distinct (curve, μ², δ) once.

        A node's totals repeat their curves (a walk node after one run: ~400 distinct among 2 047
        targets at n = 2048), and converting all of them was most of a report's CPU (issue 12).  Rows
        are grouped by their bits (:func:`~hushnet.privacy.distinct.distinct_rows`, checked bit for bit)
        and each group converted by :meth:`convert_rows`, whose numbers depend on a row's own values
        only: the columns equal :meth:`spent_many`'s, bit for bit (tests compare).  Every key must have
        spending.

        ``known``: a conversion already made (a report's run row): when the stored sums are its rows bit
        for bit, at its orders and δ, and no target's totals can take the GDP curve, its results are
        used — what ``convert_rows`` computes of those rows.  A node's totals after its first run are
        that run's row (issue 12: a report converted the same 2 047 curves twice)."""
        rows = self._rows(keys, create=False)
        m = len(keys)
        deltas = np.asarray(deltas, dtype=np.float64)
        if m and rows.min() < 0:
            raise KeyError(keys[int(np.argmin(rows))])
        # the whole ledger in any order (Ledger.spent: sorted keys): work on the stored rows in place
        # (no gathered copy of the n × orders sums) and permute the per-row results
        whole = m == len(self._keys) and m > 0
        if whole:
            perm = np.empty(m, dtype=np.int64)
            perm[rows] = np.arange(m)
            if not np.array_equal(np.sort(rows), np.arange(m)):
                whole = False
        if whole:
            rdp = self._rdp[:m]
            d = deltas[perm]
            src = slice(0, m)
        else:
            rdp = self._rdp[rows]
            d = deltas
            src = rows
        ne = self._n_entries[src]
        gdp_sq = self._gdp_sq[src]
        gdp_ok = self._n_gdp[src] == ne
        reuse = None
        if known is not None and whole and not gdp_ok.any() and (d == known.delta).all():
            reuse = known.for_rows(self.orders, rdp, known.delta)
        found = None
        if reuse is None and m >= 2:
            found = _distinct.distinct_rows(rdp, d, gdp_sq, gdp_ok.astype(np.int64))
        if reuse is not None:  # what convert_rows gives rows without GDP at one δ: ε, best order
            eps, best = reuse
            gdp = np.zeros(m, dtype=bool)
            inv = None
        elif found is None:
            eps, methods, orders, _ = self.convert_rows(rdp, gdp_sq, gdp_ok, d)
            inv = np.arange(m)
        else:
            first, inv = found
            eps, methods, orders, _ = self.convert_rows(
                rdp[first], gdp_sq[first], gdp_ok[first], d[first]
            )
        if inv is not None:
            gdp = np.array([x == "gdp" for x in methods], dtype=bool)
            best = np.array([math.nan if o is None else o for o in orders], dtype=np.float64)
            eps, gdp, best = eps[inv], gdp[inv], best[inv]
        paper = self._paper[src] > 0
        ne = ne.astype(np.int64)
        if whole:
            eps, gdp, best, paper, ne = eps[rows], gdp[rows], best[rows], paper[rows], ne[rows]
            d = deltas
        return SpentColumns(list(keys), eps, d.copy(), gdp, best, paper, ne)

    def rdp(self, target: str) -> np.ndarray:
        """The composed RDP curve toward ``target`` (a copy; zeros if nothing was spent)."""
        i = self._row.get(target)
        return np.zeros_like(self.orders, dtype=float) if i is None else self._rdp[i].copy()

    def remaining(self, targets: Iterable | None = None) -> dict[str, float]:
        """ε left toward each target (budget ε − spent ε at the budget's δ; ∞ without a budget)."""
        keys = set(self._keys)
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


def _curve_allowance(T: np.ndarray, B: np.ndarray, curve: np.ndarray, cap: int) -> np.ndarray:
    """Per row, the largest k ≤ cap with ``(T + k·B)·g ≤ curve`` at every order (the RDP budget curve
    of :meth:`LedgerState.repeat_allowance`; +∞ in the curve: no limit at that order), checked."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        room = curve * (1.0 - 1e-7) - T
        prop = np.where(B > 0.0, room / B, np.where(room >= 0.0, float(cap), -1.0))
        prop = np.where(np.isinf(curve), float(cap), prop)
        prop = np.where(np.isnan(prop), -1.0, prop)
        k = np.clip(np.floor(prop.min(axis=1)), 0.0, float(cap))
        ok = np.zeros(T.shape[0], dtype=bool)
        for _ in range(64):
            r = (T + k[:, None] * B) * (1.0 + (k[:, None] + 4.0) * _REPEAT_ULP)
            ok = np.all((r <= curve) | np.isinf(curve), axis=1)
            if ok.all() or not (k[~ok] > 0).any():
                break
            k = np.where(ok, k, np.floor(k * 0.5))
    return np.where(ok, k, 0.0)


def _span(rows: np.ndarray) -> slice | np.ndarray:
    """``rows`` as a slice when they are consecutive (a view instead of a gathered copy)."""
    if rows.size and rows[-1] - rows[0] == rows.size - 1 and np.all(np.diff(rows) == 1):
        return slice(int(rows[0]), int(rows[-1]) + 1)
    return rows


class Projections(Mapping[str, Projection]):
    """What one entry would make of the loss toward each target it touches, computed lazily.

    The composed curves and budgets are arrays; :meth:`violations` decides which targets go over
    budget without converting every curve: the improved rule's ε is a minimum over the orders, so
    its value at **any one** order bounds it from above — a target whose value at its last best
    order is under its budget (by a relative 1e-9, without the comparison slack) cannot be over it
    — the same elementwise arithmetic as the full conversion.  Targets that check leaves (all of
    them at a node's first charge of a run, when no best order is known) are next bounded all at once
    by their pointwise maximum curve (:meth:`_cleared_by_maximum`).  Every other target is
    converted exactly (:meth:`LedgerState.convert_rows`), so every reported number and every
    decision is the exact conversion's.  Reading an item converts every target exactly.
    """

    def __init__(self, state: LedgerState, costs: Costs):
        self.state = state
        self.costs = costs
        keys = costs.keys_
        self.version = state.version
        rows = state._rows(keys, create=False)
        known = rows >= 0
        r = np.where(known, rows, 0)
        # the composed curve as the scalar path summed it: the stored sum + this cost (0.0 + cost
        # for a new target)
        if known.all():
            self.rdp = state._rdp[_span(rows)] + costs.rdp
        elif not known.any():  # a run's first charge toward new targets: no stored row to gather
            self.rdp = np.add(0.0, costs.rdp)
        else:
            self.rdp = np.where(known[:, None], state._rdp[r], 0.0) + costs.rdp
        n_e = np.where(known, state._n_entries[r], 0) + 1
        n_g = np.where(known, state._n_gdp[r], 0) + costs.has_mu
        gsq_prev = np.where(known, state._gdp_sq[r], 0.0)
        self.gdp_sq = gsq_prev + np.where(costs.has_mu, costs.mu * costs.mu, 0.0)
        self.gdp_ok = n_g == n_e
        self.hints = np.where(known, state._hint[r], -1)
        self.be, self.deltas, curves, has_curve = state.budget_arrays(costs)
        if curves is None:
            self.curve_bad = np.zeros(len(keys), dtype=bool)
        else:
            self.curve_bad = has_curve & np.any(self.rdp > curves * (1 + _RTOL), axis=1)
        self._exact: dict[str, Projection] | None = None

    def _convert_arrays(self, sel: np.ndarray) -> tuple[np.ndarray, list[str], list[float | None]]:
        """Exact ε, method and best order of the rows ``sel`` (arrays/lists in ``sel``'s order); notes
        each row's best order as its hint for the next quick check."""
        eps, methods, orders, hint = self.state.convert_rows(
            self.rdp[sel], self.gdp_sq[sel], self.gdp_ok[sel], self.deltas[sel]
        )
        self.hints[sel] = np.where(hint >= 0, hint, self.hints[sel])
        return eps, methods, orders

    def _projection(self, i: int, eps: float, method: str, order: float | None) -> Projection:
        return (
            float(eps),
            method,
            order,
            float(self.be[i]),
            float(self.deltas[i]),
            bool(self.curve_bad[i]),
        )

    def _convert(self, sel: np.ndarray) -> dict[int, Projection]:
        eps, methods, orders = self._convert_arrays(sel)
        return {
            int(i): self._projection(i, eps[j], methods[j], orders[j]) for j, i in enumerate(sel)
        }

    def violations(self) -> dict[str, Projection]:
        """The targets over their (ε, δ) budget or their RDP curve, with exact projections, in
        the entry's order."""
        thr = self.be * (1 + _RTOL)
        need = np.isfinite(thr) | self.curve_bad
        cand = np.flatnonzero(need & (self.hints >= 0) & ~self.curve_bad)
        if cand.size:  # quick check at each target's last best order (an upper bound on ε)
            j = self.hints[cand]
            a = self.state.orders[j]
            ub = np.empty(cand.size)
            for d in np.unique(self.deltas[cand]):
                s = self.deltas[cand] == d
                r = self.rdp[cand[s], j[s]][:, None]
                ub[s] = _rule(a[s][:, None], r, float(d), "improved")[0]
            # within budget with room to spare: the exact ε (≤ ub) cannot be over it even if a
            # math kernel rounded the two evaluations of the same element differently
            need[cand[ub <= self.be[cand] * (1 - _MARGIN)]] = False
        sel = np.flatnonzero(need)
        if sel.size >= _DOMINATING_MIN_ROWS:
            sel = sel[~self._cleared_by_maximum(sel)]
        if not sel.size:
            return {}
        # exact conversion of every target the quick check could not clear (a node's first charge of a
        # run: all of them, no best order known yet), but a projection tuple only for those over budget:
        # building n tuples of Python floats took longer than the conversion (≈ 24 of 45 ms at n = 1024)
        eps, methods, orders = self._convert_arrays(sel)
        over = (eps > self.be[sel] * (1 + _RTOL)) | self.curve_bad[sel]
        keys = self.costs.keys_
        return {
            keys[i]: self._projection(i, eps[j], methods[j], orders[j])
            for j, i in enumerate(sel)
            if over[j]
        }

    def _cleared_by_maximum(self, sel: np.ndarray) -> np.ndarray:
        """Which of the rows ``sel`` are proven within their (ε, δ) budget by one conversion of their
        pointwise maximum curve (per distinct δ): :func:`~hushnet.privacy.conversions.rdp_epsilon_dominating`
        bounds the exact ε of every curve under that maximum, so a row whose budget is above the
        bound (with its rounding margin) cannot be over it — whatever the GDP side says, as the
        ledger's ε is the smaller of the two.  Rows over their RDP budget curve are never cleared
        (they are violations whatever their ε), nor rows whose budget the bound does not meet: they are
        converted exactly, as before, so every decision and every reported number is the exact path's.

        Why: a node's first charge of a run knows no best order toward any target (no hint), so every
        target was converted exactly — (n − 1) × 159 orders, most of the first charge at n = 2048
        (issue 12).  A cleared row with no hint takes the maximum's best order as its hint: the quick
        check at the next charge is sound at any order (a value at one order bounds the minimum).  So
        does a cleared row whose old hint failed the quick check: kept, it failed again at every later
        charge and sent the row back here (297 maximum conversions in 300 hops of a 90-target walk whose
        cost piles up at the first hint's orders; 4 with the maximum's order)."""
        cleared = np.zeros(sel.size, dtype=bool)
        free = ~self.curve_bad[sel]
        deltas = self.deltas[sel]
        for d in np.unique(deltas[free]):
            m = free & (deltas == d)
            g = np.arange(sel.size) if m.all() else np.flatnonzero(m)
            rows = sel[g]
            r = self.rdp[_span(rows)] if g.size == sel.size else self.rdp[rows]
            bound, j, scale = rdp_epsilon_dominating(self.state.orders, r.max(axis=0), float(d))
            if not math.isfinite(bound):
                continue
            ok = bound + _MARGIN * scale <= self.be[rows]
            cleared[g[ok]] = True
            # the maximum's best order, also over a hint the quick check just failed at (a stale one
            # would send the row here again at every later charge)
            self.hints[rows[ok]] = j
        return cleared

    def _all(self) -> dict[str, Projection]:
        if self._exact is None:
            exact = self._convert(np.arange(len(self.costs)))
            self._exact = {k: exact[i] for i, k in enumerate(self.costs.keys_)}
        return self._exact

    def __getitem__(self, t: str) -> Projection:
        return self._all()[t]

    def __iter__(self):
        return iter(self.costs.keys_)

    def __len__(self) -> int:
        return len(self.costs)
