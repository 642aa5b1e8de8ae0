"""Onion relaying along graph edges (sender anonymity) as a sans-IO wrapper around any machine.

:class:`OnionLayer` wraps a protocol machine (e.g. RW DP-SGD).  Every ``Send(dst, msg)`` of the
inner machine becomes an onion packet (:mod:`hushnet.crypto.onion`) that travels
``sender → r_1 → … → r_L → dst`` over graph edges (each relay is a neighbour of the previous one);
only the recipient's layer reveals ``msg``, which reaches the inner machine as
``MessageArrived(src=r_L, msg)`` — the link peer the receiver sees is the last relay, drawn
independently of the sender.  A relay learns only its previous hop (the link) and its next hop (its slot).  Packets
are whole fixed-size cells (:mod:`hushnet.crypto.cells`), one size for every hop and path length.

Each hop is acknowledged and retransmitted hop-by-hop (the inner walk then runs with
``reliable=False``: an end-to-end ack would have to travel back to an anonymous sender).  The ack is
a ``KIND_HOP_ACK`` message, or — with ``link_receipts`` (the networked node, whose ``Deliver`` RPC
answers only after the receiving machine accepted the packet) — the transport's own response, fed
back as :class:`~hushnet.engine.events.Delivered`: one RPC per link hop instead of two.  Bad
input — truncated/oversized cells, a tampered layer, a replayed packet, a packet for an unknown
key epoch, a packet from a non-neighbour or routed to a non-neighbour — is refused with a typed,
counted :class:`~hushnet.engine.actions.Fault`; nothing reaches the inner machine (nor its ledger).

Path choice (:class:`RelayPlan`, docs/anonymity.md "Why the receiver cannot tell the sender"):
every path has the same public number of relays ``k`` (:func:`relay_plan`: the smallest ``k ≥ hops``
that works for the whole graph), the last relay is drawn **first**, uniformly among the recipient's
neighbours and independently of the sender (the sender itself may be drawn), and the earlier relays
uniformly among the walks of ``k`` edges from the sender to it that avoid the recipient
(:func:`relay_path`).  With random header padding (:mod:`hushnet.crypto.onion`) the receiver's
view of a delivery then has one law whatever the sender.  Where no such ``k`` fits the header
(``independent = False``) the run is charged the sender-known bound, and its report says why.  The
path must be unpredictable to others, so it is drawn from ``path_rng`` — by default seeded from
the OS CSPRNG, not from the public run seed (docs/design/spec/randomwalk.md §E.4).

The accounting views (which observation model the accountant must use when each mechanism is
really on) are :mod:`hushnet.families.views`; the onion run's own view is :func:`onion_view`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from hushnet.crypto.cells import CELL_BODY, from_cells, n_cells, to_cells
from hushnet.crypto.keys import KeyDirectory
from hushnet.crypto.onion import (
    DuplicatePacket,
    OnionKeyring,
    build_packet,
    onion_ad,
    packet_length,
    peel,
)
from hushnet.engine.actions import (
    Action,
    CancelTimer,
    Fault,
    Finish,
    Metric,
    Paused,
    Send,
    SetTimer,
)
from hushnet.engine.errors import MalformedMessage, UnexpectedSender
from hushnet.engine.events import MessageArrived, RunStarted, TimerFired
from hushnet.engine.protocol import NodeContext, Protocol
from hushnet.engine.rng import secret_generator
from hushnet.families.anonymity.wire import KIND_HOP_ACK, KIND_PACKET
from hushnet.families.views import VIEWS

_TIMER = "onion-retx:"
_WORK = "onion-work:"  # a hop's role work (forward or delivery) runs on a zero timer, after its hop ack left


# ---- accounting views --------------------------------------------------------------------------


def onion_view(plan: "RelayPlan") -> dict[str, Any]:
    """The accounting view of an onion run with relay plan ``plan``, as a report shows it (the plan says
    whether each delivery hides the sender from its receiver; the charge is local DP either way)."""
    return {
        **VIEWS["onion-relay"].as_dict(),
        "relays": plan.relays,
        "mean_relays": plan.mean_relays,
        "relay_plan": plan.reason,
        "sender_hidden_per_delivery": plan.independent,
    }


# ---- relay paths -------------------------------------------------------------------------------


def _adjacency(graph: sp.spmatrix | np.ndarray) -> sp.csr_matrix:
    A = sp.csr_matrix(graph, dtype=np.float64)
    A = (A != 0).astype(np.float64).tocsr()
    A.setdiag(0)
    A.eliminate_zeros()
    return A


@dataclass(frozen=True)
class RelayPlan:
    """The public relay-path rule of a run (graph, ``hops``, ``slots``) and whether it hides the sender.

    A path to recipient ``v`` is ``sender → r_1 → … → r_k → v``: the last relay ``ℓ = r_k`` is drawn
    **first, uniformly among v's neighbours and independently of the sender** (the sender itself
    included), then ``k = k(v, ℓ)`` — the smallest ``k ≥ hops`` such that *every* neighbour of ``v``
    reaches ``ℓ`` by a walk of ``k`` edges avoiding ``v`` — and ``r_1..r_{k-1}`` uniform among such
    walks from the sender.  ``k`` is public and a function of ``(v, ℓ)`` only.  ``independent`` says
    that ``k(v, ℓ) ≤ slots − 1`` exists for every recipient and neighbour; then the receiver's view
    of a delivery (its link peer ``ℓ``; the path length ``k(v, ℓ)``, hidden anyway by the random
    header padding; fixed-size cells) is a function of ``ℓ`` and fresh randomness alone, so it has
    one law whatever the sender — the anonymous-sender accountant's premise.  Otherwise ``reason``
    says where it fails and the run is charged the sender-known bound.
    """

    hops: int
    slots: int
    relays: int  # the longest path (relays) the plan uses
    mean_relays: float  # averaged over recipients and their uniform last relay
    independent: bool
    reason: str


#: a recipient's public path tables: its neighbours ``nb`` (possible last relays), the walk counts
#: ``F[m][x, j]`` (∝ walks of ``m`` edges from ``x`` to ``nb[j]`` avoiding the recipient, m < slots)
#: and ``k[j] = k(v, nb[j])`` (0: none ≤ slots − 1)
RelayTables = tuple[np.ndarray, list[np.ndarray], np.ndarray]


def relay_tables(adj: sp.csr_matrix, dst: int, hops: int, slots: int) -> RelayTables:
    """:data:`RelayTables` of recipient ``dst`` (public: senders cache them per recipient).

    ``slots − 1`` sparse products of the adjacency with a ``deg(dst)``-column block; each column is
    rescaled per length (ratios kept, no overflow on long walks).
    """
    n = adj.shape[0]
    Ac = adj.tocsc()
    nb = Ac.indices[Ac.indptr[dst] : Ac.indptr[dst + 1]].astype(
        np.int64
    )  # who can hand dst a packet
    mask = np.ones((n, 1))
    mask[dst] = 0.0
    F = [np.zeros((n, nb.size))]
    F[0][nb, np.arange(nb.size)] = 1.0
    k = np.zeros(nb.size, dtype=np.int64)
    for m in range(1, slots):
        X = (adj @ F[-1]) * mask
        top = X.max(axis=0) if n else np.zeros(nb.size)
        F.append(X / np.where(top > 0, top, 1.0))
        if m >= hops:
            every = (F[m][nb] > 0).all(
                axis=0
            )  # every possible sender reaches nb[j] in exactly m edges
            k[(k == 0) & every] = m
    return nb, F, k


_PLAN_CACHE: dict[tuple, RelayPlan] = {}


def relay_plan(graph: sp.spmatrix | np.ndarray, hops: int, slots: int) -> RelayPlan:
    """The run's :class:`RelayPlan`: public and deterministic (cached per graph), so every node of a
    run and the accountant before it derive the same one.

    On a bipartite graph the sender and the last relay lie on the same side, so every ``k(v, ℓ)`` is
    even; an odd ring around a degree-2 receiver, a leaf whose only neighbour is a leaf's, or
    distances above ``slots − 1`` leave some ``k(v, ℓ)`` undefined (``independent = False``).
    """
    A = _adjacency(graph)
    key = (A.shape[0], A.indptr.tobytes(), A.indices.tobytes(), int(hops), int(slots))
    if key in _PLAN_CACHE:
        return _PLAN_CACHE[key]
    longest, means, fail = 0, [], ""
    for v in range(A.shape[0]):
        nb, F, k = relay_tables(A, v, hops, slots)
        if nb.size == 0:
            continue
        if not fail and (k == 0).any():
            j = int(np.flatnonzero(k == 0)[0])
            u = (
                int(nb[int(np.flatnonzero(F[hops][nb, j] == 0)[0])])
                if hops < len(F)
                else int(nb[0])
            )
            fail = (
                f"recipient {v}: no common walk length in {hops}..{slots - 1} from all its neighbours "
                f"to its neighbour {int(nb[j])} avoiding it (none of {hops} edges from {u})"
            )
        longest = max(longest, int(k.max()))
        means.append(float(k[k > 0].mean()) if (k > 0).any() else float(hops))
    if fail:
        plan = RelayPlan(
            hops,
            slots,
            longest or hops,
            float(np.mean(means)) if means else float(hops),
            False,
            f"{fail}: the last relay's law would depend on the sender, so the run is charged "
            f"the sender-known bound",
        )
    else:
        mean = float(np.mean(means)) if means else float(hops)
        plan = RelayPlan(
            hops,
            slots,
            longest or hops,
            mean,
            True,
            f"last relay uniform among the recipient's neighbours (sender included) whatever the "
            f"sender; path length a function of (recipient, last relay): {hops}..{longest} relays, "
            f"mean {mean:.2f}",
        )
    if len(_PLAN_CACHE) > 16:
        _PLAN_CACHE.clear()
    _PLAN_CACHE[key] = plan
    return plan


def relay_path(
    adj: sp.csr_matrix,
    src: int,
    dst: int,
    hops: int,
    slots: int,
    rng: np.random.Generator,
    tables: RelayTables | None = None,
) -> list[int] | None:
    """Relays ``r_1..r_k`` with ``src ~ r_1 ~ … ~ r_k ~ dst`` along edges (:class:`RelayPlan`).

    The last relay is drawn first, uniformly among ``dst``'s neighbours for which ``k(dst, ℓ)``
    exists — all of them when the plan is independent, so the draw never looks at ``src`` — then
    the walk of ``k(dst, ℓ)`` edges from ``src``, uniform among those avoiding ``dst`` (backtracking
    allowed; the sender may reappear).  Where ``k(dst, ℓ)`` is undefined (a sender-known run) the
    draw falls back to the neighbours ``src`` itself reaches, each at its own shortest length.
    None if there is none.  The draws come from ``rng``, which must be secret.
    """
    nb, F, klen = tables if tables is not None else relay_tables(adj, dst, hops, slots)
    k = klen.copy()
    for j in np.flatnonzero(k == 0):  # only in a plan that is not independent
        m = next((m for m in range(max(hops, 1), len(F)) if F[m][src, j] > 0), 0)
        k[j] = m
    # a src outside dst's neighbourhood (never a token sender) may miss some; for a neighbour with
    # k(dst, ℓ) defined this keeps every ℓ (that is what k guarantees), so the filter never looks at src
    cand = np.flatnonzero([k[j] > 0 and F[k[j]][src, j] > 0 for j in range(k.size)])
    if cand.size == 0:
        return None
    j = int(
        cand[int(rng.integers(cand.size))]
    )  # the last relay first: nothing above involves src when klen > 0
    path: list[int] = []
    cur = src
    for m in range(int(k[j]) - 1, -1, -1):
        lo, hi = adj.indptr[cur], adj.indptr[cur + 1]
        nbrs = adj.indices[lo:hi]
        cw = np.cumsum(F[m][nbrs, j])
        cur = int(
            nbrs[min(int(np.searchsorted(cw, rng.random() * cw[-1], side="right")), nbrs.size - 1)]
        )
        path.append(cur)
    return path


# ---- the wrapper machine -----------------------------------------------------------------------


@dataclass(frozen=True)
class OnionParams:
    """Public onion options (run spec): ``hops`` relays per message (≥ 1), ``slots`` header slots
    (≥ hops + 2: the recipient and room for longer detours, see :func:`relay_path`), the inner message capacity
    ``payload_len``, the network-wide ``cell_body``, the key ``epoch``, hop-level reliability."""

    hops: int = 3
    slots: int = 10
    payload_len: int = 4096
    cell_body: int = CELL_BODY
    epoch: int = 0
    reliable: bool = True
    ack_timeout: float = 0.05
    max_retries: int = 3
    #: the driver reports each hop's transport receipt (``Delivered``), which then is the hop ack: set
    #: only by a driver whose transport answers after the receiver's machine accepted the bytes
    link_receipts: bool = False
    pause_retry: float = 1.0

    def __post_init__(self) -> None:
        if self.hops < 1:
            raise ValueError("onion relaying needs at least one relay (hops >= 1)")
        if self.slots < self.hops + 2:
            raise ValueError(
                "slots must be >= hops + 2 (relays, the recipient, room for one longer detour)"
            )

    @property
    def packet_len(self) -> int:
        return packet_length(self.slots, self.payload_len)

    @property
    def cells(self) -> int:
        return n_cells(self.packet_len, self.cell_body)


def payload_len_for(message_len: int, cell_body: int, slots: int) -> int:
    """Largest payload capacity ≥ ``message_len + 4`` that fills the same number of cells (no waste)."""
    from hushnet.crypto.cells import capacity

    need = packet_length(slots, message_len + 4)
    cells = n_cells(need, cell_body)
    return cells * capacity(cell_body) - packet_length(slots, 0)


class OnionLayer(Protocol):
    """Sender-anonymous transport for an inner machine (one per node)."""

    name: ClassVar[str] = "onion"

    def __init__(
        self,
        ctx: NodeContext,
        inner: Protocol,
        graph: sp.spmatrix | np.ndarray,
        keyring: OnionKeyring,
        directory: KeyDirectory,
        params: OnionParams | None = None,
        *,
        path_rng: np.random.Generator | None = None,
    ) -> None:
        super().__init__(ctx)
        self.inner = inner
        self.name = f"{inner.name}+onion"  # type: ignore[misc]
        self.adj = _adjacency(graph)
        if self.adj.shape != (ctx.n, ctx.n):
            raise ValueError(f"graph is {self.adj.shape}, run has {ctx.n} nodes")
        lo, hi = self.adj.indptr[ctx.node], self.adj.indptr[ctx.node + 1]
        self.neighbours = frozenset(int(x) for x in self.adj.indices[lo:hi])
        self.keyring = keyring
        self._ad = onion_ad(ctx.run_id)  # every layer is bound to this run (issue 11, finding 4)
        self.directory = directory
        self.p = params or OnionParams()
        self.path_rng = path_rng if path_rng is not None else secret_generator()
        self.plan = relay_plan(self.adj, self.p.hops, self.p.slots)
        self._pending: dict[str, tuple[int, bytes, int]] = {}
        self._tables: dict[int, RelayTables] = {}  # recipient -> its public path tables
        self._work: dict[
            str, Any
        ] = {}  # deferred role work by timer key: (link peer, peeled layer)
        self._work_n = 0
        self.relayed = 0
        self.delivered = 0
        self.paths: list[list[int]] = []  # own paths (sender side; never sent anywhere)

    # inner machine passthrough ------------------------------------------------------------------

    @property
    def finished(self) -> bool:  # type: ignore[override]
        return getattr(self, "inner", None) is not None and self.inner.finished

    @finished.setter
    def finished(self, value: bool) -> None:  # Protocol.__init__ sets it; the inner machine owns it
        pass

    @property
    def contribution_sigma(self) -> float:
        """The inner machine's (0.0 when it does not say): the layer relays the inner machine's ledger
        entries unchanged, so the run's charges can be prepared at the same σ (issue 12)."""
        return float(getattr(self.inner, "contribution_sigma", 0.0) or 0.0)

    def on_start(self) -> list[Action]:
        return self._translate(self.inner.handle(RunStarted()))

    def on_timer(self, name: str) -> list[Action]:
        if name.startswith(_WORK):
            item = self._work.pop(name[len(_WORK) :], None)
            return self._role_work(*item) if item is not None else []
        if not name.startswith(_TIMER):
            return self._translate(self.inner.handle(TimerFired(name)))
        key = name[len(_TIMER) :]
        if key not in self._pending:
            return []
        dst, data, attempts = self._pending[key]
        attempts += 1
        self._pending[key] = (dst, data, attempts)
        send = Send(dst, data, key if self.p.link_receipts else "")
        if attempts <= self.p.max_retries:
            return [send, SetTimer(name, self.p.ack_timeout)]
        acts: list[Action] = [send, SetTimer(name, self.p.pause_retry)]
        if attempts == self.p.max_retries + 1:
            acts.insert(
                0,
                Paused(
                    self.ctx.node,
                    -1,
                    f"onion hop to neighbour {dst} unacknowledged after {self.p.max_retries} retries",
                ),
            )
        return acts

    def on_message(self, src: int, payload: bytes) -> list[Action]:
        if not payload:
            raise MalformedMessage("empty onion message")
        kind = payload[0]
        if kind == KIND_HOP_ACK:
            key = payload[1:].hex()
            if len(payload) != 17 or key not in self._pending or self._pending[key][0] != src:
                return []  # late or duplicate ack: harmless
            return self._acked(key)
        if kind != KIND_PACKET:
            raise MalformedMessage(f"unknown onion message kind {kind}")
        if src not in self.neighbours:
            raise UnexpectedSender(
                f"onion packet from node {src}, which is not a neighbour of node {self.ctx.node}"
            )
        packet = from_cells(payload[1:], self.p.cell_body, expected_cells=self.p.cells)
        # the hop ack: a message, or (link receipts) the transport's answer to this very delivery, which
        # leaves when this handler returns — after the same checks in every role, before any role work
        ack = (
            [Send(src, bytes([KIND_HOP_ACK]) + _digest(payload))]
            if self.p.reliable and not self.p.link_receipts
            else []
        )
        try:
            res = peel(
                self.keyring,
                packet,
                slots=self.p.slots,
                payload_len=self.p.payload_len,
                ad=self._ad,
            )
        except DuplicatePacket as err:  # our ack was lost: acknowledge again, forward nothing
            return ack + [Fault(self.ctx.node, err)]
        if not res.final and res.next_hop not in self.neighbours:
            return ack + [
                Fault(
                    self.ctx.node,
                    UnexpectedSender(
                        f"authentic onion layer routes to node {res.next_hop}, not a neighbour of node {self.ctx.node}: dropped"
                    ),
                )
            ]
        # the ack leaves here, after the checks every role makes (cells, MAC, replay tag, next hop) and
        # before any role-specific work, whether this node relays or receives (issue 11 finding 5): its
        # place and time must not tell the last relay that its successor is the token's receiver.  The
        # forward or the delivery to the inner machine runs right after, on a zero timer.
        self._work_n += 1
        key = str(self._work_n)
        self._work[key] = (src, res)
        if (
            not self.p.reliable
        ):  # no hop ack (unreliable links): nothing to keep apart from the role's work
            return self._role_work(*self._work.pop(key))
        return ack + [SetTimer(_WORK + key, 0.0)]

    def on_delivered(self, dst: int, receipt: str) -> list[Action]:
        """A hop's transport receipt (``link_receipts``): the neighbour's layer accepted the packet."""
        if receipt not in self._pending or self._pending[receipt][0] != dst:
            return []  # a receipt for a retransmission of a hop already acknowledged: harmless
        return self._acked(receipt)

    def _acked(self, key: str) -> list[Action]:
        """A hop was acknowledged: stop retransmitting it, and end the pause its silence caused.

        The driver leaves "paused" only on a ``resumed`` metric (as the walk's own handoff reports
        it); without one a node whose neighbour answered late said "paused" for the rest of the run.
        """
        _, _, attempts = self._pending.pop(key)
        acts: list[Action] = [CancelTimer(_TIMER + key)]
        late = self.p.max_retries
        if attempts > late and all(a <= late for _, _, a in self._pending.values()):
            acts.append(Metric("resumed", -1, -1, self.ctx.node))
        return acts

    def _role_work(self, src: int, res) -> list[Action]:
        """What differs by role, deferred behind the hop ack: deliver to the inner machine, or forward."""
        if res.final:
            self.delivered += 1
            inner = self.inner.handle(MessageArrived(src, res.message))
            return [Metric("onion-delivered", 1, -1, self.ctx.node)] + self._translate(inner)
        self.relayed += 1
        return self._send_packet(res.next_hop, res.packet)

    # sending ------------------------------------------------------------------------------------

    def _send_packet(self, dst: int, packet: bytes) -> list[Action]:
        data = bytes([KIND_PACKET]) + to_cells(packet, self.p.cell_body)
        if not self.p.reliable:
            return [Send(dst, data)]
        key = _digest(data).hex()
        self._pending[key] = (dst, data, 0)
        return [
            Send(dst, data, key if self.p.link_receipts else ""),
            SetTimer(_TIMER + key, self.p.ack_timeout),
        ]

    def wrap(self, dst: int, message: bytes) -> tuple[list[int], list[Action]]:
        """Onion-wrap ``message`` for ``dst``: (the path, the actions sending it to the first relay)."""
        if dst not in self._tables:  # the sparse block products once per recipient, not per message
            self._tables[dst] = relay_tables(self.adj, int(dst), self.p.hops, self.p.slots)
        relays = relay_path(
            self.adj,
            self.ctx.node,
            int(dst),
            self.p.hops,
            self.p.slots,
            self.path_rng,
            self._tables[dst],
        )
        if relays is None:
            raise ValueError(
                f"no relay path of {self.p.hops}..{self.p.slots - 1} relays from {self.ctx.node} to {dst}"
            )
        path = relays + [int(dst)]
        hops = [(v, self.directory.public(v)) for v in path]
        packet = build_packet(
            hops,
            message,
            epoch=self.p.epoch,
            slots=self.p.slots,
            payload_len=self.p.payload_len,
            ad=self._ad,
        )
        self.paths.append(path)
        return path, [
            Metric("onion-path-length", len(relays), -1, self.ctx.node)
        ] + self._send_packet(path[0], packet)

    def _translate(self, acts: list[Action]) -> list[Action]:
        out: list[Action] = []
        for a in acts:
            if isinstance(a, Send):
                out.extend(self.wrap(a.dst, a.payload)[1])
            else:
                if isinstance(
                    a, Finish
                ):  # the run report shows which view the accountant must use, and why
                    a.result.setdefault("accounting_view", onion_view(self.plan))
                    a.result.setdefault(
                        "onion", {"relayed": self.relayed, "delivered": self.delivered}
                    )
                out.append(a)
        return out


def _digest(data: bytes) -> bytes:
    """Hop-ack key of a packet transmission: its first cell's head (version, epoch, the fresh
    ephemeral key and the layer MAC) already identifies it, so the megabyte payload is not hashed."""
    return hashlib.blake2b(data[:256], digest_size=16).digest()


# ---- construction ------------------------------------------------------------------------------


def wrap_machines(
    machines: list[Protocol],
    graph: sp.spmatrix | np.ndarray,
    keyrings: list[OnionKeyring],
    directory: KeyDirectory,
    params: OnionParams,
    *,
    path_seed: int | None = None,
) -> list[OnionLayer]:
    """Wrap every machine of a run (simulator helper).  ``path_seed`` makes paths reproducible in
    tests; None draws them from the OS CSPRNG as a deployment must."""
    out = []
    for v, m in enumerate(machines):
        rng = None if path_seed is None else np.random.default_rng([path_seed, v])
        out.append(OnionLayer(m.ctx, m, graph, keyrings[v], directory, params, path_rng=rng))
    return out
