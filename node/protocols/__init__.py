"""Protocols: per-node state machines on the sans-IO engine (:mod:`hushnet.engine`).

Random-walk family: :mod:`~hushnet.protocols.rw_dpsgd` (RW DP-SGD, complete-graph SGD, local-DP
baseline), :mod:`~hushnet.families.pad.machines` (P-AD summation and histograms), :mod:`~hushnet.families.central.machines`
(the trusted-aggregator baseline), sharing the token machinery of :mod:`~hushnet.protocols.walk`;
:mod:`~hushnet.protocols.registry` builds machines by name or from a run spec.  Submodules are not
imported here so that each protocol family loads only what it needs.
"""
