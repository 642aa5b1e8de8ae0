"""The communication graph the bootstrap publishes, from the shared graph-spec parser.

Graph vertex ``i`` is occupied by the member with ``vertex == i``; the graph and its
Metropolis–Hastings weights ("hamilton" rule ``1/(1+max(d_u,d_v))``, self-loop takes the rest)
are published in the directory so that every node computes identical transition and gossip
weights without trusting anyone but the bootstrap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hushnet.privacy.graphs import Graph, metropolis_hastings, parse_graph

WEIGHT_RULE = "hamilton"


@dataclass
class PublishedTopology:
    """The graph as the bootstrap publishes it in the directory: spec, edges and weights.

    Named apart from :class:`hushnet.families.gossip.machines.Topology` (a gossip machine's per-round view
    of its neighbours), which is a different thing.
    """

    spec: str
    graph: Graph
    edges: np.ndarray  # (m, 2), u < v
    weights: list[tuple[int, int, float]]  # nonzero MH entries, including the diagonal

    @property
    def n(self) -> int:
        return self.graph.n

    def neighbors(self, vertex: int) -> list[int]:
        return [int(v) for v in self.graph.neighbors(vertex)]


def build_topology(spec: str) -> PublishedTopology:
    """Parse ``spec`` (e.g. ``ring:8``) and compute its published weights; ValueError on bad spec."""
    graph = parse_graph(spec)
    W = metropolis_hastings(graph, variant=WEIGHT_RULE).tocoo()
    weights = [(int(u), int(v), float(w)) for u, v, w in zip(W.row, W.col, W.data) if w != 0.0]
    weights.sort()
    return PublishedTopology(
        spec=spec, graph=graph, edges=np.asarray(graph.edges(), dtype=np.int64), weights=weights
    )
