"""Secure-aggregation DP-SGD (``secagg-dpsgd``): distributed DP without a trusted party.

Rounds ``r = 0 … R−1`` on the complete graph.  In round ``r`` the members ``M_r`` (every node, or a
subset of ``sample`` nodes drawn from a *public* generator of the run seed: every node computes the
same set, no amplification is claimed) compute their clipped gradient ``g_u`` at the common model
``x_r``, add their share of the noise ``z_u ~ N(0, s² I)`` with ``s² = (σΔ_eff)²/(t − c)``
(:mod:`hushnet.privacy.secure_sum`: ``Δ_eff`` ≥ Δ covers the fixed-point rounding of the gradient and of
the noise, rounded apart; plain aggregation sends float64 shares, ``Δ_eff = Δ``), and run one secure-summation round
(:class:`hushnet.families.secagg.machines.SecAggMachine`, unchanged: pairwise masks, Shamir dropout recovery,
threshold ``t``) led by ``L_r = r mod n`` — the leader rotates over the peers and may or may not be
a member.  The leader learns ``S_r = Σ_{u∈U_r} (g_u + z_u)`` over the survivors ``U_r`` and sends it,
with ``|U_r|``, to every other node (``OUTCOME``); every node applies ``x_{r+1} = x_r − η·S_r/|U_r|``
and starts the next round.  A round below the threshold releases nothing and leaves the model
unchanged.  After R rounds every node holds the same model and finishes.

Accounting: a member charges its own ledger for round ``r`` right before its masked input leaves
(the engine entry precedes the send; the node driver refuses the send if the charge does not fit),
with the Gaussian view of :class:`~hushnet.privacy.secure_sum.SecureSumView`: ``α/(2σ²)`` toward
every other node, for any coalition of up to ``c`` members (``collusion``, below the secure sum's
collusion tolerance).  The leader's per-contributor release records become ``ddp-release`` metrics.

``aggregation = "plain"`` is the same protocol without masks (members send ``g_u + z_u`` to the
leader in the clear): the baseline of the masking's cost (benchmarks), accounted honestly as
local DP of the share (``α/(2(s/Δ)²)`` per round: the leader sees each noisy input).

Wire: every message carries ``kind ‖ u32 round``; ``ROUND`` wraps a secure-summation message,
``OUTCOME`` is the leader's release (status, survivors, the sum) and, with secure aggregation before
the last round, the next round's 32-byte secure-sum nonce, ``PLAIN`` a plain input.  The nonce rides
on the outcome every node receives anyway, so rounds after the first have no ANNOUNCE trip: a member
masks as soon as it applied the outcome (one leader round trip and n − 1 messages less per round).
It is drawn by round r's leader from its CSPRNG instead of round r+1's; each member still checks it
against its replay cache before masking (:class:`~hushnet.families.secagg.machines.SecAggMachine` with
``nonce=``), which is what makes masks fresh per execution, whoever drew the nonce.  Messages
of a later round (a peer already moved on) are buffered up to ``WINDOW`` rounds ahead; messages of a
past round are dropped with a ``ddp-late`` metric (a straggler's input after the release).

Durable (issue 14): a node checkpoints its model, round, the rounds it contributed to, its
generator state and the outcomes it released as leader (the last :data:`HISTORY`, at most
:data:`HISTORY_BYTES` of them) before anything of a batch leaves it — never the secure sum's
one-time secrets (self-mask seeds, the shares it holds).
Restarted on its state directory, a node in the middle of round ``r`` is a **dropout** of that round:
a member never masks and sends (nor is charged for) a second input for it, and answers nothing of it
(the leader removes its masks with the survivors' shares, or aborts below the threshold); a
restarted *leader* has lost the masked inputs, so it aborts its round and tells everyone (an
``OUTCOME`` without a sum).  It then **catches up**: ``SYNC(r)`` to every other node, each of which
answers with the ``OUTCOME`` messages of the rounds ``≥ r`` it led (from its history; ``GONE(r)`` if
it led ``r`` but no longer holds it — the node then finishes without a model, ``status =
"out-of-sync"``, with the reason), and again to every node every
:func:`sync_period` while it is behind (an outcome sent while the node was down is lost with it).  A
leader re-sends its last outcome on restore (it may have died between its checkpoint and the sends).
Rounds it missed entirely it did not take part in (it never saw their announcement), so nothing is
charged for them.  A finished node still answers ``SYNC`` (the last round's outcome may be what a
restarted node lacks).  The result lists the rounds a node ``contributed`` to (its masked input
left: the ledger's charges) and, for the rounds it ``led``, the survivor sets (``None``: aborted) —
the realised schedule the tests replay.

A leader that never comes back (issue 14): the secure sum handles member dropouts, not a dead
leader, and every node needs its round's outcome.  A node waits :func:`leader_timeout` (spec
``protocol_params.leader_timeout``, default 10 round timeouts, at least 30 s) for it, then **ends the run**
``leader-lost``: no model (no intermediate model is released — the accountant assumes none is),
nothing of that round applied, every input that left for it stays charged (whether or not the dead
leader had unmasked it), and ``LOST(r, leader)`` to every other node, so the nodes already past round
``r`` (the leader died amid its outcome's sends) end too instead of waiting for a leader that ended; a
restarted node asking ``SYNC`` is told the same.  Ending rather than going on without it is the sound
and simple choice: going on needs every node to agree whether round ``r`` was released (a leader may
die amid its sends) and who leads later rounds, i.e. agreement the rotation does not have.  A leader
that is only slow to come back (restarted within ``leader_timeout``) is caught up as above.  The
threat model stays honest-but-curious: a node that sends a false ``LOST`` can end the run (never
release anything).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from hushnet.crypto.keys import KeyDirectory, KeyPair
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
from hushnet.engine.errors import MalformedMessage, UnexpectedSender, WrongDimension
from hushnet.engine.events import MessageArrived, RunStarted, TimerFired
from hushnet.engine.protocol import NodeContext, Protocol
from hushnet.families.secagg.machines import SecAggMachine
from hushnet.families.secagg.params import SECAGG_DPSGD, DDPParams, SecAggParams
from hushnet.families.secagg.wire import (
    DDP_HEAD,
    DDP_LOST,
    DDP_OUTCOME,
    GONE,
    LOST,
    NONCE_LEN,
    OUTCOME,
    PLAIN,
    ROUND,
    SYNC,
)
from hushnet.privacy.secure_sum import SecureSumView

WINDOW = 4  # rounds ahead a message may be buffered
#: outcomes a leader keeps for restarted nodes catching up (its last HISTORY led rounds) ...
HISTORY = 16
#: ... and at most this many bytes of them (at least the last one): the history is in every checkpoint
#: (16 outcomes of a 10⁴-float model would be 1.3 MB per batch; 256 KiB keeps 3 of them)
HISTORY_BYTES = 1 << 18
#: rounds ahead a catching-up node takes outcomes for (the rest: at its next SYNC)
CATCHUP_AHEAD = 64
AGGREGATIONS = ("secure", "plain")
#: the run's ending when a round's leader never answered (``Finish.result["ended"]``)
LEADER_LOST = "leader-lost"
_SECAGG_TIMER = "secagg-round"


def round_members(n: int, sample: int | None, seed: int, r: int) -> tuple[int, ...]:
    """The members of round ``r``: every node, or ``sample`` of them from a public generator (same at every node)."""
    if sample is None or sample >= n:
        return tuple(range(n))
    rng = np.random.default_rng([int(seed), int(r), 0x5ECA66])
    return tuple(sorted(int(v) for v in rng.choice(n, size=int(sample), replace=False)))


def round_leader(n: int, r: int) -> int:
    return r % n


def sync_period(p: DDPParams) -> float:
    """How often a restarted node still behind asks its round's leader for the outcome again (s)."""
    return max(0.5, 2.0 * float(p.round_timeout))


def leader_timeout(p: DDPParams) -> float:
    """How long a node waits in a round for its leader's outcome before it ends the run ``leader-lost`` (s).

    A live leader closes its round within three secure-sum phases of ``round_timeout`` each (plus the
    announcement and the network), so the default — 10 round timeouts, at least 30 s (a loaded host's
    scheduling must never pass for a dead leader) — only fires on a leader that is gone (or cut off
    for that long); a run whose leaders may be restarted slowly sets a larger ``leader_timeout`` in
    its ``protocol_params``."""
    if p.leader_timeout is not None:
        return float(p.leader_timeout)
    return max(30.0, 10.0 * float(p.round_timeout))


def calibrate(p: DDPParams, n: int, sensitivity: float, dim: int | None = None) -> SecureSumView:
    """Validate the run's secure-sum parameters and return the certified view (one-line errors).

    ``dim``: the model's dimension, which the share's std needs under secure aggregation (the fixed-point
    rounding's Δ_eff); None for a projection from the spec, which needs only σ.  Plain aggregation sends
    float64 shares: no grid, ``frac_bits = None``."""
    if p.aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {p.aggregation!r}")
    if not (isinstance(p.rounds, int) and p.rounds >= 1) or not p.step_size > 0:
        raise ValueError("need rounds >= 1 and step_size > 0")
    m = p.members_per_round(n)
    if not 2 <= m <= n:
        raise ValueError(f"sample must be in 2..{n} members per round, got {m}")
    probe = SecAggParams(
        members=tuple(range(m)),
        leader=0,
        threshold=p.t(n),
        dim=1,
        frac_bits=p.frac_bits,
        bits=p.bits,
        round_timeout=p.round_timeout,
        mask_degree=p.mask_degree,
    )
    fp = probe.fixed_point  # validates frac_bits/bits
    # a member whose data part is out of range drops out: a dropout that depends on its data unless the
    # public clip (entries of a clipped gradient are ≤ Δ/2 = clip) keeps every gradient in range
    if p.aggregation == "secure" and float(sensitivity) / 2.0 > fp.max_abs(m):
        raise ValueError(
            f"clipped gradient entries up to Δ/2 = {float(sensitivity) / 2.0:g} exceed the fixed-point range "
            f"±{fp.max_abs(m):.3g} of a sum of {m} members (bits={p.bits}, frac_bits={p.frac_bits})"
        )
    if p.leader_timeout is not None and not float(p.leader_timeout) > 0:
        raise ValueError(f"leader_timeout must be > 0 seconds, got {p.leader_timeout!r}")
    # the rounds run the consistency check, so the tolerance is the one against a malicious (equivocating) leader
    return SecureSumView(
        float(p.sigma),
        float(sensitivity),
        p.t(n),
        int(p.collusion),
        probe.malicious_collusion_tolerance(),
        frac_bits=p.frac_bits if p.aggregation == "secure" else None,
        dim=dim,
    )


class SecAggDPSGD(Protocol):
    """One node of a ``secagg-dpsgd`` run: member of the rounds it is sampled in, leader of rounds ``r ≡ node``."""

    name: ClassVar[str] = SECAGG_DPSGD
    #: checkpoint/restore implemented (issue 14); the driver checkpoints every batch that sends or finishes
    durable: ClassVar[bool] = True
    #: a finished node still answers ``SYNC``: a restarted node may lack the last round's outcome
    serves_when_finished: ClassVar[bool] = True

    def __init__(
        self,
        ctx: NodeContext,
        task: Any,
        params: DDPParams,
        share_key: KeyPair,
        directory: KeyDirectory,
        x0: np.ndarray | None = None,
        *,
        signer: Any = None,
        signers: Any = None,
        nonce_cache: Any = None,
    ) -> None:
        super().__init__(ctx)
        self.task = task
        self.p = params
        self.n = ctx.n
        self.dim = int(task.dim)
        self.sens = float(task.sensitivity())
        self.view = calibrate(params, self.n, self.sens, self.dim)
        self.s = self.view.share_std  # σΔ_eff/√(t − c): Δ_eff covers the fixed-point rounding
        self.key, self.directory = share_key, directory
        # the secure sum's consistency round (members sign the survivor set) and its nonce replay cache
        self.signer, self.signers, self.nonce_cache = signer, signers, nonce_cache
        self.x = np.zeros(self.dim) if x0 is None else np.asarray(x0, dtype=np.float64).copy()
        if self.x.shape != (self.dim,):
            raise ValueError(f"x0 must have shape ({self.dim},)")
        self.round = -1
        self.inner: SecAggMachine | None = None
        # the secure sum's nonce of the next round, drawn by this round's leader and sent with its outcome
        self.next_nonce: bytes | None = None
        self.charged: set[int] = set()
        self.buffer: dict[int, list[tuple[int, int, bytes]]] = {}
        self.plain: dict[int, np.ndarray] = {}  # plain aggregation: the leader's collected inputs
        self.members: tuple[int, ...] = ()
        self.leader = -1
        self.released = 0
        self.aborted = 0
        self.survivors: list[
            int
        ] = []  # |U_r| of every released round (a leader's knowledge, sent in OUTCOME)
        # durability (issue 14)
        self.led: dict[
            int, bytes
        ] = {}  # the OUTCOME messages of the last HISTORY rounds this node led
        self.led_record: dict[
            int, list[int] | None
        ] = {}  # survivors of every round it led (None: aborted)
        self.dropped = -1  # the round this node is a dropout of (restarted in the middle of it)
        self.catching_up = False  # restarted, and may have missed outcomes
        self.lost: dict[str, int] | None = (
            None  # ended: {"leader", "round"} of the leader that never answered
        )

    @property
    def redeliver_for(self) -> float:
        """Seconds the node's driver sends a failed delivery again for (transport failures only).

        Why: each message is sent once (``SYNC`` is only for a restarted node), so a lost announcement or
        masked input makes a member a dropout of the round, and a lost ``OUTCOME`` leaves a node waiting
        until :func:`leader_timeout`, when it ends the whole run ``leader-lost`` (measured:
        ``test_ddpnet_redeliver.py``).  The driver sends the *same bytes* again under the same envelope
        number: nothing is drawn, masked or charged again, a receiver that took the first copy drops the
        second by its replay cache, and the machines refuse a copy that slips past it (a second input,
        signature or unmask answer in the secure sum; an ``OUTCOME`` of a round already applied is late).
        For as long as a receiver may still wait for it: the leader timeout (a round's own messages are
        refused as out of phase sooner, which ends their repeats)."""
        return max(leader_timeout(self.p), 2.0 * float(self.p.round_timeout))

    # ---- rounds ---------------------------------------------------------------------------------

    def on_start(self) -> list[Action]:
        return self._begin(0)

    def _begin(self, r: int) -> list[Action]:
        if r >= self.p.rounds:
            self.finished = True
            self.inner = None
            info = {
                "rounds": self.p.rounds,
                "released": self.released,
                "aborted": self.aborted,
                "survivors": list(self.survivors),
                "accounting_view": self.view.as_dict(),
                "aggregation": self.p.aggregation,
                "contributed": sorted(self.charged),
                "led": {rr: self.led_record[rr] for rr in sorted(self.led_record)},
            }
            return [Finish(self.ctx.node, r, self.x.copy(), info)]
        me = self.ctx.node
        self.round, self.inner, self.plain = r, None, {}
        self.members = round_members(self.n, self.p.sample, self.p.sample_seed, r)
        self.leader = round_leader(self.n, r)
        acts: list[Action] = []
        if self.catching_up and self.leader != me:
            acts.append(SetTimer(f"ddp-sync:{r}", sync_period(self.p)))
        if (
            self.leader != me
        ):  # a leader that never answers ends the run (explained), never stalls it
            acts.append(SetTimer(f"ddp-leader:{r}", leader_timeout(self.p)))
        member = me in self.members
        vec = self.task.gradient(self.x) if member else None
        if self.p.aggregation == "secure":
            if member or me == self.leader:
                sp = SecAggParams(
                    self.members,
                    self.leader,
                    self.view.threshold,
                    self.dim,
                    self.p.frac_bits,
                    self.p.bits,
                    self.p.round_timeout,
                    self.s,
                    self.sens,
                    broadcast=False,
                    round_id=r,
                    mask_degree=self.p.mask_degree,
                )
                self.inner = SecAggMachine(
                    self.ctx,
                    sp,
                    vec,
                    self.key,
                    self.directory,
                    self.signer,
                    self.signers,
                    self.nonce_cache,
                    nonce=self.next_nonce if r > 0 else None,
                )
                self.next_nonce = None
                acts += self._wrap(r, self.inner.handle(RunStarted()))
        else:
            if me == self.leader:
                acts.append(SetTimer(f"plain:{r}", self.p.round_timeout))
            if member:
                noisy = vec + self.ctx.rng.standard_normal(self.dim) * self.s
                acts.append(self._entry(r, "plain"))
                self.charged.add(r)
                if me == self.leader:
                    acts += self._plain_in(me, noisy)
                else:
                    acts.append(
                        Send(self.leader, DDP_HEAD.pack(PLAIN, r) + noisy.astype("<f8").tobytes())
                    )
        for src, kind, payload in self.buffer.pop(r, []):
            if self.round != r:
                break
            acts += self._dispatch(src, kind, r, payload)
        return acts

    def _entry(self, r: int, view: str) -> LedgerEntry:
        """The member's own charge for round r (precedes the send of its input)."""
        sigma = self.view.sigma if view == "aggregate" else self.s / self.sens
        return LedgerEntry(
            self.ctx.node,
            r,
            "gradient",
            view,
            self.sens,
            self.s,
            sigma,
            self.name,
            self.ctx.run_id,
            {
                "dim": self.dim,  # the ledger's Δ_eff (fixed-point rounding) depends on it
                "mechanism": "secure-summation" if view == "aggregate" else "plain-sum",
                "collusion": self.view.collusion,
                "threshold": self.view.threshold,
                "members": len(self.members),
                "leader": self.leader,
            },
        )

    def _wrap(self, r: int, acts: list[Action]) -> list[Action]:
        """The inner secure-sum machine's actions, tagged with the round; its release/abort ends the round."""
        out: list[Action] = []
        end: Finish | None = None
        for a in acts:
            cls = a.__class__
            if cls is Send:
                out.append(Send(a.dst, DDP_HEAD.pack(ROUND, r) + a.payload))
            elif cls is SetTimer:
                out.append(SetTimer(f"{a.name}:{r}", a.delay))
            elif cls is CancelTimer:
                out.append(CancelTimer(f"{a.name}:{r}"))
            elif (
                cls is LedgerEntry
            ):  # the leader's release record for a contributor: not a charge of this node
                out.append(Metric("ddp-release", int(a.node), r, self.ctx.node))
            elif cls is Finish:
                if self.ctx.node == self.leader:
                    end = a
            else:
                out.append(a)
        if self.inner is not None and self.inner.input_sent and r not in self.charged:
            self.charged.add(r)
            out.insert(0, self._entry(r, "aggregate"))
        if end is not None:
            res = end.result if isinstance(end.result, dict) else {}
            out += self._release(
                r, end.model, len(res.get("survivors", [])), res.get("survivors", [])
            )
        return out

    def _release(
        self, r: int, total: np.ndarray | None, survivors: int, who: Any = None
    ) -> list[Action]:
        """Leader: send the outcome of round r to every other node, apply it, start round r+1.

        The outcome is kept (the last :data:`HISTORY` led rounds) for nodes that restart and catch up."""
        released = total is not None and survivors > 0
        d = self.dim if released else 0
        msg = DDP_HEAD.pack(OUTCOME, r) + DDP_OUTCOME.pack(
            1 if released else 0, survivors if released else 0, d
        )
        if released:
            msg += np.asarray(total, dtype="<f8").tobytes()
        if self._carries_nonce(
            r
        ):  # the next round's secure-sum nonce: no ANNOUNCE trip in round r+1
            self.next_nonce = self.ctx.csprng(NONCE_LEN)
            msg += self.next_nonce
        self.led[r] = msg  # kept (with the nonce) to answer a restarted node's catch-up
        while len(self.led) > HISTORY or (
            len(self.led) > 1 and sum(map(len, self.led.values())) > HISTORY_BYTES
        ):
            del self.led[min(self.led)]
        self.led_record[r] = sorted(int(u) for u in who) if released and who is not None else None
        acts: list[Action] = [Send(v, msg) for v in range(self.n) if v != self.ctx.node]
        return acts + self._apply(r, total if released else None, survivors)

    def _apply(self, r: int, total: np.ndarray | None, survivors: int) -> list[Action]:
        acts: list[Action] = []
        if self.leader != self.ctx.node:
            acts.append(CancelTimer(f"ddp-leader:{r}"))
        if total is None:
            self.aborted += 1
            acts.append(Metric("ddp-aborted", 1.0, r, self.ctx.node))
        else:
            upd = total / survivors if self.p.average else total
            self.x = self.x - self.p.step_size * upd
            self.released += 1
            self.survivors.append(int(survivors))
            acts.append(Metric("ddp-survivors", float(survivors), r, self.ctx.node))
        acts.append(Metric("step", r, r, self.ctx.node))
        return acts + self._begin(r + 1)

    def _carries_nonce(self, r: int) -> bool:
        """Whether round r's outcome carries round r+1's secure-sum nonce (secure aggregation, not the last round)."""
        return self.p.aggregation == "secure" and r + 1 < self.p.rounds

    # ---- plain aggregation (baseline of the masking's cost) -------------------------------------

    def _plain_in(self, src: int, vec: np.ndarray) -> list[Action]:
        self.plain[src] = vec
        if len(self.plain) == len(self.members):
            return [CancelTimer(f"plain:{self.round}")] + self._plain_close()
        return []

    def _plain_close(self) -> list[Action]:
        r = self.round
        got = sorted(self.plain)
        if len(got) < self.view.threshold:
            return self._release(r, None, 0)
        total = np.sum(np.stack([self.plain[u] for u in got]), axis=0)
        return self._release(r, total, len(got), got)

    # ---- events ---------------------------------------------------------------------------------

    def on_message(self, src: int, payload: bytes) -> list[Action]:
        if len(payload) < DDP_HEAD.size:
            raise MalformedMessage("secagg-dpsgd message shorter than its header")
        kind, r = DDP_HEAD.unpack_from(payload)
        if kind not in (ROUND, OUTCOME, PLAIN, SYNC, GONE, LOST):
            raise MalformedMessage(f"unknown secagg-dpsgd message kind {kind}")
        if r >= self.p.rounds:
            raise MalformedMessage(f"message for round {r}, the run has {self.p.rounds}")
        body = payload[DDP_HEAD.size :]
        if kind == SYNC:
            return self._answer_sync(src, r, body)
        if kind == LOST:
            return self._on_lost(src, r, body)
        if r < self.round or self.finished:
            return [Metric("ddp-late", float(kind), r, self.ctx.node)]
        if r > self.round:
            # a node catching up after a restart takes the outcomes of every round it missed
            ahead = CATCHUP_AHEAD if self.catching_up and kind in (OUTCOME, GONE) else WINDOW
            if r > self.round + ahead:
                raise MalformedMessage(f"message for round {r}, this node is at round {self.round}")
            if kind in (OUTCOME, GONE) and src != round_leader(self.n, r):
                raise UnexpectedSender(
                    f"outcome of round {r} from node {src}, its leader is {round_leader(self.n, r)}"
                )
            self.buffer.setdefault(r, []).append((src, kind, body))
            return []
        return self._dispatch(src, kind, r, body)

    def _answer_sync(self, src: int, r: int, body: bytes) -> list[Action]:
        """A restarted node at round ``r`` asks for the outcomes it may have missed: those of the rounds
        ``≥ r`` this node led and still holds; ``GONE(r)`` if it led round ``r``, released it, and no
        longer holds it (the asker cannot catch up)."""
        if body or src == self.ctx.node:
            raise MalformedMessage("malformed catch-up request")
        acts: list[Action] = [
            Send(src, self.led[rr]) for rr in sorted(self.led) if r <= rr <= r + CATCHUP_AHEAD
        ]
        if self.lost is not None:  # the run ended here: a leader never answered
            acts.append(
                Send(
                    src,
                    DDP_HEAD.pack(LOST, self.lost["round"]) + DDP_LOST.pack(self.lost["leader"]),
                )
            )
        if (
            round_leader(self.n, r) == self.ctx.node
            and r not in self.led
            and (r < self.round or self.finished)
        ):
            acts.append(Send(src, DDP_HEAD.pack(GONE, r)))
        return acts

    def _on_lost(self, src: int, r: int, body: bytes) -> list[Action]:
        """Another node declared the leader of round ``r`` lost and ended the run: end it here too (the
        nodes past round ``r`` would otherwise wait for a leader that has ended)."""
        if len(body) != DDP_LOST.size or src == self.ctx.node:
            raise MalformedMessage("malformed leader-lost notice")
        (leader,) = DDP_LOST.unpack(body)
        if leader != round_leader(self.n, r):
            raise UnexpectedSender(
                f"leader-lost notice of round {r} from node {src} names node {leader}, "
                f"its leader is {round_leader(self.n, r)}"
            )
        if self.finished:
            return [Metric("ddp-late", float(LOST), r, self.ctx.node)]
        return self._end_lost(r, leader, src)

    def _end_lost(self, r: int, leader: int, reporter: int | None) -> list[Action]:
        """End the run without a model: the leader of round ``r`` never answered.

        Sound because nothing is undone: a member's input for round ``r`` was charged before it left (the
        charge stays, whether or not the leader unmasked it), no outcome of round ``r`` is applied, and no
        intermediate model is released (the accountant assumes none is).  Every other node is told
        (``LOST``), so the nodes already past round ``r`` end too instead of waiting for a leader that ended;
        a restarted node asking for outcomes (``SYNC``) is told the same."""
        me = self.ctx.node
        wait = leader_timeout(self.p)
        why = (
            f"node {leader}, the leader of round {r}, "
            + (
                f"did not answer within {wait:g} s (leader_timeout)"
                if reporter is None
                else f"was declared lost by node {reporter} (no outcome within {wait:g} s)"
            )
            + f": round {r} released nothing, the run ended at round {self.round} without a model "
            f"({self.released} rounds released, {self.aborted} aborted before it); inputs that left "
            "for it stay charged"
        )
        self.finished = True
        self.inner = None
        self.lost = {"leader": int(leader), "round": int(r)}
        acts: list[Action] = []
        if reporter is None:
            note = DDP_HEAD.pack(LOST, r) + DDP_LOST.pack(leader)
            acts += [Send(v, note) for v in range(self.n) if v != me]
        info = {
            "status": LEADER_LOST,
            "ended": LEADER_LOST,
            "reason": why,
            "lost_leader": int(leader),
            "lost_round": int(r),
            "reported_by": reporter,
            "rounds": self.p.rounds,
            "at_round": self.round,
            "released": self.released,
            "aborted": self.aborted,
            "survivors": list(self.survivors),
            "accounting_view": self.view.as_dict(),
            "aggregation": self.p.aggregation,
            "contributed": sorted(self.charged),
            "led": {rr: self.led_record[rr] for rr in sorted(self.led_record)},
        }
        return acts + [
            Deviation(
                me, r, LEADER_LOST, {"dead": int(leader), "round": int(r), "reported_by": reporter}
            ),
            Finish(me, max(self.round, 0), None, info),
        ]

    def _dispatch(self, src: int, kind: int, r: int, body: bytes) -> list[Action]:
        if kind == GONE:
            if src != self.leader or self.ctx.node == self.leader or body:
                raise UnexpectedSender(f"catch-up refusal of round {r} from node {src}")
            why = (
                f"restarted and behind: the outcome of round {r} is no longer held by its leader "
                f"(it keeps its last {HISTORY} rounds, at most {HISTORY_BYTES} bytes of them); "
                "this node cannot rejoin the run"
            )
            self.finished = True
            self.inner = None
            return [
                Deviation(self.ctx.node, r, "out-of-sync", {"round": r}),
                Finish(
                    self.ctx.node,
                    r,
                    None,
                    {"status": "out-of-sync", "reason": why, "contributed": sorted(self.charged)},
                ),
            ]
        if kind == OUTCOME:
            if src != self.leader or self.ctx.node == self.leader:
                raise UnexpectedSender(
                    f"outcome of round {r} from node {src}, its leader is {self.leader}"
                )
            if len(body) < DDP_OUTCOME.size:
                raise MalformedMessage("truncated outcome")
            status, survivors, d = DDP_OUTCOME.unpack_from(body)
            if status not in (0, 1) or (
                status == 1
                and (
                    d != self.dim
                    or survivors < self.view.threshold
                    or survivors > len(self.members)
                )
            ):
                raise WrongDimension(
                    f"outcome of round {r}: status {status}, {survivors} survivors, dim {d}"
                )
            extra = NONCE_LEN if self._carries_nonce(r) else 0
            if len(body) != DDP_OUTCOME.size + 8 * d + extra:
                raise MalformedMessage(
                    f"outcome of round {r} has {len(body) - DDP_OUTCOME.size} payload bytes, "
                    f"expected {8 * d + extra}"
                )
            total = (
                np.frombuffer(body, dtype="<f8", count=d, offset=DDP_OUTCOME.size).astype(
                    np.float64
                )
                if status == 1
                else None
            )
            if total is not None and not np.all(np.isfinite(total)):
                raise MalformedMessage(f"outcome of round {r} is not finite")
            if self.inner is not None:
                self.inner.finished = True
            self.next_nonce = body[len(body) - extra :] if extra else None
            return self._apply(r, total, survivors)
        if kind == PLAIN:
            if self.p.aggregation != "plain" or self.ctx.node != self.leader:
                raise UnexpectedSender(
                    f"plain input of round {r} at node {self.ctx.node}, not its plain leader"
                )
            if src not in self.members or src in self.plain:
                raise UnexpectedSender(
                    f"plain input of round {r} from node {src}: not a member, or twice"
                )
            if len(body) != 8 * self.dim:
                raise WrongDimension(f"plain input of {len(body)} bytes, expected {8 * self.dim}")
            vec = np.frombuffer(body, dtype="<f8").astype(np.float64)
            if not np.all(np.isfinite(vec)):
                raise MalformedMessage("plain input is not finite")
            return self._plain_in(src, vec)
        if self.inner is None:
            if r == self.dropped:  # restarted mid-round: a dropout of it, it answers nothing of it
                return [Metric("ddp-dropped", float(src), r, self.ctx.node)]
            raise UnexpectedSender(
                f"secure-sum message of round {r} at node {self.ctx.node}, which has no part in it"
            )
        self.catching_up = False  # its round's leader talks to it: back in step
        return self._wrap(r, self.inner.handle(MessageArrived(src, body)))

    def on_timer(self, name: str) -> list[Action]:
        base, _, rs = name.rpartition(":")
        if not rs.isdigit() or int(rs) != self.round or self.finished:
            return []
        r = int(rs)
        if base == "ddp-leader" and self.leader != self.ctx.node:
            return self._end_lost(r, self.leader, None)
        if base == "ddp-sync":  # still behind: ask everyone again (an answer may have been lost)
            if not self.catching_up or self.leader == self.ctx.node:
                return []
            me = self.ctx.node
            return [Send(v, DDP_HEAD.pack(SYNC, r)) for v in range(self.n) if v != me] + [
                SetTimer(f"ddp-sync:{r}", sync_period(self.p))
            ]
        if base == _SECAGG_TIMER and self.inner is not None:
            return self._wrap(r, self.inner.handle(TimerFired(_SECAGG_TIMER)))
        if base == "plain" and self.ctx.node == self.leader and self.p.aggregation == "plain":
            return self._plain_close()
        return []

    # ---- durability (issue 14) ------------------------------------------------------------------

    def checkpoint(self) -> dict[str, Any]:
        """Model, round, contributions, counters, generator state, outcomes led and messages buffered for
        later rounds.  Never the secure sum's one-time secrets: a restarted node must not answer an
        unmask request of a round it may have been declared dropped in."""
        return {
            "rng": self.ctx.rng.bit_generator.state,
            "round": self.round,
            "x": self.x.copy(),
            "charged": sorted(self.charged),
            "released": self.released,
            "aborted": self.aborted,
            "survivors": list(self.survivors),
            "led": dict(self.led),
            "led_record": dict(self.led_record),
            "buffer": {r: list(v) for r, v in self.buffer.items()},
            "dropped": self.dropped,
            "catching_up": self.catching_up,
            "finished": self.finished,
            "lost": self.lost,
        }

    def restore(self, state: dict[str, Any]) -> list[Action]:
        """Load a :meth:`checkpoint` after the node restarted in round ``r``: a dropout of ``r`` (a
        restarted leader aborts it), re-send the last outcome led, ask every node for the outcomes
        missed (see the module docstring)."""
        self.ctx.rng.bit_generator.state = state["rng"]
        self.round = int(state["round"])
        self.x = np.asarray(state["x"], dtype=np.float64).copy()
        self.charged = {int(r) for r in state["charged"]}
        self.released, self.aborted = int(state["released"]), int(state["aborted"])
        self.survivors = [int(u) for u in state["survivors"]]
        self.led = {int(r): bytes(m) for r, m in state["led"].items()}
        self.led_record = {
            int(r): None if u is None else [int(x) for x in u]
            for r, u in state["led_record"].items()
        }
        self.buffer = {
            int(r): [(int(a), int(k), bytes(b)) for a, k, b in v]
            for r, v in state["buffer"].items()
        }
        self.dropped = int(state["dropped"])
        self.finished = bool(state["finished"])
        lost = state.get("lost")
        self.lost = None if lost is None else {k: int(v) for k, v in lost.items()}
        self.inner, self.plain = None, {}
        me, r = self.ctx.node, self.round
        if self.finished or r < 0:
            self.catching_up = False
            last = self.p.rounds - 1
            if self.finished and last in self.led:  # the last round's outcome may not have left
                return [Send(v, self.led[last]) for v in range(self.n) if v != me]
            return []
        self.members = round_members(self.n, self.p.sample, self.p.sample_seed, r)
        self.leader = round_leader(self.n, r)
        self.catching_up = True
        acts: list[Action] = []
        if (
            self.led and max(self.led) == r - 1
        ):  # it may have died between its checkpoint and the sends
            acts += [Send(v, self.led[r - 1]) for v in range(self.n) if v != me]
        acts += [Send(v, DDP_HEAD.pack(SYNC, r)) for v in range(self.n) if v != me]
        if self.leader == me:  # the masked inputs it held are gone: abort the round, tell everyone
            acts.append(Deviation(me, r, "restarted-mid-round", {"role": "leader", "round": r}))
            return acts + self._release(r, None, 0)
        if me in self.members:
            self.dropped = r
            acts.append(
                Deviation(
                    me,
                    r,
                    "restarted-mid-round",
                    {"role": "member", "round": r, "input_sent": r in self.charged},
                )
            )
        acts.append(SetTimer(f"ddp-sync:{r}", sync_period(self.p)))
        acts.append(SetTimer(f"ddp-leader:{r}", leader_timeout(self.p)))
        return acts


def make_ddp_machine(
    ctx: NodeContext, task: Any, params: dict[str, Any], *, run_seed: int
) -> SecAggDPSGD:
    """Build one node's machine (registry entry).  ``share_key``/``share_directory``: the node's long-term
    X25519 key and the directory's public keys (a deployment); without them, simulation keys derived
    from the run seed (reproducible, simulator only)."""
    from hushnet.crypto.keys import simulation_directory, simulation_keypairs
    from hushnet.tasks.base import GradientTask, TaskError

    p = dict(params)
    key, directory = p.pop("share_key", None), p.pop("share_directory", None)
    if key is None or directory is None:
        pairs = simulation_keypairs(run_seed, ctx.n, "share")
        key, directory = pairs[ctx.node], simulation_directory(pairs)
    signer, sdir, nonces = (
        p.pop("sign_key", None),
        p.pop("sign_directory", None),
        p.pop("replay_cache", None),
    )
    if (
        signer is None or sdir is None
    ):  # simulator: signing keys from the public run seed (never deployed)
        from hushnet.crypto.signing import signer_directory, simulation_signers

        signers = simulation_signers(run_seed, ctx.n)
        signer, sdir = signers[ctx.node], signer_directory(signers)
    if not isinstance(task, GradientTask):
        raise TaskError(f"{SECAGG_DPSGD} needs a gradient task (got {type(task).__name__})")
    x0 = p.pop("x0", None)
    p.setdefault("sample_seed", int(run_seed))
    known = set(DDPParams.__dataclass_fields__) - {"extra"}
    unknown = set(p) - known
    if unknown:
        raise ValueError(f"unknown {SECAGG_DPSGD} parameter(s) {sorted(unknown)}")
    return SecAggDPSGD(
        ctx,
        task,
        DDPParams(**p),
        key,
        directory,
        x0=x0,
        signer=signer,
        signers=sdir,
        nonce_cache=nonces,
    )


__all__ = [
    "DDPParams",
    "SecAggDPSGD",
    "calibrate",
    "round_members",
    "round_leader",
    "leader_timeout",
    "LEADER_LOST",
    "make_ddp_machine",
]
