"""Secure summation over the real network, and the node's key material for every family that needs it.

The sans-IO machines (the anonymity family's :mod:`hushnet.families.anonymity`,
:mod:`hushnet.protocols.secagg`) take their key material as parameters; in the simulator that is
derived from the public run seed, which would let anyone open every layer.  Here a deployed node
passes its **own long-term X25519 key** (``x25519.key`` in its state directory, created by
:mod:`hushnet.net.node`, never sent anywhere) and the **directory's public keys** (each member's
``x25519_public`` as published through the bootstrap): :func:`node_keypair`, :func:`node_keys`,
:func:`node_onion_keys`, :func:`node_signer`, :func:`node_replay_cache`.

``secagg-sum``'s machine parameters, projection and node machine (the secagg family asks them):
one contribution, Gaussian bound of the sum seen in the clear (α/(2σ²)); the aggregate view is what
the leader sees, no credit taken for other members' noise — unless ``protocol_params.collusion = c``
is set: then each member adds only σΔ/√(t − c) and the same α/(2σ²) is the sum's Gaussian view
toward any coalition of ≤ c members (:mod:`hushnet.privacy.secure_sum`, :mod:`hushnet.runs.ddp_runs`).

Secure summation over the network is wrapped by :class:`NetworkSecAgg`: the sans-IO leader writes
one ledger entry *per contributor*, which over the network would charge the leader's ledger for
other nodes' data.  The wrapper instead charges each member's **own** ledger right before its
masked input leaves — at the round's start, since the input and its shares are the member's first
message (the last moment the member controls: after it, the leader can release the sum from the
other members' shares alone) — and keeps the leader's release record as a metric.  A round that then
aborts below the threshold released nothing, but the charges of the members whose input left stay
(conservative: no node can know at start whether enough others will show up).
"""

from __future__ import annotations

import hashlib
import math
import pathlib
import time
import weakref
from typing import Any

import numpy as np

from hushnet.crypto.keys import KeyDirectory, KeyPair, public_bytes
from hushnet.engine.actions import Action, Deviation, Finish, LedgerEntry, Metric
from hushnet.engine.protocol import Protocol
from hushnet.families.anonymity.accounting import ldp_decision, refuse
from hushnet.runs.spec import Budget, PolicyDecision, RunSpec

#: a secure-summation phase waits this long for stragglers before it closes (members that did not
#: answer by then are dropouts)
NET_ROUND_TIMEOUT = 5.0


# ---- keys --------------------------------------------------------------------------------------


def node_keypair(node) -> KeyPair:
    """The node's own long-term X25519 key pair (from its state directory, via its identity)."""
    ident = getattr(node, "identity", None)
    if ident is None or ident.x25519 is None:
        raise ValueError("this node has no long-term X25519 key yet (not started)")
    sk = ident.x25519
    return KeyPair(sk, public_bytes(sk.public_key()))


def node_key_directory(node, epoch: int = 0) -> KeyDirectory:
    """vertex → 32-byte X25519 public key of every member, as the bootstrap directory publishes it."""
    d = getattr(node, "directory", None)
    if d is None:
        raise ValueError("this node has no membership directory yet")
    keys = {
        int(m.vertex): bytes(m.x25519_public)
        for m in d.members
        if len(bytes(m.x25519_public)) == 32
    }
    return KeyDirectory(int(epoch), keys)


def node_signer(node):
    """The node's ECDSA P-256 identity key as a protocol signer (its public half is bound to its vertex by the
    directory's ``key_sha256``)."""
    from hushnet.crypto.signing import Signer

    ident = getattr(node, "identity", None)
    if ident is None or ident.key is None:
        raise ValueError("this node has no identity key yet (not started)")
    return Signer.from_key(ident.key)


def node_signer_directory(node):
    """vertex → SHA-256 of each member's signing key (SubjectPublicKeyInfo), as the bootstrap publishes it."""
    from hushnet.crypto.signing import SignerDirectory

    d = getattr(node, "directory", None)
    if d is None:
        raise ValueError("this node has no membership directory yet")
    return SignerDirectory(
        {int(m.vertex): bytes.fromhex(m.key_sha256) for m in d.members if len(m.key_sha256) == 64}
    )


_REPLAY: "weakref.WeakKeyDictionary[Any, dict[str, Any]]" = weakref.WeakKeyDictionary()


def node_replay_cache(node, purpose: str):
    """The node's persistent replay cache for ``purpose`` (``"onion"``: onion layers and sealed tokens
    under the onion/destination key; ``"secagg"``: secure-sum round nonces): one SQLite file in its state
    directory, opened once per node and shared by all its runs, so a replay is refused for the key's
    whole epoch — in another run, or after a restart (issue 11, finding 4)."""
    from hushnet.crypto.replay import PersistentReplayCache

    if purpose not in ("onion", "secagg"):
        raise ValueError(f"unknown replay-cache purpose {purpose!r}")
    state = getattr(node, "state_dir", None)
    if state is None:
        raise ValueError("this node has no state directory: its replay cache could not persist")
    caches = _REPLAY.setdefault(node, {})
    if purpose not in caches:
        caches[purpose] = PersistentReplayCache(pathlib.Path(state) / f"replay-{purpose}.sqlite")
    return caches[purpose]


def node_onion_keys(node, ids: list[str], vertex: int, spec: RunSpec):
    """(keyring, directory) for an onion run: the **per-epoch** onion keys when the network rotates them
    (``Directory.onion_epoch_seconds > 0``), else ``None`` (the long-term key with the spec's epoch label).

    The run uses the epoch current at acceptance (when the node builds its machine): the directory of
    every member's public key for that epoch, and the node's keyring, which holds every epoch the node
    still has a key for (a relay opens packets of runs accepted in the previous epoch too).  Refused with
    the reason when a member has not published that epoch's key, or when the directory's key for this
    node is not the one in its state directory."""
    store = getattr(node, "onion_keys", None)
    if store is None:
        return None
    if "epoch" in spec.protocol_params:
        raise ValueError(
            "protocol_params.epoch is a label for networks without onion-key rotation; this network "
            "rotates onion keys, and a run uses the epoch current at acceptance"
        )
    epoch = store.current_epoch()
    d = node.directory
    keys = {
        int(m.vertex): bytes(k.public_key)
        for m in d.members
        for k in m.onion_keys
        if int(k.epoch) == epoch
    }
    missing = [ids[v] for v in range(len(ids)) if v not in keys]
    if missing:
        raise ValueError(
            f"the directory has no onion key of epoch {epoch} for {', '.join(missing[:5])}"
            f"{' …' if len(missing) > 5 else ''} (not published yet): cannot build onion layers"
        )
    if keys[vertex] != store.pair(epoch).public:
        raise ValueError(
            f"the directory's onion key of epoch {epoch} for this node is not the key in its state directory"
        )
    return store.keyring, KeyDirectory(epoch, keys)


def node_keys(node, ids: list[str], vertex: int, epoch: int) -> tuple[KeyPair, KeyDirectory]:
    kp = node_keypair(node)
    directory = node_key_directory(node, epoch)
    missing = [ids[v] for v in range(len(ids)) if v not in directory.keys]
    if missing:
        raise ValueError(
            f"the directory has no X25519 key for {', '.join(missing[:5])}"
            f"{' …' if len(missing) > 5 else ''}: cannot seal to them"
        )
    if directory.keys.get(vertex) != kp.public:
        raise ValueError(
            "the directory's X25519 key for this node is not the key in its state directory"
        )
    return kp, directory


# ---- machine parameters (public, from the spec) -----------------------------------------------


def _secagg_params(spec: RunSpec) -> dict[str, Any]:
    pp = dict(spec.protocol_params)
    n = spec.n
    members = tuple(int(m) for m in pp.get("members", range(n)))
    out: dict[str, Any] = {
        "members": members,
        "leader": int(pp.get("leader", spec.start)),
        "threshold": int(pp.get("threshold", len(members) // 2 + 1)),
        "round_timeout": float(pp.get("round_timeout", NET_ROUND_TIMEOUT)),
        "broadcast": bool(pp.get("broadcast", True)),
        "round_id": int(pp.get("round_id", 0)),
    }
    for k in ("frac_bits", "bits", "mask_degree"):
        if k in pp:
            out[k] = int(pp[k])
    if "consistency_check" in pp:  # off only with threshold > n/2 (SecAggParams refuses otherwise)
        out["consistency_check"] = bool(pp["consistency_check"])
    return out


def project_secagg(
    spec: RunSpec, vertex: int, local: Budget | None = None, W: Any = None
) -> PolicyDecision:
    p = _secagg_params(spec)
    n = spec.n
    if not set(p["members"]) <= set(range(n)) or not 0 <= p["leader"] < n:
        return refuse(spec, "members/leader outside the graph")
    from hushnet.protocols.secagg import SecAggParams

    try:  # threshold, fixed point, masking-graph degree: refused here with the reason, not at build time
        SecAggParams(dim=1, **p).fixed_point
    except ValueError as exc:
        return refuse(spec, f"secure-summation parameters: {exc}")
    if vertex not in p["members"]:
        return PolicyDecision(
            True,
            "not a member of the secure sum: no contribution",
            np.zeros(n),
            spec.budget.delta,
            "certified",
            {"N_u": 0.0},
        )
    from hushnet.runs.ddp_runs import secagg_sum_calibration

    try:  # protocol_params.collusion: noise calibrated σΔ/√(t−c) per member, charged as the sum's Gaussian view
        view = secagg_sum_calibration(spec)
    except ValueError as exc:
        return refuse(spec, f"secure-sum calibration: {exc}")
    if view is not None:
        dec = ldp_decision(
            spec,
            vertex,
            local,
            n,
            1.0,
            spec.sigma,
            f"one input seen only inside the sum: Gaussian view of ≥ t−c honest survivors' noise "
            f"(c={view.collusion} colluding members)",
            "secure-summation",
        )
        if dec.details.get("accounting_view") is not None:
            dec.details["accounting_view"] = {
                **view.as_dict(),
                "charged_as": "secure-sum Gaussian view",
            }
        return dec
    return ldp_decision(
        spec,
        vertex,
        local,
        n,
        1.0,
        spec.sigma,
        "one contribution: Gaussian bound of the node's noisy input seen in the sum",
        "secure-summation",
    )


# ---- machine builders --------------------------------------------------------------------------


def secure_sum_material(node, ids: list[str], vertex: int) -> dict[str, Any]:
    """What a node's secure-sum machine needs from the node: its long-term X25519 share key and the
    directory's, its signing key and the directory's signing-key digests (checked against each other),
    and its persistent nonce/replay cache — for ``secagg-sum`` and ``secagg-dpsgd`` alike."""
    kp, directory = node_keys(node, ids, vertex, 0)
    signer, sdir = node_signer(node), node_signer_directory(node)
    if sdir.keys.get(vertex) != hashlib.sha256(signer.spki).digest():
        raise ValueError(
            "the directory's signing key for this node is not the key in its state directory"
        )
    return {
        "share_key": kp,
        "share_directory": directory,
        "sign_key": signer,
        "sign_directory": sdir,
        "replay_cache": node_replay_cache(node, "secagg"),
    }


def build_secagg(node, spec: RunSpec, vertex: int, ids: list[str], task, W, options) -> Protocol:
    from hushnet.protocols.registry import make_machine

    params = {**spec.machine_params(), **secure_sum_material(node, ids, vertex)}
    if task is not None:
        from hushnet.runs.ddp_runs import secagg_sum_calibration

        view = secagg_sum_calibration(spec, float(task.sensitivity()))
        # distributed calibration (protocol_params.collusion): σΔ/√(t−c) per member; else σΔ (local DP)
        params["noise_std"] = (
            view.share_std if view is not None else float(spec.sigma) * float(task.sensitivity())
        )
    inner = make_machine(
        spec.protocol,
        vertex,
        len(ids),
        task,
        run_seed=spec.seed,
        run_id=spec.run_id,
        params=params,
        view_model=spec.view_model,
        options=options,
        rng=spec.node_rng(vertex, len(ids)),
    )
    return NetworkSecAgg(inner)


class NetworkSecAgg(Protocol):
    """A :class:`~hushnet.protocols.secagg.SecAggMachine` whose ledger entries land on the right ledger.

    * member: one :class:`LedgerEntry` for *itself* is emitted before the actions that carry its
      masked input (the node driver refuses the rest of the actions if the charge does not fit, so
      the input never leaves unaccounted);
    * leader: the machine's per-contributor entries become ``secagg-release`` metrics (the release
      record in the event stream); they are not charged on the leader's ledger, which holds the
      leader's own loss only.
    """

    def __init__(self, inner: Protocol) -> None:
        super().__init__(inner.ctx)
        self.inner = inner
        self.name = inner.name  # type: ignore[misc]
        self.charged = False
        self.released_for: list[int] = []
        self.busy = (
            0.0  # seconds spent in the machine (crypto, masks): benchmarks separate it from waiting
        )

    @property
    def finished(self) -> bool:  # type: ignore[override]
        return getattr(self, "inner", None) is not None and self.inner.finished

    @finished.setter
    def finished(self, value: bool) -> None:
        pass

    def handle(self, event) -> list[Action]:  # type: ignore[override]
        t0 = time.perf_counter()
        acts = self.inner.handle(event)
        self.busy += time.perf_counter() - t0
        out: list[Action] = []
        p = self.inner.p
        for a in acts:
            if isinstance(a, LedgerEntry):
                self.released_for.append(int(a.node))
                out.append(Metric("secagg-release", int(a.node), p.round_id, self.ctx.node))
            else:
                out.append(a)
        if not self.charged and getattr(self.inner, "input_sent", False):
            self.charged = True
            sens = float(p.sensitivity)
            sigma = p.noise_std / sens if sens > 0 else math.inf
            entry = LedgerEntry(
                self.ctx.node,
                p.round_id,
                "value",
                "aggregate",
                sens,
                p.noise_std,
                sigma,
                self.name,
                self.ctx.run_id,
                {"mechanism": "secure-summation", "charged_at": "masked input leaves"},
            )
            out.insert(0, entry)
        for a in out:
            if isinstance(a, Finish) and isinstance(a.result, dict):
                a.result.setdefault("released_for", list(self.released_for))
        return out

    # ---- durability (issue 14): membership survives a restart, the round's secrets do not ------------
    durable = True

    def checkpoint(self) -> dict[str, Any]:
        """Membership and progress only: whether the masked input left (and was charged), the phases, the
        result if the round ended.  Never the one-time masks or the shares held: a restarted node must not
        answer an unmask request for a round it may have been declared dropped in (revealing both a
        member's self-mask and its pairwise seeds would expose its input)."""
        m = self.inner
        return {
            "charged": self.charged,
            "released_for": list(self.released_for),
            "finished": bool(m.finished),
            "input_sent": bool(getattr(m, "input_sent", False)),
            "phase": getattr(m, "phase", ""),
            "lphase": getattr(m, "lphase", ""),
            "round": int(m.p.round_id),
        }

    def restore(self, state: dict[str, Any]) -> list[Action]:
        """A round that ended stays ended.  A round in progress: a member is a dropout of it (the leader
        removes its masks with the others' shares, or aborts below the threshold); a restarted leader has
        lost the masked inputs, so it aborts the round and tells the members why."""
        m = self.inner
        self.charged = bool(state["charged"])  # the input is never masked and sent a second time
        self.released_for = [int(v) for v in state["released_for"]]
        m.input_sent = bool(state["input_sent"])
        if state["finished"]:
            m.finished = True
            return []
        rnd = int(state["round"])
        if m.is_leader and state["lphase"] not in ("", "idle", "done"):
            return m._abort("the leader restarted mid-round: the masked inputs it held are gone")  # noqa: SLF001
        m.finished = True
        m.phase = "done"
        why = (
            "node restarted mid-round: a dropout of this round (its one-time masks and the shares it held are "
            "gone; the sum goes on without it)"
        )
        return [
            Deviation(self.ctx.node, rnd, "restarted-mid-round", {"input_sent": m.input_sent}),
            Finish(
                self.ctx.node,
                rnd,
                None,
                {
                    "status": "dropped-out",
                    "reason": why,
                    "input_sent": m.input_sent,
                    "released_for": list(self.released_for),
                },
            ),
        ]

    # the wrapper only forwards: Protocol's dispatch is replaced by handle() above
    def on_start(self) -> list[Action]:  # pragma: no cover - never called (handle is overridden)
        return []

    def on_message(self, src: int, payload: bytes) -> list[Action]:  # pragma: no cover
        return []

    def on_timer(self, name: str) -> list[Action]:  # pragma: no cover
        return []


__all__ = [
    "node_keypair",
    "node_key_directory",
    "node_onion_keys",
    "node_signer",
    "node_signer_directory",
    "node_replay_cache",
    "project_secagg",
    "build_secagg",
    "NetworkSecAgg",
    "NET_ROUND_TIMEOUT",
]
