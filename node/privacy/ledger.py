"""A node's privacy ledger: what it has leaked to every other node, and its budget.

Pairwise network DP gives every (contributor, observer) pair its own loss, so a node keeps one
loss **per observer**.  :class:`Ledger` is what the node holds: it refuses any charge that would
push the loss toward **any** target over the configured budget — the refusal is atomic, so a
refused charge leaves no trace — and persists every accepted one before it counts.

It joins two parts kept apart so that the accountant's arithmetic carries no I/O:

* :mod:`hushnet.privacy.ledger_math` — entries, budgets, composition (RDP adds per order, GDP in
  quadrature), the (ε, δ) conversion and the budget check (pure, no sqlite3);
* :mod:`hushnet.privacy.ledger_store` — the SQLite file (WAL), so a node restarting mid-run
  still knows what it has spent.

A lock makes a ledger safe to share between threads of one process.  The value types and errors
are re-exported here (``from hushnet.privacy.ledger import PrivacyEntry`` keeps working).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hushnet.privacy.distinct import Converted
from hushnet.privacy.ledger_math import (
    BOUND_LABELS,
    BudgetExceeded,
    LedgerBudget,
    LedgerError,
    LedgerState,
    PrivacyEntry,
    RepeatKey,
    Spent,
    SpentColumns,
    StoredBudgetError,
    as_key,
    check_budget,
    check_orders,
)
from hushnet.privacy.ledger_store import LedgerStore

__all__ = [
    "BOUND_LABELS",
    "LedgerError",
    "StoredBudgetError",
    "BudgetExceeded",
    "PrivacyEntry",
    "RepeatKey",
    "LedgerBudget",
    "Spent",
    "SpentColumns",
    "Ledger",
]


def _GONE() -> None:  # noqa: N802 - stands for a weak reference whose key is gone
    """What :attr:`Ledger._last_key` holds before any charge: a dead reference (no other run's key)."""
    return None


@dataclass
class _Repeats:
    """The charges a :class:`RepeatKey` may still make without a budget check, and those made since the
    totals were last composed (see :meth:`Ledger.charge_repeat`)."""

    key: weakref.ref
    block: int  # the stored block every repeated charge points at
    bound: str
    left: int  # proven within budget (LedgerState.repeat_allowance), counted down
    pending: int = 0  # recorded in the file, not yet added to the totals


class Ledger:
    """Persistent, thread-safe privacy ledger of one node (see the module docstring).

    ``path`` is an SQLite file (``":memory:"`` allowed).  ``orders`` defaults to
    :data:`~hushnet.privacy.conversions.DEFAULT_ORDERS`; a file remembers its orders and refuses to
    be reopened with others.  A ``budget`` given here replaces the stored one; otherwise the stored
    one (if any) is used.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        orders=None,
        budget: LedgerBudget | None = None,
        node_id: str = "",
    ):
        self._lock = threading.RLock()
        #: the key of the last charge (``None``: it had none; a reference that answers ``None``: no charge
        #: yet here, or its key is gone) — a keyed charge after it or after its own key proves an allowance
        self._last_key: weakref.ref | None = _GONE
        self._repeats: _Repeats | None = None
        self._path = str(path)
        self._store = LedgerStore(self._path)
        with self._lock:
            stored = self._store.orders()
            if stored is None:
                self.orders = check_orders(orders)
                self._store.init_meta(self.orders, node_id)
            else:
                self.orders = stored
                if orders is not None and not np.array_equal(
                    np.asarray(orders, dtype=float), self.orders
                ):
                    raise LedgerError("this ledger file was created with other Rényi orders")
            self.node_id = self._store.meta("node_id") or node_id
            self._state = self._load(read_budget=budget is None)
            if budget is not None:
                self.set_budget(budget)

    def _load(self, read_budget: bool = True) -> LedgerState:
        state = LedgerState(self.orders, self.node_id)
        for bound, costs in self._store.replay(len(self.orders)):
            state.add_costs(costs, bound)
        if read_budget:  # else the caller replaces it: a bad stored one can be overwritten
            state.budget = self._store.read_budget()
            # a stored value an older build let through (a NaN ε …): refused in one line, not ignored
            if state.budget is not None:
                try:
                    check_budget(state.budget, self.orders)
                except LedgerError as exc:
                    raise StoredBudgetError(f"stored {exc}: set the budget again") from None
        return state

    # ---------------------------------------------------------------- budget
    @property
    def budget(self) -> LedgerBudget | None:
        return self._state.budget

    def set_budget(self, budget: LedgerBudget) -> None:
        """Replace the stored budget (persisted).  Existing spending is not re-checked."""
        check_budget(budget, self.orders)
        with self._lock:
            self._settle()
            self._repeats = None  # proven against the old budget
            self._store.write_budget(budget)
            self._state.budget = self._store.read_budget()

    # ---------------------------------------------------------------- public API
    def would_exceed(self, entry: PrivacyEntry) -> dict[str, float]:
        """Targets whose budget the entry would break, mapped to the would-be ε (empty: it fits)."""
        with self._lock:
            self._settle()
            proj = self._state.projection(self._state.validate(entry))
        return {t: p[0] for t, p in LedgerState.violations(proj).items()}

    def charge(
        self,
        entry: PrivacyEntry,
        *,
        enforce_budget: bool = True,
        report: bool = True,
        repeat: RepeatKey | None = None,
    ) -> dict[str, Spent]:
        """Record the entry, or raise :class:`BudgetExceeded` (recording nothing) if it would exceed
        the budget toward any node.  Returns the new loss toward every target it touched (``report=False``:
        an empty dict — a run's per-hop charge skips converting every target's curve a second time).

        ``enforce_budget=False`` records spending that has already happened (e.g. the top-up after a
        walk deviated: the data were used, so the ledger must say so even past the budget).  It is
        never a way to release more; callers check :meth:`would_exceed` before any release.

        ``repeat``: the caller promises that every charge with this key has this entry's costs (see
        :class:`RepeatKey`); unless the last charge had another live key or none, the ledger proves how
        many more fit the budget, and :meth:`charge_repeat` records them without checking each."""
        with self._lock:
            self._settle()
            self._repeats = None  # proven for totals this charge changes
            costs = self._state.validate(entry)
            proj = self._state.projection(costs)
            bad = LedgerState.violations(proj)
            if bad and enforce_budget:
                raise LedgerState.refusal(bad, entry.run_id)
            eid = self._store.append(
                entry, costs
            )  # persisted before it counts: a crash loses nothing
            self._state.add_costs(costs, entry.bound, proj)
            last, self._last_key = self._last_key, None
            if repeat is not None and entry.gdp_mu is None and enforce_budget:
                self._last_key = weakref.ref(repeat)
                # worth proving an allowance unless another run's charges come between (two runs
                # alternating at a node would prove one at every charge and use none of it)
                if last is not None and ((k := last()) is None or k is repeat):
                    left = self._state.repeat_allowance(costs)
                    if left > 0:
                        block = self._store.block_of(eid)
                        self._repeats = _Repeats(self._last_key, block, entry.bound, left)
            if not report:
                return {}
            return self._state.spent_many(costs.keys_, proj.deltas)

    def charge_repeat(
        self, repeat: RepeatKey, run_id: str, protocol: str, view_model: str, note: str = ""
    ) -> bool:
        """Charge once more what the last :meth:`charge` with ``repeat`` charged, if it is proven within
        budget; ``False`` (nothing recorded) when it is not — the caller then charges the entry itself.

        Why: at n = 2048 a walk hop's charge checked and composed 2 047 targets' totals (~4 ms, most of
        a hop).  A charge made here is durable before it returns (the file gets the entry and a reference
        to the stored block: exactly what :meth:`charge` writes for a repeated block) and is composed into
        the totals when anything reads them; the allowance it draws on was proven by
        :meth:`LedgerState.repeat_allowance` for totals no other charge has changed since (any other
        charge or a new budget drops it)."""
        with self._lock:
            r = self._repeats
            if r is None or r.left <= 0 or r.key() is not repeat:
                return False
            self._store.append_repeat(run_id, protocol, view_model, r.bound, note, r.block)
            r.left -= 1
            r.pending += 1
            return True

    def prepare_repeat(self, entry: PrivacyEntry, repeat: RepeatKey) -> int:
        """Prove before any charge how many charges of ``entry``'s costs fit every target's budget, and
        store its block, so that :meth:`charge_repeat` with ``repeat`` charges even the first of them by
        reference; returns that number (0: none proven, nothing changes — the charges take the exact
        path).  Records no charge.

        Why: a node proving it at its first visit did O(n) work on the walk's critical path (issue 12:
        ~9 ms a first visit at n = 2048, most of a walk's first-visit phase); the node accepting a run
        can do it before the run starts.  Any charge made before the first by reference drops it, as
        for an allowance proven at a charge."""
        with self._lock:
            self._settle()
            if entry.gdp_mu is not None:
                return 0
            costs = self._state.validate(entry)
            left = self._state.repeat_allowance(costs)
            if left <= 0:
                return 0
            block = self._store.put_block(costs)
            self._repeats = _Repeats(weakref.ref(repeat), block, entry.bound, left)
            self._last_key = weakref.ref(repeat)
            return left

    def _settle(self) -> None:
        """Compose the repeated charges recorded since the totals were last read (caller holds the
        lock): the stored block added once per charge, in order — the same sums, bit for bit, as
        charging each one through :meth:`charge` (and as a reopened ledger's replay)."""
        r = self._repeats
        if r is None or not r.pending:
            return
        costs = self._store.block_costs(r.block, len(self.orders))
        while r.pending:  # one at a time: an error midway leaves the count of those not yet added
            self._state.add_costs(costs, r.bound)
            r.pending -= 1

    def spent(self, target=None, delta: float | None = None) -> Spent | dict[str, Spent]:
        """The composed (ε, δ) loss toward ``target`` (or every target), at ``delta`` (default:
        the budget's δ for that target, else 1e-6)."""
        with self._lock:
            self._settle()
            if target is not None:
                t = as_key(target)
                return self._state.spent(
                    t, self._state.default_delta(t) if delta is None else delta
                )
            return self.spent_columns(delta).as_spent()

    def spent_columns(
        self, delta: float | None = None, known: Converted | None = None
    ) -> SpentColumns:
        """:meth:`spent` toward every target as columns (sorted keys; the same numbers bit for bit),
        for callers that serialise them: a report, the ledger command (issue 12: at n = 2048 one
        :class:`Spent` per target cost as much as the conversion).  ``known``: a conversion the caller
        made of curves that may be these totals (see :meth:`LedgerState.spent_columns`)."""
        with self._lock:
            self._settle()
            keys = self._state.targets()  # every one has spending
            return self._state.spent_columns(keys, self._state.deltas(keys, delta), known)

    def rdp(self, target) -> np.ndarray:
        """The composed RDP curve toward ``target`` (zeros if nothing was spent)."""
        with self._lock:
            self._settle()
            return self._state.rdp(as_key(target))

    def remaining(self, targets: Iterable | None = None) -> dict[str, float]:
        """ε left toward each target (budget ε − spent ε at the budget's δ; ∞ without a budget).

        Covers the targets with a per-node budget or spending, plus ``targets`` if given.
        """
        with self._lock:
            self._settle()
            return self._state.remaining(targets)

    def entries(self, run_id: str | None = None) -> list[dict]:
        """The recorded entries (metadata and per-target costs), oldest first."""
        with self._lock:
            return self._store.entries(run_id)

    def entry_counts(self) -> list[tuple[str, str, int]]:
        """``(run_id, protocol, entries)`` per run, oldest run first, without reading the costs."""
        with self._lock:
            return self._store.entry_counts()

    def close(self) -> None:
        with self._lock:
            self._store.close()

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
