"""Public setup of the source-anonymity walk and the numbers a node reports (docs/design/spec/anonymity.md §2.1–§2.6).

This is the interface the walk protocol uses (the protocol/crypto layer itself is a later issue):

* :func:`public_setup` – what every node computes identically from the public directory: distances,
  per-node shells, ``Ā(ℓ)`` and ``p*_{κ,δ}`` (decision D3: graph-mean shell sizes, COR mode).
* :func:`model_p_star` / :func:`graph_p_star` – ``p*`` from the RRG model alone, or for a deployed
  graph (model likelihood with graph-mean shells, or the exact first-passage likelihood).
* :func:`sample_destination_distance`, :func:`sample_destination`, :func:`sample_destinations` –
  the source's draw ``ℓ ~ p*`` (renormalised over non-empty shells) then ``j`` uniform in
  ``S_i(ℓ)``, with a caller-supplied :class:`numpy.random.Generator`.
* :func:`anonymity_report` – α-privacy / entropy numbers, each labelled ``paper`` (the published
  formula, PAW mode) or ``certified`` (exact on the deployed graph under the paper's threat model,
  or the corrected Theorem 1 + Theorem 2 bound proved within its model). These are anonymity
  diagnostics: they are **never** credited as differential privacy (docs/design/spec/anonymity.md §6.7).
* :func:`simulate_walk`, :func:`simulate_protocol` – vectorised Monte Carlo of the walk and of the
  running protocol (many independent chains in lock-step), used by tests and figures.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import scipy.sparse as sp

from hushnet.privacy.anonymity import (
    Mode,
    RRGModel,
    entropy_w,
    kappa_midpoint,
    mean_iteration_time,
    p_star,
    t1_return_bound,
    theorem3_alpha,
    tree_shell_sizes,
)
from hushnet.privacy.anonymity_graph import (
    as_adjacency,
    chain_of_custody_probability,
    definition1_entropies,
    destination_matrix,
    distance_matrix,
    graph_mean_shell_sizes,
    hitting_pmf_horizon,
    mean_hitting_times,
    protocol_mean_iteration_time,
    shell_counts,
    stationary_distribution,
    strong_adversary,
    window_masses,
    window_masses_grid,
)

log = logging.getLogger(__name__)

__all__ = [
    "AnonymitySetup",
    "public_setup",
    "model_p_star",
    "graph_p_star",
    "sample_destination_distance",
    "sample_destination",
    "sample_destinations",
    "anonymity_report",
    "simulate_walk",
    "ProtocolTrace",
    "simulate_protocol",
    "onion_path_length_max",
    "sample_walk_to_destination",
    "exact_graph_alpha",
    "timing_leak_alert",
]


# ---------------------------------------------------------------------------------------------
# p* for a model or a deployed graph
# ---------------------------------------------------------------------------------------------


def model_p_star(
    n: int,
    c: int,
    ell1: int = 2,
    ell2: int = 6,
    kappa: float = math.inf,
    *,
    mode: Mode = "cor",
    delta: float = 5.0,
) -> np.ndarray:
    """``p*_{κ,δ}`` of the RRG *model* with the tree shell sizes ``c(c−1)^{ℓ−1}`` (the paper's choice).

    Only meaningful while the tree count is below N; prefer :func:`graph_p_star` for a deployment.
    """
    model = RRGModel(n, c)
    return p_star(
        model,
        ell1,
        ell2,
        kappa,
        mode=mode,
        delta=delta,
        A=tree_shell_sizes(c, range(ell1, ell2 + 1)),
    )


def _regular_degree(adj: sp.csr_matrix) -> int:
    deg = np.asarray(adj.sum(axis=1)).ravel().astype(int)
    if deg.min() != deg.max():
        raise ValueError("the source-anonymity model needs a c-regular graph (degrees differ)")
    return int(deg[0])


def graph_p_star(
    graph: Any,
    ell1: int = 2,
    ell2: int = 6,
    kappa: float = math.inf,
    *,
    mode: Mode = "cor",
    delta: float = 5.0,
    likelihood: Literal["model", "exact"] = "model",
    dist: np.ndarray | None = None,
) -> np.ndarray:
    """``p*_{κ,δ}`` for a deployed c-regular graph.

    ``likelihood="model"`` (spec D3, the production choice): the model likelihood ``Λ_{δ,κ}`` of
    ``mode`` with the graph-mean shell sizes ``Ā(ℓ)``. ``likelihood="exact"`` ([BEYOND]): the
    per-node window mass from the exact first-passage pmfs, averaged over pairs at distance ℓ,
    ``Λ(ℓ) = mean_{dist(i,j)=ℓ} mass_ij/|S_i(ℓ)|``, so that the destination's average per-node
    likelihood is flat across distances on *this* graph (``mode`` is then ignored).
    """
    adj = as_adjacency(graph)
    c = _regular_degree(adj)
    dist = distance_matrix(adj) if dist is None else dist
    if likelihood == "model":
        A = graph_mean_shell_sizes(dist, ell1, ell2)
        return p_star(RRGModel(adj.shape[0], c), ell1, ell2, kappa, mode=mode, delta=delta, A=A)
    if likelihood != "exact":
        raise ValueError("likelihood must be 'model' or 'exact'")
    mass = window_masses(adj, delta, kappa)
    counts = shell_counts(dist)
    lam = np.empty(ell2 - ell1 + 1)
    for k, ell in enumerate(range(ell1, ell2 + 1)):
        sel = dist == ell
        if not sel.any():
            raise ValueError(f"no pair of nodes at distance {ell}")
        per_node = mass / np.maximum(counts[:, min(ell, counts.shape[1] - 1)], 1)[:, None]
        lam[k] = per_node[sel].mean()
    inv = 1.0 / lam
    return inv / inv.sum()


# ---------------------------------------------------------------------------------------------
# Public setup
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class AnonymitySetup:
    """The public parameters of the anonymity walk on one graph (identical at every node, §2.1).

    ``p_star[k]`` is the probability of distance ``ell1 + k``; ``per_node_p[i]`` is ``p*``
    renormalised over the non-empty shells around ``i``. ``order[i]`` lists the nodes sorted by
    distance from ``i``; ``shell_start[i, ℓ]`` indexes the first node of ``S_i(ℓ)`` in it.
    """

    n: int
    c: int
    ell1: int
    ell2: int
    delta: float
    kappa: float
    delta_prime: float
    mode: str
    shells: str
    p_star: np.ndarray
    A: np.ndarray
    adjacency: sp.csr_matrix
    dist: np.ndarray
    counts: np.ndarray
    per_node_p: np.ndarray
    order: np.ndarray
    shell_start: np.ndarray
    nodes_with_empty_shells: int
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def n_distances(self) -> int:
        return self.ell2 - self.ell1 + 1

    @property
    def model(self) -> RRGModel:
        return RRGModel(self.n, self.c)

    def destination_distribution(self, i: int) -> np.ndarray:
        """``p_{D_i}(j)`` for all j (length N): ``p̃_i(ℓ)/|S_i(ℓ)|`` on the band, 0 elsewhere."""
        return self.destination_matrix()[i].copy()

    def destination_matrix(self) -> np.ndarray:
        """The destination chain ``M_ij = p_{D_i}(j)`` (row-stochastic, dense N×N)."""
        if "M" not in self._cache:
            self._cache["M"] = destination_matrix(self.dist, self.p_star, self.ell1)
        return self._cache["M"]

    def source_stationary(self) -> np.ndarray:
        """Long-run law ``π`` of the source (stationary law of ``M``; not uniform on a real RRG)."""
        if "pi" not in self._cache:
            self._cache["pi"] = stationary_distribution(self.destination_matrix())
        return self._cache["pi"]

    def public_parameters(self) -> dict[str, Any]:
        """What goes into the signed directory (§6.5): ``(ℓ1, ℓ2, δ, κ, p*)`` and how p* was made."""
        return {
            "ell1": self.ell1,
            "ell2": self.ell2,
            "delta": self.delta,
            "kappa": self.kappa,
            "delta_prime": self.delta_prime,
            "mode": self.mode,
            "shells": self.shells,
            "p_star": [float(x) for x in self.p_star],
            "A": [float(x) for x in self.A],
        }


def public_setup(
    graph: Any,
    *,
    ell1: int = 2,
    ell2: int = 6,
    delta: float = 5.0,
    kappa: float | None = None,
    delta_prime: float = 0.3,
    mode: Mode = "cor",
    shells: Literal["graph", "tree", "exact"] = "graph",
) -> AnonymitySetup:
    """Compute the public setup of §2.1 for a connected c-regular graph.

    ``kappa=None`` applies the midpoint rule ``κ = 2ℓ1 + (N/c')·ln(2/(1−δ'))`` (§2.6).
    ``shells="graph"`` (default, D3) uses the graph-mean ``Ā(ℓ)`` in the model likelihood;
    ``"tree"`` the paper's tree counts; ``"exact"`` the exact first-passage likelihood
    (:func:`graph_p_star` with ``likelihood="exact"``). Nodes whose shells in ``[ℓ1, ℓ2]`` are
    partly empty renormalise ``p*`` over the non-empty ones; their number is logged.
    """
    if ell1 < 2:
        raise ValueError("ell1 must be >= 2 so that a source never picks a direct neighbour")
    adj = as_adjacency(graph)
    c = _regular_degree(adj)
    n = adj.shape[0]
    dist = distance_matrix(adj)
    diam = int(dist.max())
    if ell2 > diam:
        raise ValueError(f"ell2={ell2} exceeds the graph diameter {diam}")
    if kappa is None:
        kappa = kappa_midpoint(n, c, ell1, delta_prime)
    model = RRGModel(n, c)
    ells = np.arange(ell1, ell2 + 1)
    if shells == "graph":
        A = graph_mean_shell_sizes(dist, ell1, ell2)
        p = p_star(model, ell1, ell2, kappa, mode=mode, delta=delta, A=A)
    elif shells == "tree":
        A = tree_shell_sizes(c, ells)
        p = p_star(model, ell1, ell2, kappa, mode=mode, delta=delta, A=A)
    elif shells == "exact":
        A = graph_mean_shell_sizes(dist, ell1, ell2)
        p = graph_p_star(adj, ell1, ell2, kappa, delta=delta, likelihood="exact", dist=dist)
    else:
        raise ValueError("shells must be 'graph', 'tree' or 'exact'")
    counts = shell_counts(dist)
    band = counts[:, ell1 : ell2 + 1].astype(float)
    avail = band > 0
    per_node = np.where(avail, p[None, :], 0.0)
    per_node /= per_node.sum(axis=1, keepdims=True)
    n_empty = int((~avail).any(axis=1).sum())
    if n_empty:
        log.warning(
            "%d of %d nodes have an empty shell in [%d, %d]; p* is renormalised over their non-empty shells",
            n_empty,
            n,
            ell1,
            ell2,
        )
    order = np.argsort(dist, axis=1, kind="stable")
    shell_start = np.concatenate(
        [np.zeros((n, 1), dtype=np.int64), np.cumsum(counts, axis=1)], axis=1
    )
    return AnonymitySetup(
        n=n,
        c=c,
        ell1=ell1,
        ell2=ell2,
        delta=float(delta),
        kappa=float(kappa),
        delta_prime=float(delta_prime),
        mode=mode,
        shells=shells,
        p_star=p,
        A=A,
        adjacency=adj,
        dist=dist,
        counts=counts,
        per_node_p=per_node,
        order=order,
        shell_start=shell_start,
        nodes_with_empty_shells=n_empty,
    )


# ---------------------------------------------------------------------------------------------
# Sampling a destination
# ---------------------------------------------------------------------------------------------


def sample_destinations(
    setup: AnonymitySetup, sources: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised source step: for each source i draw ``ℓ ~ p̃_i`` then ``j ~ Uniform(S_i(ℓ))``.

    Returns ``(destinations, distances)``. Never returns i or a neighbour (``ℓ ≥ ℓ1 ≥ 2``).
    """
    sources = np.asarray(sources, dtype=np.int64)
    cdf = np.cumsum(setup.per_node_p[sources], axis=1)
    u = rng.random(sources.size)
    k = (cdf < u[:, None] * cdf[:, -1:]).sum(axis=1)
    k = np.minimum(k, setup.n_distances - 1)
    ell = setup.ell1 + k
    size = setup.counts[sources, ell]
    pos = setup.shell_start[sources, ell] + np.floor(rng.random(sources.size) * size).astype(
        np.int64
    )
    pos = np.minimum(pos, setup.shell_start[sources, ell + 1] - 1)
    return setup.order[sources, pos], ell


def sample_destination_distance(setup: AnonymitySetup, i: int, rng: np.random.Generator) -> int:
    """Draw the destination distance ``ℓ ~ p*`` restricted to the non-empty shells around ``i``."""
    cdf = np.cumsum(setup.per_node_p[i])
    k = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return setup.ell1 + min(k, setup.n_distances - 1)


def sample_destination(setup: AnonymitySetup, i: int, rng: np.random.Generator) -> int:
    """Draw the destination of source ``i``: ``ℓ ~ p*`` then uniform in ``S_i(ℓ)`` (§2.3)."""
    ell = sample_destination_distance(setup, i, rng)
    lo, hi = setup.shell_start[i, ell], setup.shell_start[i, ell + 1]
    return int(setup.order[i, lo + int(rng.integers(hi - lo))])


# ---------------------------------------------------------------------------------------------
# What a node reports
# ---------------------------------------------------------------------------------------------


def exact_graph_alpha(
    setup: AnonymitySetup, kappa_primes: list[float] | None = None, *, t1: float | None = None
) -> dict[str, Any]:
    """Exact-graph α under return-time side information: Definition 1 (distance and node level,
    min over destinations) for each ``κ'`` of a grid, and the worst case over ``κ' ≥ t1``.

    Default grid: 12 geometric points from ``⌈t1⌉`` to ``20·N/c'`` plus ``∞``, with
    ``t1 = 2ℓ1 − (N/c')·ln(1−δ')``. Cost: two streamed first-passage passes to ``20·N/c'``.
    """
    model = setup.model
    if t1 is None:
        t1 = t1_return_bound(setup.n, setup.c, setup.ell1, setup.delta_prime)
    if kappa_primes is None:
        lo = max(math.ceil(t1), setup.ell2 + 1)
        kappa_primes = sorted({float(round(x)) for x in np.geomspace(lo, 20.0 / model.a, 12)}) + [
            math.inf
        ]
    masses = window_masses_grid(setup.adjacency, setup.delta, kappa_primes)
    M = setup.destination_matrix()
    dist_min, node_min = [], []
    for mass in masses:
        r = definition1_entropies(setup.dist, M, mass, setup.ell1, setup.ell2)
        dist_min.append(float(r.distance_level.min()))
        node_min.append(float(r.node_level.min()))
    sel = [i for i, k in enumerate(kappa_primes) if k >= t1]
    return {
        "t1": t1,
        "kappa_prime": [("inf" if math.isinf(k) else k) for k in kappa_primes],
        "distance_level_min": dist_min,
        "node_level_min": node_min,
        "alpha_distance_level": min(dist_min[i] for i in sel) if sel else math.nan,
        "alpha_node_level": min(node_min[i] for i in sel) if sel else math.nan,
    }


def timing_leak_alert(mutual_information: float, baseline: float, *, max_rise: float = 0.2) -> bool:
    """§5.4 item 22: ``True`` (alert) when the strong adversary's ``I(S;T|D)`` rose by more than
    ``max_rise`` (relative) over the recorded baseline of the deployment."""
    if baseline < 0 or mutual_information < 0:
        raise ValueError("mutual information is non-negative")
    return mutual_information > (1.0 + max_rise) * baseline


def anonymity_report(
    setup: AnonymitySetup,
    *,
    strong: bool = False,
    strong_t_max: int | None = None,
    side_information: bool = False,
) -> dict[str, Any]:
    """The α-privacy / entropy numbers of §2.6 step 4, each with the bound that produced it.

    * ``model_paper``: PAW closed form (the paper's formulas, tree shells) — ``paper``.
    * ``model_certified``: COR closed form with the setup's shells; ``α_emp`` over ``κ' ≥ t1`` and
      the corrected Theorem 1 (``1/K``) + Theorem 2 bound — ``certified`` within the RRG model.
    * ``exact_graph``: Definition 1 on the deployed graph with the exact first-passage pmfs
      (node level = α-privacy, and distance level) — ``certified`` for the paper's threat model.
    * ``exact_graph_side_information`` (optional): the same with return-time side information,
      worst case over a grid of ``κ' ≥ t1`` (:func:`exact_graph_alpha`) — ``certified`` on the grid.
    * ``strong_adversary`` (optional): a destination seeing the exact hop count (outside the
      paper's model): ``I(S;T|D)`` and ``H(S|D=j,T=2)`` — a diagnostic, ``certified``: exact up to the
      first-passage mass beyond the horizon (``tail_mass_closed``), which only widens the reported
      bracket (``H_S_given_D_T_mean`` a lower bound, ``I_S_T_given_D`` an upper bound).
    * ``cost``: mean hops per update (exact), chain-of-custody probability (§6.6).
    """
    model = setup.model
    K = setup.n_distances
    ells = range(setup.ell1, setup.ell2 + 1)
    tree_A = tree_shell_sizes(setup.c, ells)
    p_paw = p_star(
        model, setup.ell1, setup.ell2, setup.kappa, mode="paw", delta=setup.delta, A=tree_A
    )
    thm_paper = theorem3_alpha(
        model,
        setup.ell1,
        setup.ell2,
        setup.kappa,
        setup.delta_prime,
        mode="paw",
        delta=setup.delta,
        A=tree_A,
    )
    cert_A = setup.A
    thm_cert = theorem3_alpha(
        model,
        setup.ell1,
        setup.ell2,
        setup.kappa,
        setup.delta_prime,
        p=setup.p_star,
        mode="cor",
        delta=setup.delta,
        A=cert_A,
        version="corrected",
        normalizer="tight",
    )
    M = setup.destination_matrix()
    pi = setup.source_stationary()
    E = mean_hitting_times(setup.adjacency)
    mass = window_masses(setup.adjacency, setup.delta, math.inf, E=E)
    d1 = definition1_entropies(setup.dist, M, mass, setup.ell1, setup.ell2)
    report: dict[str, Any] = {
        "note": "anonymity diagnostics (nats); never credited as differential privacy",
        "parameters": setup.public_parameters(),
        "max_entropy_distance_level": math.log(K),
        "model_paper": {
            "bound": "paper",
            "what": "PAW closed form (Prop. 1 as printed), tree shells; Theorem 3 via printed Theorem 1",
            "H_at_kappa": float(
                entropy_w(p_paw, model, setup.ell1, setup.ell2, setup.kappa, mode="paw")
            ),
            "t1": thm_paper.t1,
            "alpha_emp": thm_paper.alpha_emp,
            "rho_max": thm_paper.rho_max,
            "alpha_bound": thm_paper.alpha_bound,
            "mean_iteration_time": mean_iteration_time(model, p_paw, setup.ell1),
        },
        "model_certified": {
            "bound": "certified",
            "what": "COR closed form (exact truncated mean) with the setup's shells; corrected Theorem 1 "
            "(1/K) + Theorem 2, proved within the RRG model (Assumptions 1-3)",
            "alpha_emp": thm_cert.alpha_emp,
            "rho_max": thm_cert.rho_max,
            "alpha_bound": thm_cert.alpha_bound,
        },
        "exact_graph": {
            "bound": "certified",
            "what": "Definition 1 on the deployed graph with exact first-passage pmfs, kappa' = inf",
            "alpha_node_level": d1.alpha,
            **d1.summary(),
            "max_entropy_node_level": float(
                np.log(setup.counts[:, setup.ell1 : setup.ell2 + 1].sum(axis=1)).mean()
            ),
        },
        "cost": {
            "mean_hops_per_update": protocol_mean_iteration_time(M, E, pi),
            "chain_of_custody_probability": chain_of_custody_probability(M, pi),
            "source_frequency_times_n_range": [
                float(pi.min() * setup.n),
                float(pi.max() * setup.n),
            ],
        },
    }
    if side_information:
        report["exact_graph_side_information"] = {
            "bound": "certified",
            "what": "Definition 1 on the deployed graph, worst case over a grid of kappa' >= t1 (eq. (6) t1; "
            "the true probability of kappa' >= t1 on a real graph is lower, erratum E9)",
            **exact_graph_alpha(setup),
        }
    if strong:
        t_max = strong_t_max or hitting_pmf_horizon(setup.n, setup.c, tail=10.0)
        sa = strong_adversary(setup.adjacency, M, t_max=t_max, pi=pi)
        report["strong_adversary"] = {
            "bound": "certified",
            "what": "destination observes the exact hop count T (outside the paper's model); "
            "H(S|D,T) bracketed [H_S_given_D_T_mean, H_S_given_D_T_mean_upper], I(S;T|D) "
            "[I_S_T_given_D_lower, I_S_T_given_D] (the certified side first), by the first-passage "
            "mass beyond t_max",
            **sa.summary(),
        }
    return report


# ---------------------------------------------------------------------------------------------
# Monte Carlo
# ---------------------------------------------------------------------------------------------


def _step(
    indptr: np.ndarray,
    indices: np.ndarray,
    deg: np.ndarray,
    cur: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """One simple-random-walk hop for every walker: uniform neighbour, backtracking allowed (D2)."""
    pick = np.floor(rng.random(cur.size) * deg[cur]).astype(np.int64)
    return indices[indptr[cur] + pick]


def _csr_parts(adj: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    adj = sp.csr_matrix(adj)
    adj.sort_indices()
    return (
        adj.indptr.astype(np.int64),
        adj.indices.astype(np.int64),
        np.diff(adj.indptr).astype(np.int64),
    )


def simulate_walk(graph: Any, start: int, n_steps: int, rng: np.random.Generator) -> np.ndarray:
    """Trajectory ``v_0 = start, v_1, …, v_{n_steps}`` of a simple random walk."""
    indptr, indices, deg = _csr_parts(as_adjacency(graph))
    traj = np.empty(n_steps + 1, dtype=np.int64)
    traj[0] = start
    u = rng.random(n_steps)
    cur = int(start)
    for t in range(n_steps):
        cur = int(indices[indptr[cur] + int(u[t] * deg[cur])])
        traj[t + 1] = cur
    return traj


@dataclass(frozen=True)
class ProtocolTrace:
    """Iterations recorded by :func:`simulate_protocol` (one row per completed model update).

    ``chain[k]`` identifies the independent protocol chain; within a chain rows are in time order.
    """

    chain: np.ndarray
    source: np.ndarray
    destination: np.ndarray
    distance: np.ndarray
    hops: np.ndarray

    def previous_source(self) -> np.ndarray:
        """Source of the previous iteration in the same chain (−1 for a chain's first iteration)."""
        order = np.lexsort((np.arange(self.chain.size), self.chain))
        prev = np.full(self.chain.size, -1, dtype=np.int64)
        same = self.chain[order][1:] == self.chain[order][:-1]
        prev[order[1:][same]] = self.source[order[:-1][same]]
        return prev


def simulate_protocol(
    setup: AnonymitySetup,
    n_iterations: int,
    rng: np.random.Generator,
    *,
    n_chains: int = 1000,
    start: Literal["stationary", "uniform"] | int = "stationary",
) -> ProtocolTrace:
    """Run ``n_chains`` independent copies of the protocol in lock-step, each until it has
    recorded its quota of ``ceil(n_iterations/n_chains)`` updates (a fixed count per chain: stopping
    all chains at a common *time* would drop the length-biased iterations still in flight and bias
    the mean hop count low by about ``n_chains·E[T]/n_iterations``).

    Each chain is one uninterrupted simple random walk: the source draws a destination
    (:func:`sample_destinations`), the walk moves hop by hop and stops *only* at the first visit of
    the destination, which becomes the next source (§2.3–§2.5). ``start="stationary"`` draws the
    first sources from ``π`` so that recorded iterations follow the long-run law.
    """
    indptr, indices, deg = _csr_parts(setup.adjacency)
    if start == "stationary":
        src = rng.choice(setup.n, size=n_chains, p=setup.source_stationary())
    elif start == "uniform":
        src = rng.integers(setup.n, size=n_chains)
    else:
        src = np.full(n_chains, int(start), dtype=np.int64)
    src = np.asarray(src, dtype=np.int64)
    dest, ell = sample_destinations(setup, src, rng)
    cur = src.copy()
    hops = np.zeros(n_chains, dtype=np.int64)
    out_chain, out_src, out_dst, out_ell, out_hops = [], [], [], [], []
    quota = -(-n_iterations // n_chains)
    done = np.zeros(n_chains, dtype=np.int64)
    chains = np.arange(n_chains)
    active = chains.copy()
    while active.size:
        cur[active] = _step(indptr, indices, deg, cur[active], rng)
        hops[active] += 1
        hit = active[cur[active] == dest[active]]
        if hit.size:
            out_chain.append(chains[hit])
            out_src.append(src[hit])
            out_dst.append(dest[hit])
            out_ell.append(ell[hit])
            out_hops.append(hops[hit].copy())
            done[hit] += 1
            src[hit] = dest[hit]
            hops[hit] = 0
            new_dest, new_ell = sample_destinations(setup, src[hit], rng)
            dest[hit] = new_dest
            ell[hit] = new_ell
            active = active[done[active] < quota]
    cat = lambda xs: np.concatenate(xs)  # noqa: E731
    return ProtocolTrace(
        chain=cat(out_chain),
        source=cat(out_src),
        destination=cat(out_dst),
        distance=cat(out_ell),
        hops=cat(out_hops),
    )


# ---------------------------------------------------------------------------------------------
# Mode B: the source simulates the walk itself (docs/design/spec/anonymity.md §6.3; the maths only, no crypto)
# ---------------------------------------------------------------------------------------------


def onion_path_length_max(n: int, c: int, ell2: int, eps_tr: float = 1e-3) -> int:
    """``L_max = ℓ2 + ⌈(N/c')·ln(1/ε_tr)⌉`` onion slots: ``P(T > L_max) ≲ ε_tr`` under eq. (2)
    (4151 for N=300, c=3, ℓ2=6)."""
    return ell2 + int(math.ceil((n / RRGModel(n, c).c_prime) * math.log(1.0 / eps_tr)))


def sample_walk_to_destination(
    graph: Any,
    source: int,
    destination: int,
    rng: np.random.Generator,
    *,
    l_max: int | None = None,
    burn_in: int = 0,
    max_tries: int = 1000,
) -> np.ndarray:
    """Trajectory ``v_1 … v_T`` of a simple random walk from ``source`` (excluded) that stops at
    the first visit of ``destination`` at or after step ``burn_in`` (``burn_in=0``: the plain first
    hitting time of the paper; ``>0``: the [BEYOND] mix-then-hit variant of §6.6).

    Mode B's source builds the onion along this path. Paths longer than ``l_max`` are rejected and
    resampled (the truncated law differs from the untruncated one by ``P(T > l_max)``).
    """
    adj = as_adjacency(graph)
    indptr, indices, deg = _csr_parts(adj)
    if source == destination and burn_in == 0:
        raise ValueError("source and destination must differ")
    cap = l_max if l_max is not None else 10**9
    for _ in range(max_tries):
        path: list[int] = []
        cur = int(source)
        while len(path) < cap:
            cur = int(indices[indptr[cur] + int(rng.random() * deg[cur])])
            path.append(cur)
            if cur == destination and len(path) >= burn_in:
                return np.asarray(path, dtype=np.int64)
    raise RuntimeError(f"no walk reached the destination within l_max={l_max} in {max_tries} tries")
