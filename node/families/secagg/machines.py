"""Secure summation with pairwise masks and dropout recovery (SecAgg, Bonawitz et al. CCS 2017).

A group (a node's closed neighbourhood in gossip, or any set of nodes) sums its vectors so that
the aggregating node — the *leader*, which relays all messages (members of a neighbourhood need
not be neighbours of one another) and may itself be a member — learns only the sum, and members
learn only the sum if it is broadcast.  After the leader's announcement, three leader round trips
(two with ``consistency_check=False``), each closed by "everyone answered" or a timeout:

0. **announce** (leader → members): a fresh 32-byte nonce from the leader's CSPRNG; every pairwise
   seed, self mask, share envelope and signature of the execution is bound to it (the round
   *context* is run id ‖ round ‖ leader ‖ nonce), so the same signed spec run again — after a
   restart, when accepted runs are forgotten — derives different masks (issue 11, finding 6).  A
   member given a ``nonce_cache`` (its node's persistent replay cache) refuses a nonce it already
   masked under for that round, so even a leader that replays its nonce gets no second execution
   with the same seeds.  An enclosing protocol may announce the nonce ahead instead (``nonce=`` of
   the machine; ``secagg-dpsgd`` sends round r+1's with round r's outcome, saving this trip): the
   leader then sends no ANNOUNCE, and every member — the leader's own member part included — checks
   it against its replay cache exactly as an announced one before it masks.  Who draws the nonce does
   not matter for the guarantee, which rests on each member masking at most once per (round, leader,
   nonce); a node that hands out different nonces only makes the round abort (the share envelopes,
   seeds and signatures of members with different contexts do not match), as a leader that
   equivocates on its ANNOUNCE could already.
1. **masked input with its shares** (member → leader, one message, sent once the nonce is announced):
   ``y_u = R(x_u) + R(noise) + PRG(b_u) + Σ_{v∈N(u)} ±PRG(s_uv)`` mod 2^k (:mod:`hushnet.crypto.masks`;
   + if u < v), N(u) = u's neighbours in the *masking graph* on the members (complete by default).
   The pairwise seed comes from the members' **long-term** share-transport X25519 keys of the
   bootstrap directory: ``s_uv = HKDF(X25519(sk_u, pk_v), info = run_id ‖ round_id ‖ leader ‖ nonce ‖ (u, v))``
   (:func:`~hushnet.crypto.masks.pairwise_seed`) — fresh per round and execution by construction, so revealing one
   round's ``s_uv`` tells nothing about another round's.  With ``y_u`` go SHA-256 commitments to the
   fresh self-mask seed ``b_u`` and to each ``s_uv``, and, for every other member w, Shamir shares
   (threshold t, :mod:`hushnet.crypto.shamir`) of ``b_u`` and of every ``s_uv``, encrypted from u to w
   under their static-static key (:func:`~hushnet.crypto.sealed.seal_static`: HKDF of the cached
   ``X25519(sk_u, pk_w)`` with both public keys in sender-first order and info = the round's context,
   a random nonce) — no X25519 per round at all once a member has met its peers, and the envelope
   is authenticated: the leader cannot pass off shares of its own as u's.  U3 = members whose whole message arrived (input and
   shares are taken together or not at all); D = members \\ U3.  ``|U3| < t`` → abort.
2. **confirm** (leader → each survivor → leader; SecAgg's malicious-variant consistency round): the
   leader sends survivor v the sets (U3, D); v checks ``D = members \\ U3`` and ``|U3| ≥ q``, signs
   ``(context, U3)`` with its node signing key (ECDSA P-256, :mod:`hushnet.crypto.signing`; a MAC
   would not do — the leader relays the confirmations and must not be able to forge them) and answers
   at most one such request.  U4 = members whose valid signature arrived; ``|U4| < q`` → abort.
3. **unmask** (leader → each member of U4 → leader): the leader sends the signatures of U4 and the
   share envelopes sealed to v by the other members of U3.  v checks that the request is for the very
   U3 it signed and carries at least ``q`` valid signatures of distinct survivors over it (any bad
   signature is a refusal), and reveals its shares of ``b_w`` for w ∈ U3
   and of ``s_ud`` for u ∈ U3 and u's masking neighbours d ∈ D — never a share of a dropped
   member's ``b``.  The leader reconstructs each secret, checks it against its dealer's commitment
   (finding members whose shares are inconsistent), removes the self masks and the masks the
   survivors shared with dropped members, and decodes the sum.

**Against a leader that equivocates** (issue 11, finding 3: with 9 members and t = 4, telling one
half "everyone survived" and the other "the victim dropped" opened the victim's input): the
consistency quorum is ``q = max(t, ⌊n/2⌋ + 1)`` (:attr:`SecAggParams.consistency_quorum`).  Two
quorums for different survivor sets share at least ``2q − n`` members, each of whom signs one set
per round, so every honest member that unmasks does so for the same U3 unless ``2q − n`` members
collude with the leader — and for one U3 the honest-but-curious argument below applies.  Hence
:meth:`SecAggParams.malicious_collusion_tolerance` ``= min(collusion_tolerance, 2q − n − 1)``; e.g.
n = 9: t ≤ 5 → 0 colluders, t = 7 → 4 (capped by t − 1 = 6 and the masking graph).  Note that
the signatures alone at quorum t would *not* stop the split when t ≤ n/2 (both halves reach t
signers); the majority floor on q is what does.  Without the check (``consistency_check=False``,
used by the gossip neighbourhood sums, which assume an honest-but-curious leader) each member still
answers one unmask request, which gives the same bound with q = t — so a threshold ``t ≤ n/2`` is
refused there.

Dropouts: a member whose first message never came is in D (its pairwise masks in the survivors'
inputs are removed with the survivors' shares of those seeds); a member that sent it and vanished
is in U3 (its ``b_u`` *and* its seeds with dropped members are rebuilt from t shares — which is why
every member shares its pairwise seeds: a survivor that goes silent in trip 2 cannot reveal its
``s_ud`` itself, and ``s_ud`` is also known only to d).

Why it stays secure (SecAgg's double-masking argument, unchanged): the input of a member declared
dropped — should it arrive late or be kept by the leader — stays hidden behind ``PRG(b_u)``, whose
shares are never revealed for a dropped member (and each survivor answers one unmask request). For a
survivor u the leader learns ``b_u`` and the seeds with *dropped* neighbours, never the seeds u
shares with other survivors, so the survivors' masks still cancel only in their total: an
honest-but-curious leader learns only the sum of the survivors' inputs. The seeds are bound to (run,
round, leader, pair), so a revealed seed opens nothing else, and revealed seed shares are checked
against the dealer's commitment (a lying holder is found, as for ``b`` shares). What is lost against
per-round mask keys (and ephemeral-key share envelopes) is forward secrecy: a leader that keeps its
transcripts and *later* obtains u's long-term private key can recompute u's seeds, open the share
envelopes u sent and received, and with the ``b_u`` it rebuilt, recover u's past inputs (rotating
the long-term key bounds this).  The share envelopes (static-static keys) widen this a little: u's
stolen key also opens the envelopes u sent, hence its shares of ``b_u``, so an input of u that the
leader kept from a round in which u was declared dropped opens too (with ephemeral-key envelopes
that took t holders' keys). The price of dropping the
advertise round is accounting: a member's masked input leaves with its first message, so a networked member
charges its ledger then (:class:`hushnet.families.secagg.node.NetworkSecAgg`), and a round that aborts below
the threshold leaves that (conservative) charge at each member whose input left, although nothing
was released and the leader records no release.

Any round below the threshold aborts cleanly: ``Finish(model=None, status="aborted")``, an ABORT
to the members, and no release.  On release the leader writes one ledger entry per contributor
(view ``"aggregate"``: the observer sees only the sum, ``S = e_iᵀ``).

Bad input — a masked input of the wrong length, a message from a non-member or out of phase, a
duplicate, shares that do not open or are inconsistent — is a typed, counted Fault; the offender
is treated as dropped where that keeps the sum exact, otherwise the round aborts.
Fixed-point error bound: see :mod:`hushnet.crypto.masks` (``n·2^-(f+1)`` per entry; with noise a member
rounds its data and its noise apart, :func:`encode_input`, so ``n·2^-f``).

Sparse masking (``mask_degree = k``, the SecAgg+ idea of Bell et al. CCS 2020): each member masks
with only its k neighbours in the Harary graph ``H_{k,n}`` on the members in id order (public,
same for everyone), which costs k keystreams instead of n−1.  SecAgg+ draws a random k-regular
graph and gets a w.h.p. guarantee; the Harary graph is deterministic and exactly k-vertex-connected,
which gives a plain statement: the leader learns the inputs of the surviving honest members only
through their sum as long as the members it removes from the graph — the dropped ones (at most
``n − t``: members refuse to unmask below the threshold) plus the members colluding with it — number
fewer than k.  So ``k ≥ n − t + 1`` is required (refused otherwise) and the round tolerates
``c = min(t − 1, k − 1 − (n − t))`` colluding members (:meth:`SecAggParams.collusion_tolerance`);
the complete graph (default) tolerates ``t − 1``, as plain SecAgg does (t colluders would hold t
shares of every secret).  Shamir shares of ``b_u`` still go to every member, so dropout recovery
is unchanged.

Threat model: members honest-but-curious; the leader may be malicious towards the survivor sets
(see above; a leader that drops or delays messages can only abort the round).  Shares are not
verifiable (no Feldman VSS): a member
that *dealt* inconsistent shares is caught (its secret fails the commitment) but the blame lands
on the holders of the bad shares; recovery stays exact whenever ``t`` consistent shares remain.
Self-mask seeds come from the context's CSPRNG
(``ctx.csprng``, the OS pool by default), Shamir coefficients and sealing nonces from the OS pool inside
the primitives; the DP noise (``noise_std``) comes from the node's run generator like every other
machine.
"""

from __future__ import annotations

import hashlib
import itertools
from typing import Any, ClassVar

import numpy as np

from hushnet.crypto.errors import CryptoError, InconsistentShares, IntegrityError
from hushnet.crypto.keys import KeyDirectory, KeyPair
from hushnet.crypto.masks import FixedPoint, add_masks, pairwise_seed
from hushnet.crypto.sealed import open_static, seal_static
from hushnet.crypto.shamir import (
    SHARE_LEN,
    Share,
    check_encoded,
    combine,
    consistent,
    split_many_encoded,
)
from hushnet.crypto.signing import MAX_SIG_LEN, MAX_SPKI_LEN, Signer, SignerDirectory
from hushnet.engine.actions import (
    Action,
    CancelTimer,
    Deviation,
    Fault,
    Finish,
    LedgerEntry,
    Metric,
    Send,
    SetTimer,
)
from hushnet.engine.errors import (
    MalformedMessage,
    ReplayedMessage,
    UnexpectedSender,
    WrongDimension,
)
from hushnet.engine.protocol import NodeContext, Protocol
from hushnet.families.secagg.params import SECAGG_SUM, SecAggParams
from hushnet.families.secagg.wire import (
    ABORT,
    ANNOUNCE,
    CHECK_REQ,
    CHECK_SIG,
    HEAD,
    MASKED,
    NONCE_LEN,
    RESULT,
    SECRET_B,
    SECRET_S,
    U16,
    U32,
    UNMASK,
    UNMASK_REQ,
    Reader,
    pack_ids,
)
from hushnet.families.views import VIEWS
from hushnet.privacy.secure_sum import effective_sensitivity

ACCOUNTING_VIEW = VIEWS["secure-summation"]
_CHECK_LABEL = b"hushnet-secagg-consistency-v1|"
_TIMER = "secagg-round"


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


def encode_input(
    fp: FixedPoint, x: np.ndarray, noise: np.ndarray | None, n_terms: int
) -> np.ndarray:
    """The member's words ``R(x) + R(noise) mod 2^bits``: the data and the noise rounded *apart*.

    Rounding the noisy share ``R(x + noise)`` would make the sum of the words depend on each share
    (shares of std below the grid step round almost deterministically and show ``x``); with the data on
    the grid first, the sum is ``Σ R(x) + Σ R(z)`` and a neighbouring input shifts it by a grid vector,
    which the honest shares' rounded noise hides (:mod:`hushnet.privacy.secure_sum`, *Fixed point*: the
    charge's Δ_eff).  Only the data part is range-checked (a refusal is then a function of ``x``, not of
    the noise); the noise words wrap mod ``2^bits``, a function of the exact integer sum after decoding.

    The data part is first clipped into the range a sum of ``n_terms`` words decodes without wrap-around
    (a public, 1-Lipschitz map: the sensitivity Δ still bounds it).  Refusing an out-of-range ``x``
    instead would make the member drop out *because of its data*, and the dropout set is shown to the
    leader and every survivor; node builders refuse a task whose declared range does not fit, so the
    clip only acts on data (gossip's noisy messages) far outside a sane spec.
    """
    lim = fp.max_abs(n_terms)
    words = fp.encode(np.clip(x, -lim, lim), n_terms)  # a fresh array: masked in place later
    if noise is not None:
        words += fp.encode_wrapping(noise)  # uint64 addition wraps mod 2^64, then mod 2^bits
        words = fp.reduce(words)
    return words.astype(fp.dtype, copy=False)


class SecAggMachine(Protocol):
    """One node of a secure-summation round: the leader, a member, or both."""

    name: ClassVar[str] = SECAGG_SUM

    def __init__(
        self,
        ctx: NodeContext,
        params: SecAggParams,
        vector: np.ndarray | None,
        share_key: KeyPair,
        directory: KeyDirectory,
        signer: Signer | None = None,
        signers: SignerDirectory | None = None,
        nonce_cache: Any = None,
        nonce: bytes | None = None,
    ) -> None:
        super().__init__(ctx)
        p = params
        if nonce is not None and (not p.fresh_nonce or len(nonce) != NONCE_LEN):
            raise ValueError(
                f"a pre-announced round nonce needs fresh_nonce and {NONCE_LEN} bytes, got {len(nonce)}"
            )
        # the round's nonce announced ahead by an enclosing protocol (secagg-dpsgd: with the previous round's
        # outcome); None: the leader draws it and announces it itself (ANNOUNCE)
        self.preset_nonce = nonce
        if p.consistency_check and (signers is None or (signer is None and ctx.node in p.members)):
            raise ValueError(
                "the consistency check needs the node's signing key and the directory of signing keys"
            )
        self.signer, self.signers = signer, signers
        # nonces this member has masked under (a ReplayCache, persistent on a deployed node): a leader that
        # replays its nonce in a re-run of the same spec is refused instead of getting the same masks again
        self.nonce_cache = nonce_cache
        if nonce_cache is not None and ctx.node in p.members:
            nonce_cache.open_epoch(directory.epoch)
        self.p = p
        self.fp = p.fixed_point
        self.is_leader = ctx.node == p.leader
        self.is_member = ctx.node in p.members
        if self.is_member:
            if vector is None or np.asarray(vector).shape != (p.dim,):
                raise ValueError(f"member {ctx.node} needs an input vector of shape ({p.dim},)")
            self.x = np.asarray(vector, dtype=np.float64)
        self.key = share_key  # long-term: seals the shares and agrees the pairwise seeds
        self.directory = directory
        self.base_context = (
            ctx.run_id.encode() + b"|" + p.round_id.to_bytes(8, "big") + p.leader.to_bytes(4, "big")
        )
        self.context = self.base_context  # + "|" + the leader's fresh nonce once announced
        self.nonce: bytes | None = None
        self.q = p.consistency_quorum
        self.signed_U3: list[int] | None = None
        self.t = p.threshold
        self.members = frozenset(p.members)
        self.graph = mask_graph(
            p.members, p.mask_degree
        )  # public: every node computes the same graph
        # member state
        self.phase = "idle"
        self.input_sent = (
            False  # the masked input (and the shares) left: the networked wrapper charges then
        )
        # dealer -> (share of b, {peer: share of s}), kept encoded: a holder only forwards them to the leader
        self.held: dict[int, tuple[bytes, dict[int, bytes]]] = {}
        self.result: np.ndarray | None = None
        # leader state
        self.lphase = "idle"
        self.commits: dict[int, bytes] = {}
        self.pair_commits: dict[int, dict[int, bytes]] = {}
        self.cts: dict[int, dict[int, bytes]] = {}
        self.masked: dict[int, np.ndarray] = {}
        self.reveals: dict[int, dict[tuple[int, int, int], Share]] = {}
        self.lU3: list[int] = []
        self.lD: list[int] = []
        self.sigs: dict[
            int, tuple[bytes, bytes]
        ] = {}  # signer -> (SubjectPublicKeyInfo, signature over U3)
        self.lU4: list[int] = []
        self.offenders: set[int] = set()
        # (U3, D) → the shares every unmask answer must reveal (checked once per answer)
        self._wanted_for: tuple[tuple[tuple[int, ...], tuple[int, ...]], frozenset] | None = None

    @property
    def redeliver_for(self) -> float:
        """Seconds the node's driver sends a failed delivery again for (transport failures only).

        Why: every message of the round is sent once and only the leader has a timer, which closes a phase
        and never asks again — one lost delivery makes a member a dropout (its masked input, charged when
        it left, is left out), and a member that never got the announcement or the sum waits forever
        (measured: ``test_secaggnet_redeliver.py``).  The driver sends the *same bytes* again under the same
        envelope number, so nothing is drawn or masked again and a receiver that took the first copy (its
        answer lost) drops the second by its replay cache; the phase checks here refuse a copy that slips
        past it (a second masked input, signature or unmask answer is a :class:`ReplayedMessage`).  A
        repeat reveals nothing new: it is the message already sent, to the node it was sent to (a member
        answers one unmask request, whatever the copies).  Two round timeouts: by then the leader closed
        the phase and refuses the copy as out of phase, which ends the repeats."""
        return 2.0 * self.p.round_timeout

    # plumbing -----------------------------------------------------------------------------------

    def _send(self, dst: int, data: bytes) -> list[Action]:
        if dst == self.ctx.node:  # the leader as a member talks to itself without the network
            try:
                return self._receive(dst, data)
            except (
                MalformedMessage,
                CryptoError,
                ReplayedMessage,
                UnexpectedSender,
                WrongDimension,
            ) as err:
                return [Fault(self.ctx.node, err)]
        return [Send(dst, data)]

    def on_start(self) -> list[Action]:
        acts: list[Action] = []
        if self.is_leader:
            self.lphase = "collect"
            acts.append(SetTimer(_TIMER, self.p.round_timeout))
            if self.p.fresh_nonce and self.preset_nonce is None:
                self._set_nonce(self.ctx.csprng(NONCE_LEN))
                msg = bytes([ANNOUNCE]) + self.nonce  # type: ignore[operator]
                for v in sorted(self.members):
                    acts += self._send(v, msg)
                return acts
        if self.preset_nonce is not None:
            if self.is_leader:  # collects under it whatever its own member part does
                self._set_nonce(self.preset_nonce)
            if self.is_member:  # the announcement already came: check it as an ANNOUNCE, then mask
                try:
                    acts += self._take_nonce(self.preset_nonce)
                except ReplayedMessage as err:  # not masked, nothing sent: a dropout of this round
                    acts.append(Fault(self.ctx.node, err))
            return acts
        if self.is_member and not self.p.fresh_nonce:
            acts += self._mask()
        return acts

    def _take_nonce(self, nonce: bytes) -> list[Action]:
        """A member's use of the round's nonce: refused if this node already masked under it for this round
        (its replay cache; :class:`ReplayedMessage`), else bound into the context and the input masked.  The
        leader skips the check only for a nonce it drew itself (not for one announced ahead to it)."""
        if self.nonce_cache is not None and (
            self.ctx.node != self.p.leader or self.preset_nonce is not None
        ):
            self.nonce_cache.check_and_add(
                self.directory.epoch, _nonce_tag(self.base_context, nonce)
            )
        self._set_nonce(nonce)
        return self._mask()

    def _set_nonce(self, nonce: bytes) -> None:
        self.nonce = nonce
        self.context = self.base_context + b"|" + nonce

    def _mask(self) -> list[Action]:
        """Draw the noise, encode, mask and send the input with its shares (the member's first message)."""
        noise = (
            self.ctx.rng.standard_normal(self.p.dim) * self.p.noise_std
            if self.p.noise_std > 0
            else None
        )
        try:
            enc = encode_input(self.fp, self.x, noise, len(self.p.members))
        except ValueError as exc:  # NaN or infinity in the data part (a function of x alone)
            self.phase = "out"
            return [
                Deviation(
                    self.ctx.node, self.p.round_id, "secagg-input-out-of-range", {"error": str(exc)}
                )
            ]
        # what the member handed in, before rounding (tests and attacks read it)
        if noise is not None:
            self.x = self.x + noise
        msg = self._trip_one(enc)
        self.phase = "masked"
        self.input_sent = True
        return self._send(self.p.leader, msg)

    def _trip_one(self, enc: np.ndarray) -> bytes:
        """The member's only unsolicited message: masked input, commitments, and sealed shares.

        ``y = enc(x) + PRG(b) + Σ_{v∈N(u)} ±PRG(s_uv)`` (+ if u < v), with ``s_uv`` agreed from the
        long-term keys; every other member gets (sealed) a Shamir share of ``b`` and of each ``s_uv``."""
        me = self.ctx.node
        b = self.ctx.csprng(32)
        nbrs = sorted(self.graph[me])
        seeds = {
            v: pairwise_seed(self.key, self.directory.public(v), me, v, self.context) for v in nbrs
        }
        y = enc  # a fresh array from encode(): masked in place
        add_masks(y, [(b, 1)], self.context + b"|self")
        add_masks(y, ((seeds[v], 1 if me < v else -1) for v in nbrs), self.context + b"|pair")
        y = self.fp.reduce(y).astype(self.fp.dtype, copy=False)
        peers = sorted(self.members)
        xs = [v + 1 for v in peers]
        # one pass over the points, every share in its wire form (the member only ever sends them)
        b_sh, *s_rows = split_many_encoded([b] + [seeds[v] for v in nbrs], xs, self.t)
        s_sh = dict(zip(nbrs, s_rows))
        tags = [U32.pack(v) for v in nbrs]
        me_tag, count = U32.pack(me), U16.pack(len(nbrs))
        others, plains = [], []
        for i, w in enumerate(peers):
            if w == me:
                self.held[me] = (b_sh[i], {v: s_sh[v][i] for v in nbrs})
                continue
            others.append(w)
            parts = [me_tag, U32.pack(w), b_sh[i], count]
            for tag, row in zip(tags, s_rows):
                parts += (tag, row[i])
            plains.append(b"".join(parts))
        info = self.context + b"|shares"
        cts = [
            seal_static(self.key, self.directory.public(w), pt, info)
            for w, pt in zip(others, plains)
        ]
        head = (
            _commit(b"b", b)
            + U16.pack(len(nbrs))
            + b"".join(U32.pack(v) + _commit(b"s", seeds[v]) for v in nbrs)
            + U16.pack(len(others))
            + b"".join(U32.pack(w) + U32.pack(len(ct)) + ct for w, ct in zip(others, cts))
        )
        off = -(-(HEAD + len(head)) // 8) * 8  # the words start 8-byte aligned
        # one copy of the words into the message (not tobytes() and then a concatenation)
        return b"".join(
            (
                bytes([MASKED]),
                U32.pack(self.p.dim),
                U32.pack(off),
                head,
                bytes(off - HEAD - len(head)),
                np.ascontiguousarray(y).data,
            )
        )

    def on_message(self, src: int, payload: bytes) -> list[Action]:
        return self._receive(src, payload)

    def _receive(self, src: int, data: bytes) -> list[Action]:
        if not data:
            raise MalformedMessage("empty secure-summation message")
        kind = data[0]
        if kind in (MASKED, CHECK_SIG, UNMASK):
            if not self.is_leader:
                raise UnexpectedSender(f"node {self.ctx.node} is not this round's leader")
            if src not in self.members:
                raise UnexpectedSender(
                    f"secure-summation input from node {src}, which is not a member"
                )
            return self._leader(src, kind, data)
        if kind in (ANNOUNCE, CHECK_REQ, UNMASK_REQ, RESULT, ABORT):
            if not self.is_member:
                raise UnexpectedSender(f"node {self.ctx.node} is not a member of this round")
            if src != self.p.leader:
                raise UnexpectedSender(
                    f"round message from node {src}, the leader is {self.p.leader}"
                )
            return self._member(kind, data)
        raise MalformedMessage(f"unknown secure-summation message kind {kind}")

    # member -------------------------------------------------------------------------------------

    def _member(self, kind: int, data: bytes) -> list[Action]:
        me = self.ctx.node
        r = Reader(data)
        if kind == ANNOUNCE:
            if not self.p.fresh_nonce or self.preset_nonce is not None or self.phase != "idle":
                raise ReplayedMessage(f"round announcement in phase {self.phase}: refused")
            nonce = r.take(NONCE_LEN)
            r.end()
            if me == self.p.leader:  # its own announcement: the nonce it drew is already set
                return self._mask()
            # ReplayedMessage: this leader used this nonce with us before
            return self._take_nonce(nonce)
        if kind == CHECK_REQ:
            if not self.p.consistency_check or self.phase != "masked":
                raise ReplayedMessage(
                    f"survivor-set confirmation request in phase {self.phase}: refused"
                )
            U3, D = r.ids(), r.ids()
            r.end()
            self._check_sets(U3, D, self.q)
            assert self.signer is not None
            sig = self.signer.sign(self._check_message(U3))
            self.signed_U3 = U3
            self.phase = "signed"  # one survivor set per round: a second request is refused above
            spki = self.signer.spki
            return self._send(
                self.p.leader,
                bytes([CHECK_SIG]) + U16.pack(len(spki)) + spki + U16.pack(len(sig)) + sig,
            )
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
        if kind == UNMASK_REQ:
            if self.phase != ("signed" if self.p.consistency_check else "masked"):
                raise ReplayedMessage(f"unmask request in phase {self.phase}: refused")
            U3, D = r.ids(), r.ids()
            self._check_sets(U3, D, self.t)
            s3 = set(U3)
            if self.p.consistency_check:
                if U3 != self.signed_U3:
                    raise MalformedMessage(
                        "unmask request for a survivor set other than the one this member confirmed"
                    )
                self._check_quorum(r, U3)
            got: dict[int, tuple[bytes, dict[int, bytes]]] = {}
            for _ in range(r.u16()):
                u = r.u32()
                ct = r.take(r.u32())
                if u not in s3 or u == me or u in got:
                    raise MalformedMessage(
                        f"shares from node {u}, which is not a survivor (or twice)"
                    )
                got[u] = self._open_shares(u, ct)
            r.end()
            if set(got) != s3 - {me}:
                raise MalformedMessage(f"shares from {sorted(got)}, expected every other survivor")
            held = {**got, me: self.held[me]}
            parts = [U32.pack(w) + bytes([SECRET_B]) + held[w][0] for w in U3]
            parts += [
                U32.pack(u) + bytes([SECRET_S]) + U32.pack(d) + held[u][1][d]
                for u in U3
                for d in D
                if d in self.graph[u]
            ]
            self.phase = "unmasked"
            if not self.p.broadcast and me != self.p.leader:
                # a plain member's part ends here; a leader that is also a member is finished only when it
                # releases or aborts (its straggler timer must keep running until then)
                self.finished = True
            return self._send(
                self.p.leader, bytes([UNMASK]) + U16.pack(len(parts)) + b"".join(parts)
            )
        raise MalformedMessage(f"unexpected message kind {kind}")

    def _check_sets(self, U3: list[int], D: list[int], need: int) -> None:
        s3 = set(U3)
        if (
            not s3 <= self.members
            or self.ctx.node not in s3
            or set(D) != self.members - s3
            or len(U3) < need
            or len(s3) != len(U3)
        ):
            raise MalformedMessage(f"survivor/dropout sets inconsistent or below {need} survivors")

    def _check_message(self, U3: list[int]) -> bytes:
        """What a member signs: the round (run, round, leader, fresh nonce) and the survivor set it was told."""
        return _CHECK_LABEL + U32.pack(len(self.context)) + self.context + pack_ids(U3)

    def _check_quorum(self, r: Reader, U3: list[int]) -> None:
        """Refuse unless the request carries valid signatures of at least q distinct survivors, every one over
        the very survivor set this member signed (any bad signature is a refusal: SecAgg's malicious variant)."""
        assert self.signers is not None
        msg = self._check_message(U3)
        s3, seen = set(U3), set()
        for _ in range(r.u16()):
            v = r.u32()
            spki = r.take(r.u16())
            sig = r.take(r.u16())
            if v not in s3 or v in seen:
                raise MalformedMessage(
                    f"survivor-set signature of node {v}, which is not a survivor (or twice)"
                )
            self.signers.verify(
                v, spki, msg, sig
            )  # IntegrityError: forged, or over another survivor set
            seen.add(v)
        if len(seen) < self.q:
            raise MalformedMessage(
                f"{len(seen)} members confirmed the survivor set, quorum {self.q}: refused to unmask"
            )

    def _open_shares(self, u: int, ct: bytes) -> tuple[bytes, dict[int, bytes]]:
        """Open dealer ``u``'s share envelope to this member: its share of ``b_u`` and of each ``s_uv``
        (encoded, checked to be at this member's point and in the field)."""
        me = self.ctx.node
        x = me + 1  # the dealer's share points are the member ids + 1
        # IntegrityError unless u made it for me in this round
        plain = open_static(self.key, self.directory.public(u), ct, self.context + b"|shares")
        nb = sorted(self.graph[u])
        if (
            len(plain) != 10 + SHARE_LEN + len(nb) * (4 + SHARE_LEN)
            or U32.unpack_from(plain, 0)[0] != u
            or U32.unpack_from(plain, 4)[0] != me
            or U16.unpack_from(plain, 8 + SHARE_LEN)[0] != len(nb)
        ):
            raise IntegrityError(f"share envelope from {u} is malformed or misaddressed")
        b = check_encoded(plain[8 : 8 + SHARE_LEN], x)
        seeds: dict[int, bytes] = {}
        o = 10 + SHARE_LEN
        for v in nb:
            if U32.unpack_from(plain, o)[0] != v:
                raise IntegrityError(
                    f"share envelope from {u} names pairwise seeds for the wrong neighbours"
                )
            seeds[v] = check_encoded(plain[o + 4 : o + 4 + SHARE_LEN], x)
            o += 4 + SHARE_LEN
        return b, seeds

    # leader -------------------------------------------------------------------------------------

    def _leader(self, src: int, kind: int, data: bytes) -> list[Action]:
        r = Reader(data)
        if kind == MASKED:
            if self.lphase != "collect" or src in self.masked:
                raise ReplayedMessage(f"masked input from {src} out of phase or twice")
            dim, off = r.u32(), r.u32()
            w = self.fp.dtype.itemsize
            if (
                dim != self.p.dim
                or off % 8
                or not HEAD <= off <= len(data)
                or len(data) - off != w * self.p.dim
            ):
                raise WrongDimension(
                    f"masked input of {dim} entries ({len(data) - min(off, len(data))} bytes), "
                    f"the round sums {self.p.dim} words of {w} bytes"
                )
            r = Reader(data[:off], HEAD)
            commit = r.take(32)
            pair_commits: dict[int, bytes] = {}
            for _ in range(r.u16()):
                v = r.u32()
                pair_commits[v] = r.take(32)
            cts: dict[int, bytes] = {}
            for _ in range(r.u16()):
                v = r.u32()
                if v in cts:
                    raise MalformedMessage(f"member {src} sent two share envelopes for {v}")
                cts[v] = r.take(r.u32())
            if off - r.o >= 8 or any(data[r.o : off]):
                raise MalformedMessage("masked input with a malformed header padding")
            if set(cts) != self.members - {src}:
                raise MalformedMessage(
                    f"member {src} sent shares for {sorted(cts)}, expected every other member"
                )
            if set(pair_commits) != self.graph[src]:
                raise MalformedMessage(
                    f"member {src} committed to pairwise seeds with {sorted(pair_commits)}, "
                    f"its masking-graph neighbours are {sorted(self.graph[src])}"
                )
            # input and shares are taken together or not at all: U3 = members whose whole message came
            self.commits[src], self.pair_commits[src], self.cts[src] = commit, pair_commits, cts
            self.masked[src] = np.frombuffer(
                data, dtype=self.fp.dtype, offset=off
            )  # read-only view, summed at release
            return self._maybe_advance(len(self.masked) == len(self.members))
        if kind == CHECK_SIG:
            if self.lphase != "check" or src in self.sigs or src not in self.lU3:
                raise ReplayedMessage(f"survivor-set signature from {src} out of phase or twice")
            spki = r.take(r.u16())
            sig = r.take(r.u16())
            r.end()
            if len(spki) > MAX_SPKI_LEN or len(sig) > MAX_SIG_LEN:
                raise MalformedMessage(f"oversized survivor-set signature from {src}")
            self.signers.verify(src, spki, self._check_message(self.lU3), sig)  # type: ignore[union-attr]
            self.sigs[src] = (spki, sig)
            return self._maybe_advance(len(self.sigs) == len(self.lU3))
        if kind == UNMASK:
            if (
                self.lphase != "unmask"
                or src in self.reveals
                or src not in (self.lU4 if self.p.consistency_check else self.lU3)
            ):
                raise ReplayedMessage(f"unmask shares from {src} out of phase or twice")
            rev: dict[tuple[int, int, int], Share] = {}
            for _ in range(r.u16()):
                owner = r.u32()
                which = r.take(1)[0]
                peer = r.u32() if which == SECRET_S else -1
                rev[(owner, which, peer)] = Share.decode(r.take(SHARE_LEN))
            r.end()
            if set(rev) != self._wanted():
                raise MalformedMessage(f"member {src} revealed shares for the wrong owners")
            self.reveals[src] = rev
            return self._maybe_advance(
                len(self.reveals) == len(self.lU4 if self.p.consistency_check else self.lU3)
            )
        raise MalformedMessage(f"unexpected message kind {kind}")

    def _wanted(self) -> frozenset[tuple[int, int, int]]:
        """The shares a survivor reveals: of ``b_w`` for survivors w, of ``s_ud`` for survivors u and their
        dropped masking neighbours d (never a share of a dropped member's ``b``)."""
        key = (tuple(self.lU3), tuple(self.lD))  # fixed once the inputs are collected: built once
        if self._wanted_for is None or self._wanted_for[0] != key:
            d = set(self.lD)
            want = {(w, SECRET_B, -1) for w in self.lU3} | {
                (u, SECRET_S, v) for u in self.lU3 for v in self.graph[u] & d
            }
            self._wanted_for = (key, frozenset(want))
        return self._wanted_for[1]

    def on_timer(self, name: str) -> list[Action]:
        if name != _TIMER or not self.is_leader or self.lphase in ("done", "idle"):
            return []
        return self._advance()

    def _maybe_advance(self, complete: bool) -> list[Action]:
        return [CancelTimer(_TIMER)] + self._advance() if complete else []

    def _advance(self) -> list[Action]:
        ph = self.lphase
        acts: list[Action] = []
        if ph == "collect":
            self.lU3 = sorted(self.masked)
            self.lD = sorted(self.members - set(self.lU3))
            if len(self.lU3) < self.q:
                return self._abort(
                    f"{len(self.lU3)} masked inputs arrived, threshold {self.t}"
                    + (f" (consistency quorum {self.q})" if self.q > self.t else "")
                )
            sets = pack_ids(self.lU3) + pack_ids(self.lD)
            acts.append(SetTimer(_TIMER, self.p.round_timeout))
            if self.p.consistency_check:
                self.lphase = "check"
                for v in self.lU3:
                    acts += self._send(v, bytes([CHECK_REQ]) + sets)
                return acts
            return acts + self._unmask_requests(self.lU3, sets)
        if ph == "check":
            self.lU4 = sorted(self.sigs)
            if len(self.lU4) < self.q:
                return self._abort(
                    f"{len(self.lU4)} members confirmed the survivor set, quorum {self.q}"
                )
            acts.append(SetTimer(_TIMER, self.p.round_timeout))
            quorum = U16.pack(len(self.lU4)) + b"".join(
                U32.pack(v) + U16.pack(len(k)) + k + U16.pack(len(g)) + g
                for v in self.lU4
                for k, g in [self.sigs[v]]
            )
            return acts + self._unmask_requests(
                self.lU4, pack_ids(self.lU3) + pack_ids(self.lD) + quorum
            )
        if ph == "unmask":
            if len(self.reveals) < self.t:
                return self._abort(
                    f"{len(self.reveals)} members answered the unmask request, threshold {self.t}"
                )
            return self._release()
        return []

    def _unmask_requests(self, to: list[int], head: bytes) -> list[Action]:
        self.lphase = "unmask"
        acts: list[Action] = []
        for v in to:
            parts = [
                U32.pack(u) + U32.pack(len(self.cts[u][v])) + self.cts[u][v]
                for u in self.lU3
                if u != v
            ]
            acts += self._send(
                v, bytes([UNMASK_REQ]) + head + U16.pack(len(parts)) + b"".join(parts)
            )
        return acts

    def _abort(self, reason: str) -> list[Action]:
        self.lphase = "done"
        acts: list[Action] = [
            CancelTimer(_TIMER),
            Metric("secagg-aborted", reason, self.p.round_id, self.ctx.node),
        ]
        msg = bytes([ABORT]) + U16.pack(len(reason.encode())) + reason.encode()
        for v in sorted(self.members):
            if v != self.ctx.node:
                acts.append(Send(v, msg))
        self.finished = True
        if self.is_member:
            self.phase = "done"
        acts.append(
            Finish(self.ctx.node, self.p.round_id, None, {"status": "aborted", "reason": reason})
        )
        return acts

    def _recover(self, key: tuple[int, int, int]) -> tuple[bytes | None, list[Action]]:
        """Reconstruct one secret, verified against its dealer's commitment; report members with bad shares."""
        owner, which, peer = key
        holders = sorted(self.reveals)
        shares = [self.reveals[h][key] for h in holders]
        what = "self-mask seed" if which == SECRET_B else f"pairwise seed with member {peer}"
        want = self.commits[owner] if which == SECRET_B else self.pair_commits[owner][peer]
        tag = b"b" if which == SECRET_B else b"s"

        def ok(secret: bytes) -> bool:
            return _commit(tag, secret) == want

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
                    faults.append(
                        Fault(
                            self.ctx.node,
                            InconsistentShares(
                                f"member {h} revealed a share of member {owner}'s {what} that is not on the committed polynomial"
                            ),
                        )
                    )
            return sec, faults
        return None, [
            Fault(
                self.ctx.node,
                InconsistentShares(
                    f"no {self.t} revealed shares of member {owner}'s {what} open its commitment"
                ),
            )
        ]

    def _release(self) -> list[Action]:
        d = self.p.dim
        acts: list[Action] = []
        total = np.zeros(d, dtype=self.fp.dtype)
        for u in self.lU3:
            np.add(total, self.masked[u], out=total)
        self_seeds, pair_seeds = [], []
        for key in sorted(self._wanted()):
            sec, f = self._recover(key)
            acts += f
            owner, which, peer = key
            if sec is None:
                what = (
                    "self-mask seed"
                    if which == SECRET_B
                    else f"pairwise seed with dropped member {peer}"
                )
                return acts + self._abort(f"{what} of member {owner} could not be recovered")
            if which == SECRET_B:
                self_seeds.append((sec, -1))
            else:  # y_owner holds +PRG(s) if owner < peer: take it out
                pair_seeds.append((sec, -1 if owner < peer else 1))
        add_masks(total, self_seeds, self.context + b"|self")
        add_masks(total, pair_seeds, self.context + b"|pair")
        result = self.fp.decode(self.fp.reduce(total))
        self.lphase = "done"
        self.finished = True
        acts.append(CancelTimer(_TIMER))
        sens = float(self.p.sensitivity)
        # one share R(x) + R(z) seen alone: Δ + q√d (hushnet.privacy.secure_sum, *Fixed point*)
        eff = effective_sensitivity(sens, 1, dim=self.p.dim, frac_bits=self.p.frac_bits)
        sigma = self.p.noise_std / eff if sens > 0 else float("inf")
        for u in self.lU3:
            acts.append(
                LedgerEntry(
                    u,
                    self.p.round_id,
                    "value",
                    ACCOUNTING_VIEW.view_model,
                    sens,
                    self.p.noise_std,
                    sigma,
                    self.name,
                    self.ctx.run_id,
                    {
                        "released_to": self.ctx.node,
                        "contributors": len(self.lU3),
                        "mechanism": ACCOUNTING_VIEW.mechanism,
                        "dim": d,
                    },
                )
            )
        if self.p.broadcast:
            msg = bytes([RESULT]) + U32.pack(d) + result.astype("<f8").tobytes()
            for v in self.lU3:
                if v != self.ctx.node:
                    acts.append(Send(v, msg))
            if self.is_member:
                self.result = result
                self.phase = "done"
        info = {
            "status": "released",
            "role": "leader",
            "survivors": list(self.lU3),
            "dropped": list(self.lD),
            "offenders": sorted(self.offenders),
            "error_bound": self.fp.error_bound(  # data and noise rounded apart: two terms a member
                len(self.lU3) * (2 if self.p.noise_std > 0 else 1)
            ),
            "view": ACCOUNTING_VIEW.as_dict(),
        }
        acts.append(Finish(self.ctx.node, self.p.round_id, result, info))
        return acts


def _nonce_tag(base_context: bytes, nonce: bytes) -> bytes:
    """Replay-cache tag of a round announcement: the round (run, round, leader) and the leader's nonce."""
    return hashlib.sha256(b"hushnet-secagg-nonce|" + base_context + b"|" + nonce).digest()[:16]


def _commit(tag: bytes, secret: bytes) -> bytes:
    """Hash commitment to a uniform 32-byte seed (hiding as a random oracle; binding by collision resistance)."""
    return hashlib.sha256(b"hushnet-secagg-commit|" + tag + b"|" + secret).digest()


def make_sum_machine(ctx, task, params: dict[str, Any], *, run_seed: int):
    """One member's (or the leader's) secure-sum machine.  A deployed node passes its keys, signer and
    replay cache in ``params`` (``share_key``/``share_directory``, ``sign_key``/``sign_directory``,
    ``replay_cache``); without them the keys come from the public run seed (simulator only)."""
    from hushnet.crypto.keys import machine_keypair

    p = dict(params)
    node, n = ctx.node, ctx.n
    nonces = p.pop(
        "replay_cache", None
    )  # the node's persistent cache (deployed); None: per machine
    p.pop("secret_seed", None)
    p.setdefault("members", tuple(range(n)))
    p["members"] = tuple(int(m) for m in p["members"])
    key, directory = machine_keypair(p, "share", run_seed, n, node)
    p.pop("epoch", None)
    if task is None:
        raise ValueError(
            f"{SECAGG_SUM} needs a value task (its dimension, and the input of members)"
        )
    p.setdefault("dim", int(task.dim))
    p.setdefault("sensitivity", float(task.sensitivity()))
    signer, sdir = p.pop("sign_key", None), p.pop("sign_directory", None)
    if (
        signer is None or sdir is None
    ):  # simulator: signing keys from the public run seed (never deployed)
        from hushnet.crypto.signing import signer_directory, simulation_signers

        signers = simulation_signers(run_seed, n)
        signer, sdir = signers[node], signer_directory(signers)
    sp_ = SecAggParams(**p)
    vec = task.value(0) if node in sp_.members else None
    return SecAggMachine(ctx, sp_, vec, key, directory, signer, sdir, nonces)


def build_round(
    vectors: dict[int, np.ndarray],
    params: SecAggParams,
    n: int,
    *,
    run_seed: int,
    run_id: str = "sim",
    keys: list[KeyPair] | None = None,
    signers: list[Signer] | None = None,
) -> tuple[list[SecAggMachine], list[KeyPair]]:
    """Machines for all ``n`` nodes of a run with one secure-summation round (simulator helper).
    ``keys=None`` / ``signers=None`` derive simulation share-transport / signing keys from the run seed
    (never in a deployment)."""
    from hushnet.crypto.keys import simulation_directory, simulation_keypairs
    from hushnet.crypto.signing import signer_directory, simulation_signers
    from hushnet.engine.rng import node_generators

    keys = keys if keys is not None else simulation_keypairs(run_seed, n, "share")
    signers = signers if signers is not None else simulation_signers(run_seed, n)
    directory = simulation_directory(keys)
    sdir = signer_directory(signers)
    rngs = node_generators(run_seed, n)
    ms = [
        SecAggMachine(
            NodeContext(v, n, run_id, rngs[v]),
            params,
            vectors.get(v),
            keys[v],
            directory,
            signers[v],
            sdir,
        )
        for v in range(n)
    ]
    return ms, keys
