"""The certified accountant of networked gossip runs: exact sensitivities on the public or realised
schedule, RDP curves, the papers' labelled values, the node's projection and its ledger cost.
Pure maths on public data and schedule records: nothing here does IO.
"""

from __future__ import annotations

import collections
import functools
import math
import threading
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import scipy.sparse as sp

from hushnet.engine.actions import LedgerEntry as EngineEntry
from hushnet.families.gossip.params import (
    GOSSIP_STREAM,
    MUFFLIATO,
    MUFFLIATO_GD,
    NET_GOSSIP,
    PAIRWISE,
    STREAM_MAX_CELLS,
    view_of,
)
from hushnet.families.gossip.realised import (
    RealisedSchedule,
    averaging_sensitivities,
    complete_crashed,
    gd_sensitivity,
    schedule_from_ledgers,
    stream_sensitivity,
)
from hushnet.families.gossip.schedule import (
    activation_schedule,
    fresh_er,
    public_activations,
    public_schedule,
    realised_activations,
    resolved,
    round_matrices,
    round_plan,
    topology,
)
from hushnet.families.views import VIEWS as ANON_VIEWS
from hushnet.privacy.conversions import DEFAULT_ORDERS
from hushnet.privacy.ledger import PrivacyEntry
from hushnet.privacy.ledger_math import sealed
from hushnet.runs.spec import Budget, PolicyDecision, RunSpec, _best_order_dp


def pairwise_row(spec: RunSpec, vertex: int, W, rec=None) -> np.ndarray:
    """(1, n) certified ``Δ²(vertex → v)/Δ²`` of randomized Muffliato: the exact projection of observer
    v's view (every value it received, its own noise known) on the activations ``rec`` (default: public)."""
    from hushnet.families.gossip.realised import pairwise_sensitivities

    sched = activation_schedule(spec, W)
    rec = public_activations(sched) if rec is None else rec
    row = pairwise_sensitivities(rec, len(sched), W.shape[0])[vertex].copy()
    row[vertex] = 0.0
    return row[None, :]


#: the view every certified gossip value is computed with (see :func:`certified_view`)
CERTIFIED_VIEW = "neighbourhood"

#: the label of the aggregate view's value in a secure-summation run: shown, never charged
REAL_ARITHMETIC_LABEL = (
    "real arithmetic: aggregate view (S = e_i^T) as if each secure sum were the exact Σ_j W_ij m_j — NOT "
    "certified: every member rounds its term W_ij·m_j (data and noise mixed, weights not dyadic) to the "
    "fixed-point grid on its own, so the released sum is not a function of the exact sum "
    "(docs/design/spec/secagg.md §6)"
)

#: the run's note saying why a secure-summation run is charged with the neighbourhood view
SECURE_NOTE = (
    "secure neighbourhood summation is on, but certified with the neighbourhood view: each member's "
    "fixed-point rounded term R(W_ij·m_j) makes the released sum a function of the individual messages "
    "(which that view shows), not of the exact sum the aggregate view assumes; the aggregate value is "
    "shown uncertified (real arithmetic)"
)


def certified_view(spec: RunSpec) -> str:
    """The view the certified accountant uses for ``spec``: always the neighbourhood view.

    ``protocol_params.view = "aggregate"`` turns secure neighbourhood summation on (its only switch), but
    the aggregate view's value is not certified for it: the members' sums are over fixed-point rounded
    terms, a function of every message the neighbourhood view shows (so that view's bound holds, the
    rounding being post-processing), not of the exact weighted sum (docs/design/spec/secagg.md §6)."""
    return CERTIFIED_VIEW


def certified_sensitivities(
    spec: RunSpec, vertex: int, W, sched: RealisedSchedule | dict | None = None
) -> np.ndarray:
    """(phases, n): certified ``Δ²(vertex → v)/Δ²`` of each noise phase on ``sched`` (default: public),
    with :func:`certified_view` (the neighbourhood view, also for secure-summation runs).

    Averaging: exact projection of the observer's view (its own noise removed), [M] Alg. 1, one phase.
    Muffliato-GD and streaming gossip: the whole run as one linear-Gaussian view (the state carries
    earlier noise into later steps/rounds, so per-step values must NOT be composed) with [K] Thm 12's box
    sensitivity (per-step/round contributions bounded by Δ), ``min(spectral, 1ᵀ|M|1, SDP dual certificate)``
    unless M ≥ 0 — valid for vector models (the scalar vertex enumeration is not), one phase.  Fresh ER graphs per step:
    the same, on each round's step graph.  Randomized Muffliato: :func:`pairwise_row` (``sched`` is then
    the activation records ``rec[t][node]``).
    """
    return _view_sensitivities(spec, vertex, W, sched, certified_view(spec))


def real_arithmetic_sensitivities(
    spec: RunSpec, vertex: int, W, sched: RealisedSchedule | None = None
) -> np.ndarray:
    """(phases, n): the aggregate view's ``Δ²(vertex → v)/Δ²`` as if every secure sum were exact — the
    uncertified figure :data:`REAL_ARITHMETIC_LABEL` describes; never charged nor used to accept."""
    return _view_sensitivities(spec, vertex, W, sched, "aggregate")


def _view_sensitivities(
    spec: RunSpec, vertex: int, W, sched: RealisedSchedule | dict | None, view: str
) -> np.ndarray:
    if spec.protocol == PAIRWISE:
        return pairwise_row(spec, vertex, W, sched)
    phases, gammas = round_plan(spec, W)
    T = max(max(ph) for ph in phases) + 1
    public = sched is None
    if sched is None:
        sched = public_schedule(round_matrices(spec, W), T)
    if sched.rounds != T:
        raise ValueError(f"the schedule has {sched.rounds} rounds, the run has {T}")
    n = sched.n
    if spec.protocol == MUFFLIATO_GD and public:
        # the public schedule is the same for every node: all pairs once per process, shared by the
        # nodes it hosts and by each node's decision and cost (symmetry used only where verified)
        from hushnet.families.gossip.allpairs import public_gd

        return public_gd(sched, phases, gammas, view).row(vertex)[None, :]
    if spec.protocol in (GOSSIP_STREAM, MUFFLIATO_GD):
        row = np.zeros(n)
        for v in range(n):
            if v != vertex:
                if spec.protocol == GOSSIP_STREAM:
                    res = stream_sensitivity(sched, vertex, v, view=view, exact_limit=0)
                else:
                    res = gd_sensitivity(sched, vertex, v, phases, gammas, view=view)
                row[v] = float(res["value"])
        return row[None, :]
    out = np.zeros((len(phases), n))
    for k, (ph, g) in enumerate(zip(phases, gammas)):
        S = averaging_sensitivities(sched, g, view=view, rounds=ph, source=vertex)
        out[k] = S[vertex]
    out[:, vertex] = 0.0
    return out


def rdp_curves(sens: np.ndarray, sigma: float, orders: np.ndarray) -> np.ndarray:
    """(targets…, orders): Gaussian RDP ``α Δ²/(2σ²)`` of each sensitivity (σ = noise multiplier)."""
    return (
        np.asarray(sens, dtype=float)[..., None]
        * np.asarray(orders, dtype=float)
        / (2.0 * sigma**2)
    )


# ---- the papers' values (labelled "paper", never charged) ----------------------------------------

#: the report's label of each protocol's paper value, with the spec's warning (gossip.md §1.3.9, §2.5)
PAPER_LABELS = {
    MUFFLIATO: (
        "paper: [M] Theorem 1, eq. (6), t = 0..T-1, unclipped, on the public W — NOT a guarantee: every "
        "message carries the same noise, and summing per-message divergences can be far below the exact "
        "loss (docs/design/spec/gossip.md §1.3.9 errata; e.g. 9.5e-3 where the exact loss is LDP)"
    ),
    MUFFLIATO_GD: (
        "paper: [M] Theorem 6, eq. (13), K rounds per step composed over steps, on the public W — NOT a "
        "guarantee: a step's K messages share its noise (docs/design/spec/gossip.md §1.3.9 errata, item 4)"
    ),
    GOSSIP_STREAM: (
        "paper: [K] Theorem 15 (observer set = closed neighbourhood, observers' noise counted; the "
        "spec's corrected form) — NOT a guarantee: the spec flags its explicit constants as not "
        "following from the proof, and the observer does know its own noise (gossip.md §2.5)"
    ),
}


#: eigendecompositions of public gossip matrices, shared by the nodes of a process (every node's run
#: report shows the paper's row: at n = 1024 the dense eigh was 0.33 s of each node's 0.5 s)
_EIGH: collections.OrderedDict[str, tuple[np.ndarray, np.ndarray]] = collections.OrderedDict()
_EIGH_LOCK = threading.Lock()
_EIGH_MAX = 2  # n² floats each: 8 MB at n = 1024, 32 MB at 2048


def _public_eigh(Wc: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray]:
    """``np.linalg.eigh`` of the public W, once per process per matrix (keyed by its exact entries);
    the arrays are read-only because every hosted node reads the same ones."""
    from hushnet.families.gossip.allpairs import matrix_digest

    key = matrix_digest(Wc)
    with _EIGH_LOCK:
        hit = _EIGH.get(key)
        if hit is not None:
            _EIGH.move_to_end(key)
            return hit
        lam, Q = np.linalg.eigh(Wc.toarray())
        lam, Q = sealed(lam), sealed(Q)  # shared by every node of the process
        _EIGH[key] = (lam, Q)
        while len(_EIGH) > _EIGH_MAX:
            _EIGH.popitem(last=False)
        return lam, Q


#: per public matrix: Theorem 1's row norms for t < T and its adjacency (see thm1_parts), shared as _EIGH
_THM1: collections.OrderedDict[str, tuple[list[np.ndarray], sp.csr_matrix]] = (
    collections.OrderedDict()
)


def _public_thm1(Wc: sp.csr_matrix, T: int) -> tuple[list[np.ndarray], sp.csr_matrix]:
    """:func:`~hushnet.privacy.paper.muffliato.thm1_parts` of the public W for sums up to ``T``, once per
    process per matrix (n floats per t: 16 kB a round at n = 2048); read-only, as every node reads them."""
    from hushnet.families.gossip.allpairs import matrix_digest
    from hushnet.privacy.paper.muffliato import thm1_parts

    key = matrix_digest(Wc)
    with _EIGH_LOCK:
        hit = _THM1.get(key)
        if hit is not None and len(hit[0]) >= T:
            _THM1.move_to_end(key)
            return hit
    norms, adjacency = thm1_parts(Wc, T, _public_eigh(Wc))
    for a in (*norms, adjacency.data, adjacency.indices, adjacency.indptr):
        a.flags.writeable = False
    with _EIGH_LOCK:
        _THM1[key] = (norms, adjacency)
        while len(_THM1) > _EIGH_MAX:
            _THM1.popitem(last=False)
    return norms, adjacency


def paper_sensitivities(spec: RunSpec, vertex: int, W) -> np.ndarray:
    """(n,) the paper's unit-free ``Δ²(vertex → v)/Δ²`` on the public schedule (0 toward itself).

    Muffliato: [M] Thm 1 (:func:`hushnet.privacy.paper.muffliato.thm1_from_source`, T resolved rounds; acceleration
    does not change it).  Muffliato-GD: Thm 6 eq. (13), Thm 1 with K rounds per step (on the
    step's graph), summed over steps.  Streaming gossip: [K] Thm 15 with ``m = |N̄_v|`` (1 in the
    aggregate view), ``ρ = max(|λ₂|, |λ_n|)``:
    ``m T/n + 2/(1−ρ)² √(m T/n) + 2/(1−ρ)⁴`` (∞ if W is not primitive;
    :func:`hushnet.privacy.paper.koskela.thm15_sensitivities`).
    """
    from hushnet.families.gossip.build import mh_matrix
    from hushnet.privacy.paper.koskela import thm15_sensitivities
    from hushnet.privacy.paper.muffliato import thm1_from_source

    Wc = sp.csr_matrix(W, dtype=float)
    p = resolved(spec, Wc)
    if spec.protocol == MUFFLIATO:
        out = thm1_from_source(Wc, vertex, int(p["rounds"]))
    elif spec.protocol == MUFFLIATO_GD and fresh_er(spec):  # Thm 1 on each step's own ER graph
        topo = topology(spec, Wc)
        out = sum(
            thm1_from_source(mh_matrix(topo.graph(r)), vertex, int(k))
            for r, k in enumerate(p["ks"])
        )
    elif spec.protocol == MUFFLIATO_GD:
        # each step's Theorem 1 term once per distinct K (the steps' terms are equal), with the norms and
        # adjacency every node of the process shares: the same sum, term for term, in the same order
        # (issue 12: 140 ms of each node's report at n = 2048, four equal terms each rebuilding them)
        ks = [int(k) for k in p["ks"]]
        norms, adjacency = _public_thm1(Wc, max(ks, default=0))
        terms: dict[int, np.ndarray] = {}
        for k in ks:
            if k not in terms:
                terms[k] = thm1_from_source(Wc, vertex, k, norms=norms, adjacency=adjacency)
        out = sum(terms[k] for k in ks)
    elif spec.protocol == GOSSIP_STREAM:
        out = thm15_sensitivities(Wc, int(p["rounds"]), aggregate=view_of(spec) == "aggregate")
    else:
        raise ValueError(f"no paper bound for {spec.protocol}")
    out = np.array(out, dtype=float)
    out[vertex] = 0.0
    return out


def paper_gossip(spec: RunSpec, vertex: int, W=None) -> tuple[np.ndarray, str] | None:
    """The run report's "paper" row: ε toward every node at the spec's δ (best order, Gaussian RDP of the
    paper's sensitivity, no order limit), and the label that says which theorem and why it is no guarantee."""
    from hushnet.protocols.registry import transition_matrix

    if spec.protocol not in PAPER_LABELS:
        return None
    W = transition_matrix(spec.graph, spec.weights) if W is None else W
    sens = paper_sensitivities(spec, vertex, W)
    # once per distinct value (the conversion is elementwise; a hypercube:11 row has ~a dozen among 2 048,
    # and converting each entry was most of the row at n = 2048); ±0 merge, but those entries are set to 0
    vals, inv = np.unique(sens / (2.0 * spec.sigma**2), return_inverse=True)
    row = _best_order_dp(vals, math.inf, math.log(1.0 / spec.budget.delta))[inv.reshape(sens.shape)]
    row[sens <= 0] = 0.0
    row[vertex] = 0.0
    label = PAPER_LABELS[spec.protocol]
    if fresh_er(spec):
        label += "; fresh Erdős–Rényi graph per step: Theorem 1 on each step's public graph"
    if view_of(spec) == "aggregate":
        label += (
            "; aggregate view: [K] Thm 15 with m = 1"
            if spec.protocol == GOSSIP_STREAM
            else "; aggregate view: [M] has no such view, its neighbourhood value is shown"
        )
    return row, label


# ---- projector ----------------------------------------------------------------------------------


def _refuse(spec: RunSpec, reason: str) -> PolicyDecision:
    return PolicyDecision(
        False,
        f"cannot project this node's privacy loss: {reason}",
        None,
        spec.budget.delta,
        "certified",
    )


def accounting_view(spec: RunSpec) -> dict[str, Any]:
    """What the report says about the view: the mechanism (``gossip_view``) and the certified view.

    With secure summation on, the mechanism is the secure sum but the view model the bound certifies is
    the neighbourhood one (:func:`certified_view`)."""
    from hushnet.families.gossip.secure import ACCOUNTING_LABEL

    view = view_of(spec)
    if view != "aggregate":
        v = ANON_VIEWS["neighbourhood"].as_dict()
        label = "neighbourhood (plain gossip)"
    else:
        v = ANON_VIEWS["secure-gossip"].as_dict()
        label = ACCOUNTING_LABEL
    return {
        **v,
        "gossip_view": view,
        "certified_view": certified_view(spec),
        "label": label,
        "bound": "certified",
    }


def check_network_spec(spec: RunSpec) -> str | None:
    """Why this gossip spec cannot run (or be accounted) between nodes, or None."""
    pp = spec.protocol_params
    if spec.protocol not in NET_GOSSIP:
        return (
            f"{spec.protocol} is simulator-only (its activations or graphs are not the network's links); "
            f"networked gossip protocols: {', '.join(NET_GOSSIP)}"
        )
    graph = pp.get("graph", "fixed")
    if graph != "fixed":
        if not fresh_er(spec):
            return (
                f"graph {graph!r} is simulator-only over the network: only Muffliato-GD may draw a fresh "
                "Erdős–Rényi graph per step ('er-per-step'), on a complete network topology"
            )
        from hushnet.protocols.registry import transition_matrix

        try:
            A = sp.csr_matrix(transition_matrix(spec.graph, spec.weights))
        except (ValueError, KeyError) as exc:
            return f"graph {spec.graph!r}: {exc}"
        n = A.shape[0]
        A.setdiag(0.0)
        A.eliminate_zeros()
        if A.nnz != n * (n - 1):
            return (
                f"fresh Erdős–Rényi graphs per step: needs a complete network topology (complete:{n}): ER edges "
                f"outside the network's links ({spec.graph} has {A.nnz // 2} of {n * (n - 1) // 2} edges)"
            )
    view = view_of(spec)
    if view not in ("neighbourhood", "aggregate"):
        return f"protocol_params.view must be 'neighbourhood' or 'aggregate', got {view!r}"
    if spec.protocol == PAIRWISE and ("dropout" in pp or pp.get("chebyshev")):
        return "randomized Muffliato has no simulated dropouts nor Chebyshev acceleration (options of the rounds)"
    if view == "aggregate" and spec.protocol == PAIRWISE:
        return (
            "randomized Muffliato exchanges single values between two nodes: there is no neighbourhood sum to "
            "secure, so only the 'neighbourhood' view applies"
        )
    if (
        view == "aggregate"
        and "frac_bits" in pp
        and not (isinstance(pp["frac_bits"], int) and 8 <= pp["frac_bits"] <= 40)
    ):
        return (
            "frac_bits (fixed-point fraction bits of the secure sums) must be an integer in 8..40"
        )
    if spec.weights != "hamilton":
        return "gossip rounds rebuild Metropolis-Hastings weights 1/(1+max(d_u,d_v)) on both ends: weights must be 'hamilton'"
    if not (isinstance(spec.sigma, (int, float)) and math.isfinite(spec.sigma) and spec.sigma > 0):
        return f"{spec.protocol} needs sigma > 0 (noise multiplier): a run without noise is not private"
    if "noise_std" in pp or pp.get("clip_after_noise"):
        return "absolute noise and clipping after noise are reproduction options, not accountable by the node"
    return None


#: Muffliato-GD on a schedule with verified translations computes ONE observer's joint view (not n), so a
#: larger steps×nodes fits: n = 2048 with 4 steps is 8192 cells (one basis of 8192 rows)
GD_SYMMETRIC_MAX_CELLS = 4 * STREAM_MAX_CELLS


def _symmetric_gd(spec: RunSpec, W, steps: int) -> bool:
    """Whether Muffliato-GD's public schedule has verified translations and fits the larger cap."""
    if spec.protocol != MUFFLIATO_GD or steps * W.shape[0] > GD_SYMMETRIC_MAX_CELLS:
        return False
    from hushnet.families.gossip.allpairs import verified_translations

    phases, _ = round_plan(spec, W)
    T = max(max(ph) for ph in phases) + 1
    return verified_translations(public_schedule(round_matrices(spec, W), T)) is not None


def project_gossip(
    spec: RunSpec, vertex: int, local: Budget | None = None, W: Any = None
) -> PolicyDecision:
    """Accept iff the certified exact row on the public schedule fits the node's budget (best order per target)."""
    from hushnet.protocols.registry import transition_matrix

    budget = local or spec.budget
    refused = PolicyDecision.delta_refusal(spec.budget.delta, budget.delta)
    if refused is not None:
        return refused
    why = check_network_spec(spec)
    if why:
        return _refuse(spec, why)
    W = transition_matrix(spec.graph, spec.weights) if W is None else W
    if spec.protocol in (GOSSIP_STREAM, MUFFLIATO_GD, PAIRWISE):
        T = int(resolved(spec, W)["rounds"]) if spec.protocol != MUFFLIATO_GD else int(spec.steps)
        if spec.protocol == PAIRWISE:
            T //= 8  # the pairwise replay is (activations × n), a few rows per activation
        if T * W.shape[0] > STREAM_MAX_CELLS and not _symmetric_gd(spec, W, T):
            return _refuse(
                spec,
                f"{spec.protocol} accounting is dense in {'rounds' if spec.protocol == GOSSIP_STREAM else 'steps'}"
                f"×nodes ({T}×{W.shape[0]} > {STREAM_MAX_CELLS})",
            )
    try:
        sens = certified_sensitivities(spec, vertex, W)
    except (ValueError, np.linalg.LinAlgError) as exc:
        return _refuse(spec, str(exc))
    slope = sens.sum(axis=0) / (2.0 * spec.sigma**2)  # RDP per unit α, composed over phases
    row = _best_order_dp(slope, math.inf, math.log(1.0 / spec.budget.delta))
    row[vertex] = 0.0
    row[slope <= 0] = 0.0
    det = {
        "N_u": 1.0,
        "phases": int(sens.shape[0]),
        "sensitivity_sq": sens.sum(axis=0).tolist(),
        "accounting_view": accounting_view(spec),
        "notes": [
            f"certified exact loss on the public {'activation ' if spec.protocol == PAIRWISE else ''}"
            "schedule (no dropouts); the ledger is settled on the realised schedule after the run "
            "(top-up, never refund)"
        ],
    }
    if view_of(spec) == "aggregate":
        det["notes"].append(SECURE_NOTE)
        try:
            agg = real_arithmetic_sensitivities(spec, vertex, W).sum(axis=0)
        except (ValueError, np.linalg.LinAlgError) as exc:
            ra: dict[str, Any] = {"error": str(exc)}
        else:
            ra_row = _best_order_dp(
                agg / (2.0 * spec.sigma**2), math.inf, math.log(1.0 / spec.budget.delta)
            )
            ra_row[vertex] = 0.0
            ra_row[agg <= 0] = 0.0
            ra = {"sensitivity_sq": agg.tolist(), "epsilon": ra_row.tolist()}
        real = {"bound": "uncertified", "label": REAL_ARITHMETIC_LABEL, **ra}
        det["aggregate_real_arithmetic"] = real
        det["accounting_view"]["aggregate_real_arithmetic"] = real
    return PolicyDecision.certified(
        row, spec.budget.delta, budget.epsilon, det, f"{certified_view(spec)} view"
    )


# ---- the ledger cost ----------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _sealed_zeros(shape: tuple[int, ...]) -> np.ndarray:
    """A read-only zero array backed by immutable bytes (shared: nobody can write it)."""
    return sealed(np.zeros(shape))


@dataclass
class GossipCost:
    """Duck-types :class:`hushnet.runs.accounting.ContributionCost` for the node driver.

    ``phase_curves[k]`` (targets × orders) is charged at the k-th data action of the run (averaging:
    the one noisy input; GD and streaming: the whole run at the first data action, nothing later — their
    joint-view bound is not additive per step, so a stopped run has charged its whole projection).  ``curves(σ)`` is what the service's
    lifetime check multiplies by ``N_u = 1``: the whole run.

    The cost keeps the certified sensitivities ``sens`` (phases × targets) and builds a phase's curves
    when it is charged (:meth:`phase_row`, the same element-wise :func:`rdp_curves`, so the same bits):
    the curves are ``len(orders)`` = 159 times larger — 1.3 MB a node at n = 1024, 2.6 MB at 2048, held
    for the whole run by every hosted node (issue 12: host memory).
    """

    spec: RunSpec
    vertex: int
    ids: list[str]
    targets: list[str]
    orders: np.ndarray
    sens: np.ndarray  # (phases, targets): the certified sensitivities, squared (rdp_curves' input)
    walk_slope: None = None
    alpha_max: float = math.inf
    bound_name: str = (
        "certified exact view divergence (Muffliato / Koskela), projected on the public schedule"
    )
    used: int = 0
    charged: np.ndarray | None = None
    settled: dict[str, Any] = field(default_factory=dict)

    @property
    def phase_curves(self) -> np.ndarray:
        """(phases, targets, orders): every phase's curves (built on each call, not kept)."""
        return rdp_curves(self.sens, self.spec.sigma, self.orders)

    def phase_row(self, k: int) -> np.ndarray:
        """(targets, orders): phase ``k``'s curves, a fresh array (equal bit for bit to ``phase_curves[k]``)."""
        return rdp_curves(self.sens[k], self.spec.sigma, self.orders)

    def curves(self, sigma: float) -> np.ndarray:
        return self.phase_curves.sum(axis=0)

    def entry(self, ev: EngineEntry, run_id: str, node_id: str) -> PrivacyEntry:
        if abs(float(ev.sigma) - float(self.spec.sigma)) > 1e-12 * max(1.0, self.spec.sigma):
            raise ValueError(
                f"noise multiplier {ev.sigma} differs from the spec's {self.spec.sigma}"
            )
        k = self.used
        self.used += 1
        if self.spec.protocol in (GOSSIP_STREAM, MUFFLIATO_GD):
            # after the first data action nothing more is charged: one sealed zero row per shape and
            # process, so the ledger stores its block once per node and run (its recent-block reuse
            # takes sealed rows only), not a fresh (targets × orders) block of zeros per step — at
            # n = 1024 those were 3 of each node's 4 ledger blocks, ~1.2 MB each, ~3.7 GB of writes
            shape = (len(self.targets), self.orders.size)
            nothing = k > 0
            rdp = _sealed_zeros(shape) if nothing else self.phase_row(0)
        elif k < self.sens.shape[0]:
            nothing, rdp = False, self.phase_row(k)
        else:
            raise ValueError(f"data action {k + 1} of a run projected with {self.sens.shape[0]}")
        if self.charged is None:
            # sealed and not copied again: this run's charged row, the driver's run row (it keeps a
            # read-only row as it is), the ledger's recent block and the run store's checkpoint buffer
            # (its own bytes, recognised by identity: no copy and no hash per checkpoint) are one array
            rdp = sealed(rdp)
            self.charged = rdp
        elif not nothing:  # adding the zero row changes nothing: no new (targets × orders) array
            self.charged = self.charged + rdp
        view = certified_view(self.spec)
        return PrivacyEntry.from_row(
            run_id,
            ev.protocol,
            view,
            "certified",
            self.targets,
            rdp,
            note=f"{ev.kind} at round {ev.step} ({self.bound_name}, {view} view)",
        )


def gossip_cost(spec: RunSpec, vertex: int, ids: list[str], W=None, orders=None) -> GossipCost:
    from hushnet.protocols.registry import transition_matrix

    o = np.asarray(DEFAULT_ORDERS if orders is None else orders, dtype=float)
    W = transition_matrix(spec.graph, spec.weights) if W is None else W
    sens = certified_sensitivities(spec, vertex, W)
    keep = [v for v in range(len(ids)) if v != vertex]
    return GossipCost(spec, vertex, list(ids), [ids[v] for v in keep], o, sens[:, keep])


def realised_schedule(
    records: Mapping[int, list[dict[str, Any]]], n: int, rounds: int
) -> RealisedSchedule:
    """Rebuild the realised schedule from every node's records (vertex → list of records)."""
    ledgers = {
        int(v): [
            EngineEntry(
                int(v),
                int(r["round"]),
                "schedule",
                "sender-known",
                0.0,
                0.0,
                0.0,
                "gossip",
                "",
                {**r, "row": {int(k): float(w) for k, w in r["row"].items()}},
            )
            for r in recs
        ]
        for v, recs in records.items()
    }
    return schedule_from_ledgers(ledgers, n, rounds)


def settled_schedule(
    spec: RunSpec, records: Mapping[int, list[dict[str, Any]]], n: int, W=None
) -> tuple[RealisedSchedule, dict[int, int]]:
    """The schedule the settlement accounts: the recorded rounds, plus the SAFE completion of every node
    whose (durable) records stop early — a crashed node is assumed to have sent its value of the round
    it died in to all its neighbours (:func:`~hushnet.families.gossip.realised.complete_crashed`).
    Returns the schedule and ``{vertex: first unrecorded round}`` of the completed nodes."""
    from hushnet.protocols.registry import transition_matrix

    W = transition_matrix(spec.graph, spec.weights) if W is None else W
    if spec.protocol == PAIRWISE:  # the activations instead of rounds (same contract)
        return realised_activations(spec, records, W)  # type: ignore[return-value]
    phases, _ = round_plan(spec, W)
    T = max(max(ph) for ph in phases) + 1
    sched = realised_schedule(records, n, T)
    topo = topology(spec, W)  # a crashed node may have sent to its neighbours of that round's graph
    completed = complete_crashed(sched, records.keys(), topo.neighbours)
    return sched, completed


def realised_curves(
    spec: RunSpec,
    vertex: int,
    ids: list[str],
    records: Mapping[int, list[dict[str, Any]]],
    orders: np.ndarray,
    W=None,
) -> np.ndarray:
    """(targets, orders): the certified RDP of ``vertex`` on the realised schedule (the accountant's replay,
    crashed nodes' unrecorded rounds completed in the safe direction)."""
    from hushnet.protocols.registry import transition_matrix

    W = transition_matrix(spec.graph, spec.weights) if W is None else W
    sched, _ = settled_schedule(spec, records, len(ids), W)
    sens = certified_sensitivities(spec, vertex, W, sched).sum(axis=0)
    keep = [v for v in range(len(ids)) if v != vertex]
    return rdp_curves(sens[keep], spec.sigma, orders)
