"""Protocols: per-node state machines on the sans-IO engine (:mod:`node.engine`).

Random-walk family: :mod:`~node.protocols.rw_dpsgd` (RW DP-SGD, complete-graph SGD, local-DP
baseline), :mod:`~node.protocols.pad` (P-AD summation and histograms), :mod:`~node.protocols.central`
(the trusted-aggregator baseline), sharing the token machinery of :mod:`~node.protocols.walk`;
:mod:`~node.protocols.registry` builds machines by name or from a run spec.  Submodules are not
imported here so that each protocol family loads only what it needs.
"""
