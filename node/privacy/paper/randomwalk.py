"""The random-walk paper's printed formulas and the P-RW figures' gossip baseline: **not guarantees**.

* Theorem 3 as printed (ln T horizon, no noise condition, classic conversion at the best real
  order) — what run reports show in their "paper" column next to the certified walk bound;
* Theorems 4 and 5 closed forms exactly as printed (errata: Theorem 4 was derived from a
  non-stochastic W, Theorem 5 has wrong indices) — kept for regression tests of the corrected forms
  in :mod:`hushnet.privacy.randomwalk`;
* the gossip baseline of the P-RW figures (Muffliato Theorem 1's per-message sum, plain powers).

The certified accountant is :mod:`hushnet.privacy.randomwalk`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from hushnet.privacy.matrix import adjacency_of
from hushnet.privacy.paper.conversions import classic_linear_best_order_epsilon
from hushnet.privacy.randomwalk import _csr_W, gossip_T_mix, rw_single_loss_matrix, rw_spectrum

__all__ = [
    "theorem3_printed_row",
    "gossip_baseline_loss_vector",
    "ring_loss_printed_thm5",
    "star_loss_printed_thm4",
]


def theorem3_printed_row(
    W: Any,
    T: int,
    sigma: float,
    vertex: int,
    contributions: float,
    delta: float,
    *,
    sender_known: bool = False,
    S: np.ndarray | None = None,
) -> np.ndarray:
    """Theorem 3 as printed for one contributor: (ε, δ) toward every node at the best real order.

    Per-contribution slope from the ln T horizon with no noise condition, times the contributions,
    converted with Mironov's rule at ``α* = 1 + sqrt(ln(1/δ)/s)`` (no cap on α: the printed theorem
    omits the condition that bounds it).  0 toward the vertex itself.  ``S``: the all-pairs
    ``rw_single_loss_matrix(W, T, 1, sigma, horizon="lnT", sender_known=…)`` if the caller already has
    it (a process hosting many nodes computes it once; only the contributor's row is read)."""
    if S is None:
        S = rw_single_loss_matrix(W, T, 1.0, sigma, horizon="lnT", sender_known=sender_known)
    slope = np.maximum(S[vertex] * contributions, 0.0)
    eps = classic_linear_best_order_epsilon(slope, math.log(1.0 / delta))
    eps[vertex] = 0.0
    return eps


def gossip_baseline_loss_vector(
    W: Any,
    graph: Any,
    u: int,
    alpha: float,
    sigma: float,
    *,
    T_g: int | None = None,
    clip_at: float | None = None,
) -> np.ndarray:
    """[CODE, "paper"] Muffliato gossip-averaging loss of u towards every v, as the P-RW figures compute it.

    ``ε_{u→v} = (α/(2σ²)) Σ_{t=1}^{T_g} Σ_{w∈N(v)} ((W^t)_{wu}/‖(W^t)_{w,:}‖₂)²`` (plain powers of W).  This is
    Muffliato Theorem 1's per-message sum — a *paper* value, not a guarantee (see ``hushnet.privacy.muffliato`` for
    the exact accountant).  ``T_g`` defaults to :func:`gossip_T_mix`.  ``clip_at``: clip to ``[0, clip_at]``
    (figures use ε_local = 1) and set the source's own entry to ``clip_at``.
    """
    Ws = _csr_W(W)
    n = Ws.shape[0]
    adj = adjacency_of(graph) if graph is not None else rw_spectrum(W).adjacency
    if T_g is None:
        T_g = gossip_T_mix(W, sigma)
    P = np.eye(n)
    eps = np.zeros(n)
    for _ in range(int(T_g)):
        P = np.asarray(Ws @ P)
        rn2 = np.einsum("ij,ij->i", P, P)
        c = P[:, u] ** 2 / rn2
        eps += adj @ c
    eps *= alpha / (2.0 * sigma**2)
    if clip_at is not None:
        eps = np.clip(eps, 0.0, clip_at)
        eps[u] = clip_at
    return eps


def ring_loss_printed_thm5(n: int, u: int, v: int, T: int, alpha: float, sigma: float) -> float:
    """[paper, ERRATUM] Theorem 5 exactly as printed (1-indexed u, v) — wrong; kept for regression tests only.

    ``α' ln(T) cos(2πa/n)/(nσ²) + (2α/(nσ²)) Σ_k cos(πak/n) ln(3 csc²(πk/n)/4)``, ``a = (u+v−2) mod n``,
    ``α' = α·1_{|u−v|=1}``.
    """
    a = (u + v - 2) % n
    ap = alpha if abs(u - v) == 1 else 0.0
    k = np.arange(1, n)
    s = np.sum(np.cos(np.pi * a * k / n) * np.log(3.0 / (4.0 * np.sin(np.pi * k / n) ** 2)))
    return float(
        ap * math.log(T) * math.cos(2 * math.pi * a / n) / (n * sigma**2)
        + 2 * alpha / (n * sigma**2) * s
    )


def star_loss_printed_thm4(
    n: int, alpha: float, sigma: float, *, centre_pair: bool, kappa: float = 0.0
) -> float:
    """[paper, ERRATUM] Theorem 4 as printed (single contribution) — derived from a non-stochastic W; not valid.

    leaf–leaf: ``−α(1−κ)/(σ²(n−1)) ln(1 − 1/(n−1))``; centre pair: ``α(1−κ)/(2σ²√(n−1)) ln((√(n−1)+1)/(√(n−1)−1))``.
    """
    m = n - 1
    if centre_pair:
        r = math.sqrt(m)
        return alpha * (1 - kappa) / (2 * sigma**2 * r) * math.log((r + 1) / (r - 1))
    return -alpha * (1 - kappa) / (sigma**2 * m) * math.log(1 - 1 / m)
