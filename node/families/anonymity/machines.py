"""The anonymity layer's machines, built by name (the family's ``make_machine``): onion-relayed
RW DP-SGD (:class:`~hushnet.families.anonymity.onion.OnionLayer` around the walk's
:class:`~hushnet.families.walk.machines.RWDPSGD`) and the source-anonymous walk
(:mod:`hushnet.families.anonymity.anonymous_walk`, Mode B in :mod:`~hushnet.families.anonymity.onion_walk`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from hushnet.crypto.cells import CELL_BODY
from hushnet.crypto.onion import OnionKeyring
from hushnet.engine.protocol import NodeContext, Protocol
from hushnet.families.anonymity.onion import (
    OnionLayer,
    OnionParams,
    _adjacency,
    payload_len_for,
    relay_plan,
)
from hushnet.families.anonymity.params import ANON_WALK_SGD, RW_DPSGD_ONION

_SETUP_CACHE: dict[tuple, Any] = {}


def _anon_setup(W, p: dict[str, Any]):
    from hushnet.privacy.anonymity_setup import public_setup

    A = _adjacency(W)
    key = (
        A.shape[0],
        A.indptr.tobytes(),
        A.indices.tobytes(),
        int(p.get("ell1", 2)),
        int(p.get("ell2", 6)),
        float(p.get("delta", 5.0)),
        p.get("kappa"),
        float(p.get("delta_prime", 0.3)),
    )
    if key not in _SETUP_CACHE:
        if len(_SETUP_CACHE) > 8:
            _SETUP_CACHE.clear()
        _SETUP_CACHE[key] = public_setup(
            A, ell1=key[3], ell2=key[4], delta=key[5], kappa=key[6], delta_prime=key[7]
        )
    return _SETUP_CACHE[key]


def make_anonymity_machine(
    protocol: str,
    node: int,
    n: int,
    task: Any,
    *,
    run_seed: int,
    run_id: str,
    params: dict[str, Any],
    W: sp.spmatrix | np.ndarray | None,
    view_model: str = "sender-known",
    options: Any = None,
    rng: np.random.Generator | None = None,
) -> Protocol:
    """Build one node's machine of an anonymity-layer protocol (called by the registry).

    Keys: a deployed node passes its own private key and the directory of public keys in
    ``params`` (``onion_key``/``onion_directory``, ``dest_key``/``dest_directory``,
    ``share_key``/``share_directory``, and for secure sums ``sign_key``/``sign_directory``).  Without them, *simulation* keys are derived from the run
    seed — reproducible, and therefore only for the in-process simulator.  Likewise ``secret_seed``
    (reproducible relay paths / destinations / forwarding) is for tests only: in a deployment
    those draws must stay secret, so they come from the OS CSPRNG when it is absent.
    """
    from hushnet.crypto.keys import machine_keypair
    from hushnet.engine.rng import node_generator

    p = dict(params)
    if rng is None:
        rng = node_generator(run_seed, n, node)

    def keypair(purpose: str):
        return machine_keypair(p, purpose, run_seed, n, node)

    replay = p.pop(
        "replay_cache", None
    )  # the node's persistent cache (deployed); None: one per machine
    secret_seed = p.pop("secret_seed", None)
    srng = None if secret_seed is None else np.random.default_rng([int(secret_seed), node])
    if protocol == RW_DPSGD_ONION:
        from hushnet.families.walk.hops import TransitionRow
        from hushnet.families.walk.machines import RWDPSGD
        from hushnet.families.walk.params import RWParams
        from hushnet.families.walk.walker import WalkOptions

        if W is None:
            raise ValueError(
                f"{RW_DPSGD_ONION} needs the public transition matrix W (its support is the relay graph)"
            )
        shared = p.pop(
            "onion_keyring", None
        )  # a deployed node's per-epoch keyring (all epochs it holds)
        receipts = bool(
            p.pop("link_receipts", False)
        )  # only the networked node's driver reports them
        op = {
            k[len("onion_") :]: p.pop(k)
            for k in list(p)
            if k.startswith("onion_") and k not in ("onion_key", "onion_directory")
        }
        if shared is not None:
            key, directory = None, p.pop("onion_directory")
            op.pop(
                "epoch", None
            )  # the packets' epoch is the directory's (the run's, fixed at submit)
        else:
            key, directory = keypair("onion")
        hops = int(op.pop("hops", 3))
        slots = int(op.pop("slots", hops + 8))
        plan = relay_plan(W, hops, slots)
        # the receiver's peer is the last relay, sender-independent only where the plan says so
        ctx = NodeContext(node, n, run_id, rng, "anonymous" if plan.independent else "sender-known")
        base = options or WalkOptions()
        inner_opt = WalkOptions(
            reliable=False, progress_every=base.progress_every, snapshot_every=base.snapshot_every
        )
        inner = RWDPSGD(ctx, TransitionRow.from_matrix(W, node), task, RWParams(**p), inner_opt)
        inner.name = RW_DPSGD_ONION  # type: ignore[misc]
        cell_body = int(op.pop("cell_body", CELL_BODY))
        payload = int(op.pop("payload_len", payload_len_for(8 * task.dim + 64, cell_body, slots)))
        par = OnionParams(
            hops=hops,
            slots=slots,
            payload_len=payload,
            cell_body=cell_body,
            epoch=directory.epoch,
            reliable=base.reliable,
            link_receipts=receipts,
            **op,
        )
        keyring = (
            shared
            if shared is not None
            else OnionKeyring.single(key, directory.epoch, replay=replay)
        )
        return OnionLayer(ctx, inner, W, keyring, directory, par, path_rng=srng)
    if protocol == ANON_WALK_SGD:
        from hushnet.families.anonymity.anonymous_walk import AnonWalkParams, walk_machine

        if W is None:
            raise ValueError(f"{ANON_WALK_SGD} needs the graph (pass W; its support is the graph)")
        setup = _anon_setup(W, p)
        for k in ("ell1", "ell2", "delta", "kappa", "delta_prime"):
            p.pop(k, None)
        key, directory = keypair("dest")
        okey, odir = keypair("onion") if p.get("mode", "A") == "B" else (None, None)
        p.pop("onion_key", None), p.pop("onion_directory", None)  # Mode A has no onion layers
        ctx = NodeContext(node, n, run_id, rng, view_model)
        return walk_machine(
            ctx,
            setup,
            task,
            AnonWalkParams(**p),
            key,
            directory,
            onion_key=okey,
            onion_directory=odir,
            secret_rng=srng,
            replay=replay,
        )
    raise ValueError(f"not an anonymity-layer protocol: {protocol!r}")
