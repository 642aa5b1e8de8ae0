"""Synchronous gossip protocols (Muffliato Alg. 1 and 3, Koskela–Kulkarni streaming gossip) as sans-IO machines.

Every node adds Gaussian noise to what it shares — once (averaging) or at every gradient step /
round (learning) — and then repeatedly averages with its neighbours.  All of these are the same
*round machine* with a different injection rule, so this module holds one :class:`GossipMachine`
that owns everything about a round over a real network, and three thin protocol classes:

* :class:`MuffliatoAveraging` — [M] Alg. 1: ``x⁰ = x + η`` once, then T rounds of ``W``, plain or
  Chebyshev-accelerated (Def. 3 initialisation: ``x¹ = W x⁰``, so the mean is preserved exactly);
* :class:`MuffliatoGD` — [M] Alg. 3: a local noisy gradient step, then K (accelerated) gossip rounds,
  repeated; the graph may be a fresh public Erdős–Rényi draw per step (the paper's Fig. 1c);
* :class:`StreamingGossip` — [K] §5: fresh noise every round, ``θ ← W(θ + x + u)``.

**The round over a network** (docs/design/spec/gossip.md §4.2).  Round t has two phases:

1. *availability*: the node sends ``AVAIL(t, up)`` to its round-t neighbours (``up = 0`` announces a
   dropout) and waits for theirs, or for a timeout; ``H`` = neighbours heard as up.
2. *values*: to every neighbour in ``H`` it sends ``VALUE(t, |H|, m)``, to every other one ``SKIP(t)``;
   it waits for a VALUE or SKIP from every neighbour it heard from in phase 1 (or a timeout), so no
   phase-2 message of a live neighbour ever arrives after the round closed.  The edge {i, j} is used iff
   both sent each other VALUE, and its weight ``1/(1 + max(|H_i|, |H_j|))`` is computed from the two
   announced degrees — the same number on both ends, so the effective ``W_t`` is symmetric and doubly
   stochastic (the self-weight takes the rest, and ``|used| ≤ |H|`` keeps it positive).

A node computes round t+1 only after round t is closed; messages for later rounds are buffered (up
to ``max_ahead`` rounds), messages for closed rounds or phases are refused with a typed
:class:`~hushnet.engine.actions.Fault`, never silently used.  A neighbour that misses ``give_up_after``
consecutive rounds is declared gone (a :class:`~hushnet.engine.actions.Deviation`) and no longer awaited,
so a node that leaves mid-run costs a few timeouts, never a hang.

**The schedule goes into the ledger.**  Every round closes with a ``LedgerEntry(kind="schedule")``
holding the node's actual row of ``W_t`` and the list of neighbours it sent its message to.  The
accountant (:mod:`hushnet.families.gossip.realised`) rebuilds the realised ``W_0..W_{T-1}`` and every
observer's view from these entries, so what is certified is what really happened.  Views are built
from *sender-side* records: a value a receiver refused as late is still in its view.

**Secure neighbourhood summation** (:mod:`hushnet.families.gossip.secure`, attached with
``attach_secure`` before the machine starts): phase 2 sends ``JOIN(t, |H|)`` — the VALUE message
without the value — and a third phase runs one SecAgg sum per node over the neighbours that joined;
the round closes when the node's own sum is released (its row = the survivors) or aborted (row
empty: the node keeps its own value).  A plain VALUE is then refused, never mixed in, and the
observer learns only its sums (``S = e_iᵀ``; still certified with the neighbourhood view because of
the members' fixed-point rounding, see :mod:`hushnet.families.gossip.secure`).  The node heartbeats while its sum runs, and
after the last round it stays until its memberships in its neighbours' last sums are done.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, ClassVar, Sequence

import numpy as np
import scipy.sparse as sp

from hushnet.engine.actions import (
    Action,
    CancelTimer,
    Deviation,
    Finish,
    LedgerEntry,
    Metric,
    Send,
    SetTimer,
)
from hushnet.engine.errors import (
    MalformedMessage,
    ProtocolError,
    ReplayedMessage,
    UnexpectedSender,
)
from hushnet.engine.protocol import NodeContext, Protocol
from hushnet.families.gossip.params import GOSSIP_STREAM, MUFFLIATO, MUFFLIATO_GD, GossipOptions
from hushnet.families.gossip.wire import (
    KIND_AVAIL,
    KIND_HEARTBEAT,
    KIND_JOIN,
    KIND_SKIP,
    KIND_VALUE,
    SECURE_KINDS,
    decode_round,
    encode_round,
)
from hushnet.tasks.base import GradientTask, Task, TaskError, ValueTask

__all__ = [
    "StaleRound",
    "FutureRound",
    "Topology",
    "FixedTopology",
    "ERPerStep",
    "GossipMachine",
    "MuffliatoAveraging",
    "MuffliatoGD",
    "StreamingGossip",
    "mh_weight",
    "connected_er",
    "er_graph",
    "t_stop",
]


class StaleRound(ProtocolError):
    """A round message for a round (or phase) this node has already closed."""

    code = "stale-round"


class FutureRound(ProtocolError):
    """A round message too far ahead of this node's round to be a legitimate early arrival."""

    code = "future-round"


def mh_weight(deg_a: int, deg_b: int) -> float:
    """Metropolis–Hastings ("hamilton") weight of an edge from the two effective degrees."""
    return 1.0 / (1.0 + max(int(deg_a), int(deg_b)))


# ---- public topologies --------------------------------------------------------------------------


class Topology:
    """Who a node's neighbours are in round t, from public information only."""

    n: int

    def neighbours(self, node: int, rnd: int) -> np.ndarray:  # pragma: no cover - interface
        raise NotImplementedError

    def step_of(self, rnd: int) -> int:
        return 0

    def neighbour_set(self, node: int, rnd: int) -> frozenset[int]:
        """Round-t neighbours as a set (cached per graph: validating a sender is a hash lookup)."""
        key = (node, self.step_of(rnd))
        cache = self.__dict__.setdefault("_sets", {})
        s = cache.get(key)
        if s is None:
            if len(cache) > 4:
                cache.clear()
            s = cache[key] = frozenset(int(j) for j in self.neighbours(node, rnd))
        return s


class FixedTopology(Topology):
    """One public graph for the whole run (its adjacency; self-loops ignored)."""

    def __init__(self, adjacency: sp.spmatrix | np.ndarray) -> None:
        A = sp.csr_matrix(adjacency)
        A = (A != 0).astype(np.int8).tolil()
        A.setdiag(0)
        self.adj = A.tocsr()
        self.adj.eliminate_zeros()
        self.adj.sort_indices()
        self.n = self.adj.shape[0]

    def neighbours(self, node: int, rnd: int) -> np.ndarray:
        a = self.adj
        return a.indices[a.indptr[node] : a.indptr[node + 1]]


@lru_cache(maxsize=64)
def connected_er(n: int, q: float, seed: int) -> sp.csr_matrix:
    """A connected G(n, q) drawn from public seeds ``seed, seed+1, …`` (first connected draw wins).

    Deterministic in (n, q, seed), so every node computes the same graph; cached because every
    machine of a simulated run asks for it.
    """
    import networkx as nx

    s = int(seed)
    for _ in range(1000):
        g = nx.fast_gnp_random_graph(n, q, seed=s)
        if nx.is_connected(g):
            return (
                nx.to_scipy_sparse_array(g, nodelist=range(n), format="csr").astype(np.int8).tocsr()
            )
        s += 1_000_003
    raise ValueError(f"G({n}, {q}) never connected in 1000 draws: raise q")


@lru_cache(maxsize=64)
def er_graph(n: int, q: float, seed: int) -> sp.csr_matrix:
    """G(n, q) from a public seed, connected or not (the dropout experiment's per-round graphs)."""
    import networkx as nx

    g = nx.fast_gnp_random_graph(n, q, seed=int(seed))
    return nx.to_scipy_sparse_array(g, nodelist=range(n), format="csr").astype(np.int8).tocsr()


class ERPerStep(Topology):
    """A fresh public Erdős–Rényi graph per gradient step ([M] §5, Fig. 1c) or per round ([M] App. H.6).

    ``rounds_per_step[r]`` rounds use graph r, drawn with seed ``seed·1_000_003 + r``; ``connected``
    re-draws until connected (Fig. 1c) — the dropout experiment's sparse graphs are used as drawn.
    """

    def __init__(
        self, n: int, q: float, seed: int, rounds_per_step: Sequence[int], connected: bool = True
    ) -> None:
        self.n, self.q, self.seed = int(n), float(q), int(seed)
        self.connected = bool(connected)
        self.ks = [int(k) for k in rounds_per_step]
        self._starts = np.cumsum([0] + self.ks)

    def graph(self, step: int) -> sp.csr_matrix:
        draw = connected_er if self.connected else er_graph
        return draw(self.n, self.q, self.seed * 1_000_003 + int(step))

    def step_of(self, rnd: int) -> int:
        return int(np.searchsorted(self._starts, rnd, side="right") - 1)

    def neighbours(self, node: int, rnd: int) -> np.ndarray:
        a = self.graph(self.step_of(rnd))
        return a.indices[a.indptr[node] : a.indptr[node + 1]]


# ---- the round machine --------------------------------------------------------------------------

_A, _B, _C, _Z = (
    0,
    1,
    2,
    3,
)  # phases: availability, values (or joins), secure sum, last round's memberships


class GossipMachine(Protocol):
    """Base class: synchronous two-phase gossip rounds; subclasses say what is sent and how it is mixed.

    Hooks: :meth:`outgoing` (the message of round t; may inject noise / data and return ledger
    actions), :meth:`incorporate` (the weighted sum of round t's messages), :meth:`final_model`.
    """

    name: ClassVar[str] = "gossip"

    def __init__(
        self,
        ctx: NodeContext,
        topology: Topology,
        rounds: int,
        dim: int,
        options: GossipOptions | None = None,
    ) -> None:
        super().__init__(ctx)
        if rounds < 1:
            raise ValueError("a gossip run needs at least one round")
        if topology.n != ctx.n:
            raise ValueError(f"topology has {topology.n} nodes, the run has {ctx.n}")
        self.topo = topology
        self.rounds = int(rounds)
        self.dim = int(dim)
        self.opt = options or GossipOptions()
        self._drop_rng = ctx.rng.spawn(1)[0] if self.opt.dropout > 0 else None
        self.t = 0
        self.phase = _A
        self.gone: set[int] = set()
        self._missed: dict[int, int] = {}
        self._buf: dict[tuple[int, int, int], tuple[int, int, np.ndarray | None]] = {}
        self._seen: dict[
            tuple[int, int, int], int
        ] = {}  # (round, phase, src) -> hash of the payload
        self._cand: np.ndarray = np.zeros(0, dtype=np.int64)
        self._up = True
        self._heard: dict[int, int] = {}
        self._H: list[int] = []
        self._replies: dict[int, tuple[int, np.ndarray | None]] = {}
        self._msg: np.ndarray | None = None
        self._round_missing: list[int] = []
        self._up_next = True
        self._silence: dict[int, int] = {}
        self.schedule: list[dict[str, Any]] = []  # this node's realised rows (also in the ledger)
        #: secure neighbourhood summation (hushnet.families.gossip.secure.attach_secure), None for plain gossip
        self.secure: Any = None
        self._draining = False
        self._late: list[int] = []
        #: restored from a checkpoint after a crash and not yet back in step with its neighbours (issue 14)
        self._rejoining = False
        self._skipping = (
            False  # inside _fast_forward: silence of skipped rounds declares nobody gone
        )

    # ---- hooks ------------------------------------------------------------------------------------

    def outgoing(self, rnd: int) -> tuple[np.ndarray, list[Action]]:  # pragma: no cover - interface
        raise NotImplementedError

    def incorporate(
        self, rnd: int, mixed: np.ndarray
    ) -> list[Action]:  # pragma: no cover - interface
        raise NotImplementedError

    def final_model(self) -> tuple[np.ndarray, dict[str, Any]]:  # pragma: no cover - interface
        raise NotImplementedError

    # ---- events -----------------------------------------------------------------------------------

    def on_start(self) -> list[Action]:
        if self.finished or self.t or self.phase != _A or self._msg is not None:
            return []
        return self._announce(0) + self._begin_round(0)

    def on_message(self, src: int, payload: bytes) -> list[Action]:
        if self.finished:
            raise StaleRound(f"run {self.ctx.run_id} already finished at node {self.ctx.node}")
        if payload[:1] and payload[0] in SECURE_KINDS:
            if self.secure is None:
                raise MalformedMessage("secure-summation message in a plain gossip run")
            if src in self.gone:
                raise UnexpectedSender(
                    f"node {src} was declared gone by node {self.ctx.node}; its messages are refused"
                )
            return self.secure.on_message(src, payload)
        kind, rnd, aux, vec = decode_round(payload, self.dim)
        if kind == KIND_VALUE and self.secure is not None:
            raise MalformedMessage(
                "a plain round value in a secure-summation run: refused and never used (it would be "
                "a release the aggregate-view accountant does not account)"
            )
        if kind == KIND_JOIN and self.secure is None:
            raise MalformedMessage("a secure-summation JOIN in a plain gossip run")
        pre: list[Action] = []
        if (
            self.durable
            and rnd < self.rounds
            and src in self.topo.neighbour_set(self.ctx.node, rnd)
        ):
            if (
                src in self.gone
            ):  # a neighbour declared gone is alive again (restarted): wire it back in
                pre = self._readmit(src)
            if self._rejoining and rnd > self.t and self.phase in (_A, _B):
                pre += self._fast_forward(rnd)
        if (
            pre
        ):  # the message itself may be for a round this node has already closed: then only `pre`
            try:
                return pre + self._round_message(src, kind, rnd, aux, vec, payload)
            except ProtocolError:
                return pre
        return self._round_message(src, kind, rnd, aux, vec, payload)

    def _round_message(
        self, src: int, kind: int, rnd: int, aux: int, vec: np.ndarray | None, payload: bytes
    ) -> list[Action]:
        if rnd >= self.rounds:
            raise MalformedMessage(f"round {rnd} outside 0..{self.rounds - 1}")
        if src in self.gone:
            raise UnexpectedSender(
                f"node {src} was declared gone by node {self.ctx.node}; its messages are refused"
            )
        if src not in self.topo.neighbour_set(self.ctx.node, rnd):
            raise UnexpectedSender(
                f"node {src} is not a neighbour of node {self.ctx.node} in round {rnd}"
            )
        if kind == KIND_HEARTBEAT:
            # The sender is alive.  It counts as *legitimately slow* only if it has not yet reached the
            # stage at which it sends what we wait for (AVAIL(t) leaves at the end of phase A of round
            # t−1, the round-t value at the end of phase A of round t); a heartbeat from a node past that
            # stage means our message was lost or refused, so its silence keeps counting (no livelock).
            if src in self._silence and aux <= 2 * self.t - (2 if self.phase == _A else 0):
                self._silence[src] = 0
            return []
        phase = _A if kind == KIND_AVAIL else _B
        key = (rnd, phase, src)
        if key in self._seen:
            same = self._seen[key] == hash(payload)
            raise ReplayedMessage(
                f"{'duplicate' if same else 'conflicting'} phase-{'AB'[phase]} message of round "
                f"{rnd} from node {src} (already received; not used again)"
            )
        if (rnd, phase) < (self.t, self.phase):
            raise StaleRound(
                f"phase {'AB'[phase]} of round {rnd} is closed at node {self.ctx.node} "
                f"(now round {self.t}); message from node {src} not used"
            )
        if rnd > self.t + self.opt.max_ahead:
            raise FutureRound(
                f"message for round {rnd} while node {self.ctx.node} is in round {self.t} "
                f"(at most {self.opt.max_ahead} ahead)"
            )
        self._seen[key] = hash(payload)
        if (rnd, phase) > (self.t, self.phase):
            self._buf[key] = (kind, aux, vec)
            return []
        return self._accept(src, kind, aux, vec)

    def on_timer(self, name: str) -> list[Action]:
        if self.finished:
            return []
        if self.secure is not None and name[:1] in ("S", "Z"):
            return self.secure.on_timer(name)
        if self.phase >= _C:
            if name != f"C{self.t}" or self.phase != _C:
                return []
            # waiting for this node's own secure sum: tell the neighbours it is alive (slow, not dropped)
            hb = encode_round(KIND_HEARTBEAT, self.t, 2 * self.t + 1)
            return [Send(int(j), hb) for j in self._cand] + [
                SetTimer(name, self.opt.timeout / self.opt.ticks)
            ]
        if name != f"{'AB'[self.phase]}{self.t}":
            return []  # a timer of a phase that already closed
        awaited = self._awaited()
        for j in awaited:
            self._silence[j] = self._silence.get(j, 0) + 1
        if all(self._silence.get(j, 0) >= self.opt.ticks for j in awaited):
            if self.phase == _A:
                return self._close_availability(timed_out=True)
            return self._close_values(timed_out=True)
        hb = encode_round(KIND_HEARTBEAT, self.t, 2 * self.t + self.phase)
        acts: list[Action] = [Send(int(j), hb) for j in self._cand]
        return acts + [SetTimer(name, self.opt.timeout / self.opt.ticks)]

    def _awaited(self) -> list[int]:
        if self.phase == _A:
            return [int(j) for j in self._cand if int(j) not in self._heard]
        if self.phase == _B:
            return [j for j in self._heard if j not in self._replies]
        return []

    def _arm(self, phase: int) -> SetTimer:
        for j in self._awaited():
            self._silence[j] = 0
        return SetTimer(f"{'AB'[phase]}{self.t}", self.opt.timeout / self.opt.ticks)

    # ---- the round --------------------------------------------------------------------------------

    def _candidates(self, t: int) -> np.ndarray:
        return np.asarray(
            [j for j in self.topo.neighbours(self.ctx.node, t) if j not in self.gone],
            dtype=np.int64,
        )

    def _announce(self, t: int) -> list[Action]:
        """Send ``AVAIL(t)``.  It goes out as soon as round t−1's availability phase closes (with the
        round-(t−1) values), so a live neighbour is never awaited in phase A: only silent ones are,
        and a node delayed by a dead neighbour does not make its other neighbours time out on it."""
        self._up_next = not (
            self._drop_rng is not None and self._drop_rng.random() < self.opt.dropout
        )
        avail = encode_round(KIND_AVAIL, t, int(self._up_next))
        return [Send(int(j), avail) for j in self._candidates(t)]

    def _begin_round(self, t: int) -> list[Action]:
        self.t, self.phase = t, _A
        self._cand = self._candidates(t)
        self._up = self._up_next
        self._heard = {}
        self._replies = {}
        self._H = []
        msg, acts = self.outgoing(t)
        self._msg = np.asarray(msg, dtype=np.float64)
        if self._msg.shape != (self.dim,):
            raise ValueError(
                f"outgoing message has shape {self._msg.shape}, expected ({self.dim},)"
            )
        if self._cand.size == 0:
            return acts + self._close_availability(timed_out=False)
        acts.append(self._arm(_A))
        return acts + self._drain(_A)

    def _drain(self, phase: int) -> list[Action]:
        """Feed buffered messages of the current (round, phase) in sender order (deterministic)."""
        acts: list[Action] = []
        keys = sorted(k for k in self._buf if k[0] == self.t and k[1] == phase)
        for key in keys:
            if self.t != key[0] or self.phase != phase:
                break
            if (
                key not in self._buf
            ):  # consumed by a nested drain (the round advanced and came back here)
                continue
            kind, aux, vec = self._buf.pop(key)
            acts.extend(self._accept(key[2], kind, aux, vec))
        return acts

    def _accept(self, src: int, kind: int, aux: int, vec: np.ndarray | None) -> list[Action]:
        if self.phase == _A:
            self._rejoining = False  # a neighbour's announcement for our round: back in step
            self._heard[src] = aux
            if len(self._heard) == self._cand.size:
                return self._close_availability(timed_out=False)
            return []
        self._replies[src] = (
            (aux, vec) if kind == KIND_VALUE else (aux, None) if kind == KIND_JOIN else (0, None)
        )
        if all(j in self._replies for j in self._heard):
            return self._close_values(timed_out=False)
        return []

    def _close_availability(self, timed_out: bool) -> list[Action]:
        t = self.t
        acts: list[Action] = []
        missing = [int(j) for j in self._cand if j not in self._heard]
        self._H = [int(j) for j in self._cand if self._heard.get(int(j)) == 1] if self._up else []
        self.phase = _B
        deg = len(self._H)
        if self.secure is not None:
            val = encode_round(KIND_JOIN, t, deg) if deg else b""
            if (
                deg and not self._skipping
            ):  # a skipped round's JOIN never leaves (see _fast_forward)
                self.secure.offer(t, self._msg, self._H)
        else:
            val = encode_round(KIND_VALUE, t, deg, self._msg) if deg else b""
        skip = encode_round(KIND_SKIP, t, 0)
        hs = set(self._H)
        for j in self._cand:
            acts.append(Send(int(j), val if int(j) in hs else skip))
        if t + 1 < self.rounds:
            acts.extend(self._announce(t + 1))
        self._round_missing = missing
        if timed_out and missing:
            acts.append(
                Deviation(self.ctx.node, t, "availability-timeout", {"round": t, "silent": missing})
            )
        if all(
            j in self._replies for j in self._heard
        ):  # nobody heard (or all replies already buffered)
            return acts + self._close_values(timed_out=False)
        acts.append(self._arm(_B))
        return acts + self._drain(_B)

    def _close_values(self, timed_out: bool) -> list[Action]:
        t = self.t
        acts: list[Action] = []
        me = self.ctx.node
        deg = len(self._H)
        late = [j for j in self._heard if j not in self._replies]
        self._late = late
        if timed_out and late:
            acts.append(Deviation(me, t, "value-timeout", {"round": t, "silent": late}))
        if self.secure is not None:
            self.phase = _C
            if (
                self._skipping
            ):  # a round a restored node closes unheard: no sum led (nothing is sent)
                self.secure.lead_info[t] = {
                    "status": "skipped",
                    "members": [me],
                    "reason": "restarted: the neighbours closed this round without this node",
                }
                return acts + self._secure_done(t, {}, None)
            joiners = {
                j: int(self._replies[j][0])
                for j in self._H
                if j in self._replies and self._replies[j][0] >= 1
            }
            acts.append(SetTimer(f"C{t}", self.opt.timeout / self.opt.ticks))
            return acts + self.secure.lead(t, joiners)
        row: dict[int, float] = {}
        mixed = np.zeros(self.dim)
        for j in self._H:
            rep = self._replies.get(j)
            if rep is None or rep[1] is None:
                continue
            w = mh_weight(deg, rep[0])
            row[j] = w
            mixed += w * rep[1]
        self_w = 1.0 - sum(row.values())
        mixed += self_w * self._msg
        return self._complete_round(acts, row, self_w, mixed)

    def _secure_done(self, t: int, row: dict[int, float], total: np.ndarray | None) -> list[Action]:
        """This node's round-t secure sum closed: released (``total`` = Σ_row W_ij m_j) or not (keep own value)."""
        if self.finished or t != self.t or self.phase != _C:
            return []
        self_w = 1.0 - sum(row.values())
        mixed = self_w * self._msg if total is None else total + self_w * self._msg
        return self._complete_round(
            [CancelTimer(f"C{t}")], row, self_w, mixed, self.secure.lead_info.get(t)
        )

    def _secure_drained(self) -> list[Action]:
        """The last round's memberships are done (or their wait timed out): the run ends here."""
        if self.finished or not self._draining:
            return []
        self._draining = False
        return [CancelTimer("Zsecure")] + self._finish()

    def _complete_round(
        self,
        acts: list[Action],
        row: dict[int, float],
        self_w: float,
        mixed: np.ndarray,
        secure: dict[str, Any] | None = None,
    ) -> list[Action]:
        t = self.t
        me = self.ctx.node
        late = self._late
        entry = {
            "round": t,
            "up": self._up,
            "row": {int(k): float(v) for k, v in row.items()},
            "self": self_w,
            "sent_value": list(self._H),
            "missing": list(self._round_missing) + late,
            "step": self.topo.step_of(t),
        }
        if secure is not None:
            entry["secure"] = secure
        self.schedule.append(entry)
        acts.append(
            LedgerEntry(
                me,
                t,
                "schedule",
                self.ctx.view_model,
                0.0,
                0.0,
                0.0,
                self.name,
                self.ctx.run_id,
                entry,
            )
        )
        # neighbours silent in both phases of consecutive rounds are declared gone
        silent = set(self._round_missing)
        for j in self._cand:
            j = int(j)
            self._missed[j] = self._missed.get(j, 0) + 1 if j in silent else 0
            if (
                self._missed[j] >= self.opt.give_up_after
                and j not in self.gone
                and not self._skipping
            ):
                self.gone.add(j)
                acts.append(
                    Deviation(
                        me, t, "neighbour-gone", {"neighbour": j, "silent_rounds": self._missed[j]}
                    )
                )
        acts.extend(self.incorporate(t, mixed))
        if self.opt.record_states:
            acts.append(Metric("state", self.current_state().copy(), t + 1, me))
        if (
            t % 4 == 3
        ):  # prune old rounds now and then (a replay of those is refused as stale anyway)
            self._seen = {k: v for k, v in self._seen.items() if k[0] >= t}
        self._buf = {k: v for k, v in self._buf.items() if k[0] > t}
        if t + 1 >= self.rounds:
            if self.secure is not None and self.secure.pending():
                # neighbours' last sums still need this node's masked input / unmask shares
                self.phase, self._draining = _Z, True
                return acts + [self.secure.drain_timer()]
            return acts + self._finish()
        return acts + self._begin_round(t + 1)

    def _finish(self) -> list[Action]:
        self.finished = True
        model, extra = self.final_model()
        extra = {"rounds": self.rounds, "gone": sorted(self.gone), **extra}
        if self.secure is not None:
            extra["secure"] = {
                "released": self.secure.released,
                "aborted": self.secure.aborted,
                "view": "aggregate",
            }
        return [Finish(self.ctx.node, self.rounds, model, extra)]

    def current_state(self) -> np.ndarray:
        return self.final_model()[0]

    # ---- durability (issue 14) --------------------------------------------------------------------
    #: checkpointed with every batch that sends (at least twice a round: the phase closes), not after every
    #: event: a value received since the last checkpoint is lost in a crash, and the restored node treats it
    #: as late (missing from its row) — sound, since views are built from the *sender's* records — at a
    #: fraction of the cost (per-event checkpoints of 10⁴-float rounds: 4.6 instead of 17.6 rounds/s)
    checkpoint_every_event: ClassVar[bool] = False
    #: not part of a checkpoint: public construction inputs the rebuilt machine already has
    _NOT_STATE = frozenset(
        {"ctx", "topo", "opt", "task", "secure", "_drop_rng", "_sets", "_skipping"}
    )

    @property
    def redeliver_for(self) -> float:
        """Seconds the node's driver sends a failed delivery again for (transport failures only).

        Why: a round sends each ``AVAIL`` / ``VALUE`` / ``SKIP`` (and SecAgg envelope) once, and its timer
        only heartbeats — a neighbour whose copy was lost waits the whole timeout and drops this node
        (issue 12: 1 728 of 2 048 nodes with a round-0 ``availability-timeout`` after ``DEADLINE_EXCEEDED``
        while their hosts were busy starting).  The same bytes go again under the same envelope number, so
        a receiver that took the first copy drops the second and nothing is released twice.  After two
        timeouts the neighbour has closed that phase anyway (it would refuse the copy as stale)."""
        return 2.0 * self.opt.timeout

    @property
    def durable(self) -> bool:  # type: ignore[override]
        """Plain gossip and secure summation alike (issue 14).  Secure summation checkpoints its
        memberships and led sums' records, never their SecAgg sessions (one-time secrets): a restarted
        node is a dropout of the sums in flight (:meth:`~hushnet.families.gossip.secure.SecureNeighbourhood.restore`)."""
        return True

    def checkpoint(self) -> dict[str, Any]:
        """The whole round state (round, phase, values heard, the state vector, the realised schedule,
        neighbours declared gone) and the generators' states: a restored node continues the same run."""
        state = {k: v for k, v in self.__dict__.items() if k not in self._NOT_STATE}
        state["_rng"] = self.ctx.rng.bit_generator.state
        if self._drop_rng is not None:
            state["_drop_rng_state"] = self._drop_rng.bit_generator.state
        if self.secure is not None:
            state["_secure"] = self.secure.checkpoint()
        return state

    def restore(self, state: dict[str, Any]) -> list[Action]:
        """Load a :meth:`checkpoint`; re-arm the current phase's timer.  The node is then *rejoining*: its
        neighbours went on without it (it was a dropout of the rounds it missed), so the first message of
        a later round moves it to that round (:meth:`_fast_forward`) and its heartbeats readmit it at
        neighbours that had declared it gone."""
        state = dict(state)
        self.ctx.rng.bit_generator.state = state.pop("_rng")
        drop = state.pop("_drop_rng_state", None)
        if drop is not None and self._drop_rng is not None:
            self._drop_rng.bit_generator.state = drop
        sec = state.pop("_secure", None)
        if (sec is None) != (self.secure is None):
            raise ValueError("gossip checkpoint and run disagree on secure summation")
        unknown = set(state) - set(self.__dict__)
        if unknown:
            raise ValueError(f"gossip checkpoint has unknown fields {sorted(unknown)[:5]}")
        self.__dict__.update(state)
        self._cand = np.asarray(self._cand, dtype=np.int64)
        if self.secure is not None:
            self.secure.restore(sec)
        if self.finished:
            return []
        self._rejoining = True
        for j in self._awaited():
            self._silence[j] = 0
        if self.phase == _C:  # its own sum was in flight: the masked inputs it held are gone
            return self.secure.abort_restarted(self.t)
        if (
            self.phase == _Z
        ):  # waiting for the last round's memberships, which died with the process
            return self._secure_drained()
        return [SetTimer(f"{'AB'[self.phase]}{self.t}", self.opt.timeout / self.opt.ticks)]

    def journal_entries(self) -> list[LedgerEntry]:
        """The ``schedule`` entries of every round this machine closed (a restored driver re-journals them:
        its checkpoint is written before the journal, so a crash between the two is repaired)."""
        return [
            LedgerEntry(
                self.ctx.node,
                int(e["round"]),
                "schedule",
                self.ctx.view_model,
                0.0,
                0.0,
                0.0,
                self.name,
                self.ctx.run_id,
                e,
            )
            for e in self.schedule
        ]

    def _readmit(self, src: int) -> list[Action]:
        """``src`` was declared gone but speaks again: it is a candidate again from the next round on (its
        records and ours stay sender-side facts, so the accountant needs nothing more)."""
        self.gone.discard(src)
        self._missed[src] = 0
        return [Metric("neighbour_back", float(src), self.t, self.ctx.node)]

    def _fast_forward(self, rnd: int) -> list[Action]:
        """A restored node learns its neighbours are in round ``rnd``: close its rounds before ``rnd`` as a
        node nobody heard (exactly what a full timeout does: row empty, own value kept, the in-progress
        round's record naming the neighbours it had already sent its value to), then announce itself for
        ``rnd``.  Nothing of the skipped rounds is sent (the neighbours closed them), and silence during
        the skip does not count toward declaring a neighbour gone."""
        start, gone, missed = self.t, set(self.gone), dict(self._missed)
        later = {k: v for k, v in self._buf.items() if k[0] >= rnd}
        self._buf = {}
        kept: list[Action] = []
        self._skipping = True
        try:
            while not self.finished and self.t < rnd and self.phase in (_A, _B):
                for j in self._awaited():
                    self._silence[j] = self.opt.ticks
                acts = (
                    self._close_availability(timed_out=True)
                    if self.phase == _A
                    else self._close_values(timed_out=True)
                )
                kept.extend(a for a in acts if not isinstance(a, (Send, Deviation)))
        finally:
            self._skipping = False
        self.gone, self._missed = gone, {j: 0 for j in missed}
        self._buf = later
        if self.finished or self.phase != _A:
            return kept
        avail = encode_round(KIND_AVAIL, self.t, int(self._up))
        kept.extend(Send(int(j), avail) for j in self._cand)
        kept.append(
            Deviation(
                self.ctx.node,
                start,
                "rejoined",
                {"from_round": start, "to_round": self.t, "skipped": self.t - start},
            )
        )
        return kept + self._drain(_A)

    def data_entry(
        self, step: int, kind: str, sensitivity: float, noise_std: float, **detail: Any
    ) -> LedgerEntry:
        return LedgerEntry.of_noise(self.ctx, self.name, step, kind, sensitivity, noise_std, detail)


# ---- the protocols ------------------------------------------------------------------------------


class MuffliatoAveraging(GossipMachine):
    """[M] Alg. 1: private averaging.  Noise ``N(0, (σΔ)²)`` once (σ = noise multiplier, Δ the
    task's sensitivity), then ``rounds`` gossip rounds; ``gamma`` (1 = plain) is the public Chebyshev
    coefficient, applied from round 1 on (Def. 3).  The result is the node's estimate of the mean."""

    name: ClassVar[str] = MUFFLIATO

    def __init__(
        self,
        ctx: NodeContext,
        topology: Topology,
        task: ValueTask,
        rounds: int,
        sigma: float,
        *,
        gamma: float = 1.0,
        options: GossipOptions | None = None,
    ) -> None:
        if not isinstance(task, ValueTask):
            raise TaskError(
                f"muffliato averages values: it needs a value task (got {type(task).__name__})"
            )
        if not sigma >= 0 or not 1.0 <= gamma < 2.0:
            raise ValueError("need sigma >= 0 and gamma in [1, 2)")
        super().__init__(ctx, topology, rounds, task.dim, options)
        self.task = task
        self.sigma = float(sigma)
        self.gamma = float(gamma)
        self.sens = float(task.sensitivity())
        self.x: np.ndarray | None = None
        self.prev: np.ndarray | None = None

    def outgoing(self, rnd: int) -> tuple[np.ndarray, list[Action]]:
        if rnd == 0:
            std = self.sigma * self.sens
            self.x = (
                np.asarray(self.task.value(0), dtype=np.float64)
                + self.ctx.rng.standard_normal(self.dim) * std
            )
            return self.x, [
                self.data_entry(0, "value", self.sens, std, gamma=self.gamma, rounds=self.rounds)
            ]
        return self.x, []

    def incorporate(self, rnd: int, mixed: np.ndarray) -> list[Action]:
        if rnd == 0 or self.gamma == 1.0:
            nxt = mixed
        else:
            nxt = self.gamma * mixed + (1.0 - self.gamma) * self.prev
        self.prev, self.x = self.x, nxt
        return []

    def final_model(self) -> tuple[np.ndarray, dict[str, Any]]:
        x = np.zeros(self.dim) if self.x is None else self.x
        return x, {"estimate": x.copy()}


class MuffliatoGD(GossipMachine):
    """[M] Alg. 3 (full-batch local gradients): for each step r, ``θ̂ = θ − ν(∇φ_v(θ) + ξ)`` with
    ``ξ ~ N(0, (σΔ_φ)²)`` (σ a noise multiplier, or ``noise_std`` absolute for reproductions), then
    ``ks[r]`` gossip rounds with Chebyshev coefficient ``gammas[r]`` (Def. 3 within each step).

    ``clip_after_noise`` emulates the reference code (noisy gradient clipped to the task's clip
    norm) for the Fig. 1c reproduction only.
    """

    name: ClassVar[str] = MUFFLIATO_GD

    def __init__(
        self,
        ctx: NodeContext,
        topology: Topology,
        task: GradientTask,
        ks: Sequence[int],
        step_size: float,
        sigma: float,
        *,
        gammas: Sequence[float] | None = None,
        noise_std: float | None = None,
        clip_after_noise: bool = False,
        x0: Sequence[float] | None = None,
        options: GossipOptions | None = None,
    ) -> None:
        if not isinstance(task, GradientTask):
            raise TaskError(f"muffliato-gd needs a gradient task (got {type(task).__name__})")
        ks = [int(k) for k in ks]
        if not ks or min(ks) < 1:
            raise ValueError("every gradient step needs at least one gossip round")
        super().__init__(ctx, topology, sum(ks), task.dim, options)
        self.task = task
        self.ks = ks
        self.starts = np.cumsum([0] + ks)
        self.gammas = [1.0] * len(ks) if gammas is None else [float(g) for g in gammas]
        if len(self.gammas) != len(ks) or not all(1.0 <= g < 2.0 for g in self.gammas):
            raise ValueError("need one gamma in [1, 2) per gradient step")
        if not step_size > 0 or not sigma >= 0:
            raise ValueError("need step_size > 0 and sigma >= 0")
        self.nu = float(step_size)
        self.sens = float(task.sensitivity())
        self.noise_std = float(noise_std) if noise_std is not None else float(sigma) * self.sens
        self.clip_after_noise = bool(clip_after_noise)
        self.theta = np.zeros(self.dim) if x0 is None else np.asarray(x0, dtype=np.float64)
        if self.theta.shape != (self.dim,):
            raise ValueError(f"x0 has shape {self.theta.shape}, the model has ({self.dim},)")
        self.x = self.theta
        self.prev: np.ndarray | None = None

    def _step_of(self, rnd: int) -> tuple[int, int]:
        r = int(np.searchsorted(self.starts, rnd, side="right") - 1)
        return r, rnd - int(self.starts[r])

    def outgoing(self, rnd: int) -> tuple[np.ndarray, list[Action]]:
        r, k = self._step_of(rnd)
        if k:
            return self.x, []
        xi = self.ctx.rng.standard_normal(self.dim) * self.noise_std
        if self.clip_after_noise:
            g = self.task.raw_gradient(self.theta) + xi
            nrm = float(np.sqrt(g @ g))
            clip = float(getattr(self.task, "clip", np.inf))
            if nrm > clip:
                g = g * (clip / nrm)
        else:
            g = self.task.gradient(self.theta) + xi
        self.x = self.theta - self.nu * g
        self.prev = None
        return self.x, [
            self.data_entry(
                r,
                "gradient",
                self.sens,
                self.noise_std,
                rounds=self.ks[r],
                gamma=self.gammas[r],
                clip_after_noise=self.clip_after_noise,
            )
        ]

    def incorporate(self, rnd: int, mixed: np.ndarray) -> list[Action]:
        r, k = self._step_of(rnd)
        g = self.gammas[r]
        nxt = mixed if (k == 0 or g == 1.0) else g * mixed + (1.0 - g) * self.prev
        self.prev, self.x = self.x, nxt
        acts: list[Action] = []
        if k == self.ks[r] - 1:
            self.theta = self.x
            acts.append(Metric("step", r + 1, r + 1, self.ctx.node))
            if self.opt.record_steps:
                acts.append(Metric("model", self.theta.copy(), r + 1, self.ctx.node))
        return acts

    def final_model(self) -> tuple[np.ndarray, dict[str, Any]]:
        return self.theta, {"steps": len(self.ks)}


class StreamingGossip(GossipMachine):
    """[K] §5 streaming gossip: every round the node sends ``m = θ + x_t + u_t`` (fresh noise) and sets
    ``θ ← Σ_j W_ij m_j``.  With a value task ``x_t = value(t)`` and ``u_t ~ N(0, (σΔ)²)``; with a
    gradient task it is DP-GD with gossip averaging: ``x_t = −η∇f(θ)``, ``u_t = −η ξ_t``, ``ξ_t ~ N(0, (σΔ)²)``."""

    name: ClassVar[str] = GOSSIP_STREAM

    def __init__(
        self,
        ctx: NodeContext,
        topology: Topology,
        task: Task,
        rounds: int,
        sigma: float,
        *,
        step_size: float = 1.0,
        x0: Sequence[float] | None = None,
        options: GossipOptions | None = None,
    ) -> None:
        if not isinstance(task, (ValueTask, GradientTask)):
            raise TaskError("gossip-stream needs a value task or a gradient task")
        if not sigma >= 0 or not step_size > 0:
            raise ValueError("need sigma >= 0 and step_size > 0")
        super().__init__(ctx, topology, rounds, task.dim, options)
        self.task = task
        self.sigma = float(sigma)
        self.eta = float(step_size)
        self.sens = float(task.sensitivity())
        self.theta = np.zeros(self.dim) if x0 is None else np.asarray(x0, dtype=np.float64)

    def outgoing(self, rnd: int) -> tuple[np.ndarray, list[Action]]:
        std = self.sigma * self.sens
        noise = self.ctx.rng.standard_normal(self.dim) * std
        if isinstance(self.task, GradientTask):
            m = self.theta - self.eta * (self.task.gradient(self.theta) + noise)
            kind = "gradient"
        else:
            m = self.theta + np.asarray(self.task.value(rnd), dtype=np.float64) + noise
            kind = "value"
        return m, [self.data_entry(rnd, kind, self.sens, std, step_size=self.eta)]

    def incorporate(self, rnd: int, mixed: np.ndarray) -> list[Action]:
        self.theta = mixed
        return []

    def final_model(self) -> tuple[np.ndarray, dict[str, Any]]:
        return self.theta, {}


def t_stop(n: int, gap: float, sigma_abs: float, spread: float = 0.25, dim: int = 1) -> int:
    """The spec's number of rounds ([M] Thm 2 / the code's ``T_mix``): ``⌈ln(n/(Dσ²)·max(Dσ², spread))/√λ⌉``."""
    v = dim * sigma_abs**2
    return max(1, int(math.ceil(math.log(n / v * max(v, spread)) / math.sqrt(gap))))
