"""Secure summation with pairwise masks and dropout recovery (SecAgg, Bonawitz et al. CCS 2017).

A group (a node's closed neighbourhood in gossip, or any set of nodes) sums its vectors so that
the aggregating node — the *leader*, which relays all messages (members of a neighbourhood need
not be neighbours of one another) and may itself be a member — learns only the sum, and members
learn only the sum if it is broadcast.  Three leader round trips, each closed by "everyone answered"
or a timeout:

1. **advertise and share** (one message): member u sends a fresh per-round X25519 mask key
   ``pk_u``, a commitment (SHA-256) to a fresh self-mask seed ``b_u``, and Shamir shares of ``b_u``
   and of its mask secret key ``sk_u`` (threshold t, :mod:`node.crypto.shamir`) for *every other
   member*, each pair sealed to the recipient's long-term share-transport key
   (:func:`~node.crypto.sealed.seal`).  Bonawitz et al. spend a round before the shares because they
   encrypt them under keys agreed from the advertised ones; the share-transport keys here come from
   the bootstrap directory (a PKI), so the shares need not wait for the key list.  U1 = U2 = members
   whose message came; fewer than ``threshold`` → abort (nobody has masked: no ledger entry
   anywhere).  The leader sends each member of U1 the key list and the shares sealed to it.
2. **masked input**: ``y_u = enc(x_u + noise) + PRG(b_u) + Σ_{v∈N(u)∩U2} ±PRG(s_uv)`` mod 2^k
   (:mod:`node.crypto.masks`; + if u < v), N(u) = u's neighbours in the *masking graph* on U1
   (complete by default).  U3 = members whose input came; D = U2 \\ U3 dropped.
3. **unmask**: each member of U3 reveals its share of ``b_u`` for u ∈ U3 and of ``sk_u`` for
   u ∈ D — never both for one u (a member answers one unmask request only, and checks
   ``D = U2 \\ U3``, ``|U3| ≥ t``).  The leader reconstructs, checks every secret against its
   commitment / public key (finding and reporting members whose shares are inconsistent), removes
   the self masks and the dropped members' pairwise masks, and decodes the sum.

Any round below the threshold aborts cleanly: ``Finish(model=None, status="aborted")``, an ABORT
to the members, and **no ledger entry**.  On release the leader writes one ledger entry per
contributor (view ``"aggregate"``: the observer sees only the sum, ``S = e_iᵀ``).

Bad input — a masked input of the wrong length, a message from a non-member or out of phase, a
duplicate, shares that do not open or are inconsistent — is a typed, counted Fault; the offender
is treated as dropped where that keeps the sum exact, otherwise the round aborts.
Fixed-point error bound: see :mod:`node.crypto.masks` (``n·2^-(f+1)`` per entry).

Sparse masking (``mask_degree = k``, the SecAgg+ idea of Bell et al. CCS 2020): each member masks
with only its k neighbours in the Harary graph ``H_{k,|U1|}`` on the advertisers in id order (public,
same for everyone), which costs k keystreams instead of |U1|−1.  SecAgg+ draws a random k-regular
graph and gets a w.h.p. guarantee; the Harary graph is deterministic and exactly k-vertex-connected,
which gives a plain statement: the leader learns the inputs of the surviving honest members only
through their sum as long as the members it removes from the graph — the dropped ones (at most
``n − t``: members refuse to unmask below the threshold) plus the members colluding with it — number
fewer than k.  So ``k ≥ n − t + 1`` is required (refused otherwise) and the round tolerates
``c = min(t − 1, k − 1 − (n − t))`` colluding members (:meth:`SecAggParams.collusion_tolerance`);
the complete graph (default) tolerates ``t − 1``, as plain SecAgg does (t colluders would hold t
shares of every secret).  Shamir shares still go to every member, so dropout recovery is
unchanged.

Threat model: an honest-but-curious leader and members (SecAgg's semi-honest setting); a
threshold ``t > |members|/2`` is recommended.  Shares are not verifiable (no Feldman VSS): a member
that *dealt* inconsistent shares is caught (its secret fails the commitment) but the blame lands
on the holders of the bad shares; recovery stays exact whenever ``t`` consistent shares remain.
Randomness for keys, seeds and shares is the OS CSPRNG; the DP noise (``noise_std``) comes from
the node's run generator like every other machine.
"""
from __future__ import annotations

import hashlib
import itertools
import os
import struct
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from node.crypto.errors import CryptoError, InconsistentShares, IntegrityError
from node.crypto.keys import KeyDirectory, KeyPair
from node.crypto.masks import FixedPoint, add_masks, pairwise_seed
from node.crypto.sealed import open_sealed, seal_many
from node.crypto.shamir import SHARE_LEN, Share, combine, consistent, split
from node.engine.actions import Action, CancelTimer, Deviation, Fault, Finish, LedgerEntry, Metric, Send, SetTimer
from node.engine.errors import MalformedMessage, ReplayedMessage, UnexpectedSender, WrongDimension
from node.engine.protocol import NodeContext, Protocol
from node.protocols.onion import VIEWS

ACCOUNTING_VIEW = VIEWS["secure-summation"]
# 0x63 / 0x64 were the separate share / forwarded-share messages of the four-round version
ADV, KEYS, MASKED, UNMASK_REQ, UNMASK, RESULT, ABORT = 0x61, 0x62, 0x65, 0x66, 0x67, 0x68, 0x69
_TIMER = "secagg-round"
_U16, _U32 = struct.Struct(">H"), struct.Struct(">I")
_B, _S = 0, 1  # which secret a revealed share belongs to


@dataclass(frozen=True)
class SecAggParams:
    """Public parameters of one secure-summation round."""

    members: tuple[int, ...]
    leader: int
    threshold: int
    dim: int
    frac_bits: int = 24
    bits: int = 64
    round_timeout: float = 0.05
    noise_std: float = 0.0
    sensitivity: float = 1.0
    broadcast: bool = True
    round_id: int = 0
    mask_degree: int | None = None  # None: complete masking graph (plain SecAgg); k: Harary graph H_{k,n}

    def __post_init__(self) -> None:
        m = self.members
        if len(set(m)) != len(m) or len(m) < 2:
            raise ValueError("members must be at least two distinct nodes")
        if not 2 <= self.threshold <= len(m):
            raise ValueError(f"threshold must be in 2..{len(m)}")
        if self.dim < 1 or self.round_timeout <= 0 or self.noise_std < 0:
            raise ValueError("need dim >= 1, round_timeout > 0, noise_std >= 0")
        if self.mask_degree is not None:
            lo = len(m) - self.threshold + 1
            if not lo <= self.mask_degree:
                raise ValueError(f"mask_degree {self.mask_degree} < n − t + 1 = {lo}: dropouts allowed by the threshold "
                                 "could cut the masking graph and expose partial sums")

    @property
    def fixed_point(self) -> FixedPoint:
        return FixedPoint(self.frac_bits, self.bits)

    def collusion_tolerance(self) -> int:
        """How many members may collude with the leader while the surviving honest inputs stay hidden
        except through their sum (see the module docstring)."""
        n, t = len(self.members), self.threshold
        shamir = t - 1  # t colluders would hold t shares of every secret
        if self.mask_degree is None or self.mask_degree >= n - 1:
            return shamir
        return min(shamir, self.mask_degree - 1 - (n - t))


def mask_graph(ids: list[int] | tuple[int, ...], degree: int | None) -> dict[int, frozenset[int]]:
    """Neighbours in the Harary graph ``H_{degree,m}`` on ``ids`` (sorted, by position): ``degree``-regular
    (one vertex has degree+1 if both are odd) and exactly ``degree``-vertex-connected (Harary 1962).
    ``None`` or ``degree ≥ m − 1``: the complete graph."""
    ids = sorted(ids)
    m = len(ids)
    if degree is None or degree >= m - 1:
        return {u: frozenset(ids) - {u} for u in ids}
    if degree < 1:
        raise ValueError("mask degree must be at least 1")
    nb: list[set[int]] = [set() for _ in range(m)]
    for i in range(m):
        for j in range(1, degree // 2 + 1):
            nb[i].add((i + j) % m)
            nb[(i + j) % m].add(i)
    if degree % 2:
        if m % 2 == 0:
            for i in range(m // 2):
                nb[i].add(i + m // 2)
                nb[i + m // 2].add(i)
        else:
            for i in range((m + 1) // 2):
                k = (i + (m - 1) // 2) % m
                nb[i].add(k)
                nb[k].add(i)
    return {ids[i]: frozenset(ids[j] for j in nb[i] if j != i) for i in range(m)}


def _ids(ids: list[int] | tuple[int, ...] | set[int]) -> bytes:
    ids = sorted(ids)
    return _U16.pack(len(ids)) + b"".join(_U32.pack(i) for i in ids)


class _Reader:
    def __init__(self, data: bytes, off: int = 1) -> None:
        self.d, self.o = data, off

    def take(self, n: int) -> bytes:
        if self.o + n > len(self.d):
            raise MalformedMessage("truncated secure-summation message")
        b = self.d[self.o : self.o + n]
        self.o += n
        return b

    def u16(self) -> int:
        return _U16.unpack(self.take(2))[0]

    def u32(self) -> int:
        return _U32.unpack(self.take(4))[0]

    def ids(self) -> list[int]:
        return [self.u32() for _ in range(self.u16())]

    def end(self) -> None:
        if self.o != len(self.d):
            raise MalformedMessage(f"{len(self.d) - self.o} trailing bytes in secure-summation message")


class SecAggMachine(Protocol):
    """One node of a secure-summation round: the leader, a member, or both."""

    name: ClassVar[str] = "secagg-sum"

    def __init__(
        self,
        ctx: NodeContext,
        params: SecAggParams,
        vector: np.ndarray | None,
        share_key: KeyPair,
        directory: KeyDirectory,
    ) -> None:
        super().__init__(ctx)
        p = params
        self.p = p
        self.fp = p.fixed_point
        self.is_leader = ctx.node == p.leader
        self.is_member = ctx.node in p.members
        if self.is_member:
            if vector is None or np.asarray(vector).shape != (p.dim,):
                raise ValueError(f"member {ctx.node} needs an input vector of shape ({p.dim},)")
            self.x = np.asarray(vector, dtype=np.float64)
        self.key = share_key
        self.directory = directory
        self.context = ctx.run_id.encode() + b"|" + p.round_id.to_bytes(8, "big")
        self.t = p.threshold
        self.members = frozenset(p.members)
        # member state
        self.phase = "idle"
        self.mkp: KeyPair | None = None
        self.pks: dict[int, bytes] = {}
        self.U2: list[int] = []
        self.held: dict[int, tuple[Share, Share]] = {}  # owner -> (share of sk, share of b)
        self.result: np.ndarray | None = None
        # leader state
        self.lphase = "idle"
        self.adv: dict[int, bytes] = {}
        self.commits: dict[int, bytes] = {}
        self.cts: dict[int, dict[int, bytes]] = {}
        self.masked: dict[int, np.ndarray] = {}
        self.reveals: dict[int, dict[tuple[int, int], Share]] = {}
        self.lU1: list[int] = []
        self.lU2: list[int] = []
        self.lU3: list[int] = []
        self.lD: list[int] = []
        self.offenders: set[int] = set()

    # plumbing -----------------------------------------------------------------------------------

    def _send(self, dst: int, data: bytes) -> list[Action]:
        if dst == self.ctx.node:  # the leader as a member talks to itself without the network
            try:
                return self._receive(dst, data)
            except (MalformedMessage, CryptoError, ReplayedMessage, UnexpectedSender, WrongDimension) as err:
                return [Fault(self.ctx.node, err)]
        return [Send(dst, data)]

    def on_start(self) -> list[Action]:
        acts: list[Action] = []
        if self.is_leader:
            self.lphase = "adv"
            acts.append(SetTimer(_TIMER, self.p.round_timeout))
        if self.is_member:
            if self.p.noise_std > 0:
                self.x = self.x + self.ctx.rng.standard_normal(self.p.dim) * self.p.noise_std
            try:
                self.enc = self.fp.encode(self.x, len(self.p.members)).astype(self.fp.dtype)  # range-checked once
            except ValueError as exc:
                self.phase = "out"
                return acts + [Deviation(self.ctx.node, self.p.round_id, "secagg-input-out-of-range", {"error": str(exc)})]
            self.mkp = KeyPair.generate()
            self.b = os.urandom(32)
            me = self.ctx.node
            peers = sorted(self.members)
            s_sh = split(self.mkp.private_bytes(), [v + 1 for v in peers], self.t)
            b_sh = split(self.b, [v + 1 for v in peers], self.t)
            others, plains = [], []
            for v, ss, bs in zip(peers, s_sh, b_sh):
                if v == me:
                    self.held[me] = (ss, bs)
                else:
                    others.append(v)
                    plains.append(_U32.pack(me) + _U32.pack(v) + ss.encode() + bs.encode())
            cts = seal_many([self.directory.public(v) for v in others], plains, self.context + b"|shares")
            parts = [_U32.pack(v) + _U32.pack(len(ct)) + ct for v, ct in zip(others, cts)]
            self.phase = "advertised"
            acts += self._send(self.p.leader, bytes([ADV]) + self.mkp.public + _commit(self.b) + _U16.pack(len(parts))
                               + b"".join(parts))
        return acts

    def on_message(self, src: int, payload: bytes) -> list[Action]:
        return self._receive(src, payload)

    def _receive(self, src: int, data: bytes) -> list[Action]:
        if not data:
            raise MalformedMessage("empty secure-summation message")
        kind = data[0]
        if kind in (ADV, MASKED, UNMASK):
            if not self.is_leader:
                raise UnexpectedSender(f"node {self.ctx.node} is not this round's leader")
            if src not in self.members:
                raise UnexpectedSender(f"secure-summation input from node {src}, which is not a member")
            return self._leader(src, kind, data)
        if kind in (KEYS, UNMASK_REQ, RESULT, ABORT):
            if not self.is_member:
                raise UnexpectedSender(f"node {self.ctx.node} is not a member of this round")
            if src != self.p.leader:
                raise UnexpectedSender(f"round message from node {src}, the leader is {self.p.leader}")
            return self._member(kind, data)
        raise MalformedMessage(f"unknown secure-summation message kind {kind}")

    # member -------------------------------------------------------------------------------------

    def _member(self, kind: int, data: bytes) -> list[Action]:
        me = self.ctx.node
        r = _Reader(data)
        if kind == ABORT:
            reason = r.take(r.u16()).decode(errors="replace")
            self.phase = "done"
            self.finished = True
            return [Finish(me, self.p.round_id, None, {"status": "aborted", "reason": reason})]
        if kind == RESULT:
            if self.phase != "unmasked":
                raise MalformedMessage(f"result in phase {self.phase}")
            if r.u32() != self.p.dim:
                raise WrongDimension("result of the wrong dimension")
            s = np.frombuffer(r.take(8 * self.p.dim), dtype="<f8").copy()
            r.end()
            self.result = s
            self.phase = "done"
            self.finished = True
            return [Finish(me, self.p.round_id, s, {"status": "released", "role": "member"})]
        if kind == KEYS:
            if self.phase != "advertised":
                raise ReplayedMessage(f"key list again (phase {self.phase})")
            pks = {}
            for _ in range(r.u16()):
                v = r.u32()
                pks[v] = r.take(32)
            if not set(pks) <= self.members or me not in pks or pks[me] != self.mkp.public:
                raise MalformedMessage("key list names non-members or misses this member's key")
            if len(pks) < self.t:
                raise MalformedMessage(f"key list of {len(pks)} members is below the threshold {self.t}")
            got: dict[int, tuple[Share, Share]] = {}
            for _ in range(r.u16()):
                u = r.u32()
                ct = r.take(r.u32())
                if u not in pks or u == me or u in got:
                    raise MalformedMessage(f"shares from node {u}, which is not on the key list (or twice)")
                plain = open_sealed(self.key, ct, self.context + b"|shares")  # IntegrityError if not for me
                if len(plain) != 8 + 2 * SHARE_LEN or _U32.unpack_from(plain, 0)[0] != u or _U32.unpack_from(plain, 4)[0] != me:
                    raise IntegrityError(f"share envelope from {u} is malformed or misaddressed")
                got[u] = (Share.decode(plain[8 : 8 + SHARE_LEN]), Share.decode(plain[8 + SHARE_LEN :]))
            r.end()
            if set(got) != set(pks) - {me}:
                raise MalformedMessage(f"shares from {sorted(got)}, expected every other member on the key list")
            self.pks = pks
            self.held.update(got)
            self.U2 = sorted(pks)
            y = self._masked_input()
            self.phase = "masked"
            return self._send(self.p.leader, bytes([MASKED]) + _U32.pack(self.p.dim) + y.tobytes())
        if kind == UNMASK_REQ:
            if self.phase != "masked":
                raise ReplayedMessage(f"second unmask request (phase {self.phase}): refused")
            U3, D = r.ids(), r.ids()
            r.end()
            s3, sd, s2 = set(U3), set(D), set(self.U2)
            if not s3 <= s2 or me not in s3 or sd != s2 - s3 or len(U3) < self.t:
                raise MalformedMessage("unmask request with inconsistent survivor/dropout sets or below threshold")
            parts = []
            for u in U3:
                parts.append(_U32.pack(u) + bytes([_B]) + self.held[u][1].encode())
            for u in D:
                parts.append(_U32.pack(u) + bytes([_S]) + self.held[u][0].encode())
            self.phase = "unmasked"
            if not self.p.broadcast and me != self.p.leader:
                # a plain member's part ends here; a leader that is also a member is finished only when it
                # releases or aborts (its straggler timer must keep running until then)
                self.finished = True
            return self._send(self.p.leader, bytes([UNMASK]) + _U16.pack(len(parts)) + b"".join(parts))
        raise MalformedMessage(f"unexpected message kind {kind}")

    def _masked_input(self) -> np.ndarray:
        """``enc(x) + PRG(b) ± PRG(s_uv)`` for the masking-graph neighbours that shared keys, in machine
        words (little-endian uint32/uint64, ready for the wire)."""
        me = self.ctx.node
        y = self.enc.copy()
        add_masks(y, [(self.b, 1)], self.context + b"|self")
        nbrs = mask_graph(sorted(self.pks), self.p.mask_degree)[me]
        add_masks(y, ((pairwise_seed(self.mkp, self.pks[v], me, v, self.context), 1 if me < v else -1)
                      for v in self.U2 if v in nbrs), self.context + b"|pair")
        return self.fp.reduce(y).astype(self.fp.dtype, copy=False)

    # leader -------------------------------------------------------------------------------------

    def _leader(self, src: int, kind: int, data: bytes) -> list[Action]:
        r = _Reader(data)
        if kind == ADV:
            if self.lphase != "adv" or src in self.adv:
                raise ReplayedMessage(f"mask key from {src} out of phase or twice")
            pk, commit = r.take(32), r.take(32)
            cts = {}
            for _ in range(r.u16()):
                v = r.u32()
                if v in cts:
                    raise MalformedMessage(f"member {src} sent two share envelopes for {v}")
                cts[v] = r.take(r.u32())
            r.end()
            if set(cts) != self.members - {src}:
                raise MalformedMessage(f"member {src} sent shares for {sorted(cts)}, expected every other member")
            self.adv[src], self.commits[src], self.cts[src] = pk, commit, cts
            return self._maybe_advance(len(self.adv) == len(self.members))
        if kind == MASKED:
            if self.lphase != "masked" or src in self.masked or src not in self.lU2:
                raise ReplayedMessage(f"masked input from {src} out of phase or twice")
            dim = r.u32()
            w = self.fp.dtype.itemsize
            if dim != self.p.dim or len(data) != 5 + w * self.p.dim:
                raise WrongDimension(f"masked input of {dim} entries ({len(data) - 5} bytes), the round sums "
                                     f"{self.p.dim} words of {w} bytes")
            self.masked[src] = np.frombuffer(data, dtype=self.fp.dtype, offset=5)  # read-only view, summed at release
            return self._maybe_advance(len(self.masked) == len(self.lU2))
        if kind == UNMASK:
            if self.lphase != "unmask" or src in self.reveals or src not in self.lU3:
                raise ReplayedMessage(f"unmask shares from {src} out of phase or twice")
            rev: dict[tuple[int, int], Share] = {}
            for _ in range(r.u16()):
                owner = r.u32()
                which = r.take(1)[0]
                rev[(owner, which)] = Share.decode(r.take(SHARE_LEN))
            r.end()
            want = {(u, _B) for u in self.lU3} | {(u, _S) for u in self.lD}
            if set(rev) != want:
                raise MalformedMessage(f"member {src} revealed shares for the wrong owners")
            self.reveals[src] = rev
            return self._maybe_advance(len(self.reveals) == len(self.lU3))
        raise MalformedMessage(f"unexpected message kind {kind}")

    def on_timer(self, name: str) -> list[Action]:
        if name != _TIMER or not self.is_leader or self.lphase in ("done", "idle"):
            return []
        return self._advance()

    def _maybe_advance(self, complete: bool) -> list[Action]:
        return [CancelTimer(_TIMER)] + self._advance() if complete else []

    def _advance(self) -> list[Action]:
        ph = self.lphase
        acts: list[Action] = []
        if ph == "adv":
            self.lU1 = self.lU2 = sorted(self.adv)
            if len(self.lU1) < self.t:
                return self._abort(f"{len(self.lU1)} members advertised keys, threshold {self.t}")
            self.lphase = "masked"
            keys = _U16.pack(len(self.lU1)) + b"".join(_U32.pack(v) + self.adv[v] for v in self.lU1)
            acts.append(SetTimer(_TIMER, self.p.round_timeout))
            for v in self.lU1:
                parts = [_U32.pack(u) + _U32.pack(len(self.cts[u][v])) + self.cts[u][v] for u in self.lU1 if u != v]
                acts += self._send(v, bytes([KEYS]) + keys + _U16.pack(len(parts)) + b"".join(parts))
            return acts
        if ph == "masked":
            self.lU3 = sorted(self.masked)
            self.lD = sorted(set(self.lU2) - set(self.lU3))
            if len(self.lU3) < self.t:
                return self._abort(f"{len(self.lU3)} masked inputs arrived, threshold {self.t}")
            self.lphase = "unmask"
            acts.append(SetTimer(_TIMER, self.p.round_timeout))
            msg = bytes([UNMASK_REQ]) + _ids(self.lU3) + _ids(self.lD)
            for v in self.lU3:
                acts += self._send(v, msg)
            return acts
        if ph == "unmask":
            if len(self.reveals) < self.t:
                return self._abort(f"{len(self.reveals)} members answered the unmask request, threshold {self.t}")
            return self._release()
        return []

    def _abort(self, reason: str) -> list[Action]:
        self.lphase = "done"
        acts: list[Action] = [CancelTimer(_TIMER), Metric("secagg-aborted", reason, self.p.round_id, self.ctx.node)]
        msg = bytes([ABORT]) + _U16.pack(len(reason.encode())) + reason.encode()
        for v in sorted(self.members):
            if v != self.ctx.node:
                acts.append(Send(v, msg))
        self.finished = True
        if self.is_member:
            self.phase = "done"
        acts.append(Finish(self.ctx.node, self.p.round_id, None, {"status": "aborted", "reason": reason}))
        return acts

    def _recover(self, owner: int, which: int) -> tuple[bytes | None, list[Action]]:
        """Reconstruct one secret, verified against its commitment; report members with bad shares."""
        holders = sorted(self.reveals)
        shares = [self.reveals[h][(owner, which)] for h in holders]

        def ok(secret: bytes) -> bool:
            if which == _B:
                return _commit(secret) == self.commits[owner]
            return KeyPair.from_private_bytes(secret).public == self.adv[owner]

        try:
            if all(consistent(shares, self.t)):
                sec = combine(shares, self.t)
                if ok(sec):
                    return sec, []
        except InconsistentShares:
            pass
        for n_tried, idx in enumerate(itertools.combinations(range(len(shares)), self.t)):
            if n_tried > 20000:
                break
            sub = [shares[i] for i in idx]
            try:
                sec = combine(sub, self.t)
            except InconsistentShares:
                continue
            if not ok(sec):
                continue
            good = consistent(sub + [s for i, s in enumerate(shares) if i not in idx], self.t)
            rest = [h for i, h in enumerate(holders) if i not in idx]
            faults: list[Action] = []
            for h, g in zip(rest, good[self.t :]):
                if not g:
                    self.offenders.add(h)
                    faults.append(Fault(self.ctx.node, InconsistentShares(
                        f"member {h} revealed a share of member {owner}'s {'seed' if which == _B else 'key'} "
                        "that is not on the committed polynomial")))
            return sec, faults
        return None, [Fault(self.ctx.node, InconsistentShares(
            f"no {self.t} revealed shares of member {owner}'s {'seed' if which == _B else 'key'} open its commitment"))]

    def _release(self) -> list[Action]:
        d = self.p.dim
        acts: list[Action] = []
        total = np.zeros(d, dtype=self.fp.dtype)
        for u in self.lU3:
            np.add(total, self.masked[u], out=total)
        for u in self.lU3:
            b, f = self._recover(u, _B)
            acts += f
            if b is None:
                return acts + self._abort(f"self-mask seed of member {u} could not be recovered")
            add_masks(total, [(b, -1)], self.context + b"|self")
        graph = mask_graph(self.lU1, self.p.mask_degree)
        for v in self.lD:
            s, f = self._recover(v, _S)
            acts += f
            if s is None:
                return acts + self._abort(f"mask key of dropped member {v} could not be recovered")
            kv = KeyPair.from_private_bytes(s)
            add_masks(total, ((pairwise_seed(kv, self.adv[u], v, u, self.context), -1 if u < v else 1)
                              for u in self.lU3 if u in graph[v]), self.context + b"|pair")
        result = self.fp.decode(self.fp.reduce(total))
        self.lphase = "done"
        self.finished = True
        acts.append(CancelTimer(_TIMER))
        sens = float(self.p.sensitivity)
        sigma = self.p.noise_std / sens if sens > 0 else float("inf")
        for u in self.lU3:
            acts.append(LedgerEntry(u, self.p.round_id, "value", ACCOUNTING_VIEW.view_model, sens, self.p.noise_std, sigma,
                                    self.name, self.ctx.run_id,
                                    {"released_to": self.ctx.node, "contributors": len(self.lU3), "mechanism": ACCOUNTING_VIEW.mechanism}))
        if self.p.broadcast:
            msg = bytes([RESULT]) + _U32.pack(d) + result.astype("<f8").tobytes()
            for v in self.lU3:
                if v != self.ctx.node:
                    acts.append(Send(v, msg))
            if self.is_member:
                self.result = result
                self.phase = "done"
        info = {"status": "released", "role": "leader", "survivors": list(self.lU3), "dropped": list(self.lD),
                "offenders": sorted(self.offenders), "error_bound": self.fp.error_bound(len(self.lU3)),
                "view": ACCOUNTING_VIEW.as_dict()}
        acts.append(Finish(self.ctx.node, self.p.round_id, result, info))
        return acts


def _commit(b: bytes) -> bytes:
    return hashlib.sha256(b"hushnet-secagg-commit|" + b).digest()


def build_round(
    vectors: dict[int, np.ndarray],
    params: SecAggParams,
    n: int,
    *,
    run_seed: int,
    run_id: str = "sim",
    keys: list[KeyPair] | None = None,
) -> tuple[list[SecAggMachine], list[KeyPair]]:
    """Machines for all ``n`` nodes of a run with one secure-summation round (simulator helper).
    ``keys=None`` derives simulation share-transport keys from the run seed (never in a deployment)."""
    from node.crypto.keys import simulation_directory, simulation_keypairs
    from node.engine.rng import node_generators

    keys = keys if keys is not None else simulation_keypairs(run_seed, n, "share")
    directory = simulation_directory(keys)
    rngs = node_generators(run_seed, n)
    ms = [SecAggMachine(NodeContext(v, n, run_id, rngs[v]), params, vectors.get(v), keys[v], directory) for v in range(n)]
    return ms, keys
