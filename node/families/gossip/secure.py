"""Secure neighbourhood summation inside synchronous gossip rounds (the observer learns sums, ``S = e_iᵀ``).

Plain gossip sends every node's round message ``m_j`` to each neighbour, so an observer's view is
its closed neighbourhood's messages.  With secure summation a node ``i`` learns only what it needs
to compute its next state, ``Σ_j W_t[i,j] m_j``: it *leads* one SecAgg round
(:class:`hushnet.families.secagg.machines.SecAggMachine`, Bonawitz et al.) per gossip round over its round-t
neighbourhood and is a *member* of each neighbour's round.  This module composes those sub-machines
inside a :class:`~hushnet.families.gossip.machines.GossipMachine` (sans-IO, the same code in the simulator and
in a networked node); the gossip machine keeps the availability phase, heartbeats, timeouts,
buffering and the schedule ledger records.

**Round t with secure summation** (replaces the plain VALUE phase):

1. *availability* (unchanged): ``H_i`` = neighbours heard as up.
2. *join*: ``JOIN(t, |H_i|)`` to every ``j ∈ H_i`` (``SKIP`` to the others) — the plain VALUE message
   without the value.  The round's members of i's sum are ``M_i = {i} ∪ {j ∈ H_i : JOIN from j}``,
   and the weight of each member is ``W_t[i,j] = 1/(1 + max(|H_i|, |H_j|))`` from the two announced
   degrees, exactly as in plain gossip.
3. *secure sum*: ``i`` sends ``INVITE(t, |H_i|, M_i)`` to its members and runs a SecAgg round as
   leader; member ``j`` (only if it sent ``JOIN(t)`` to ``i``) contributes the fixed-point encoding
   of ``W_t[i,j]·m_j(t)``; the leader contributes zero (it knows its own term and SecAgg needs two
   members).  Members receive no result (``broadcast = False``): they learn only the member sets.
   On release, ``i``'s new mixed value is ``sum + (1 − Σ_{j∈U3} W_t[i,j])·m_i`` over the survivors
   ``U3`` — dropouts after masking are recovered with Shamir shares (SecAgg), so a member whose
   masked input did not arrive is simply not in the row.

**Below threshold** (threshold ``max(2, ⌊|M_i|/2⌋ + 1)``, SecAgg's honest-majority rule): the sum
aborts with no release, and node ``i`` keeps its own message for that round (row empty, self weight
1); its schedule record says ``secure.status = "aborted"``.  What ``i`` observed is then only its own
value — the accountant's replay of that round is exactly the recorded row, so nothing is
released that the accountant did not account.

**What is recorded.**  The schedule record of round t holds the realised row (survivors only), the
member set, survivors, dropped members and the status of the sum.  Rows may be asymmetric (``i``
used ``j`` but ``j``'s sum dropped ``i``); the exact accountant works on the recorded rows (the
messages the certified neighbourhood view shows, and the sums ``W_t[i,:]·m_t`` of the uncertified
aggregate figure).

**Fixed-point error** (:mod:`hushnet.crypto.masks`): each sum of ``k`` survivors is off by at most
``k·2^-(f+1)`` per entry (default ``f = 24``: 16 members → 4.8e-7); over T rounds of averaging with
a stochastic ``W_t`` the errors do not amplify, so a node's final value is within
``T·max_k·2^-(f+1)`` of the plain run on the same schedule.

**The rounding and the certified view.**  The member's term ``R(W_t[i,j]·m_j(t))`` is rounded as one
value, and ``m_j(t)`` already mixes data and noise, so the released sum is not a function of the exact
``Σ_j W_t[i,j] m_j`` alone: with per-term noise near the grid step the sum shows the individual terms
(exactly on ``complete:5``, one round, σ = 0.2, Δ = 2.5 grid steps: D_2 of the release ≈ 12.3 where the
aggregate view says 6.25, ``tests/privacy/test_gossip_secure_rounding.py``).  The fix ``secagg-sum`` /
``secagg-dpsgd`` use (round data and noise apart, ``docs/design/spec/secagg.md``) does not carry over:
neither the term nor its noise lives on the grid (the weights are not dyadic).  So the family *certifies*
secure-summation runs with the **neighbourhood view** (projection, ledger cost, settlement:
:func:`hushnet.families.gossip.accounting.certified_view`) — every released sum is a function of the
messages that view shows, so its bound holds — and reports the aggregate view's value only as an
uncertified ``aggregate_real_arithmetic`` figure (``REAL_ARITHMETIC_LABEL``).  Secure summation still
hides the individual messages from the observer; it is just not credited.  Future route to a certified
aggregate view (not implemented): keep every released sum a randomized function of the exact sum, e.g.
*zero-sum secret dithers* — the members of a sum add secret dithers ``U_j`` uniform on ``[0, q)`` that sum
to 0 mod ``q`` before rounding, so the decoded sum depends on the messages only through ``Σ_j W_t[i,j]
m_j`` — with a proof of the resulting bound.

**Cost.**  Per round and node: one SecAgg round led (2 leader round trips: masked inputs with sealed
shares, unmask) and ``|H_i|`` joined as a member; each member agrees ``|M|−1`` pairwise seeds from the
long-term share-transport keys, seals ``|M|−1`` share envelopes (X25519 + AEAD) and expands ``|M|−1``
pairwise AES-128-CTR mask streams of the model's dimension.

**Durable** (issue 14): the gossip machine's checkpoint carries this part's memberships (the rounds it
sent ``JOIN`` for, the sums it was invited to) and its led sums' records — never a SecAgg session (the
self-mask and pairwise seeds and the shares held are one-time secrets; a restarted node must not
answer an unmask request of a sum it may have been declared dropped in).  Restarted, the node is a
dropout of the sums in flight: a sum it led is aborted (:meth:`SecureNeighbourhood.abort_restarted`,
the members told, the round closed with its own value), the memberships it held are *lost* (their
messages dropped quietly), and an invitation to a sum it was already invited to is refused — never
a second masked input for one sum.

Threat model: SecAgg's honest-but-curious leader and members; a colluding neighbour set of the
leader can of course subtract its own inputs (the accountant's view is per single observer).
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from hushnet.crypto.keys import KeyDirectory, KeyPair
from hushnet.engine.actions import Action, CancelTimer, Finish, LedgerEntry, Metric, Send, SetTimer
from hushnet.engine.errors import MalformedMessage, UnexpectedSender
from hushnet.engine.events import MessageArrived, RunStarted, TimerFired
from hushnet.families.gossip.machines import GossipMachine, mh_weight
from hushnet.families.gossip.wire import (
    KIND_INVITE,
    decode_members,
    decode_secure,
    encode_invite,
    encode_secagg,
)
from hushnet.families.secagg.machines import SecAggMachine
from hushnet.families.secagg.params import SecAggParams
from hushnet.families.secagg.wire import ABORT

__all__ = [
    "SecureNeighbourhood",
    "secure_threshold",
    "attach_secure",
    "ACCOUNTING_LABEL",
]

#: what the run report says when this mechanism is on (the view its certified values use: the members'
#: fixed-point rounding keeps the aggregate view uncertified, see the module docstring)
ACCOUNTING_LABEL = "secure neighbourhood summation, certified with the neighbourhood view"
_DRAIN = "Zsecure"


def secure_threshold(members: int) -> int:
    """SecAgg threshold of a neighbourhood sum: an honest majority of the members, at least 2."""
    return max(2, members // 2 + 1)


class SecureNeighbourhood:
    """The secure-summation part of one node's gossip machine: its led sums and its memberships."""

    def __init__(
        self,
        machine: GossipMachine,
        share_key: KeyPair,
        directory: KeyDirectory,
        *,
        frac_bits: int = 24,
        timeout: float | None = None,
    ) -> None:
        self.m = machine
        self.key = share_key
        self.directory = directory
        self.frac_bits = int(frac_bits)
        self.timeout = float(timeout if timeout is not None else machine.opt.timeout)
        self.subs: dict[tuple[int, int], SecAggMachine] = {}  # (round, leader) -> live sub-machine
        self.invited: set[tuple[int, int]] = (
            set()
        )  # (round, leader) of every sum this node was invited to
        self.joined: dict[
            int, tuple[np.ndarray, int, frozenset[int]]
        ] = {}  # round -> (m_i, |H_i|, H_i)
        self.lead_info: dict[int, dict[str, Any]] = {}
        self.released = self.aborted = 0
        self._lead_members: dict[int, dict[int, float]] = {}
        #: memberships in flight when the node's process died (issue 14): it is a dropout of those sums
        self.lost: set[tuple[int, int]] = set()

    # ---- durability (issue 14) -----------------------------------------------------------------

    def checkpoint(self) -> dict[str, Any]:
        """Memberships and the led sums' records — never a SecAgg session (self-mask seeds, pairwise
        seeds, the shares it holds are one-time secrets): a restarted node must not answer an unmask
        request of a sum it may have been declared dropped in."""
        return {
            "joined": {t: (m, deg, sorted(heard)) for t, (m, deg, heard) in self.joined.items()},
            "invited": sorted(self.invited),
            "lead_info": dict(self.lead_info),
            "released": self.released,
            "aborted": self.aborted,
            "lead_members": dict(self._lead_members),
            "live": sorted(self.subs),
            "lost": sorted(self.lost),
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Load :meth:`checkpoint`.  The sums it was a member of and had not finished are *lost*: it
        never joins them again (an invitation to a sum it was already invited to is refused, so it
        never sends a second masked input), and their messages are dropped quietly — SecAgg treats it
        as a dropout (its masks removed with the survivors' shares, or the sum aborts)."""
        self.joined = {
            int(t): (np.asarray(m, dtype=np.float64), int(deg), frozenset(int(j) for j in heard))
            for t, (m, deg, heard) in state["joined"].items()
        }
        self.invited = {(int(t), int(j)) for t, j in state["invited"]}
        self.lead_info = {int(t): v for t, v in state["lead_info"].items()}
        self.released, self.aborted = int(state["released"]), int(state["aborted"])
        self._lead_members = {
            int(t): {int(j): float(w) for j, w in ws.items()}
            for t, ws in state["lead_members"].items()
        }
        self.subs = {}
        self.lost = {(int(t), int(j)) for t, j in [*state["lost"], *state["live"]]}

    def abort_restarted(self, t: int) -> list[Action]:
        """The node restarted while its own round-``t`` sum was in flight: abort it (tell the members,
        so their part ends now) and close the round keeping its own value, as for a sum below the
        threshold."""
        me = self.m.ctx.node
        weights = self._lead_members.pop(t, {})
        reason = "the leader restarted mid-sum: the masked inputs it held are gone"
        self.aborted += 1
        self.lead_info[t] = {
            "status": "aborted",
            "members": sorted([me, *weights]),
            "reason": reason,
        }
        body = bytes([ABORT]) + struct.pack(">H", len(reason.encode())) + reason.encode()
        acts: list[Action] = [Send(j, encode_secagg(t, me, body)) for j in sorted(weights)]
        acts.append(Metric("secure-sum-aborted", t, t, me))
        return acts + self.m._secure_done(t, {}, None)  # noqa: SLF001

    # ---- called by the gossip machine ----------------------------------------------------------

    def offer(self, t: int, msg: np.ndarray, heard: list[int]) -> None:
        """This node sent ``JOIN(t)`` to ``heard``: keep what a member needs (its message, its degree)."""
        self.joined[t] = (
            np.array(msg, dtype=np.float64),
            len(heard),
            frozenset(int(j) for j in heard),
        )
        horizon = t - self.m.opt.max_ahead - 2
        for old in [r for r in self.joined if r < horizon]:
            self.joined.pop(old, None)
        self.invited = {k for k in self.invited if k[0] >= horizon}
        self.lost = {k for k in self.lost if k[0] >= horizon}
        for key in [
            k for k in self.subs if k[0] < horizon
        ]:  # memberships of long-gone sums (leader silent)
            del self.subs[key]

    def lead(self, t: int, joiners: dict[int, int]) -> list[Action]:
        """Start this node's round-t sum over ``{me} ∪ joiners`` (joiner → its announced degree)."""
        me = self.m.ctx.node
        deg = len(self.m._H)  # noqa: SLF001 - the machine's own heard set
        if not joiners:
            self.lead_info[t] = {"status": "alone", "members": [me]}
            return self.m._secure_done(t, {}, None)  # noqa: SLF001
        weights = {int(j): mh_weight(deg, d) for j, d in sorted(joiners.items())}
        self._lead_members[t] = weights
        members = tuple(sorted([me, *weights]))
        sub = self._machine(t, me, members, np.zeros(self.m.dim))
        acts = self._run(t, me, sub, RunStarted())
        inv = encode_invite(t, deg, list(members))
        return [Send(j, inv) for j in weights] + acts

    def pending(self) -> list[tuple[int, int]]:
        """Memberships in other nodes' sums whose part is not done yet: live ones, and the sums of the
        last rounds this node sent ``JOIN`` for but whose invitation has not arrived yet (over a real
        network it may come after this node's own round closed; finishing then would refuse it and drop
        this node's value from that leader's sum — the drain timer bounds the wait)."""
        me, t, gone = self.m.ctx.node, self.m.t, self.m.gone
        live = [
            k
            for k, s in self.subs.items()
            if k[1] != me and not s.finished and k[0] >= t - 1 and k[1] not in gone
        ]
        awaited = [
            (r, j)
            for r, (_, _, heard) in self.joined.items()
            if r >= t - 1
            for j in sorted(heard)
            if j != me and j not in gone and (r, j) not in self.invited
        ]
        return live + awaited

    # ---- messages and timers -------------------------------------------------------------------

    def on_message(self, src: int, payload: bytes) -> list[Action]:
        kind, t, aux, body = decode_secure(payload)
        m, me = self.m, self.m.ctx.node
        if t >= m.rounds:
            raise MalformedMessage(f"round {t} outside 0..{m.rounds - 1}")
        if src not in m.topo.neighbour_set(me, t):
            raise UnexpectedSender(f"node {src} is not a neighbour of node {me} in round {t}")
        if kind == KIND_INVITE:
            return self._invited(src, t, aux, body)
        leader = int(aux)
        sub = self.subs.get((t, leader))
        if sub is None:
            if body[:1] == bytes(
                [ABORT]
            ):  # an abort for a sum this node never joined (its invite was refused)
                return []
            if (t, leader) in self.lost:  # its part in this sum died with the process: a dropout
                return [Metric("secure-sum-lost", float(leader), t, me)]
            raise UnexpectedSender(
                f"secure-sum message for the round-{t} sum led by node {leader}, "
                f"which node {me} is not part of"
            )
        return self._run(t, leader, sub, MessageArrived(src, body))

    def on_timer(self, name: str) -> list[Action]:
        if name == _DRAIN:
            return self.m._secure_drained()  # noqa: SLF001
        t, leader = (int(x) for x in name[1:].split("."))
        sub = self.subs.get((t, leader))
        if sub is None:  # (the sub-protocol is gone once it finished)
            return []
        return self._run(t, leader, sub, TimerFired("secagg-round"))

    def drain_timer(self) -> SetTimer:
        """How long the last round waits for its memberships (every SecAgg phase may time out once)."""
        return SetTimer(_DRAIN, 5.0 * self.timeout)

    # ---- internals -----------------------------------------------------------------------------

    def _invited(self, leader: int, t: int, deg_leader: int, body: bytes) -> list[Action]:
        me = self.m.ctx.node
        members = decode_members(body)
        if (t, leader) in self.subs or (t, leader) in self.invited:
            # (invited survives a restart, the session does not: never a second masked input for a sum)
            raise MalformedMessage(f"second invite to node {leader}'s round-{t} sum")
        offered = self.joined.get(t)
        if offered is None or leader not in offered[2]:
            raise UnexpectedSender(f"node {me} did not offer its round-{t} value to node {leader}")
        if (
            me not in members
            or leader not in members
            or len(set(members)) != len(members)
            or deg_leader < 1
            or len(members) > deg_leader + 1
        ):
            raise MalformedMessage(
                f"invite from node {leader} with an inconsistent member list or degree"
            )
        msg, deg, _ = offered
        w = mh_weight(deg_leader, deg)
        sub = self._machine(t, leader, tuple(sorted(members)), w * msg)
        return self._run(t, leader, sub, RunStarted())

    def _machine(
        self, t: int, leader: int, members: tuple[int, ...], vector: np.ndarray
    ) -> SecAggMachine:
        m = self.m
        p = SecAggParams(
            members=members,
            leader=leader,
            threshold=secure_threshold(len(members)),
            dim=m.dim,
            frac_bits=self.frac_bits,
            round_timeout=self.timeout,
            broadcast=False,
            round_id=t * m.ctx.n + leader,
            consistency_check=False,
            fresh_nonce=False,
        )
        # the gossip machine's context: the sum adds no noise (noise_std = 0), so the run generator is not drawn
        # from and the noise stream is the plain run's (parity with the simulator holds)
        sub = SecAggMachine(m.ctx, p, vector, self.key, self.directory)
        self.subs[(t, leader)] = sub
        self.invited.add((t, leader))
        return sub

    def _run(self, t: int, leader: int, sub: SecAggMachine, event) -> list[Action]:
        """Feed the sub-machine and translate its actions into the gossip machine's (namespaced)."""
        me = self.m.ctx.node
        timer = f"S{t}.{leader}"
        out: list[Action] = []
        done: Finish | None = None
        for a in sub.handle(event):
            if isinstance(a, Send):
                out.append(Send(a.dst, encode_secagg(t, leader, a.payload)))
            elif isinstance(a, SetTimer):
                out.append(SetTimer(timer, a.delay))
            elif isinstance(a, CancelTimer):
                out.append(CancelTimer(timer))
            elif isinstance(a, LedgerEntry):
                # the leader's per-contributor release record: the data use was charged by each contributor's
                # own gossip machine when its noisy value was formed, so this is a record, not a charge
                out.append(Metric("secure-sum-release", int(a.node), t, me))
            elif isinstance(a, Finish):
                done = a
            else:
                out.append(a)
        # a member is done once its unmask shares left (no broadcast); the leader (also a member of its own
        # sum) only at its Finish
        if done is not None or (leader != me and sub.finished):
            if self.subs.get((t, leader)) is sub:
                del self.subs[(t, leader)]
            out.append(CancelTimer(timer))
            if leader == me and done is not None:
                out.extend(self._lead_done(t, done))
            elif leader != me and self.m._draining and not self.pending():  # noqa: SLF001
                out.extend(self.m._secure_drained())  # noqa: SLF001
        return out

    def _lead_done(self, t: int, fin: Finish) -> list[Action]:
        me = self.m.ctx.node
        weights = self._lead_members.pop(t, {})
        info = dict(fin.result or {})
        members = sorted([me, *weights])
        if fin.model is None:
            self.aborted += 1
            self.lead_info[t] = {
                "status": "aborted",
                "members": members,
                "reason": str(info.get("reason", "")),
            }
            return [Metric("secure-sum-aborted", t, t, me)] + self.m._secure_done(t, {}, None)  # noqa: SLF001
        self.released += 1
        surv = [int(j) for j in info.get("survivors", [])]
        row = {j: weights[j] for j in surv if j != me}
        self.lead_info[t] = {
            "status": "released",
            "members": members,
            "survivors": surv,
            "dropped": [int(j) for j in info.get("dropped", [])],
            "error_bound": float(info.get("error_bound", 0.0)),
        }
        return self.m._secure_done(t, row, np.asarray(fin.model, dtype=np.float64))  # noqa: SLF001


def attach_secure(
    machine: GossipMachine,
    share_key: KeyPair,
    directory: KeyDirectory,
    *,
    frac_bits: int = 24,
    timeout: float | None = None,
) -> GossipMachine:
    """Turn a synchronous gossip machine's value phase into secure neighbourhood summation (before it starts)."""
    if machine.t or machine._msg is not None:  # noqa: SLF001
        raise ValueError("secure summation must be attached before the machine starts")
    missing = [int(j) for j in range(machine.ctx.n) if j not in directory.keys]
    if missing:
        raise ValueError(f"the key directory has no share-transport key for vertices {missing[:5]}")
    if directory.keys.get(machine.ctx.node) != share_key.public:
        raise ValueError("the directory's key for this node is not this node's share-transport key")
    machine.secure = SecureNeighbourhood(
        machine, share_key, directory, frac_bits=frac_bits, timeout=timeout
    )
    return machine
