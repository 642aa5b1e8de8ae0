"""Per-node randomness derived from the run seed.

Every machine gets its own generator, spawned from ``SeedSequence(run_seed)``: node v's stream
depends only on (run_seed, v), never on the order in which messages arrive, so the simulator and
the networked driver draw the same numbers and produce bit-identical models (docs/design/spec/randomwalk.md PART D 24).
Real deployments may plug a secure source instead (docs/design/spec/randomwalk.md §E.4): machines only ever call the
``numpy.random.Generator`` API on the object they were given.
"""

from __future__ import annotations

import numpy as np


def node_seed_sequences(run_seed: int, n: int) -> list[np.random.SeedSequence]:
    """The n child seed sequences of ``SeedSequence(run_seed)``; child v belongs to node v."""
    if n < 1:
        raise ValueError("n must be >= 1")
    return np.random.SeedSequence(int(run_seed)).spawn(n)


def node_generators(run_seed: int, n: int) -> list[np.random.Generator]:
    """One PCG64 generator per node, node v's = ``Generator(PCG64(SeedSequence(run_seed).spawn(n)[v]))``."""
    return [np.random.Generator(np.random.PCG64(s)) for s in node_seed_sequences(run_seed, n)]


def node_generator(run_seed: int, n: int, node: int) -> np.random.Generator:
    """Node ``node``'s generator alone (what a networked node computes for itself)."""
    if not 0 <= node < n:
        raise ValueError(f"node {node} outside 0..{n - 1}")
    # spawn() gives child i the spawn key (i,), so this equals node_generators(run_seed, n)[node]
    return np.random.Generator(
        np.random.PCG64(np.random.SeedSequence(int(run_seed), spawn_key=(node,)))
    )


def secret_generator() -> np.random.Generator:
    """A generator keyed with 256 bits from the OS entropy pool, on ChaCha20: what a deployed node uses.

    Its draws (DP noise, next-hop choices, relay paths) cannot be predicted by anyone holding the public
    run spec, and — ChaCha20 being a stream cipher — observing some of them (a neighbour sees the walk's
    next hops) does not reveal the state behind the others (the DP noise).  PCG64, the simulator's
    generator, is not a CSPRNG: its state can be recovered from raw outputs, which is why it is only
    used where the run seed is public anyway.  The Gaussian sampler on top is numpy's ziggurat (not
    hardened against floating-point attacks; a documented limit, docs/design/spec/randomwalk.md §E.4).
    """
    import os

    from randomgen import ChaCha

    # a SeedSequence over 256 OS bits (so ``spawn`` works, as machines may split their generator)
    return np.random.Generator(
        ChaCha(np.random.SeedSequence(int.from_bytes(os.urandom(32), "big")), rounds=20)
    )
