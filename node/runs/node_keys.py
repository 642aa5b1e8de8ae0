"""The node's key material, for every family that needs it.

The sans-IO machines (the anonymity family's onion relaying, the secagg family's secure sums, the
gossip family's secure neighbourhood summation) take their key material as parameters; in the
simulator that is derived from the public run seed, which would let anyone open every layer.  A
deployed node passes its **own long-term X25519 key** (``x25519.key`` in its state directory, created
by :mod:`hushnet.net.node`, never sent anywhere) and the **directory's public keys** (each member's
``x25519_public`` as published through the bootstrap): :func:`node_keypair`, :func:`node_keys`,
:func:`node_onion_keys`, :func:`node_signer`, :func:`node_replay_cache`.
"""

from __future__ import annotations

import pathlib
import weakref
from typing import Any

from hushnet.crypto.keys import KeyDirectory, KeyPair, public_bytes
from hushnet.runs.spec import RunSpec

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

    The run uses the epoch the operator fixed in the signed spec (``protocol_params.epoch``, filled at
    submit by :meth:`hushnet.families.anonymity.AnonymityFamily.prepare_submit`; without it, the epoch
    current at this node's acceptance): the directory of every member's public key for that epoch, and the node's keyring, which holds every epoch the node
    still has a key for (a relay opens packets of runs accepted in the previous epoch too).  Refused with
    the reason when a member has not published that epoch's key, or when the directory's key for this
    node is not the one in its state directory."""
    store = getattr(node, "onion_keys", None)
    if store is None:
        return None
    now = store.current_epoch()
    if "epoch" in spec.protocol_params:  # fixed by the operator at submit: one epoch at every node
        epoch = int(spec.protocol_params["epoch"])
        if not now - 1 <= epoch <= now + 1:
            raise ValueError(
                f"the run's onion key epoch {epoch} is not the current epoch {now} or a neighbour of it "
                "(a stale spec, or a clock far off the network's)"
            )
    else:  # a spec signed without it (older client): the epoch current at this node's acceptance
        epoch = now
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


__all__ = [
    "node_keypair",
    "node_key_directory",
    "node_onion_keys",
    "node_signer",
    "node_signer_directory",
    "node_replay_cache",
    "node_keys",
]
