"""The random walk's accounting: the node's projection before it accepts a run, the certified ledger
charge per contribution, and the paper's (uncertified) Theorem 3 row.

The certified random-walk bound (random-walk paper, Thm 3, exact horizon, with the spec's noise
condition) is *linear in the number of contributions*: ``ε_{u→v}(α) = N_u · α · s_{uv}/σ²``.  So
charging every contribution with the per-contribution row ``α·s_{u,:}/σ²`` composes on the ledger to
exactly the run-level value the node projected when it accepted the run; per order the charge is
``min(walk bound, α/(2σ²))`` (:class:`~hushnet.runs.accounting.ContributionCost`).  Over plain links
the receiver's gRPC peer *is* the sender, so only the sender-known view is accountable.
"""

from __future__ import annotations

import collections
import hashlib
import math
import threading
from dataclasses import replace
from typing import Any

import numpy as np

from hushnet.families.walk.params import LOCAL_DP_SGD, PAD_COMPLETE_SGD, RW_DPSGD
from hushnet.privacy.conversions import DEFAULT_ORDERS
from hushnet.privacy.ledger_math import sealed
from hushnet.runs.accounting import ContributionCost
from hushnet.runs.spec import Budget, PolicyDecision, RunSpec, SpecError, _best_order_dp


def project_walk(
    spec: RunSpec, vertex: int, local: Budget | None = None, W: Any = None
) -> PolicyDecision:
    """Plain-link walks (``rw-dpsgd``, ``pad-complete-sgd``): the anonymous-sender view is refused —
    without onion relaying the receiver's gRPC peer *is* the sender."""
    if spec.view_model != "sender-known":
        return PolicyDecision(
            False,
            f"cannot project this node's privacy loss: view_model={spec.view_model!r} needs onion "
            "relaying (the anonymity family); plain links reveal the sender, so only "
            "'sender-known' is accountable",
            None,
            spec.budget.delta,
            "certified",
        )
    from hushnet.families.views import VIEWS

    dec = evaluate_policy(spec, vertex, local, W)
    return replace(dec, details={**dec.details, "accounting_view": VIEWS["plain-links"].as_dict()})


def walk_cost(spec: RunSpec, vertex: int, ids: list[str], W=None, orders=None) -> ContributionCost:
    """Random-walk bound (exact horizon, the spec's view model and noise condition) ∧ local DP, per contribution."""
    from hushnet.privacy.randomwalk import alpha_max
    from hushnet.protocols.registry import transition_matrix

    o = np.asarray(DEFAULT_ORDERS if orders is None else orders, dtype=float)
    targets = [ids[v] for v in range(len(ids)) if v != vertex]
    if W is None:
        W = transition_matrix(spec.graph, spec.weights)
    known = spec.view_model == "sender-known"  # plain links: the receiver knows the sender
    S = _single_loss(W, int(spec.steps), known)
    row = sealed(np.delete(S[vertex], vertex))  # the rows are built from it again when asked
    amax = alpha_max(spec.sigma, spec.constraint)
    view = "sender-known" if known else spec.view_model
    name = (
        f"random-walk bound ({view}, exact horizon, {spec.constraint} noise condition) ∧ local-DP"
    )
    return ContributionCost(targets, o, row, amax, name)


def paper_row(
    spec: RunSpec, vertex: int, contributions: float, W=None, *, sender_known: bool | None = None
) -> np.ndarray:
    """Theorem 3 as printed (ln T horizon, no σ condition), best order — labelled "paper".

    ``sender_known``: whether the receiver knows the sender (default: the spec's view model says so;
    onion relaying, :mod:`hushnet.families.anonymity`, decides it from its relay plan)."""
    from hushnet.privacy.paper.randomwalk import theorem3_printed_row
    from hushnet.protocols.registry import transition_matrix

    if W is None:
        W = transition_matrix(spec.graph, spec.weights)
    known = spec.view_model == "sender-known" if sender_known is None else sender_known
    return theorem3_printed_row(
        W,
        spec.steps,
        spec.sigma,
        vertex,
        contributions,
        spec.budget.delta,
        sender_known=known,
        # every node's report reads its row of the same all-pairs matrix (0.15 s per node at n = 1024)
        S=_single_loss(W, int(spec.steps), known, sigma=float(spec.sigma), horizon="lnT"),
    )


#: what the random-walk report's "paper" column is
RW_PAPER_LABEL = (
    "paper: random-walk paper Thm 3 as printed (ln T horizon, no noise condition); not a guarantee"
)


# ---- the node's projection (what it checks before accepting a walk) ----------------------------


def projected_row(spec: RunSpec, node: int, W: Any = None) -> tuple[np.ndarray, dict[str, Any]]:
    """The certified (ε, δ=budget.delta) row of ``node`` toward every other node, from public parameters only.

    Walk SGD: the random-walk accountant (exact horizon, the spec's noise condition, the view model
    of the transport, N_u = cap if set else T/n — an expectation, flagged in the notes), and the RDP
    converted at the best admissible order per target.  ``local-dp-sgd``: every contribution is
    seen in the clear by the next holder, so each target is charged ``N_u·α/(2σ²)`` (no amplification).
    """
    from hushnet.privacy.randomwalk import LOCAL_DP, WALK, alpha_max
    from hushnet.protocols.registry import transition_matrix

    if spec.protocol not in (RW_DPSGD, PAD_COMPLETE_SGD, LOCAL_DP_SGD):
        raise SpecError(
            f"no certified node-side accountant for protocol {spec.protocol!r} yet; the node cannot project its loss"
        )
    if W is None:
        W = transition_matrix(spec.graph, spec.weights)
    n = W.shape[0]
    T = spec.steps
    N_u = float(min(spec.cap, T)) if spec.cap is not None else T / n
    log_inv_delta = math.log(1.0 / spec.budget.delta)
    # the Gaussian RDP of a clear contribution holds at every order; the walk bound needs the noise condition
    amax = math.inf if spec.protocol == LOCAL_DP_SGD else alpha_max(spec.sigma, spec.constraint)
    if amax <= 1.0:
        raise SpecError(
            f"σ={spec.sigma} admits no Rényi order under the {spec.constraint} noise condition"
        )
    if spec.protocol == LOCAL_DP_SGD:
        slope = np.full(n, N_u / (2.0 * spec.sigma**2))
        notes = [
            "local-DP baseline: no amplification, every contribution charged α/(2σ²) toward every node"
        ]
    else:
        slopes, pm_notes = _walk_slopes(spec, W, amax, N_u)
        slope = slopes[node]  # the walk bound's RDP per unit α (ε_{u→v} ∝ α)
        notes = list(pm_notes)
    eps = _best_order_dp_distinct(slope, amax, log_inv_delta)
    certified_by = np.full(n, LOCAL_DP if spec.protocol == LOCAL_DP_SGD else WALK, dtype=object)
    if spec.protocol != LOCAL_DP_SGD:
        # the one rule of every entry point (hushnet.privacy.randomwalk.with_local_dp): every view is a
        # post-processing of the noisy contributions, so the local-DP bound (Gaussian RDP α/(2σ²) per
        # contribution, any order) is also valid; keep the smaller per target, and say which won
        ldp = _best_order_dp_distinct(
            np.full(n, N_u / (2.0 * spec.sigma**2)), math.inf, log_inv_delta
        )
        if np.any(ldp < eps):
            notes.append("per target: min(random-walk bound, local-DP bound) — both certified")
        certified_by[ldp < eps] = LOCAL_DP
        eps = np.minimum(eps, ldp)
    eps[node] = 0.0
    certified_by[node] = ""
    return eps, {
        "N_u": N_u,
        "alpha_max": amax,
        "constraint": spec.constraint,
        "view_model": spec.view_model,
        "notes": notes,
        "certified_by": certified_by.tolist(),
    }


def _best_order_dp_distinct(slope: np.ndarray, amax: float, log_inv_delta: float) -> np.ndarray:
    """:func:`~hushnet.runs.spec._best_order_dp` of each entry, computed once per distinct value.

    The conversion is elementwise (a fixed-length vectorised search per entry), and a row of a
    structured graph repeats values (a hypercube:10 row has 57–242 distinct slopes among 1024), so the
    distinct values give every entry exactly its own result at a fraction of the cost — the two
    conversions were most of a node's acceptance once the all-pairs matrices are shared."""
    s = np.asarray(slope, dtype=float)
    vals, inv = np.unique(s, return_inverse=True)
    return _best_order_dp(vals, amax, log_inv_delta)[inv.reshape(s.shape)]


#: held while a shared all-pairs matrix is looked up or computed.  A host's nodes accept a run in the
#: default executor's threads at once: without it each of them missed the empty cache and computed
#: the same O(n³) matrices side by side (and the spectrum under them), the first wave several times
_COMPUTE = threading.RLock()

#: the all-pairs walk accountant's result per public parameters, shared by the nodes of a process
_SLOPES: collections.OrderedDict[tuple, tuple[np.ndarray, tuple[str, ...]]] = (
    collections.OrderedDict()
)
_SLOPES_MAX = 4


def _w_fingerprint(W: Any) -> tuple:
    """Shape and SHA-256 of ``W``'s entries (sparse or dense): the cache key must bind the matrix itself."""
    import scipy.sparse as sp

    h = hashlib.sha256()
    if sp.issparse(W):
        C = sp.csr_matrix(W)
        C.sum_duplicates()
        C.sort_indices()
        for a in (C.indptr, C.indices, C.data):
            h.update(np.ascontiguousarray(a).tobytes())
    else:
        h.update(np.ascontiguousarray(np.asarray(W, dtype=float)).tobytes())
    return (tuple(W.shape), h.hexdigest())


def _walk_slopes(
    spec: RunSpec, W: Any, amax: float, N_u: float
) -> tuple[np.ndarray, tuple[str, ...]]:
    """The walk bound's RDP per unit α for every pair (row u: u's loss toward each v), read-only.

    Why cached: every node of a run projects its own row, and the accountant computes all pairs at once;
    a process hosting K nodes computed the same n×n matrix K times (at n = 2048 that dominated accepting
    a run).  The key holds every public input of the computation — protocol, walk length, noise, the
    contributions per node, noise condition, view model, and the matrix W itself (its SHA-256) — so two
    runs share an entry only when the accountant would return the same result.
    """
    from hushnet.privacy.randomwalk import WALK, rw_pndp_matrix

    cache = _SLOPES
    a0 = min(2.0, amax)
    key = (
        spec.protocol,
        int(spec.steps),
        float(spec.sigma),
        float(N_u),
        float(a0),
        spec.constraint,
        spec.view_model,
        _w_fingerprint(W),
    )
    with _COMPUTE:  # the hosted nodes' acceptance threads: one computes, the others wait for it
        hit = cache.get(key)
        if hit is not None:
            cache.move_to_end(key)
            return hit
        pm = rw_pndp_matrix(
            W,
            spec.steps,
            a0,
            spec.sigma,
            bound="certified",
            contributions=N_u,
            sender_known=spec.view_model == "sender-known",
            constraint=spec.constraint,
        )
        # shared by every node of the process: nobody may change it
        slopes = sealed(np.array(pm.components[WALK], dtype=float) / pm.alpha)
        hit = cache[key] = (slopes, tuple(pm.notes))
        while len(cache) > _SLOPES_MAX:
            cache.popitem(last=False)
        return hit


#: the per-contribution single-loss matrix of the ledger charge, per public parameters (see _single_loss)
_SINGLE: collections.OrderedDict[tuple, np.ndarray] = collections.OrderedDict()
#: four entries (a run's cost and paper matrices, for two runs): an n = 2048 matrix is 32 MB
_SINGLE_MAX = 4


def _single_loss(
    W: Any, steps: int, sender_known: bool, *, sigma: float = 1.0, horizon: str = "exact"
) -> np.ndarray:
    """``rw_single_loss_matrix(W, steps, 1, sigma, horizon, sender_known)``, read-only, once per process.

    Why cached: every node's ledger cost (:func:`walk_cost`, exact horizon, σ = 1) and its report's
    paper column (:func:`paper_row`, ln T horizon) take their row from an all-pairs matrix
    (``Φ diag(g) Φᵀ``, O(n³): 0.14–0.16 s at n = 1024 here), and a process hosting K nodes of a run
    built it K times — most of the 4.5 minutes 1024 nodes took to accept a run.  The key is every
    input of the call (walk length, σ, horizon, view, and the matrix W itself by its SHA-256), so a
    hit returns the very array an uncached call would compute."""
    from hushnet.privacy.randomwalk import rw_single_loss_matrix

    key = (int(steps), bool(sender_known), float(sigma), horizon, _w_fingerprint(W))
    with _COMPUTE:
        hit = _SINGLE.get(key)
        if hit is not None:
            _SINGLE.move_to_end(key)
            return hit
        S = rw_single_loss_matrix(W, steps, 1.0, sigma, horizon=horizon, sender_known=sender_known)
        S = sealed(S)  # shared by every node of the process: nobody may change it
        _SINGLE[key] = S
        while len(_SINGLE) > _SINGLE_MAX:
            _SINGLE.popitem(last=False)
        return S


def evaluate_policy(
    spec: RunSpec, node: int, local_budget: Budget | None = None, W: Any = None
) -> PolicyDecision:
    """Accept iff the projected certified row stays within the node's own budget (default: the spec's)."""
    budget = local_budget or spec.budget
    refused = PolicyDecision.delta_refusal(spec.budget.delta, budget.delta)
    if refused is not None:
        return refused
    try:
        row, det = projected_row(spec, node, W)
    except (SpecError, ValueError) as exc:
        return PolicyDecision(
            False,
            f"cannot project this node's privacy loss: {exc}",
            None,
            spec.budget.delta,
            "certified",
        )
    return PolicyDecision.certified(row, spec.budget.delta, budget.epsilon, det)
