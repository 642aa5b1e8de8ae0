"""The secagg family on a node: the machine a node builds with its own key material, and the wrapper
that puts a secure sum's ledger entries on the right ledger.

The sans-IO machines take their key material as parameters; in the simulator it comes from the public
run seed.  A deployed node passes its **own long-term X25519 key**, the **directory's public keys**,
its signing key with the directory's digests, and its persistent replay cache
(:func:`secure_sum_material`, from :mod:`hushnet.runs.node_keys`) — for ``secagg-sum`` and
``secagg-dpsgd`` alike.

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
import time
from typing import Any

from hushnet.engine.actions import Action, Deviation, Finish, LedgerEntry, Metric
from hushnet.engine.protocol import Protocol
from hushnet.privacy.secure_sum import effective_sensitivity
from hushnet.runs.node_keys import node_keys, node_replay_cache, node_signer, node_signer_directory
from hushnet.runs.spec import RunSpec


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
        from hushnet.families.secagg.accounting import (
            check_task_range,
            secagg_sum_calibration,
            sum_frac_bits,
        )
        from hushnet.families.secagg.params import sum_params

        view = secagg_sum_calibration(spec, float(task.sensitivity()), int(task.dim))
        check_task_range(spec, task, len(sum_params(spec)["members"]))
        # distributed calibration (protocol_params.collusion): σΔ_eff/√(t−c) per member; else σ(Δ + q√d)
        # (local DP of the share R(x) + R(z) seen alone): Δ_eff covers the fixed-point rounding
        params["noise_std"] = (
            view.share_std
            if view is not None
            else float(spec.sigma)
            * effective_sensitivity(
                float(task.sensitivity()), 1, dim=int(task.dim), frac_bits=sum_frac_bits(spec)
            )
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
    """A :class:`~hushnet.families.secagg.machines.SecAggMachine` whose ledger entries land on the right ledger.

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
    def redeliver_for(self) -> float:
        """The secure sum's re-send window (:attr:`SecAggMachine.redeliver_for`): the driver asks the
        machine it holds, which is this wrapper."""
        return float(getattr(self.inner, "redeliver_for", 0.0) or 0.0)

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
            # the share R(x) + R(z) seen alone (local DP: Δ + q√d); the distributed calibration's cost
            # recomputes its own multiplier from noise_std and dim
            eff = effective_sensitivity(sens, 1, dim=p.dim, frac_bits=p.frac_bits)
            sigma = p.noise_std / eff if sens > 0 else math.inf
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
                {
                    "mechanism": "secure-summation",
                    "charged_at": "masked input leaves",
                    "dim": int(p.dim),  # the fixed-point charge (Δ_eff) depends on it
                },
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


def build_ddp(node, spec: RunSpec, vertex: int, ids: list[str], task, W, options):
    """The node's machine with its own long-term X25519 key and the directory's public keys."""
    from hushnet.families.secagg.accounting import spec_sensitivity
    from hushnet.protocols.registry import make_machine

    if task is not None and float(task.sensitivity()) > spec_sensitivity(spec) * (1 + 1e-12):
        raise ValueError(f"the task's sensitivity {task.sensitivity():g} exceeds the public 2·clip")
    params = {**spec.machine_params(), **secure_sum_material(node, ids, vertex)}
    return make_machine(
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


__all__ = ["secure_sum_material", "build_secagg", "build_ddp", "NetworkSecAgg"]
