"""Protocols: per-node state machines on the sans-IO engine (:mod:`hushnet.engine`).

Each protocol family's machines live in its package (``hushnet.families.<name>``); this package holds
only :mod:`~hushnet.protocols.registry`, which builds any family's machines by name or from a run spec
(generic: it asks :func:`hushnet.families.family_of`).
Submodules are not imported here so that each protocol family loads only what it needs.
"""
