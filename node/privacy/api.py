"""The privacy library's entry points for a researcher: one call per question.

``privacy_matrix`` answers "how much does every node leak to every other node" for one protocol on
one graph; ``privacy_pair`` the same for one (contributor, observer) pair, with the extra detail an
accountant has for a single pair.  Both take a :class:`Query` (typed options, parsed once) or
keyword arguments (the fields of :class:`QueryOptions`), and dispatch to the accountant that owns the protocol.  The command line
(``hushnet privacy``) is a thin layer over these two functions, so the CLI and a notebook get the
same certified value.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from hushnet.privacy.graphs import Graph, metropolis_hastings, parse_graph
from hushnet.privacy.matrix import PrivacyMatrix
from hushnet.privacy.options import build

PROTOCOLS = ("rw", "rw-sender-known", "muffliato", "muffliato-aggregate", "gossip-stream")

#: what ``muffliato-aggregate`` computes, said wherever its value is shown.  Why: it is the exact-sum
#: mechanism (each round the observer sees only Σ_j W_ij m_j, in real arithmetic).  hushnet's secure gossip
#: rounds every member's term W_ij·m_j to fixed point on its own, so its released sums are functions of the
#: individual messages, and it is certified with the neighbourhood view (``muffliato``) —
#: docs/design/spec/secagg.md §6.  Read as hushnet's value, this one would be too small: a privacy breach.
AGGREGATE_LABEL = (
    "exact real-arithmetic aggregate (reproduction, not the certified value of hushnet's secure gossip): "
    "the observer sees only the exact sum of its neighbourhood each round; hushnet's secure gossip rounds "
    "each member's term to fixed point and is certified with the neighbourhood view (--protocol "
    "muffliato), see docs/design/spec/secagg.md section 6"
)


def protocol_labels(protocol: str) -> dict[str, str]:
    """What every output of ``protocol``'s value must carry besides its bound and view (empty: nothing)."""
    if protocol == "muffliato-aggregate":
        return {"label": AGGREGATE_LABEL, "hushnet_certified_protocol": "muffliato"}
    return {}


@dataclass(frozen=True)
class Query:
    """Everything a pairwise-loss computation needs, parsed from the command line."""

    graph: Graph
    W: Any
    protocol: str
    alpha: float
    sigma: float
    steps: int
    bound: str
    horizon: str | None
    contributions: float | None
    constraint: str
    chebyshev: bool
    weights: str


def matrix_fn(q: Query) -> Callable[[], Any]:
    """Dispatch to the accountant that owns the protocol; returns a zero-argument callable."""
    if q.protocol in ("rw", "rw-sender-known"):
        from hushnet.privacy import randomwalk

        kwargs: dict[str, Any] = dict(
            bound=q.bound,
            contributions=q.contributions,
            sender_known=q.protocol == "rw-sender-known",
            constraint=q.constraint,
        )
        if q.horizon is not None:
            kwargs["horizon"] = q.horizon
        return lambda: randomwalk.rw_pndp_matrix(q.W, q.steps, q.alpha, q.sigma, **kwargs)
    if q.protocol in ("muffliato", "muffliato-aggregate"):
        from hushnet.privacy import muffliato

        view = "aggregate" if q.protocol == "muffliato-aggregate" else "neighbourhood"

        def gossip() -> PrivacyMatrix:
            pm = muffliato.muffliato_loss_matrix(
                q.W,
                q.steps,
                q.alpha,
                q.sigma,
                bound=q.bound,
                view=view,
                chebyshev=q.chebyshev,
                graph=q.graph,
            )
            label = protocol_labels(q.protocol).get("label")
            return pm if label is None else dataclasses.replace(pm, notes=[label, *pm.notes])

        return gossip
    if q.protocol == "gossip-stream":
        from hushnet.privacy import koskela

        if q.bound != "certified":
            raise ValueError(
                "gossip-stream has only the exact (certified) accountant; drop --bound paper"
            )
        return lambda: koskela.gossip_stream_loss_matrix(
            q.W, q.steps, q.alpha, q.sigma, view="neighbourhood"
        )
    raise ValueError(f"unknown protocol {q.protocol!r}; choose from {', '.join(PROTOCOLS)}")


@dataclass(frozen=True)
class QueryOptions:
    """What to compute, checked once: Rényi order ``alpha`` (> 1), noise ``sigma`` (> 0), ``steps``
    (walk length or gossip rounds, >= 1), the ``bound`` label ("certified" or "paper"), the random
    walk's ``horizon``, ``contributions`` and σ ``constraint``, Chebyshev-accelerated gossip, and the
    gossip matrix ``weights`` ("hamilton", or "paper" for the printed Metropolis–Hastings rule)."""

    alpha: float
    sigma: float
    steps: int
    bound: str = "certified"
    horizon: str | None = None
    contributions: float | None = None
    constraint: str = "strict"
    chebyshev: bool = False
    weights: str = "hamilton"

    def __post_init__(self) -> None:
        if not self.sigma > 0:
            raise ValueError("sigma must be positive")
        if not self.alpha > 1:
            raise ValueError("alpha is a Rényi order and must be > 1")
        if self.steps < 1:
            raise ValueError("steps must be >= 1")
        if self.bound not in ("certified", "paper"):
            raise ValueError(f"bound must be 'certified' or 'paper', got {self.bound!r}")


def make_query(graph: str | Graph, protocol: str, options: QueryOptions) -> Query:
    """Validate the graph and protocol and build the :class:`Query` (raises ``ValueError`` with the reason)."""
    g = parse_graph(graph) if isinstance(graph, str) else graph
    if not g.is_connected():
        raise ValueError(f"graph {g.spec} is not connected; the accountants need a connected graph")
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; choose from {', '.join(PROTOCOLS)}")
    o = options
    W = metropolis_hastings(g, "hamilton" if o.weights == "hamilton" else "paper")
    return Query(
        g,
        W,
        protocol,
        float(o.alpha),
        float(o.sigma),
        int(o.steps),
        o.bound,
        o.horizon,
        o.contributions,
        o.constraint,
        o.chebyshev,
        o.weights,
    )


def _query(
    graph: str | Graph | Query, protocol: str | None, options: dict[str, Any], where: str
) -> Query:
    """A ready :class:`Query`, or one built from the keyword options (unknown names: one-line error)."""
    if isinstance(graph, Query):
        return graph
    return make_query(graph, protocol or "", build(QueryOptions, options, where))


def privacy_matrix(
    graph: str | Graph | Query, protocol: str | None = None, **options: Any
) -> PrivacyMatrix:
    """All-pairs Rényi losses ``eps[u -> v]`` (row = contributor, column = observer)."""
    return matrix_fn(_query(graph, protocol, options, "privacy_matrix"))()


def privacy_pair(
    graph: str | Graph | Query,
    protocol: str | None = None,
    *,
    source: int,
    observer: int,
    **options: Any,
) -> dict[str, Any]:
    """The loss of one pair (``rdp``, ``bound``, ``view`` and what the accountant adds)."""
    return pair(_query(graph, protocol, options, "privacy_pair"), source, observer)


def pair(q: Query, u: int, v: int) -> dict[str, Any]:
    if q.protocol in ("muffliato", "muffliato-aggregate"):
        from hushnet.privacy import muffliato

        view = "aggregate" if q.protocol == "muffliato-aggregate" else "neighbourhood"
        opts = muffliato.MuffliatoOptions(bound=q.bound, view=view, chebyshev=q.chebyshev)
        return {
            **muffliato.muffliato_pair(q.W, u, v, q.steps, q.alpha, q.sigma, opts),
            **protocol_labels(q.protocol),
        }
    if q.protocol == "gossip-stream":
        from hushnet.privacy import koskela

        return dict(
            koskela.gossip_stream_pair(
                q.W, u, v, q.steps, q.alpha, q.sigma, koskela.StreamOptions(view="neighbourhood")
            )
        )
    pm = matrix_fn(q)()
    out = {
        "rdp": float(pm.matrix[u, v]),
        "bound": pm.bound,
        "view": pm.view,
        "notes": list(pm.notes),
    }
    if pm.components:  # several valid bounds: each one's value and the one that won
        out["certified_by"] = pm.certified_by(u, v)
        out["components"] = {k: float(c[u, v]) for k, c in pm.components.items()}
    return out
