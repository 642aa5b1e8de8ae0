"""The anonymity layer on a networked node: its machines with the node's own keys.

The sans-IO machines take their key material as parameters; in the simulator that is derived from
the public run seed, which would let anyone open every layer.  Here a deployed node passes its
**own long-term X25519 key** (or its per-epoch onion keyring) and the **directory's public keys**;
relay paths, destinations and forwarding draws are left to the machines' default, the OS CSPRNG.
"""

from __future__ import annotations

from hushnet.engine.protocol import Protocol
from hushnet.runs.node_keys import node_keys, node_onion_keys, node_replay_cache
from hushnet.runs.spec import RunSpec


def _epoch(spec: RunSpec) -> int:
    return int(spec.protocol_params.get("epoch", 0))


def build_onion(node, spec: RunSpec, vertex: int, ids: list[str], task, W, options) -> Protocol:
    from hushnet.protocols.registry import make_machine, transition_matrix

    W = W if W is not None else transition_matrix(spec.graph, spec.weights)
    epoch_keys = node_onion_keys(node, ids, vertex, spec)
    if (
        epoch_keys is not None
    ):  # per-epoch onion keys: the node's shared keyring, the epoch's directory
        keyring, directory = epoch_keys
        params = {**spec.machine_params(), "onion_keyring": keyring, "onion_directory": directory}
    else:  # a network without rotation: the long-term key, the spec's epoch label
        kp, directory = node_keys(node, ids, vertex, _epoch(spec))
        params = {
            **spec.machine_params(),
            "onion_key": kp,
            "onion_directory": directory,
            "replay_cache": node_replay_cache(node, "onion"),
        }
    # the node's Deliver answers after the receiving machine accepted the packet: that answer is the hop
    # ack (Delivered, from RunDriver), so no second RPC per link hop
    params["link_receipts"] = True
    return make_machine(
        spec.protocol,
        vertex,
        len(ids),
        task,
        run_seed=spec.seed,
        run_id=spec.run_id,
        params=params,
        W=W,
        view_model="anonymous",
        options=options,
        rng=spec.node_rng(vertex, len(ids)),
    )


def build_anon_walk(node, spec: RunSpec, vertex: int, ids: list[str], task, W, options) -> Protocol:
    from hushnet.protocols.registry import make_machine, transition_matrix

    W = W if W is not None else transition_matrix(spec.graph, spec.weights)
    kp, directory = node_keys(node, ids, vertex, _epoch(spec))
    params = {
        **spec.machine_params(),
        "dest_key": kp,
        "dest_directory": directory,
        "replay_cache": node_replay_cache(node, "onion"),
    }
    if (
        params.get("mode") == "B"
    ):  # the onion layers use the same long-term key (distinct HKDF salts)
        params.update(onion_key=kp, onion_directory=directory)
    return make_machine(
        spec.protocol,
        vertex,
        len(ids),
        task,
        run_seed=spec.seed,
        run_id=spec.run_id,
        params=params,
        W=W,
        view_model="sender-known",
        options=options,
        rng=spec.node_rng(vertex, len(ids)),
    )
