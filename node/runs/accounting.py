"""Turn a machine's ledger actions into charges on the node's persistent privacy ledger.

A walk machine emits one :class:`~hushnet.engine.actions.LedgerEntry` per visit that used the node's
data.  The certified random-walk bound (random-walk paper, Thm 3, exact horizon, with the spec's
noise condition) is *linear in the number of contributions*: ``ε_{u→v}(α) = N_u · α · s_{uv}/σ²``.
So charging every contribution with the per-contribution row ``α·s_{u,:}/σ²`` composes on the
ledger to exactly the run-level value the node projected when it accepted the run — the ledger is
exact contribution by contribution, and a stopped run has charged exactly what it used.

Per order the charge is ``min(walk bound, α/(2σ²))``: the second is the Gaussian RDP of the noisy
contribution seen in the clear (post-processing), valid at every order and for every walk, so it
also covers orders above the noise condition's α_max.  Everything here is "certified"; the paper's
Theorem 3 values are computed separately (:func:`hushnet.families.walk.accounting.paper_row`) and
labelled "paper".  This module holds what every family shares: the per-contribution cost
(:class:`ContributionCost`, the local-DP default), the ledger's RDP → (ε, δ) rule, and the entry
points that ask the protocol's family.
"""

from __future__ import annotations

import collections
import math
import os
import threading
import weakref
from dataclasses import dataclass, field

import numpy as np

from hushnet.engine.actions import LedgerEntry as EngineEntry
from hushnet.privacy.conversions import DEFAULT_ORDERS, rdp_to_dp
from hushnet.privacy.distinct import Converted, convert_distinct
from hushnet.privacy.ledger import PrivacyEntry
from hushnet.privacy.ledger_math import FrozenCurves, RepeatKey, as_key, sealed
from hushnet.runs.spec import RunSpec

#: megabytes of per-σ cost rows one process keeps for the nodes it hosts (the rows of the nodes charged
#: last; others are built again when asked — the same bits, from the same slopes)
ROWS_ENV = "HUSHNET_COST_ROWS_MB"
ROWS_MB_DEFAULT = 64.0

_ROWS_LOCK = threading.Lock()
#: (id of the cost, σ) → (weak reference to the cost, its sealed rows, their FrozenCurves map)
_ROWS: "collections.OrderedDict[tuple[int, float], tuple[weakref.ref, np.ndarray, FrozenCurves]]" = collections.OrderedDict()
_ROWS_BYTES = [0]


def rows_limit() -> int:
    """Bytes of cost rows a process keeps (``HUSHNET_COST_ROWS_MB``, default 64; a one-line error if bad)."""
    raw = os.environ.get(ROWS_ENV, "").strip()
    try:
        mb = float(raw) if raw else ROWS_MB_DEFAULT
    except ValueError:
        mb = -1.0
    if not mb >= 0 or not math.isfinite(mb):
        raise ValueError(f"{ROWS_ENV} must be a number of megabytes >= 0, got {raw!r}")
    return int(mb * 2**20)


def rows_held() -> tuple[int, int]:
    """``(entries, bytes)`` of cost rows this process keeps (a benchmark's and a test's view)."""
    with _ROWS_LOCK:
        return len(_ROWS), _ROWS_BYTES[0]


@dataclass(eq=False)
class ContributionCost:
    """Per-contribution certified RDP curves of one node toward every other node (rows = targets).

    ``curves[j]`` is the curve toward ``targets[j]`` on ``orders``, for a contribution with noise
    multiplier ``sigma`` (any multiplier: the slopes are per unit of 1/σ²).

    The cost keeps its slopes, not its curves: :meth:`rows` are built when a charge (or a report) asks and
    kept in one bounded cache per process (:data:`ROWS_ENV`), because at n = 2048 a node's rows are
    2.6 MB and a host kept them for every node it hosts for the whole run while a walk charges one node
    at a time (issue 12).  Built again, they are the same bits: an element-wise function of the slope.
    """

    targets: list[str]
    orders: np.ndarray
    walk_slope: (
        np.ndarray | None
    )  # s_{u,v}: RDP per unit α at σ = 1 (None: local-DP accounting only)
    alpha_max: float
    bound_name: str
    _keys: tuple[str, ...] | None = field(default=None, init=False, repr=False)
    _repeat: dict = field(default_factory=dict, init=False, repr=False)

    def repeat_key(self, sigma: float) -> RepeatKey:
        """The ledger's :class:`~hushnet.privacy.ledger_math.RepeatKey` of a contribution with noise
        multiplier ``sigma``: every :meth:`entry` at that σ charges the same rows (an element-wise
        function of the slope, the orders and σ — built again, the same bits), so a walk's later visits
        are charged by reference (issue 12)."""
        key = self._repeat.get(float(sigma))
        if key is None:
            key = self._repeat[float(sigma)] = RepeatKey(f"{self.bound_name} at sigma={sigma:g}")
        return key

    def curves(self, sigma: float) -> np.ndarray:
        """(targets, orders) certified RDP of one contribution with noise multiplier ``sigma``.

        Computed once per distinct slope (by its bits) and gathered: the same element-wise arithmetic on
        the same values, so the same bits as computing every target's row (a hypercube:11 row has a few
        hundred distinct slopes among 2 047: 3.4 → ~1 ms)."""
        if not sigma > 0 or not math.isfinite(sigma):
            raise ValueError(f"cannot account a contribution with noise multiplier {sigma}")
        ldp = self.orders / (2.0 * sigma**2)
        if self.walk_slope is None:
            return np.array(np.broadcast_to(ldp, (len(self.targets), self.orders.size)))
        slope = np.ascontiguousarray(self.walk_slope, dtype=np.float64)
        bits, inv = np.unique(slope.view(np.uint64), return_inverse=True)
        vals = bits.view(np.float64)
        walk = vals[:, None] * self.orders[None, :] / sigma**2
        walk = np.where(self.orders[None, :] <= self.alpha_max, walk, np.inf)
        return np.minimum(walk, ldp[None, :])[inv.reshape(-1)]

    def rows(self, sigma: float) -> np.ndarray:
        """:meth:`curves` of ``sigma``, sealed: what every contribution with that noise multiplier charges
        (the driver's replay log sums them when the run's row is asked for)."""
        return self._rows_and_map(sigma)[0]

    def _rows_and_map(self, sigma: float) -> tuple[np.ndarray, FrozenCurves]:
        # σ as a Python float: a NumPy float32 σ would share this cache key (and the ledger's repeat key)
        # with its float64 value while its rows, computed in float32, differ
        sigma = float(sigma)
        key = (id(self), sigma)
        with _ROWS_LOCK:
            hit = _ROWS.get(key)
            if hit is not None and hit[0]() is self:
                _ROWS.move_to_end(key)
                return hit[1], hit[2]
        if self._keys is None:
            self._keys = tuple(as_key(t) for t in self.targets)
        rdp = sealed(self.curves(sigma))  # read-only for good: shared, and memoised by the ledger
        curves = FrozenCurves(self._keys, rdp)
        limit = rows_limit()
        with _ROWS_LOCK:
            old = _ROWS.pop(key, None)
            if old is not None:
                _ROWS_BYTES[0] -= old[1].nbytes
            _ROWS[key] = (weakref.ref(self), rdp, curves)
            _ROWS_BYTES[0] += rdp.nbytes
            while _ROWS_BYTES[0] > limit and len(_ROWS) > 1:
                _, gone = _ROWS.popitem(last=False)
                _ROWS_BYTES[0] -= gone[1].nbytes
        return rdp, curves

    def note(self, ev: EngineEntry) -> str:
        """The ledger note of the contribution ``ev`` (what :meth:`entry` and a charge by reference say)."""
        return f"{ev.kind} contribution at step {ev.step} ({self.bound_name})"

    def entry(self, ev: EngineEntry, run_id: str, node_id: str) -> PrivacyEntry:
        # every hop of a run charges the same rows (one σ): a frozen map over the sealed rows, which the
        # ledger takes as validated when the very same map comes again
        rows, curves = self._rows_and_map(ev.sigma)
        return PrivacyEntry(
            run_id,
            ev.protocol,
            ev.view_model,
            "certified",
            curves,
            None,
            self.note(ev),
            rows,
        )


def contribution_cost(spec: RunSpec, vertex: int, ids: list[str], W=None, orders=None):
    """The certified per-data-action cost of node ``vertex`` in ``spec``'s run (a :class:`RunCost`, built by
    the protocol's family); ``ids[v]`` names vertex v."""
    from hushnet.families import family_of

    return family_of(spec.protocol).cost(spec, vertex, ids, W, orders)


def local_dp_cost(vertex: int, ids: list[str], orders=None) -> ContributionCost:
    """The contribution seen in the clear (Gaussian RDP α/(2σ²)): sound for every protocol."""
    o = np.asarray(DEFAULT_ORDERS if orders is None else orders, dtype=float)
    targets = [ids[v] for v in range(len(ids)) if v != vertex]
    return ContributionCost(
        targets, o, None, math.inf, "local-DP Gaussian bound (contribution seen in the clear)"
    )


def dp_from_rdp(orders: np.ndarray, rdp: np.ndarray, delta: float) -> float:
    """The ledger's conversion (hushnet's one RDP → (ε, δ) rule, dp-accounting's improved one), 0 for an empty curve."""
    if not np.any(rdp > 0):
        return 0.0
    return float(rdp_to_dp(orders, rdp, delta)[0])


def dp_from_rdp_rows(orders: np.ndarray, rdp: np.ndarray, delta: float) -> np.ndarray:
    """:func:`dp_from_rdp` of every row of ``rdp`` in one vectorised conversion (a node's report
    converts its run's curve toward every other node: n scalar conversions stalled a host of
    hundreds of nodes past the report call's deadline).

    Each distinct curve is converted once: a node's run row repeats its curves (the walk on a
    hypercube at n = 2048: ~460 distinct of 2 047, targets at equal distance), and the conversion was
    most of a report's CPU.  The result is the same, bit for bit: a curve's conversion depends on its
    own values only, and curves count as the same only when every bit is (tests compare)."""
    r = np.asarray(rdp, dtype=float)
    if r.shape[0] == 0:
        return np.zeros(0)
    return dp_from_converted(convert_distinct(orders, r, delta))


def dp_from_converted(conv: Converted) -> np.ndarray:
    """:func:`dp_from_rdp_rows` of a conversion already made (a report keeps it for its lifetime totals)."""
    return np.where(conv.spends(), conv.epsilon(), 0.0)


def paper_bound(
    spec: RunSpec, vertex: int, contributions: float, W=None
) -> tuple[np.ndarray, str] | None:
    """The paper's value of this node's row, best order, and the label that says which bound it is
    ("paper": a labelled reproduction, never a guarantee); None when the protocol has none."""
    from hushnet.families import family_of

    return family_of(spec.protocol).paper_bound(spec, vertex, contributions, W)


__all__ = [
    "ROWS_ENV",
    "rows_held",
    "rows_limit",
    "paper_bound",
    "ContributionCost",
    "contribution_cost",
    "local_dp_cost",
    "dp_from_rdp",
    "dp_from_rdp_rows",
    "dp_from_converted",
]
