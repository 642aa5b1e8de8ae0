"""Secure summation with pairwise masks (Bonawitz et al.): Shamir dropout recovery, a threshold, and
a leader that sees only the sum — alone (``secagg-sum``) or as the aggregation step of distributed-DP
SGD (``secagg-dpsgd``, rotating leader).  Accounting: :mod:`hushnet.privacy.secure_sum`; threat model:
``docs/anonymity.md``."""

from __future__ import annotations

from typing import Any

from hushnet.families.base import Family


class SecAggFamily(Family):
    name = "secagg"
    protocols = {
        "secagg-sum": "secure summation with pairwise masks, Shamir dropout recovery and a threshold (aggregate view)",
        "secagg-dpsgd": "secure-aggregation DP-SGD: every round the (sampled) nodes' clipped gradients plus their noise "
        "shares are summed by secure summation under a rotating leader; distributed DP, no trusted party",
    }

    def task_kind(self, protocol: str) -> str | None:
        return "gradient" if protocol == "secagg-dpsgd" else None

    def graph_kind(self, protocol: str) -> str | None:
        return "complete" if protocol == "secagg-dpsgd" else None

    def machine_params(self, spec) -> dict[str, Any]:
        if spec.protocol == "secagg-dpsgd":
            from hushnet.runs.ddp_runs import ddp_params

            return ddp_params(spec)
        from hushnet.runs.anonymity import _secagg_params

        return _secagg_params(spec)

    def make_machine(self, protocol, ctx, task, params, *, W, options, run_seed):
        if protocol == "secagg-dpsgd":
            from hushnet.protocols.secagg_dpsgd import make_ddp_machine

            return make_ddp_machine(ctx, task, params, run_seed=run_seed)
        return _secagg_sum_machine(ctx, task, params, run_seed=run_seed)

    def node_machine(self, node, spec, vertex, ids, task, W, options):
        if spec.protocol == "secagg-dpsgd":
            from hushnet.runs.ddp_runs import build_ddp

            return build_ddp(node, spec, vertex, ids, task, W, options)
        from hushnet.runs.anonymity import build_secagg

        return build_secagg(node, spec, vertex, ids, task, W, options)

    def project(self, spec, vertex, local, W):
        if spec.protocol == "secagg-dpsgd":
            from hushnet.runs.ddp_runs import project_ddp

            return project_ddp(spec, vertex, local, W)
        from hushnet.runs.anonymity import project_secagg

        return project_secagg(spec, vertex, local, W)

    def cost(self, spec, vertex, ids, W, orders):
        """The secure sum's Gaussian view toward any coalition of ≤ c members when the spec calibrates the
        noise for it (``protocol_params.collusion``), else the input seen in the clear (local DP)."""
        if spec.protocol == "secagg-dpsgd":
            from hushnet.runs.ddp_runs import ddp_cost

            return ddp_cost(spec, vertex, ids, W, orders)
        from hushnet.runs.ddp_runs import secagg_sum_cost

        return secagg_sum_cost(spec, vertex, ids, W, orders)


def _secagg_sum_machine(ctx, task, params: dict[str, Any], *, run_seed: int):
    """One member's (or the leader's) secure-sum machine.  A deployed node passes its keys, signer and
    replay cache in ``params`` (``share_key``/``share_directory``, ``sign_key``/``sign_directory``,
    ``replay_cache``); without them the keys come from the public run seed (simulator only)."""
    from hushnet.crypto.keys import machine_keypair
    from hushnet.protocols.secagg import SecAggMachine, SecAggParams

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
        raise ValueError("secagg-sum needs a value task (its dimension, and the input of members)")
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


FAMILY = SecAggFamily()
