"""Protocols: per-node state machines on the sans-IO engine (:mod:`hushnet.engine`).

Each protocol family's machines live in its package (``hushnet.families.<name>``: the walk, P-AD,
gossip, the anonymity layer and the central baseline are there; the secure-aggregation machines are
still here, issue 13); :mod:`~hushnet.protocols.registry` builds any family's machines by name or from a run spec.
Submodules are not imported here so that each protocol family loads only what it needs.
"""
