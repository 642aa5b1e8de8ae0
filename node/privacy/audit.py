"""Empirical privacy audit of linear-Gaussian gossip: an attacker that learns from recorded views.

Why: an accountant can be wrong in two directions.  A certified number below what an attacker
actually achieves is a bug (or, for the papers' bounds, a false claim — [M] Theorem 1 on the
hypercube, docs/design/spec/gossip.md §1.3.9).  The audit gives an independent, model-free check: it runs
the protocol itself (the gossip recursion, not the accountant's matrices), records what the
observer receives, and trains a linear attacker by least squares to tell whether the target's
input was ``0`` or ``Δ``.  A threshold test on fresh runs then yields, via Clopper–Pearson
confidence bounds on its error rates, an ε that holds as a *lower bound* on the true (ε, δ) with
the stated confidence:

    ε_emp = ln((1 − δ − FNR⁺) / FPR⁺)    (and the symmetric test), maximised over the threshold,

where the threshold is chosen on a separate half of the runs so that the bound stays honest.
Certified ε(δ) must never fall below ε_emp; a paper value that does is refuted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from scipy import stats

from hushnet.privacy.linear_gaussian import epsilon_of
from hushnet.privacy.muffliato import _csr, _neighbours, muffliato_observer_losses, simulate

__all__ = [
    "clopper_pearson",
    "empirical_epsilon",
    "fit_linear_attacker",
    "AuditOptions",
    "audit_muffliato",
    "audit_gossip_stream",
]


def clopper_pearson(k: int, n: int, confidence: float) -> tuple[float, float]:
    """Two-sided Clopper–Pearson interval for a binomial proportion k/n."""
    a = 1.0 - confidence
    lo = 0.0 if k == 0 else float(stats.beta.ppf(a / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(stats.beta.ppf(1 - a / 2, k + 1, n - k))
    return lo, hi


def empirical_epsilon(
    scores0: np.ndarray,
    scores1: np.ndarray,
    delta: float,
    confidence: float = 0.95,
    n_thresholds: int = 200,
) -> dict[str, Any]:
    """ε lower bound from attacker scores under D (``scores0``) and D' (``scores1``).

    Each score array is split in halves: the first half picks the threshold (and the direction of
    the test) that maximises the bound computed on that half; the second half evaluates it with one-sided
    Clopper–Pearson bounds (Bonferroni over FPR and FNR), so the result is a lower bound on ε
    with probability ≥ ``confidence``.
    """
    s0 = np.asarray(scores0, dtype=float)
    s1 = np.asarray(scores1, dtype=float)
    h0, h1 = s0.size // 2, s1.size // 2
    sel0, ev0, sel1, ev1 = s0[:h0], s0[h0:], s1[:h1], s1[h1:]
    qs = np.quantile(np.concatenate([sel0, sel1]), np.linspace(0.001, 0.999, n_thresholds))

    def point(t: float, a: np.ndarray, b: np.ndarray) -> float:
        # score a threshold by the bound it would give (not the raw ratio, which favours
        # extreme thresholds whose rates cannot be estimated from this many runs)
        fpr = clopper_pearson(int(np.sum(a > t)), a.size, confidence)[1]
        fnr = clopper_pearson(int(np.sum(b <= t)), b.size, confidence)[1]
        val = 1.0 - delta - fnr
        return math.log(val / fpr) if val > 0 else -math.inf

    best = (-math.inf, 0.0, 1)
    for t in qs:
        for sign in (1, -1):  # test "D' if score > t" and the mirrored test
            a, b = (sel0, sel1) if sign == 1 else (-sel1, -sel0)
            e = point(sign * t, a, b)
            if e > best[0]:
                best = (e, float(t), sign)
    _, t, sign = best
    a, b = (ev0, ev1) if sign == 1 else (-ev1, -ev0)
    tt = sign * t
    k_fp = int(np.sum(a > tt))
    k_fn = int(np.sum(b <= tt))
    # the upper end of a two-sided CP interval at `confidence` is a one-sided bound at level
    # 1 − β/2 (β = 1 − confidence): Bonferroni over the two rates gives overall confidence 1 − β
    fpr_hi = clopper_pearson(k_fp, a.size, confidence)[1]
    fnr_hi = clopper_pearson(k_fn, b.size, confidence)[1]
    val = 1.0 - delta - fnr_hi
    eps = math.log(val / fpr_hi) if val > 0 and fpr_hi > 0 else 0.0
    return {
        "epsilon_lower_bound": max(eps, 0.0),
        "delta": float(delta),
        "confidence": float(confidence),
        "threshold": t,
        "direction": sign,
        "fpr": k_fp / a.size,
        "fnr": k_fn / b.size,
        "fpr_upper": fpr_hi,
        "fnr_upper": fnr_hi,
        "n_eval": int(a.size),
    }


def fit_linear_attacker(
    features: np.ndarray, labels: np.ndarray
) -> Callable[[np.ndarray], np.ndarray]:
    """Least-squares fit ``label ≈ wᵀ features + b`` over recorded views; returns the scorer."""
    X = np.column_stack([features, np.ones(features.shape[0])])
    w, *_ = np.linalg.lstsq(X, labels.astype(float), rcond=None)
    return lambda F: np.column_stack([F, np.ones(F.shape[0])]) @ w


def _run_views(
    record: Callable[[np.ndarray, np.random.Generator], np.ndarray],
    bits: np.ndarray,
    rng: np.random.Generator,
    chunk: int,
) -> np.ndarray:
    out = []
    for s in range(0, bits.size, chunk):
        out.append(record(bits[s : s + chunk], rng))
    return np.concatenate(out, axis=0)


@dataclass(frozen=True)
class AuditOptions:
    """The attack experiment shared by every audit: ``n_train`` runs to fit the attacker, ``n_test``
    runs per hypothesis to score it, the δ of the reported ε values, the Clopper–Pearson
    ``confidence``, the seed, and how many runs are simulated per batch (``chunk``, memory only)."""

    n_train: int = 3000
    n_test: int = 12000
    delta: float = 1e-5
    confidence: float = 0.95
    seed: int = 0
    chunk: int = 2000

    def __post_init__(self) -> None:
        for name in ("n_train", "n_test", "chunk"):
            if not getattr(self, name) >= 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta!r}")
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence!r}")


def audit_muffliato(
    W,
    source: int,
    observer: int,
    T: int,
    sigma: float,
    options: AuditOptions | None = None,
    *,
    sensitivity: float = 1.0,
    view: str = "neighbourhood",
    chebyshev: bool = False,
) -> dict[str, Any]:
    """Audit Muffliato averaging for one pair: certified vs paper vs what a trained attacker achieves.

    Neighbouring inputs: everyone's input is 0 except the source's, which is 0 or ``sensitivity``.
    The observer records what the convention says it sees (closed-neighbourhood messages
    ``x^t_w``, t < T, or its own received aggregates) and its own noise.
    """
    o = options if options is not None else AuditOptions()
    n_train, n_test, delta, confidence, seed, chunk = (
        o.n_train,
        o.n_test,
        o.delta,
        o.confidence,
        o.seed,
        o.chunk,
    )
    Wc = _csr(W)
    n = Wc.shape[0]
    if view == "neighbourhood":
        watch = np.concatenate([[observer], _neighbours(Wc, observer)]).astype(np.int64)
    elif view == "aggregate":
        watch = np.array([observer], dtype=np.int64)
    else:
        raise ValueError("view must be 'neighbourhood' or 'aggregate'")

    def record(bits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        N = bits.size
        noise = rng.normal(0.0, sigma, size=(n, N))
        x0 = noise.copy()
        x0[source] += sensitivity * bits
        feats = [noise[observer][:, None]]  # the observer knows its own noise
        states = simulate(Wc, x0, T, chebyshev=chebyshev)
        prev = None
        for t, x in enumerate(states):
            if view == "neighbourhood" and t < T:
                feats.append(x[watch].T)
            if view == "aggregate" and t >= 1:
                # what v learns each round: Σ_w W_vw x^{t-1}_w (for plain gossip this is x^t_v)
                feats.append(np.asarray(Wc[observer] @ prev).reshape(-1, 1))
            prev = x
        return np.concatenate(feats, axis=1)

    rng = np.random.default_rng(seed)
    train_bits = rng.integers(0, 2, size=n_train)
    F_train = _run_views(record, train_bits, rng, chunk)
    scorer = fit_linear_attacker(F_train, train_bits)
    s0 = scorer(_run_views(record, np.zeros(n_test), rng, chunk))
    s1 = scorer(_run_views(record, np.ones(n_test), rng, chunk))
    emp = empirical_epsilon(s0, s1, delta, confidence)

    sens_cert = (
        float(
            muffliato_observer_losses(
                Wc, observer, T, 2.0, 1.0, bound="certified", view=view, chebyshev=chebyshev
            )[source]
        )
        * sensitivity**2
    )
    slope_paper = (
        float(muffliato_observer_losses(Wc, observer, T, 2.0, 1.0, bound="paper")[source]) / 2.0
    )
    slope_paper *= sensitivity**2 / sigma**2
    cert_eps = epsilon_of(sens_cert, sigma, delta)
    from hushnet.privacy.paper.conversions import classic_epsilon_from_rdp_slope  # labelled "paper"

    paper_eps = classic_epsilon_from_rdp_slope(slope_paper, delta)
    return {
        "source": int(source),
        "observer": int(observer),
        "steps": int(T),
        "sigma": float(sigma),
        "view": view,
        "chebyshev": bool(chebyshev),
        "empirical": emp,
        "empirical_epsilon": emp["epsilon_lower_bound"],
        "certified_sensitivity_sq": sens_cert,
        "certified_epsilon": cert_eps,
        "paper_rdp_at_alpha2": 2.0 * slope_paper,
        "paper_epsilon": paper_eps,
        "labels": {
            "certified_epsilon": "certified: exact view, tight Gaussian (mu-GDP) conversion",
            "paper_epsilon": "paper: [M] Theorem 1 RDP curve converted with Mironov's RDP->DP (what the paper claims)",
            "empirical_epsilon": f"empirical lower bound, {confidence:.0%} Clopper-Pearson, least-squares attacker",
        },
    }


def audit_gossip_stream(
    W,
    source: int,
    observers: np.ndarray | list[int],
    T: int,
    sigma: float,
    options: AuditOptions | None = None,
    *,
    known: np.ndarray | list[int] = (),
    pattern: np.ndarray | None = None,
) -> dict[str, Any]:
    """Audit [K] streaming gossip: the source adds ``b·c_t`` each round (c = 1 by default).

    ``pattern`` is either T numbers (a scalar model) or a (T, d) array whose rows are the source's
    per-round contribution *vectors* (norm ≤ 1, as DP-GD's clipped gradients): every coordinate
    runs the protocol with its own noise and the observers see all of them.  The observers record
    their messages ``m^w_t = θ^w_t + x^w_t + u^w_t`` and the noise in ``known``.  Returns the
    empirical ε lower bound and the certified ε, which must cover every pattern in the box — vector
    patterns included — and the pattern's own squared sensitivity ``tr(M C Cᵀ)``.
    """
    o = options if options is not None else AuditOptions()
    n_train, n_test, delta, confidence, seed, chunk = (
        o.n_train,
        o.n_test,
        o.delta,
        o.confidence,
        o.seed,
        o.chunk,
    )
    from hushnet.privacy.koskela import stream_sensitivity

    Wc = _csr(W)
    n = Wc.shape[0]
    obs = np.asarray(observers, dtype=np.int64)
    kn = np.asarray(known, dtype=np.int64)
    c = np.ones((T, 1)) if pattern is None else np.asarray(pattern, dtype=float)
    if c.ndim == 1:
        c = c[:, None]
    if c.ndim != 2 or c.shape[0] != T:
        raise ValueError(
            f"pattern must have T={T} rows (numbers or vectors), got shape {np.shape(pattern)}"
        )
    if np.any(np.linalg.norm(c, axis=1) > 1.0 + 1e-12):
        raise ValueError(
            "every per-round contribution in the pattern must have norm <= 1 (the clipping bound)"
        )
    d = c.shape[1]

    def record(bits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        N = bits.size
        theta = np.zeros((n, d, N))
        feats = []
        for t in range(T):
            u = rng.normal(0.0, sigma, size=(n, d, N))
            x = np.zeros((n, d, N))
            x[source] = c[t][:, None] * bits[None, :]
            msg = theta + x + u
            feats.append(msg[obs].reshape(-1, N).T)
            if kn.size:
                feats.append(u[kn].reshape(-1, N).T)
            theta = np.asarray(Wc @ msg.reshape(n, d * N)).reshape(n, d, N)
        return np.concatenate(feats, axis=1)

    rng = np.random.default_rng(seed)
    train_bits = rng.integers(0, 2, size=n_train)
    scorer = fit_linear_attacker(_run_views(record, train_bits, rng, chunk), train_bits)
    s0 = scorer(_run_views(record, np.zeros(n_test), rng, chunk))
    s1 = scorer(_run_views(record, np.ones(n_test), rng, chunk))
    emp = empirical_epsilon(s0, s1, delta, confidence)
    res = stream_sensitivity(Wc, T, obs, source, known=kn)
    return {
        "empirical": emp,
        "empirical_epsilon": emp["epsilon_lower_bound"],
        "certified_sensitivity_sq": float(res["value"]),
        "certified_epsilon": epsilon_of(float(res["value"]), sigma, delta),
        "certified_method": res["method"],
        "scalar_sensitivity_sq": res.get("scalar"),
        "pattern_sensitivity_sq": float(np.trace(c.T @ res["M"] @ c))
        if np.all(np.isfinite(res["M"]))
        else math.inf,
    }
