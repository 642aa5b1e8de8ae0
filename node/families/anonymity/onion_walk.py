"""Mode B of the source-anonymous walk: the onion random walk (docs/design/spec/anonymity.md §6.3, §6.6).

Mode A (:class:`~hushnet.families.anonymity.anonymous_walk.AnonymousWalk`) lets the sealed token itself walk:
every relay forwards the *same bytes*, so a relay that sees the walk twice knows whether an update
happened in between, and colluding relays can pin an update to a segment (§6.6 "update
detection").  Mode B removes that leak without changing the hitting-time law:

* the source draws the destination ``j`` exactly as in Mode A (``p*``), seals the model to ``j``
  (the same two-part token), then **simulates** the simple random walk itself on the public graph
  — uniform neighbour, backtracking allowed — from itself until the first visit of ``j``
  (:func:`~hushnet.privacy.anonymity_setup.sample_walk_to_destination`).  The first hitting time is
  therefore distributed exactly as Mode A's, so the whole accounting of §3 (and the hitting-time
  records) applies unchanged;
* a walk longer than the header's ``L_max`` slots is **rejected and resampled** (docs/design/spec/anonymity.md §6.3: the
  truncated law differs from the untruncated one by ``P(T > L_max) ≲ ε_tr = 1e-3``, the paper's κ
  as an upper bound on ``T_FH`` made literal); the default ``L_max = ℓ2 + ⌈(N/c')·ln(1/ε_tr)⌉``;
* the source builds a Sphinx-like onion (:func:`hushnet.crypto.onion.build_packet`) along that
  trajectory ``v_1 … v_T = j`` with the token as payload.  Each hop peels one layer with its
  long-term onion key: it learns its predecessor (the link), its successor (its slot) and whether
  it is the final hop — not its position (constant header, filler), not the source, not ``j``.
  Incoming and outgoing bytes share nothing (fresh ephemeral key, fresh keystreams per hop);
* a node visited several times peels an independent layer at each visit; ``j`` may be visited
  only at the end (first hit);
* the final layer's payload is the sealed token, which ``j`` opens with its destination key; a
  final layer carrying a token that does not open is refused as an integrity failure.

Every hop's layer MAC covers header *and* payload (:mod:`hushnet.crypto.onion`), so a flipped bit
anywhere is caught at the very next hop, before the replay cache is touched; a replayed packet
(the same layer again, under any hop id) is refused by the per-epoch replay tag τ; a packet for
an unknown key epoch, truncated/oversized cells, or an authentic layer that routes to a
non-neighbour: all typed, counted Faults, nothing forwarded, nothing in the ledger.

Reliability is the same hop-by-hop ack/retransmission as Mode A, except that a silent next hop
cannot be replaced by another neighbour (the path is fixed inside the onion): the holder keeps
retrying and reports itself Paused (walk loss, §6.6 — a restart with a fresh walk would have to
come from the source, which nobody on the path knows).

Keys: the onion layers use each node's *onion* key of the epoch, the token its *destination* key
(key separation in the simulator; over the network a node has one long-term X25519 key, used for
both with distinct HKDF salts — see docs/anonymity.md).  Cost: the source does ``T`` X25519
operations plus ``O(T²·S + T·(R·S + P))`` keystream, a hop ``R·S + P`` — affordable for the
networks here (N=12: ``L_max`` = 171 slots, an 11 KB header).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from hushnet.crypto.errors import IntegrityError
from hushnet.crypto.keys import KeyDirectory, KeyPair
from hushnet.crypto.onion import OnionKeyring, build_packet, onion_ad, packet_length, peel
from hushnet.crypto.replay import ReplayCache
from hushnet.crypto.sealed import try_open_token
from hushnet.engine.actions import Action, Fault, Metric
from hushnet.engine.errors import UnexpectedSender
from hushnet.engine.protocol import NodeContext
from hushnet.families.anonymity.anonymous_walk import AnonWalkParams, AnonymousWalk
from hushnet.families.anonymity.wire import KIND_ONION
from hushnet.privacy.anonymity_setup import (
    AnonymitySetup,
    onion_path_length_max,
    sample_walk_to_destination,
)
from hushnet.tasks.base import GradientTask

_LEN_PREFIX = 4  # the onion payload's length field (hushnet.crypto.onion)


def default_l_max(setup: AnonymitySetup) -> int:
    """The spec's header size for the graph: ``ℓ2 + ⌈(N/c')·ln(1/ε_tr)⌉``, ``ε_tr = 1e-3``."""
    return onion_path_length_max(setup.n, setup.c, setup.ell2)


class OnionWalk(AnonymousWalk):
    """One node of the onion random walk (Mode B)."""

    mode: ClassVar[str] = "B"
    kind: ClassVar[int] = KIND_ONION
    can_reroute: ClassVar[bool] = False

    def __init__(
        self,
        ctx: NodeContext,
        setup: AnonymitySetup,
        task: GradientTask,
        params: AnonWalkParams,
        dest_key: KeyPair,
        directory: KeyDirectory,
        onion_key: KeyPair,
        onion_directory: KeyDirectory,
        *,
        secret_rng: np.random.Generator | None = None,
        replay: ReplayCache | None = None,
    ) -> None:
        if onion_directory.epoch != params.epoch:
            raise ValueError(
                f"onion directory is for epoch {onion_directory.epoch}, run uses epoch {params.epoch}"
            )
        self.keyring = OnionKeyring.single(onion_key, params.epoch, replay=replay)
        self.onion_directory = onion_directory
        self.paths: list[list[int]] = []  # own trajectories (source side; never sent anywhere)
        self.resampled = 0  # walks rejected for exceeding l_max
        super().__init__(
            ctx, setup, task, params, dest_key, directory, secret_rng=secret_rng, replay=replay
        )

    def _init_mode(self) -> None:
        self.l_max = int(self.p.l_max) or default_l_max(self.setup)
        if self.l_max <= self.setup.ell2:
            raise ValueError(
                f"l_max={self.l_max} cannot hold a walk to a destination at distance up to ℓ2={self.setup.ell2}"
            )
        self.payload_len = self.token_len + _LEN_PREFIX

    def _wire_len(self) -> int:
        return packet_length(self.l_max, self.payload_len)

    def _receive(self, hop_id: bytes, packet: bytes):
        """Peel one layer (MAC, then replay tag, then shift) — the same work at every hop — and
        return the role's work, run after the hop ack: deliver if final, else forward."""
        res = peel(
            self.keyring,
            packet,
            slots=self.l_max,
            payload_len=self.payload_len,
            ad=onion_ad(self.ctx.run_id),
        )
        if res.final:
            body = try_open_token(self.key, res.message, self.info)
            if body is None:
                raise IntegrityError(
                    "final onion layer carries a token that is not sealed to this node"
                )
            return self._deliver(hop_id, res.message, body)
        if res.next_hop not in self._nbset:
            return [
                Fault(
                    self.ctx.node,
                    UnexpectedSender(
                        f"authentic onion layer routes to node {res.next_hop}, not a neighbour of node {self.ctx.node}: dropped"
                    ),
                )
            ]
        return lambda: self._relayed(hop_id) + self._hand_off(res.packet, res.next_hop)

    def _dispatch(self, token: bytes, j: int) -> list[Action]:
        """Simulate the walk to ``j`` (≤ ``l_max`` hops, else resample) and send the onion along it."""
        before = self.resampled
        path = self._walk_to(j)
        hops = [(v, self.onion_directory.public(v)) for v in path]
        packet = build_packet(
            hops,
            token,
            epoch=self.p.epoch,
            slots=self.l_max,
            payload_len=self.payload_len,
            ad=onion_ad(self.ctx.run_id),
        )
        self.paths.append(path)
        acts: list[Action] = []
        if (
            self.resampled > before
        ):  # the truncation is visible in the run's events, not only in the law
            acts.append(Metric("anon-walk-resampled", self.resampled - before, -1, self.ctx.node))
        return acts + self._hand_off(packet, path[0])

    def _mode_report(self) -> dict:
        return {"walk_mode": self.mode, "l_max": self.l_max, "walks_resampled": self.resampled}

    def _walk_to(self, j: int) -> list[int]:
        # one try at a time, so that rejections are counted (each try is an independent simple walk)
        for _ in range(1000):
            try:
                path = sample_walk_to_destination(
                    self.setup.adjacency,
                    self.ctx.node,
                    j,
                    self.secret_rng,
                    l_max=self.l_max,
                    max_tries=1,
                )
            except RuntimeError:
                self.resampled += 1
                continue
            return [int(v) for v in path]
        raise RuntimeError(
            f"no walk from {self.ctx.node} reached {j} within l_max={self.l_max} in 1000 tries"
        )
