"""Accounting a gossip run from what really happened: the schedule recorded in the nodes' ledgers.

With dropouts and timeouts the gossip matrices are not the public ``W`` any more: round t used
the effective ``W_t`` that the nodes rebuilt from the announced degrees.  Every round machine
records its row of ``W_t`` and the neighbours it sent its value to (``LedgerEntry(kind="schedule")``);
this module rebuilds the realised schedule from those entries and accounts it *exactly*:

* **averaging** ([M] Alg. 1, and every gradient step of Alg. 3): the state after t rounds is
  ``P_t x⁰`` with ``P_{t+1} = γ_t W_t P_t + (1−γ_t) P_{t−1}`` (``P_1 = W_0``); observer v's view is
  the rows ``P_t[w, :]`` of every value w sent to v, plus its own states, so its squared
  sensitivity toward u is ``‖Π e_u‖²`` (projection on the row space with the observer's own noise
  column removed) — :func:`hushnet.privacy.linear_gaussian.projection_weights`, as for a public W;
* **streaming gossip** ([K]): the messages ``m_t = Σ_{k≤t} W_{t−1}⋯W_k (x_k + u_k)``; the view is
  linear-Gaussian in all rounds' contributions and noise, accounted by
  :class:`hushnet.privacy.linear_gaussian.LinearGaussianView` (box sensitivity of [K] Thm 12).

``linear_gaussian.py`` takes one fixed ``W``; the time-varying products are built here and handed
to the generic functions.  Views are built from *sender-side* records (a value counts as seen by
its receiver even if the receiver refused it as late), which can only enlarge a view: safe.

Threat models (the run spec says which one; reports say which was used): ``"neighbourhood"`` —
plain gossip, the observer sees every message sent to it (closed neighbourhood); ``"aggregate"`` —
secure neighbourhood summation, the observer learns only its own input and the weighted sums it
mixes, ``S = e_iᵀ``.  The observer always knows its own noise.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import scipy.sparse as sp

from hushnet.engine.actions import LedgerEntry
from hushnet.privacy.ledger_math import PrivacyEntry
from hushnet.privacy.linear_gaussian import (
    LinearGaussianView,
    box_quadratic_max,
    projection_weights,
    rdp_of,
)
from hushnet.privacy.view_basis import (
    IMAGE_ATOL,
    extend_basis,
    pairwise_view_basis,
    svd_basis,
)

__all__ = [
    "VIEWS",
    "RealisedSchedule",
    "schedule_from_ledgers",
    "complete_crashed",
    "replay_averaging",
    "replay_stream",
    "averaging_sensitivities",
    "averaging_thm1",
    "stream_sensitivity",
    "gd_sensitivity",
    "pairwise_schedule_from_ledgers",
    "replay_pairwise",
    "pairwise_sensitivities",
    "privacy_ledger_entries",
    "certified_report",
]

VIEWS = ("neighbourhood", "aggregate")


@dataclass
class RealisedSchedule:
    """The realised synchronous schedule: ``W[t]`` (row i = node i's recorded row) and the VALUE
    messages sent in round t (``sent[t]`` = list of (sender, receiver)).  Nodes with no record for a
    round (dead) keep their state: identity row, no messages."""

    n: int
    W: list[sp.csr_matrix]
    sent: list[list[tuple[int, int]]]
    up: np.ndarray
    recorded: np.ndarray
    steps: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def rounds(self) -> int:
        return len(self.W)

    def asymmetries(self, tol: float = 1e-15) -> list[tuple[int, int, int]]:
        """Rounds and edges where the two ends used different weights (a timeout race)."""
        out = []
        for t, Wt in enumerate(self.W):
            D = (Wt - Wt.T).tocoo()
            for i, j, v in zip(D.row, D.col, D.data):
                if i < j and abs(v) > tol:
                    out.append((t, int(i), int(j)))
        return out

    def received(self, t: int, v: int) -> list[int]:
        return [s for s, r in self.sent[t] if r == v]


def schedule_from_ledgers(
    ledgers: Mapping[int, Sequence[LedgerEntry]], n: int, rounds: int
) -> RealisedSchedule:
    """Rebuild the realised schedule from the nodes' ``schedule`` ledger entries (engine actions)."""
    rows: list[list[int]] = [[] for _ in range(rounds)]
    cols: list[list[int]] = [[] for _ in range(rounds)]
    vals: list[list[float]] = [[] for _ in range(rounds)]
    sent: list[list[tuple[int, int]]] = [[] for _ in range(rounds)]
    up = np.zeros((rounds, n), dtype=bool)
    rec = np.zeros((rounds, n), dtype=bool)
    steps = np.zeros(rounds, dtype=np.int64)
    for node, entries in ledgers.items():
        for e in entries:
            if e.kind != "schedule":
                continue
            d = e.detail
            t = int(d["round"])
            if t >= rounds:
                raise ValueError(f"node {node} recorded round {t}, the run has {rounds}")
            if rec[t, node]:
                raise ValueError(f"node {node} recorded round {t} twice")
            rec[t, node] = True
            up[t, node] = bool(d["up"])
            steps[t] = int(d.get("step", 0))
            rows[t].append(node)
            cols[t].append(node)
            vals[t].append(float(d["self"]))
            for j, w in d["row"].items():
                rows[t].append(node)
                cols[t].append(int(j))
                vals[t].append(float(w))
            sent[t].extend((node, int(j)) for j in d["sent_value"])
    Ws = []
    for t in range(rounds):
        missing = np.flatnonzero(~rec[t])
        r = rows[t] + missing.tolist()
        c = cols[t] + missing.tolist()
        v = vals[t] + [1.0] * missing.size
        Ws.append(sp.csr_matrix((v, (r, c)), shape=(n, n)))
    return RealisedSchedule(n, Ws, sent, up, rec, steps)


def complete_crashed(
    sched: RealisedSchedule, vertices: Iterable[int], neighbours
) -> dict[int, int]:
    """Account the rounds a crashed node did not record, in the SAFE direction (in place).

    A node's durable records are a prefix of its rounds (:mod:`hushnet.families.gossip.store`: a round's
    record is on disk before the next round's value leaves).  If node v recorded rounds ``0..c−1``
    only, then in round c it may have sent its value — ``P_c[v]``, fixed by its recorded rows — to any
    of its neighbours before dying, and after round c it sent nothing.  So the replay assumes v sent
    its round-c value to *every* neighbour of round c (``neighbours(v, c)``), keeps its row identity
    from round c on (it never sends again, so its state reaches no view), and adds nothing later.
    Adding messages to a view can only increase the observer's divergence (its view is a superset;
    data processing), so the certified loss on the completed schedule is at least the loss of
    whatever really happened: the accountant never under-counts.

    ``vertices``: the nodes whose records are their full durable prefix (absent nodes are not
    completed: their records are unknown, and the settlement refuses to guess).  Returns
    ``{v: c}`` for every completed node.  A record set with a gap (a missing round followed by a
    recorded one) is not a crash prefix and is refused.
    """
    out: dict[int, int] = {}
    T = sched.rounds
    for v in sorted(int(v) for v in vertices):
        rec = sched.recorded[:, v]
        c = int(np.argmin(rec)) if not rec.all() else T
        if c == T:
            continue
        if rec[c:].any():
            later = int(c + np.argmax(rec[c:]))
            raise ValueError(
                f"node {v}'s records skip round {c} but hold round {later}: not the prefix a crash "
                "leaves; the schedule cannot be completed safely"
            )
        already = {j for s, j in sched.sent[c] if s == v}
        sched.sent[c].extend(
            (v, int(j)) for j in neighbours(v, c) if int(j) != v and int(j) not in already
        )
        out[v] = c
    return out


def _gammas(gamma: float | Sequence[float], rounds: int) -> np.ndarray:
    g = np.full(rounds, float(gamma)) if np.isscalar(gamma) else np.asarray(gamma, dtype=float)
    if g.shape != (rounds,):
        raise ValueError(f"need one gamma per round ({rounds}), got {g.shape}")
    return g


def replay_averaging(
    sched: RealisedSchedule,
    x0: np.ndarray,
    gamma: float | Sequence[float] = 1.0,
    rounds: Iterable[int] | None = None,
) -> np.ndarray:
    """States after replaying the recorded ``W_t`` on ``x0`` (n×d) with the Chebyshev recursion
    (round ``rounds[0]`` is the first of its step: ``x¹ = W x⁰``).  Returns the final states."""
    ts = list(range(sched.rounds)) if rounds is None else list(rounds)
    g = _gammas(gamma, sched.rounds)
    prev, cur = None, np.asarray(x0, dtype=float)
    for k, t in enumerate(ts):
        nxt = np.asarray(sched.W[t] @ cur)
        if k > 0 and g[t] != 1.0:
            nxt = g[t] * nxt + (1.0 - g[t]) * prev
        prev, cur = cur, nxt
    return cur


def replay_stream(
    sched: RealisedSchedule, z: np.ndarray, theta0: np.ndarray | None = None
) -> np.ndarray:
    """Streaming gossip replay: ``θ_{t+1} = W_t(θ_t + z_t)``; ``z`` is (T, n, d) contributions + noise."""
    theta = np.zeros(z.shape[1:]) if theta0 is None else np.asarray(theta0, dtype=float)
    for t in range(sched.rounds):
        theta = np.asarray(sched.W[t] @ (theta + z[t]))
    return theta


def averaging_sensitivities(
    sched: RealisedSchedule,
    gamma: float | Sequence[float] = 1.0,
    *,
    view: str = "neighbourhood",
    rounds: Sequence[int] | None = None,
    observers: Sequence[int] | None = None,
    batch: int = 64,
    source: int | None = None,
) -> np.ndarray:
    """Certified ``S[u, v] = Δ²(u → v)/Δ²`` of one averaging phase (noise once, then the rounds
    ``rounds`` of the recorded schedule; all rounds by default).  Exact: projection of ``e_u`` on
    the observer's view with its own noise removed.  Diagonal 0; columns of observers not asked for
    are 0.

    The view's row space is grown backwards in time from orthonormal bases
    (:func:`_view_basis`), never from the explicit rows ``P_k[w]``: products of gossip matrices are
    badly conditioned, and an SVD of the stacked rows misses directions that exist in exact
    arithmetic — it under-stated ``S`` by up to 0.27 on grid 6×6, T = 40 (tests pin the dimension
    to exact arithmetic modulo a prime).  ``batch`` is kept for compatibility (observers are done one
    at a time).  With ``source`` only row ``source`` of S is wanted: observers whose view never
    involves it (no path of recorded rounds carries its value into a row they see) are skipped —
    exactly 0."""
    if view not in VIEWS:
        raise ValueError(f"view must be one of {VIEWS}")
    n = sched.n
    ts = list(range(sched.rounds)) if rounds is None else list(rounds)
    g = _gammas(gamma, sched.rounds)
    recv = [defaultdict(list) for _ in ts]
    for k, t in enumerate(ts):
        for w, v in sched.sent[t]:
            recv[k][v].append(w)
    obs = list(range(n)) if observers is None else [int(v) for v in observers]
    reach = _source_reach(sched, ts, g, source) if source is not None else None
    S = np.zeros((n, n))
    W0 = _static_phase(sched, ts)
    if W0 is not None:
        # one W, every edge used every round: the public-W block Arnoldi (pinned to exact arithmetic in
        # tests; acceleration does not change the view's space).  The backward recursion below would also
        # be safe there, but on symmetric graphs re-imaging a saturated basis amplifies rounding into
        # spurious directions (ring:16, aggregate view, T = 30: 13 dimensions where there are 8)
        from hushnet.privacy.muffliato import observer_sensitivities

        for v in obs:
            if reach is not None and not _involves(reach, v, view, sched, ts):
                continue
            S[:, v] = observer_sensitivities(W0, v, len(ts), view=view)
        return S
    for v in obs:
        sel = []
        for k, t in enumerate(ts):
            if view == "neighbourhood":
                E = np.zeros((n, 1 + len(recv[k][v])))
                E[[v] + recv[k][v], np.arange(E.shape[1])] = 1.0
            else:
                E = sched.W[t][v].toarray().T  # (W_t P_k)[v, :] = W_t[v, :] P_k
            sel.append(E)
        if reach is not None and not any(np.any(E[reach[k]] != 0) for k, E in enumerate(sel)):
            continue
        Q = _view_basis(sched, ts, g, sel)
        Q[v, :] = 0.0  # own noise known: the view is P_v V, and (V + e_v) ∩ e_v^⊥ = P_v V
        Q = svd_basis(Q, IMAGE_ATOL)
        s = np.clip(np.einsum("ij,ij->i", Q, Q), 0.0, 1.0)
        s[v] = 0.0
        S[:, v] = s
    return S


def _view_basis(
    sched: RealisedSchedule, ts: Sequence[int], g: np.ndarray, sel: list[np.ndarray]
) -> np.ndarray:
    """Orthonormal basis (n×r) of ``V = span_k {s_kᵀ P_k : s_k ∈ columns of sel[k]}``.

    ``P_0 = I``, ``P_{k+1} = a_k W_{t_k} P_k + b_k P_{k−1}`` (``a_k = γ`` except 1 in the phase's first
    round, ``b_k = 1 − a_k``).  With ``L_k = [P_k; P_{k−1}] = C_{k−1}⋯C_0 L_0``, ``L_0 = [I; 0]``, the
    view is ``[I 0] U_0`` where ``U_{K−1} = [sel; 0]`` and ``U_k = [sel_k; 0] + C_kᵀ U_{k+1}``,
    ``C_kᵀ (x; y) = (a_k W_tᵀ x + y; b_k x)``.  Each step maps an orthonormal basis by one matrix
    (its image keeps every direction the step does not annihilate) and adds the selectors' new
    directions as block Arnoldi does, so nothing is lost to the conditioning of long products (on
    dropout schedules the dimension found equals exact arithmetic's, tests; a spurious direction from
    rounding could only enlarge the subspace, the safe side).  Coordinates outside the structural support of
    ``U_k`` (the same recursion on sparsity patterns) are exactly 0 in exact arithmetic and are
    zeroed (a node whose value never reaches the view, e.g. a dead one, keeps weight exactly 0)."""
    n = sched.n
    K = len(ts)
    lifted = any(k > 0 and g[t] != 1.0 for k, t in enumerate(ts))
    m = 2 * n if lifted else n
    Q = np.zeros((m, 0))
    supp = np.zeros(m, bool)
    for k in range(K - 1, -1, -1):
        t = ts[k]
        a = g[t] if (k > 0 and g[t] != 1.0) else 1.0
        Wt_T = sched.W[t].T.tocsr()
        top_s = np.asarray(abs(Wt_T) @ supp[:n].astype(float)).ravel() != 0
        if lifted:
            top_s |= supp[n:]
            supp = np.concatenate([top_s, supp[:n] if a != 1.0 else np.zeros(n, bool)])
        else:
            supp = top_s
        if Q.shape[1]:
            x = Q[:n]
            top = a * np.asarray(Wt_T @ x)
            if lifted:
                top = top + Q[n:]
                Y = np.concatenate([top, (1.0 - a) * x], axis=0)
            else:
                Y = top
            Y[~supp] = 0.0
            Q = svd_basis(Y, IMAGE_ATOL)
        E = sel[k]
        if lifted:
            E = np.concatenate([E, np.zeros_like(E)], axis=0)
        supp[:n] |= np.any(sel[k] != 0, axis=1)
        Q = extend_basis(Q, E)
    return svd_basis(Q[:n], IMAGE_ATOL) if lifted else Q


def _static_phase(sched: RealisedSchedule, ts: Sequence[int]) -> sp.csr_matrix | None:
    """The phase's one gossip matrix when every round used the same symmetric W and every edge of W
    carried a value each round (a public schedule, or a recorded one without dropouts); else None."""
    if not ts:
        return None
    W0 = sched.W[ts[0]].tocsr()
    if (abs(W0 - W0.T) > 0).nnz:
        return None
    coo = W0.tocoo()
    edges = {(int(i), int(j)) for i, j, x in zip(coo.row, coo.col, coo.data) if i != j and x != 0}
    for t in ts:
        Wt = sched.W[t]
        if Wt is not W0 and (abs(Wt - W0) > 0).nnz:
            return None
        if set(sched.sent[t]) != edges or len(sched.sent[t]) != len(edges):
            return None
    return W0


def _involves(
    reach: list[np.ndarray], v: int, view: str, sched: RealisedSchedule, ts: Sequence[int]
) -> bool:
    """Whether a row observer v sees can depend on the source (``reach`` from :func:`_source_reach`)."""
    for k, t in enumerate(ts):
        if view == "neighbourhood":
            seen = [v] + [w for w, r in sched.sent[t] if r == v]
            if reach[k][seen].any():
                return True
        elif np.any(sched.W[t][v].toarray().ravel()[reach[k]] != 0):
            return True
    return False


def _source_reach(
    sched: RealisedSchedule, ts: Sequence[int], g: np.ndarray, source: int
) -> list[np.ndarray]:
    """``reach[k]``: the nodes w whose state ``P_k[w]`` can depend on ``source`` (support of column
    ``source`` of ``P_k``, propagated with the recursion's sparsity pattern: a superset, so safe)."""
    n = sched.n
    cur = np.zeros(n, bool)
    cur[source] = True
    prev = np.zeros(n, bool)
    out = []
    for k, t in enumerate(ts):
        out.append(cur.copy())
        nxt = np.asarray((abs(sched.W[t]) @ cur.astype(float)) != 0).ravel()
        if k > 0 and g[t] != 1.0:
            nxt |= prev
        prev, cur = cur, nxt
    return out


def averaging_thm1(
    sched: RealisedSchedule, rounds: Sequence[int] | None = None, *, keep_diagonal: bool = False
) -> np.ndarray:
    """[M] Theorem 1 (paper bound, unclipped, unit-free) on the recorded schedule, plain gossip:
    ``F[u, v] = Σ_t Σ_{w→v at t} W_{0:t}[w,u]²/‖W_{0:t}[w,:]‖²`` (t = 0..T−1, ``W_{0:0} = I``)."""
    n = sched.n
    ts = list(range(sched.rounds)) if rounds is None else list(rounds)
    P = np.eye(n)
    F = np.zeros((n, n))
    for t in ts:
        sq = P * P
        C = sq / np.maximum(sq.sum(axis=1, keepdims=True), 1e-300)
        for w, v in sched.sent[t]:
            F[:, v] += C[w]
        P = np.asarray(sched.W[t] @ P)
    if (
        not keep_diagonal
    ):  # u = v: the observer's own input (its term is kept only to reproduce [M] App. H.6)
        np.fill_diagonal(F, 0.0)
    return F


def stream_sensitivity(
    sched: RealisedSchedule,
    source: int,
    observer: int,
    *,
    view: str = "neighbourhood",
    exact_limit: int = 16,
) -> dict[str, Any]:
    """Certified Δ² (per-round contribution bound 1) of streaming gossip on the recorded schedule.

    Messages ``m^w_t = Σ_{k≤t} Φ(t,k)[w,:] z_k`` with ``Φ(t,k) = W_{t−1}⋯W_k``; the observer sees its
    own messages and those sent to it (or, with ``view="aggregate"``, only its own message and the
    sums ``(W_t m_t)_v`` it mixes) and knows its own noise.  Dense: for small n·T (tests, 12-node runs).
    """
    if view not in VIEWS:
        raise ValueError(f"view must be one of {VIEWS}")
    n, T = sched.n, sched.rounds
    Phi: list[list[np.ndarray]] = []  # Phi[t][k] for k <= t
    for t in range(T):
        row = [np.asarray(sched.W[t - 1] @ Phi[t - 1][k]) for k in range(t)] if t else []
        row.append(np.eye(n))
        Phi.append(row)
    blocks = []
    for t in range(T):
        who = [observer] + (sched.received(t, observer) if view == "neighbourhood" else [])
        for w in who:
            r = np.zeros(T * n)
            for k in range(t + 1):
                r[k * n : (k + 1) * n] = Phi[t][k][w]
            blocks.append(r)
        if view == "aggregate":
            r = np.zeros(T * n)
            for k in range(t + 1):
                r[k * n : (k + 1) * n] = np.asarray(sched.W[t][observer] @ Phi[t][k]).ravel()
            blocks.append(r)
    A = np.array(blocks)
    B = A.copy()
    B[:, [k * n + observer for k in range(T)]] = 0.0
    res = LinearGaussianView(A, B).box_sensitivity_sq(
        [k * n + source for k in range(T)], exact_limit=exact_limit
    )
    res.update(
        {
            "source": int(source),
            "observer": int(observer),
            "view": view,
            "rounds": T,
            "bound": "certified",
        }
    )
    return res


def gd_sensitivity(
    sched: RealisedSchedule,
    source: int,
    observer: int,
    phases: Sequence[Sequence[int]],
    gammas: Sequence[np.ndarray] | None = None,
    *,
    view: str = "neighbourhood",
) -> dict[str, Any]:
    """Certified Δ² (per-step contribution bound 1) of Muffliato-GD on the recorded schedule, the whole run
    as ONE linear-Gaussian view.

    Step r starts at round ``phases[r][0]``: every node sends ``θ + z_r`` (``z_r`` its noisy gradient step,
    fresh noise) and the K rounds ``phases[r]`` mix it (Chebyshev with ``gammas[r]``, reset per step);
    ``θ`` for the next step is the result.  The state carries earlier steps' noise into later ones, so the
    steps are NOT independent mechanisms and adding per-step exact values is not a guarantee (the privacy
    core shows a pair where the joint view leaks more: ``hushnet.privacy.muffliato.muffliato_gd_state_space``).
    Here the observer's view — its own states and every value sent to it, sender-side — is built as a map
    of all steps' inputs and accounted with [K] Thm 12's box sensitivity, ``min(spectral, 1ᵀ|M|1, SDP)``
    unless M ≥ 0 (valid for vector models and adaptively chosen gradients); own noise known.
    """
    if view not in VIEWS:
        raise ValueError(f"view must be one of {VIEWS}")
    n, R = sched.n, len(phases)
    Q = _gd_view_basis(sched, observer, phases, gammas, view)
    cols = [r * n + int(source) for r in range(R)]
    M = Q[cols] @ Q[cols].T  # Gᵀ(BBᵀ)⁺G with G = B's columns of the source: the projector's block
    res = box_quadratic_max(M, exact_limit=0)
    res.update(
        {
            "source": int(source),
            "observer": int(observer),
            "view": view,
            "steps": R,
            "bound": "certified",
            "M": M,
        }
    )
    return res


def _phase_selectors(
    sched: RealisedSchedule, ts: Sequence[int], observer: int, view: str
) -> list[np.ndarray]:
    """Per round of ``ts``: the n×m selectors s of the rows ``sᵀ P_k`` the observer sees (its own state
    and every value sent to it, or, aggregate, the weighted sum ``W_t[v, :] P_k`` it mixes)."""
    n = sched.n
    sel = []
    for t in ts:
        if view == "neighbourhood":
            seen = [observer] + [w for w, r in sched.sent[t] if r == observer]
            E = np.zeros((n, len(seen)))
            E[seen, np.arange(len(seen))] = 1.0
        else:
            E = sched.W[t][observer].toarray().T
        sel.append(E)
    return sel


def _phase_transpose(
    sched: RealisedSchedule, ts: Sequence[int], g: np.ndarray, Z: np.ndarray
) -> np.ndarray:
    """``P_Kᵀ Z`` for the phase's full map ``P_K`` (K = len(ts) rounds, the recursion of
    :func:`_view_basis`): ``[I 0] C_0ᵀ ⋯ C_{K−1}ᵀ [Z; 0]`` (coefficients, no orthonormalisation)."""
    x, y = Z.astype(float, copy=True), np.zeros_like(Z, dtype=float)
    for k in range(len(ts) - 1, -1, -1):
        t = ts[k]
        a = g[t] if (k > 0 and g[t] != 1.0) else 1.0
        x, y = a * np.asarray(sched.W[t].T @ x) + y, (1.0 - a) * x
    return x


#: singular values of the stacked step functionals (orthonormal diagonal blocks) below this count as
#: absent after the observer's own coordinates are removed
GD_ATOL = 1e-10


def _gd_view_basis(
    sched: RealisedSchedule,
    observer: int,
    phases: Sequence[Sequence[int]],
    gammas: Sequence[np.ndarray] | None,
    view: str,
) -> np.ndarray:
    """Orthonormal basis (nR×d) of the row space of the observer's joint Muffliato-GD view, as maps of all
    steps' inputs, with the observer's own coordinates removed (its noise is known).

    Step r's rows are ``yᵀ(S_r + E_r)`` for y in the phase's view space ``Y_r`` (:func:`_view_basis`,
    grown stably) and ``S_r = P^{(r−1)}_K (S_{r−1} + E_{r−1})``: the functional has block r equal to y and
    block r' < r equal to ``P^{(r')ᵀ}_K ⋯ P^{(r−1)ᵀ}_K y``.  Stacked over steps this is block triangular
    with orthonormal diagonal blocks, so its row space is computed without the conditioning of the
    explicit rows (which lost 10 of 70 dimensions on grid 6×6, 2 steps × 20 rounds)."""
    n, R = sched.n, len(phases)
    blocks = []
    for r, ph in enumerate(phases):
        g = np.ones(sched.rounds) if gammas is None else np.asarray(gammas[r], dtype=float)
        Y = _view_basis(sched, list(ph), g, _phase_selectors(sched, ph, observer, view))
        F = np.zeros((n * R, Y.shape[1]))
        F[r * n : (r + 1) * n] = Y
        Z = Y
        for rp in range(r - 1, -1, -1):
            gp = np.ones(sched.rounds) if gammas is None else np.asarray(gammas[rp], dtype=float)
            Z = _phase_transpose(sched, list(phases[rp]), gp, Z)
            F[rp * n : (rp + 1) * n] = Z
        blocks.append(F)
    F = np.concatenate(blocks, axis=1) if blocks else np.zeros((n * R, 0))
    F[[r * n + observer for r in range(R)], :] = 0.0
    return svd_basis(F, GD_ATOL)


# ---- Alg. 2: pairwise schedule -----------------------------------------------------------------


def pairwise_schedule_from_ledgers(
    ledgers: Mapping[int, Sequence[LedgerEntry]], T: int
) -> dict[int, dict[int, dict]]:
    """``rec[t][node]`` = that node's record of activation t (partner, whether it averaged, whether it sent)."""
    rec: dict[int, dict[int, dict]] = defaultdict(dict)
    for node, entries in ledgers.items():
        for e in entries:
            if e.kind == "schedule":
                t = int(e.detail["round"])
                if t >= T or node in rec[t]:
                    raise ValueError(f"bad or duplicate record of activation {t} at node {node}")
                rec[t][node] = dict(e.detail)
    return rec


def _pairwise_steps(rec, T: int) -> Iterable[tuple[int, int, int, bool, bool, bool, bool]]:
    for t in range(T):
        if t not in rec:
            continue
        nodes = sorted(rec[t])
        a = nodes[0]
        b = int(rec[t][a]["partner"])
        ra, rb = rec[t].get(a, {}), rec[t].get(b, {})
        yield (
            t,
            a,
            b,
            bool(ra.get("used")),
            bool(rb.get("used")),
            bool(ra.get("sent")),
            bool(rb.get("sent")),
        )


def replay_pairwise(rec, T: int, x0: np.ndarray) -> np.ndarray:
    """Replay Alg. 2 from the records: at activation t each end that averaged sets ``(x_a + x_b)/2``."""
    x = np.array(x0, dtype=float, copy=True)
    for _t, a, b, ua, ub, _sa, _sb in _pairwise_steps(rec, T):
        xa, xb = x[a].copy(), x[b].copy()
        if ua:
            x[a] = 0.5 * (xa + xb)
        if ub:
            x[b] = 0.5 * (xa + xb)
    return x


def pairwise_sensitivities(rec, T: int, n: int) -> np.ndarray:
    """Certified ``S[u, v]`` of randomized Muffliato on the recorded activations (own noise known).

    Each activation is one step ``P ← A_t P`` (``A_t`` averages rows a and b of the ends that used the
    value); observer a sees ``P[b]`` if b sent, and b sees ``P[a]``.  The view's row space
    ``V = span{e_wᵀ P_t}`` is grown backwards, ``U_t = sel_t + A_tᵀ U_{t+1}``, on an orthonormal basis
    (:func:`_pairwise_view_basis`), not from the explicit rows: products of averaging steps are badly
    conditioned, and the explicit rows lost directions (grid 8×8, 3000 activations: 26 of the 33 exact
    dimensions of observer 0's view)."""
    steps = list(_pairwise_steps(rec, T))
    S = np.zeros((n, n))
    for v in range(n):
        if not any((v == a and sb) or (v == b and sa) for _t, a, b, _ua, _ub, sa, sb in steps):
            continue
        Q = pairwise_view_basis(steps, n, v)
        Q[v, :] = 0.0  # own noise known
        Q = svd_basis(Q, IMAGE_ATOL)
        s = np.clip(np.einsum("ij,ij->i", Q, Q), 0.0, 1.0)
        s[v] = 0.0
        S[:, v] = s
    # a direction the backward basis keeps at ρ ≪ 1 carries rounding of order eps/ρ (1e-8 seen): where
    # the explicit rows are well conditioned they are the more accurate, so take the larger of the two
    return np.maximum(S, _pairwise_explicit_rows(rec, T, n))


def _pairwise_explicit_rows(rec, T: int, n: int) -> np.ndarray:
    """The same projection from the explicit rows ``P_t[w]`` (accurate while they are well conditioned;
    loses directions on long schedules)."""
    P = np.eye(n)
    seen: dict[int, list[np.ndarray]] = defaultdict(list)
    for v in range(n):
        seen[v].append(np.eye(n)[v])
    for _t, a, b, ua, ub, sa, sb in _pairwise_steps(rec, T):
        pa, pb = P[a].copy(), P[b].copy()
        if sb:
            seen[a].append(pb)
        if sa:
            seen[b].append(pa)
        if ua:
            P[a] = 0.5 * (pa + pb)
        if ub:
            P[b] = 0.5 * (pa + pb)
    S = np.zeros((n, n))
    for v in range(n):
        M = np.array(seen[v]).T.copy()
        M[v, :] = 0.0
        s = np.clip(projection_weights(M), 0.0, 1.0)
        s[v] = 0.0
        S[:, v] = s
    return S


# ---- what the node's privacy ledger charges --------------------------------------------------


def privacy_ledger_entries(
    S: np.ndarray,
    sigma: float,
    *,
    run_id: str,
    protocol: str,
    view: str,
    sources: Iterable[int] | None = None,
) -> dict[int, PrivacyEntry]:
    """One certified Gaussian entry per contributor u: μ toward v = ``sqrt(S[u, v])/σ`` (σ = noise
    multiplier, S in units of Δ²) — what the node's ledger charges and its budget checks."""
    n = S.shape[0]
    out = {}
    for u in range(n) if sources is None else sources:
        mu = {str(v): float(np.sqrt(S[u, v]) / sigma) for v in range(n) if v != u and S[u, v] > 0}
        if mu:
            out[int(u)] = PrivacyEntry.gaussian(
                run_id,
                protocol,
                view,
                "certified",
                mu,
                note=f"{protocol}: exact view divergence on the recorded schedule",
            )
    return out


def certified_report(
    S: np.ndarray,
    sigma: float,
    alpha: float,
    *,
    view: str,
    protocol: str,
    paper: np.ndarray | None = None,
) -> dict[str, Any]:
    """Summary a node/operator sees: certified RDP at ``alpha`` (and the paper's number, labelled)."""
    n = S.shape[0]
    off = ~np.eye(n, dtype=bool)
    cert = rdp_of(alpha, S, sigma)
    out: dict[str, Any] = {
        "protocol": protocol,
        "view": view,
        "alpha": float(alpha),
        "sigma": float(sigma),
        "certified": {
            "bound": "certified (exact view divergence on the recorded schedule)",
            "max": float(cert[off].max()),
            "mean": float(cert[off].mean()),
        },
    }
    if paper is not None:
        p = rdp_of(alpha, paper, sigma)
        out["paper"] = {
            "bound": "paper ([M] Theorem 1, unclipped; not a guarantee)",
            "max": float(p[off].max()),
            "mean": float(p[off].mean()),
        }
    return out
