"""Privacy amplification by decentralization ([P-AD], Cyffers & Bellet, AISTATS 2022).

A token walks over the users; each user adds its (noisy) contribution to the token and only
sees the token when it holds it.  [P-AD] shows that the other users then learn much less
about a contribution than under local DP, because every observed token already aggregates
(and hides) many other users' noise.  This module holds:

* the composition / amplification tools the paper builds on (docs/design/spec/randomwalk.md §0.2);
* the four algorithms (ring / complete-graph summation and histograms), as simulators used
  to check the utility claims (unbiasedness, exact noise counts);
* the paper's theorems (Thm 1, 2, 3, 4, 6; Lemma 1, Lemma 2; Remark 5) with the errata of
  docs/design/spec/randomwalk.md PART F applied;
* the reference-code procedures behind the figures: Fig. 1a curves, the Fig. 1b empirical
  walk accountant (A.6.2) and the Fig. 2 σ calibration (A.6.3).

Every result carries a ``bound`` label, as hushnet's house rule demands:

``"certified"``
    a proven bound, with the spec's corrections applied and its validity conditions
    enforced (we refuse or clamp outside them and say so).  hushnet stands behind it,
    **under the view model named in the result** (e.g. the hidden-path assumption).
``"paper"``
    the published formula or the authors' reference-code procedure, reproduced to
    regenerate the figures.  These rest on heuristic steps (the "Gaussian aggregation
    scales ε by 1/√m" rule applied to (ε, δ) pairs, Chernoff bounds on dependent events,
    code constants that differ from the lemmas) and are never a guarantee.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
from scipy import optimize, stats

__all__ = [
    "CERTIFIED",
    "PAPER",
    "Guarantee",
    "RdpGuarantee",
    "ValidityError",
    # §0.2 tools
    "advanced_composition",
    "advanced_compo_code",
    "opti_compo",
    "heterogeneous_composition",
    "subsampling_amplification",
    "erlingsson_shuffle_eps",
    "erlingsson_eps0",
    "fmt_shuffle_eps",
    "fmt_eps0",
    "contributions_bound",
    "gaussian_sigma_local",
    # randomized response
    "rr_gamma",
    "rr_epsilon",
    "randomized_response",
    "rr_gamma_for_batch",
    # algorithms (simulators)
    "ring_noise_draws",
    "ring_sum",
    "ring_histogram",
    "debias_ring_histogram",
    "complete_graph_sum",
    "complete_graph_histogram",
    "debias_complete_histogram",
    # theorems
    "ring_sum_guarantee",
    "ring_histogram_guarantee",
    "complete_sum_guarantee",
    "complete_histogram_guarantee",
    "spotted_contributions",
    "sgd_alpha_max",
    "sgd_nrdp",
    "sgd_rdp_curve",
    "colluders_effective_n",
    "sgd_epsilon",
    "sgd_sigma_search",
    "sgd_thm4_epsilon",
    "sgd_utility_bound",
    # reference-code procedures (figures)
    "fig1a_code_curves",
    "EmpiricalWalkLoss",
    "empirical_walk_accountant",
    "fig2_sigma_local_code",
    "fig2_sigma_central_code",
    "fig2_sigma_network_code",
]

CERTIFIED = "certified"
PAPER = "paper"


class ValidityError(ValueError):
    """Parameters outside the range where a theorem's proof holds (we refuse rather than guess)."""


@dataclass(frozen=True)
class Guarantee:
    """An (ε, δ) statement together with where it comes from.

    ``bound`` is ``"certified"`` or ``"paper"`` (see the module docstring), ``theorem`` names
    the statement (e.g. ``"P-AD Thm 1"``), ``view_model`` the threat model it assumes, and
    ``details`` the intermediate quantities (so a reviewer can check every step).
    """

    epsilon: float
    delta: float
    bound: str
    theorem: str
    view_model: str
    details: Mapping[str, float | int | str | bool] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class RdpGuarantee:
    """An (α, ε)-RDP statement; ``clamped`` says the requested α was outside the proof's range
    and was lowered to ``alpha`` (the largest admissible order)."""

    alpha: float
    rdp: float
    bound: str
    theorem: str
    view_model: str
    clamped: bool = False
    requested_alpha: float | None = None
    details: Mapping[str, float | int | str | bool] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def _check_delta(name: str, delta: float) -> None:
    if not 0.0 < delta < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {delta}")


# ----------------------------------------------------------------------------------------------
# §0.2 composition and amplification tools
# ----------------------------------------------------------------------------------------------


def advanced_composition(
    eps: float, delta: float, k: float, delta_prime: float
) -> tuple[float, float]:
    """Advanced composition (Dwork–Rothblum–Vadhan) of k (ε, δ)-DP mechanisms.

    Returns ``(√(2k ln(1/δ')) ε + k ε (e^ε − 1),  k δ + δ')``.  ``k`` may be a real bound
    (e.g. a Chernoff bound on a count); it is used as is, as in the paper.
    """
    _check_delta("delta_prime", delta_prime)
    if k < 0 or eps < 0:
        raise ValueError("need k >= 0 and eps >= 0")
    e = math.sqrt(2.0 * k * math.log(1.0 / delta_prime)) * eps + k * eps * math.expm1(eps)
    return e, k * delta + delta_prime


def advanced_compo_code(eps: float, delta: float, k: float) -> float:
    """Reference-code ``composition.advancedCompo``: advanced composition with ``δ' = delta``."""
    return math.sqrt(2.0 * k * math.log(1.0 / delta)) * eps + k * eps * math.expm1(eps)


def opti_compo(eps: float, delta: float, k: float) -> float:
    """Reference-code ``optiCompo`` (Fig. 1a): min(advanced, basic) for k < 1e5, advanced otherwise."""
    a = advanced_compo_code(eps, delta, k)
    return min(a, eps * k) if k < 1e5 else a


def heterogeneous_composition(eps_list: Sequence[float] | np.ndarray, delta: float) -> float:
    """Heterogeneous advanced composition of the reference code (``kairouzCompo``, §0.2).

    Composes ε_1..ε_k (Kairouz et al.'s heterogeneous bound, with the code's slack δ̃ = kδ) and
    returns ε only; it is used to reproduce Fig. 1b (``bound="paper"``).  Empty list → 0.
    """
    e = np.asarray(eps_list, dtype=float)
    if e.size == 0:
        return 0.0
    return float(
        _kairouz_from_sums(
            e.size, e.sum(), (np.expm1(e) * e / (np.exp(e) + 1.0)).sum(), (e * e).sum(), delta
        )
    )


def _kairouz_from_sums(k, worst, first, q, delta):
    """Vectorised core of :func:`heterogeneous_composition` from the additive sums it needs."""
    k = np.asarray(k, dtype=float)
    worst, first, q = (np.asarray(a, dtype=float) for a in (worst, first, q))
    with np.errstate(divide="ignore", invalid="ignore"):
        dstar = k * delta
        sq = np.sqrt(q)
        cond = math.e + sq / dstar > 1.0 / dstar
        second = np.where(
            cond,
            np.sqrt(2.0 * q * np.log(1.0 / dstar)),
            np.sqrt(2.0 * q * np.log(math.e + sq / dstar)),
        )
        out = np.minimum(first + second, worst)
    return np.where(k > 0, out, 0.0)


def subsampling_amplification(
    eps: float, n: float, m: float, delta: float = 0.0
) -> tuple[float, float]:
    """Amplification by subsampling with replacement (Balle et al. 2018 Thm 10; P-AD eq. 10).

    An ε-DP mechanism applied to m draws with replacement out of n users gives
    ``ε_amp = ln(1 + (1 − (1 − 1/n)^m)(e^ε − 1))`` and ``δ_amp ≤ (m/n) δ`` (group privacy δ_k ≤ kδ).
    """
    p = -math.expm1(m * math.log1p(-1.0 / n)) if n > 1 else 1.0
    return math.log1p(p * math.expm1(eps)), m * delta / n


def erlingsson_shuffle_eps(eps0: float, delta: float, n: int, *, check: bool = True) -> float:
    """Erlingsson et al. 2019 shuffling bound (P-AD Thm 5): ``ε = 12 ε₀ √(ln(1/δ)/n)``.

    Valid for ε₀ < 1/2, δ < 1/100 and n ≥ 1000 (spec erratum 19: the appendix prints 100).
    Raises :class:`ValidityError` outside that range unless ``check=False``.
    """
    if check:
        _erlingsson_valid(eps0, delta, n)
    return 12.0 * eps0 * math.sqrt(math.log(1.0 / delta) / n)


def _erlingsson_valid(eps0: float, delta: float, n: int) -> None:
    problems = []
    if not 0.0 < eps0 < 0.5:
        problems.append(f"eps0={eps0:.4g} not in (0, 1/2)")
    if not 0.0 < delta < 0.01:
        problems.append(f"delta={delta:.3g} not < 1/100")
    if n < 1000:
        problems.append(f"n={n} < 1000")
    if problems:
        raise ValidityError(
            "Erlingsson shuffling bound outside its validity range: " + "; ".join(problems)
        )


def erlingsson_eps0(eps: float, delta: float, n: int, *, check: bool = True) -> float:
    """Inverse of :func:`erlingsson_shuffle_eps`: ``ε₀ = (ε/12) √(n / ln(1/δ))``."""
    eps0 = eps / 12.0 * math.sqrt(n / math.log(1.0 / delta))
    if check:
        _erlingsson_valid(eps0, delta, n)
    return eps0


def fmt_shuffle_eps(eps0: float, delta: float, n: int, *, check: bool = True) -> float:
    """Feldman–McMillan–Talwar 2020 Thm 3.1 shuffling bound (P-AD Thm 7).

    ``ε = ln(1 + (e^{ε₀}−1)/(e^{ε₀}+1) (8 √(e^{ε₀} ln(4/δ))/√n + 8 e^{ε₀}/n))``, valid when
    ``ε₀ ≤ ln(n / (16 ln(2/δ)))``.
    """
    if check and not eps0 <= math.log(n / (16.0 * math.log(2.0 / delta))):
        raise ValidityError(
            f"FMT shuffling bound needs eps0 <= ln(n/(16 ln(2/delta))); eps0={eps0:.4g}, n={n}"
        )
    e0 = math.exp(eps0)
    return math.log1p(
        (e0 - 1.0)
        / (e0 + 1.0)
        * (8.0 * math.sqrt(e0 * math.log(4.0 / delta)) / math.sqrt(n) + 8.0 * e0 / n)
    )


def fmt_eps0(eps: float, delta: float, n: int) -> float:
    """Largest ε₀ whose FMT-shuffled batch of n reports is (ε, δ)-DP (numerical inversion)."""
    cap = math.log(n / (16.0 * math.log(2.0 / delta)))
    if cap <= 0:
        raise ValidityError(f"FMT bound unusable: n={n} too small for delta={delta}")
    if fmt_shuffle_eps(cap, delta, n) <= eps:
        return cap
    return float(
        optimize.brentq(
            lambda e0: fmt_shuffle_eps(e0, delta, n, check=False) - eps, 0.0, cap, xtol=1e-14
        )
    )


def contributions_bound(
    T: int, n: float, delta_hat: float, method: str = "chernoff"
) -> tuple[float, str]:
    """High-probability bound N with ``P(T_u > N) ≤ δ̂`` for ``T_u ~ Binomial(T, 1/n)``.

    ``method="chernoff"`` is P-AD App. D: ``N = T/n + √(3 (T/n) ln(1/δ̂))``; that multiplicative
    Chernoff form needs deviation ≤ 1, i.e. ``T ≥ 3 n ln(1/δ̂)``.  Outside it we switch to the
    always-valid ``exp(−d² μ/(2+d))`` tail and say so in the returned method name.
    ``method="exact"`` returns the exact binomial quantile (the tightest sound value).
    """
    _check_delta("delta_hat", delta_hat)
    mu = T / n
    if method == "exact":
        return float(stats.binom.isf(delta_hat, T, 1.0 / n)), "exact-binomial"
    if method != "chernoff":
        raise ValueError(f"unknown method {method!r}")
    log_term = math.log(1.0 / delta_hat)
    if T >= 3.0 * n * log_term:
        return mu + math.sqrt(3.0 * mu * log_term), "chernoff"
    d = (log_term + math.sqrt(log_term * log_term + 8.0 * mu * log_term)) / (2.0 * mu)
    return mu * (1.0 + d), "chernoff-wide"


def gaussian_sigma_local(eps: float, delta: float, sensitivity: float = 1.0) -> float:
    """σ_loc of ``Perturb`` (A.3): classic Gaussian mechanism ``Δ √(2 ln(1.25/δ))/ε``; needs ε < 1."""
    if not 0.0 < eps < 1.0:
        raise ValidityError(f"the classic Gaussian calibration needs 0 < eps < 1, got {eps}")
    _check_delta("delta", delta)
    return sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / eps


# ----------------------------------------------------------------------------------------------
# Randomized response (A.3)
# ----------------------------------------------------------------------------------------------


def rr_gamma(eps0: float, L: int) -> float:
    """γ making ``RR_γ`` on [L] exactly ε₀-LDP: ``γ = L / (e^{ε₀} + L − 1)``."""
    if L < 2:
        raise ValueError("L must be >= 2")
    return L / (math.exp(eps0) + L - 1.0)


def rr_epsilon(gamma: float, L: int) -> float:
    """ε₀ of ``RR_γ``: ``ln((1 − γ + γ/L)/(γ/L))``."""
    if not 0.0 < gamma <= 1.0:
        raise ValueError("gamma must be in (0, 1]")
    return math.log((1.0 - gamma + gamma / L) / (gamma / L))


def randomized_response(
    x: np.ndarray | int, gamma: float, L: int, rng: np.random.Generator
) -> np.ndarray:
    """``RR_γ``: keep each value with probability 1 − γ, else replace it by a uniform value in 0..L−1."""
    x = np.asarray(x)
    replace = rng.random(x.shape) < gamma
    return np.where(replace, rng.integers(0, L, size=x.shape), x)


def rr_gamma_for_batch(
    eps_target: float, delta: float, batch_size: int, L: int, bound: str = "erlingsson"
) -> tuple[float, float]:
    """γ for Thm 2 (spec erratum 14): invert the shuffling bound of a batch to get ε₀, then ``γ(ε₀)``.

    Returns ``(γ, ε₀)``.  ``bound`` is ``"erlingsson"`` (closed form, P-AD's choice) or ``"fmt"``.
    """
    if bound == "erlingsson":
        eps0 = erlingsson_eps0(eps_target, delta, batch_size)
    elif bound == "fmt":
        eps0 = fmt_eps0(eps_target, delta, batch_size)
    else:
        raise ValueError(f"unknown shuffling bound {bound!r}")
    return rr_gamma(eps0, L), eps0


# ----------------------------------------------------------------------------------------------
# Algorithms 1, 2, 3, 5 as simulators (utility claims)
# ----------------------------------------------------------------------------------------------


def ring_noise_draws(K: int, n: int) -> int:
    """Exact number of noise draws of Algorithm 1: ``⌈Kn/(n−1)⌉`` (the proof writes ⌊·⌋; erratum 12)."""
    if n < 2 or K < 1:
        raise ValueError("need n >= 2 and K >= 1")
    return -(-K * n // (n - 1))


def ring_sum(
    x: np.ndarray,
    sigma_loc: float,
    rng: np.random.Generator,
    *,
    runs: int = 1,
    distributed: bool = False,
) -> tuple[np.ndarray, int]:
    """Run Algorithm 1 (private summation on the directed ring) ``runs`` times in parallel.

    ``x`` has shape (K, n): ``x[k, u]`` is user u's value in round k.  Noise is injected at the
    first hop and then once every n − 1 hops.  With ``distributed=True`` the Remark 1 variant is
    run: the first contribution gets σ_loc, every other one ``σ_loc/√(n−1)`` (erratum 13).
    Returns the final tokens (shape (runs,)) and the number of σ_loc-sized noise draws.
    """
    x = np.asarray(x, dtype=float)
    K, n = x.shape
    flat = x.reshape(-1)
    steps = np.arange(K * n)
    tau = np.zeros(runs)
    if distributed:
        scales = np.full(K * n, sigma_loc / math.sqrt(n - 1))
        scales[0] = sigma_loc
        draws = 1
    else:
        scales = np.where(steps % (n - 1) == 0, sigma_loc, 0.0)
        draws = int(np.count_nonzero(scales))
    for s in range(K * n):  # the token really is passed hop by hop: each hop sees the running sum
        tau = tau + flat[s]
        if scales[s] > 0:
            tau = tau + scales[s] * rng.standard_normal(runs)
    return tau, draws


def ring_histogram(
    x: np.ndarray, gamma: float, L: int, rng: np.random.Generator
) -> tuple[np.ndarray, int]:
    """Run Algorithm 2 (ring histogram): ``round(γn)`` uniform dummies, then RR_γ of every value.

    ``x`` has shape (K, n) with values in 0..L−1.  Returns the raw token counts (length L) and
    the number of dummy elements (needed by :func:`debias_ring_histogram`).
    """
    x = np.asarray(x)
    K, n = x.shape
    n_dummy = int(round(gamma * n))
    tau = np.bincount(rng.integers(0, L, size=n_dummy), minlength=L)
    # The token is a count vector: adding the K·n randomized reports one hop at a time or all at
    # once gives the same final token, so the reports are drawn in one vectorised call.
    reports = randomized_response(x.reshape(-1), gamma, L, rng)
    return tau + np.bincount(reports, minlength=L), n_dummy


def debias_ring_histogram(
    tau: np.ndarray, gamma: float, n: int, K: int, L: int, n_dummy: int | None = None
) -> np.ndarray:
    """Unbiased counts from Algorithm 2's token (spec erratum 15).

    ``E[τ_l] = n_dummy/L + (1−γ) h_l + γKn/L``, so ``ĥ_l = (τ_l − n_dummy/L − γKn/L)/(1−γ)``;
    ``n_dummy`` defaults to γn as printed (use the actual ``round(γn)`` for exact unbiasedness).
    """
    nd = gamma * n if n_dummy is None else n_dummy
    return (np.asarray(tau, dtype=float) - nd / L - gamma * K * n / L) / (1.0 - gamma)


def _walk_contributions(x: np.ndarray, T: int, rng: np.random.Generator) -> np.ndarray:
    """Values contributed along a uniform walk of length T: user u's k-th visit uses x[u, k mod kmax]."""
    x = np.asarray(x)
    if x.ndim == 1:
        x = x[:, None]
    n, kmax = x.shape
    users = rng.integers(0, n, size=T)
    order = np.argsort(users, kind="stable")
    ranks = np.empty(T, dtype=np.int64)
    counts = np.bincount(users, minlength=n)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    ranks[order] = np.arange(T) - np.repeat(starts, counts)
    return x[users, ranks % kmax]


def complete_graph_sum(
    x: np.ndarray, T: int, sigma_loc: float, rng: np.random.Generator
) -> tuple[float, float]:
    """Run Algorithm 3 (summation on the complete graph): T uniform hops, each perturbed.

    Returns ``(token, true sum of the T contributions)``; the token is unbiased with std √T σ_loc.
    """
    vals = _walk_contributions(x, T, rng).astype(float)
    return float(vals.sum() + sigma_loc * rng.standard_normal(T).sum()), float(vals.sum())


def complete_graph_histogram(
    x: np.ndarray, T: int, gamma: float, L: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Run Algorithm 5 (histogram on the complete graph; token initialised to 0, spec [AMBIG]).

    Returns ``(raw token counts, true histogram of the T contributions)``.
    """
    vals = _walk_contributions(x, T, rng).astype(np.int64)
    noisy = randomized_response(vals, gamma, L, rng)
    return np.bincount(noisy, minlength=L), np.bincount(vals, minlength=L)


def debias_complete_histogram(tau: np.ndarray, gamma: float, T: int, L: int) -> np.ndarray:
    """Unbiased counts for Algorithm 5: ``ĥ_l = (τ_l − γT/L)/(1 − γ)``."""
    return (np.asarray(tau, dtype=float) - gamma * T / L) / (1.0 - gamma)


# ----------------------------------------------------------------------------------------------
# Theorems
# ----------------------------------------------------------------------------------------------


def ring_sum_guarantee(
    K: int,
    n: int,
    eps: float,
    delta: float,
    delta_prime: float,
    sigma_loc: float | None = None,
    *,
    colluders: int = 1,
) -> Guarantee:
    """P-AD Theorem 1: Algorithm 1 on the directed ring is
    ``(√(2K ln(1/δ')) ε + K ε (e^ε − 1), K δ + δ')``-network DP (certified; no collusion).

    Each of the K token values v receives differs from the previous one by at most one
    contribution of u plus at least one fresh σ_loc noise draw of someone other than v, so each
    is (ε, δ) when σ_loc is calibrated for (ε, δ); advanced composition over K visits.
    ``details`` holds the exact noise-draw count ⌈Kn/(n−1)⌉ and the utility std.
    Two colluders (the users just before and after u) see u's contribution with only u's own
    noise (P-AD §3.3), so ``colluders >= 2`` is refused.
    """
    if colluders >= 2:
        raise ValidityError(
            "Thm 1 gives no guarantee against >= 2 colluders on the ring (P-AD §3.3)"
        )
    e, d = advanced_composition(eps, delta, K, delta_prime)
    draws = ring_noise_draws(K, n)
    det: dict = {
        "K": K,
        "n": n,
        "eps_per_visit": eps,
        "noise_draws": draws,
        "noise_draws_printed": (K * n) // (n - 1),
        "std_ratio_to_trusted_aggregator": math.sqrt(draws / K),
    }
    if sigma_loc is not None:
        det["std"] = math.sqrt(draws) * sigma_loc
        det["std_ldp"] = math.sqrt(K * n) * sigma_loc
    return Guarantee(
        e, d, CERTIFIED, "P-AD Thm 1", "ring: token values received (no collusion)", det
    )


def ring_histogram_guarantee(
    K: int,
    n: int,
    eps: float,
    delta: float,
    delta_prime: float,
    L: int,
    *,
    shuffle_bound: str = "erlingsson",
) -> Guarantee:
    """P-AD Theorem 2 (ring histogram) with the corrected γ (spec erratum 14).

    Between two visits of v, v sees a shuffled batch of n RR reports; for the batch to be
    (ε, δ)-DP the randomizer must be ε₀-LDP with ε₀ from the inverted shuffling bound, and
    ``γ = L/(e^{ε₀} + L − 1)``.  Erlingsson's conditions (ε₀ < 1/2, δ < 1/100, n ≥ 1000) are
    enforced (:class:`ValidityError`).  The printed γ (which puts the *target* ε through the
    forward map, γ → 1) is returned in ``details["gamma_printed"]`` for reference only.
    """
    gamma, eps0 = rr_gamma_for_batch(eps, delta, n, L, bound=shuffle_bound)
    e, d = advanced_composition(eps, delta, K, delta_prime)
    printed = L / (math.exp(12.0 * eps * math.sqrt(math.log(1.0 / delta) / n)) + L - 1.0)
    det = {
        "K": K,
        "n": n,
        "L": L,
        "eps0": eps0,
        "gamma": gamma,
        "gamma_printed": printed,
        "expected_random_responses": gamma * n * (K + 1),
        "shuffle_bound": shuffle_bound,
    }
    return Guarantee(
        e,
        d,
        CERTIFIED,
        "P-AD Thm 2 (corrected gamma)",
        "ring: token values received (no collusion)",
        det,
    )


_C_GRID = np.logspace(-2, 2, 801)


def _gamma_n(n: float, c: float | np.ndarray) -> np.ndarray:
    """``γ_n = 1 − (1 − 1/n)^{c² n^{2/3}}`` (exponent restored, erratum 20)."""
    return -np.expm1(np.asarray(c, dtype=float) ** 2 * n ** (2.0 / 3.0) * math.log1p(-1.0 / n))


def _best_over_c(
    fn: Callable[[np.ndarray], np.ndarray],
    c: float | None,
    valid: Callable[[np.ndarray], np.ndarray],
):
    cs = _C_GRID if c is None else np.array([float(c)])
    vals = np.where(valid(cs), fn(cs), np.inf)
    i = int(np.argmin(vals))
    if not np.isfinite(vals[i]):
        raise ValidityError("no admissible c for these parameters")
    return float(cs[i]), float(vals[i])


def complete_sum_guarantee(
    n: int,
    T: int,
    eps: float,
    delta: float,
    delta_prime: float,
    delta_hat: float,
    c: float | None = None,
    *,
    small_cycle: str = "printed",
) -> Guarantee:
    """P-AD Theorem 3, non-asymptotic form (App. D): summation on the complete graph.

    ``γ_n = 1 − (1 − 1/n)^{c² n^{2/3}}``, ``ε_c = max(2 γ_n ε, ε/(c n^{1/3}))``,
    ``ε_f = √(2 N_u ln(1/δ')) ε_c + N_u ε_c (e^{ε_c} − 1)``, ``δ_f = N_u δ + δ' + δ̂`` with the
    Chernoff ``N_u``.  ``c`` is optimised on a log grid when not given (the theorem holds for
    every c > 0).  Needs ε < 1 and ``c² n^{2/3} < n`` (so that δ_amp ≤ δ).
    ``small_cycle="printed"`` uses the theorem's ``2γ_nε``; ``"proof"`` the tighter intermediate
    ``min(γ_n(e^ε − 1), ε)`` of the proof (both are reported as ``"paper"``).

    Labelled ``"paper"``: the large-cycle step applies the Gaussian aggregation heuristic to
    (ε, δ) pairs and the whole proof assumes hidden sender and receiver.
    """
    if not 0.0 < eps < 1.0:
        raise ValidityError(f"Thm 3 needs 0 < eps < 1, got {eps}")
    N_u, how = contributions_bound(T, n, delta_hat)
    L1 = math.log(1.0 / delta_prime)

    if small_cycle not in ("printed", "proof"):
        raise ValueError("small_cycle must be 'printed' or 'proof'")

    def eps_c(cs):
        g = _gamma_n(n, cs)
        small = 2.0 * g * eps if small_cycle == "printed" else np.minimum(g * math.expm1(eps), eps)
        return np.maximum(small, eps / (np.asarray(cs, dtype=float) * n ** (1.0 / 3.0)))

    def eps_f(cs):
        ec = eps_c(cs)
        return np.sqrt(2.0 * N_u * L1) * ec + N_u * ec * np.expm1(ec)

    c_best, val = _best_over_c(eps_f, c, lambda cs: cs**2 * n ** (2.0 / 3.0) < n)
    ec = float(eps_c(c_best))
    det = {
        "n": n,
        "T": T,
        "c": c_best,
        "gamma_n": float(_gamma_n(n, c_best)),
        "eps_c": ec,
        "N_u": N_u,
        "N_u_method": how,
        "small_cycle": small_cycle,
    }
    return Guarantee(
        val,
        N_u * delta + delta_prime + delta_hat,
        PAPER,
        "P-AD Thm 3 (App. D)",
        "complete graph, hidden sender and receiver",
        det,
    )


def complete_histogram_guarantee(
    n: int,
    T: int,
    eps: float,
    delta: float,
    delta_prime: float,
    delta_hat: float,
    c: float | None = None,
) -> Guarantee:
    """P-AD Theorem 6 (App. E): histogram on the complete graph (Algorithm 5).

    ``ε_c = max(2 γ_n ε, 14 √(ln(4/δ)) ε/(c n^{1/3}))``, ``ε' = √(2N_u ln(1/δ')) ε_c + N_u ε_c (e^{ε_c}−1)``
    (spec [AMBIG]: standard advanced composition), ``δ = N_u δ + δ' + δ̂`` (the larger of the
    printed T/n and the proof's N_u).  Requires ``ε ≤ min(1, ln(c² n^{2/3}/(16 ln(2/δ))))``
    (the FMT condition for the large cycles); c is optimised over the admissible grid.
    Labelled ``"paper"`` (hidden-path model; heuristic steps as in Thm 3).
    """
    if not 0.0 < eps <= 1.0:
        raise ValidityError(f"Thm 6 needs 0 < eps <= 1, got {eps}")
    N_u, how = contributions_bound(T, n, delta_hat)
    L1 = math.log(1.0 / delta_prime)
    k4 = 14.0 * math.sqrt(math.log(4.0 / delta))

    def eps_f(cs):
        ec = np.maximum(2.0 * _gamma_n(n, cs) * eps, k4 * eps / (cs * n ** (1.0 / 3.0)))
        return np.sqrt(2.0 * N_u * L1) * ec + N_u * ec * np.expm1(ec)

    def valid(cs):
        m = cs**2 * n ** (2.0 / 3.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            return (m < n) & (eps <= np.log(m / (16.0 * math.log(2.0 / delta))))

    c_best, val = _best_over_c(eps_f, c, valid)
    ec = max(2.0 * float(_gamma_n(n, c_best)) * eps, k4 * eps / (c_best * n ** (1.0 / 3.0)))
    det = {
        "n": n,
        "T": T,
        "c": c_best,
        "gamma_n": float(_gamma_n(n, c_best)),
        "eps_c": ec,
        "N_u": N_u,
        "N_u_method": how,
    }
    return Guarantee(
        val,
        N_u * delta + delta_prime + delta_hat,
        PAPER,
        "P-AD Thm 6 (App. E)",
        "complete graph, hidden sender and receiver",
        det,
    )


def spotted_contributions(
    N_u: float,
    n: int,
    eps: float,
    delta_tilde: float,
    *,
    delta_local: float = 0.0,
    composition: str = "min",
) -> Guarantee:
    """P-AD Lemma 2 (App. G): the extra loss when v knows its sender and receiver.

    A contribution of u is *spotted* by v (immediately before/after v) with probability 2/n;
    w.p. 1 − δ̃ at most ``K_s = 2N_u/n + √((6N_u/n) ln(1/δ̃))`` are, each costing the local ε.
    ``composition``: ``"advanced"`` (``√(2 K_s ln(1/δ̃)) ε + K_s ε(e^ε−1)``, erratum 18 restores
    the 2), ``"simple"`` (``K_s ε``) or ``"min"`` of both.  δ = K_s δ_local + δ̃ (Chernoff)
    + δ̃ (advanced composition, if used).  Labelled ``"paper"`` (Chernoff on dependent events).
    """
    _check_delta("delta_tilde", delta_tilde)
    K_s = 2.0 * N_u / n + math.sqrt(6.0 * N_u / n * math.log(1.0 / delta_tilde))
    adv = math.sqrt(2.0 * K_s * math.log(1.0 / delta_tilde)) * eps + K_s * eps * math.expm1(eps)
    simple = K_s * eps
    if composition == "advanced":
        e, used = adv, "advanced"
    elif composition == "simple":
        e, used = simple, "simple"
    elif composition == "min":
        e, used = (adv, "advanced") if adv < simple else (simple, "simple")
    else:
        raise ValueError(f"unknown composition {composition!r}")
    d = K_s * delta_local + delta_tilde + (delta_tilde if used == "advanced" else 0.0)
    return Guarantee(
        e,
        d,
        PAPER,
        "P-AD Lemma 2 (App. G)",
        "complete graph, sender and receiver known",
        {"K_s": K_s, "composition": used, "eps_advanced": adv, "eps_simple": simple},
    )


# --- SGD on the complete graph: Lemma 1, Theorem 4, Remark 5 ----------------------------------


def sgd_alpha_max(sigma: float, L: float) -> float:
    """Largest α with ``σ ≥ L √(2α(α−1))`` (weak-convexity condition of Lemma 1):
    ``α_max = (1 + √(1 + 2σ²/L²))/2``."""
    return 0.5 * (1.0 + math.sqrt(1.0 + 2.0 * sigma * sigma / (L * L)))


def _lemma1_denominator(n: int, variant: str) -> float:
    if variant == "exact":
        return float(n - 1)
    if variant == "paper":
        return float(n)
    raise ValueError("variant must be 'exact' (certified, ln n/(n-1)) or 'paper' (ln n/n)")


def sgd_nrdp(
    alpha: float,
    n: int,
    N_u: float,
    L: float,
    sigma: float,
    *,
    variant: str = "exact",
    on_invalid: str = "raise",
) -> RdpGuarantee:
    """P-AD Lemma 1: network RDP of Algorithm 4 (complete-graph SGD) over ``N_u`` contributions.

    Per contribution ``4 α L² ln n / (σ² (n−1))`` with ``variant="exact"`` (the exact geometric
    law of the return time; certified) or ``/ n`` as printed (``variant="paper"``).  The proof's
    weak-convexity step needs ``σ ≥ L √(2α(α−1))``: outside it we raise
    (``on_invalid="raise"``) or clamp α to :func:`sgd_alpha_max` (``"clamp"``) and report it.
    The gradient steps must be non-expansive (η ≤ 2/β), which the caller guarantees.
    """
    if alpha <= 1.0 or n < 2 or sigma <= 0 or L <= 0:
        raise ValueError("need alpha > 1, n >= 2, sigma > 0, L > 0")
    a_max = sgd_alpha_max(sigma, L)
    clamped = False
    used = alpha
    if alpha > a_max * (1.0 + 1e-12):
        if on_invalid == "raise":
            raise ValidityError(
                f"Lemma 1 needs sigma >= L sqrt(2 alpha (alpha-1)): alpha={alpha:.4g} > "
                f"alpha_max={a_max:.4g} for sigma={sigma:.4g}, L={L:.4g}"
            )
        if on_invalid != "clamp":
            raise ValueError("on_invalid must be 'raise' or 'clamp'")
        used, clamped = a_max, True
    per = 4.0 * used * L * L * math.log(n) / (sigma * sigma * _lemma1_denominator(n, variant))
    return RdpGuarantee(
        used,
        N_u * per,
        CERTIFIED if variant == "exact" else PAPER,
        "P-AD Lemma 1",
        "complete graph, hidden sender and receiver",
        clamped,
        alpha,
        {"per_contribution": per, "alpha_max": a_max, "N_u": N_u, "variant": variant},
    )


def sgd_rdp_curve(
    orders, n: int, N_u: float, L: float, sigma: float, *, variant: str = "exact"
) -> np.ndarray:
    """Lemma 1 as an RDP curve on ``orders`` (for the ledger): ``N_u · 4αL² ln n/(σ²(n−1))`` where
    the proof holds (α ≤ α_max) and ``inf`` — no guarantee claimed — at the orders beyond it."""
    o = np.asarray(orders, dtype=float)
    per = 4.0 * L * L * math.log(n) / (sigma * sigma * _lemma1_denominator(n, variant))
    return np.where(o <= sgd_alpha_max(sigma, L) * (1.0 + 1e-12), N_u * per * o, np.inf)


def colluders_effective_n(n: int, c: int) -> float:
    """P-AD §4.3 (A.5.8): on the complete graph, c colluders act as one user visited with
    probability c/n (return times geometric with success probability c/n, erratum 23), so the
    complete-graph guarantees hold with n replaced by ``n/c``.  (On the ring, see Thm 1.)"""
    if not 1 <= c < n:
        raise ValueError("need 1 <= c < n")
    return n / c


def sgd_epsilon(
    n: int, N_u: float, L: float, sigma: float, delta: float, *, variant: str = "exact"
) -> Guarantee:
    """Best (ε, δ) from Lemma 1 over admissible orders α ∈ (1, α_max] (Remark 5's inner step).

    The RDP is linear in α (slope a), so ``ε(α) = aα + ln(1/δ)/(α−1)`` is minimised at
    ``α* = 1 + √(ln(1/δ)/a)``, clamped to α_max when the constraint binds (reported) — Mironov's
    conversion, kept for ``variant="paper"``.  The certified variant uses hushnet's one rule, the improved
    conversion (:func:`hushnet.privacy.conversions.linear_rdp_to_dp`), never above it.
    """
    _check_delta("delta", delta)
    a = N_u * 4.0 * L * L * math.log(n) / (sigma * sigma * _lemma1_denominator(n, variant))
    a_max = sgd_alpha_max(sigma, L)
    lg = math.log(1.0 / delta)
    alpha = 1.0 + math.sqrt(lg / a)
    clamped = alpha > a_max
    alpha = min(alpha, a_max)
    eps = a * alpha + lg / (alpha - 1.0)
    if (
        variant == "exact"
    ):  # certified: hushnet's one RDP → (ε, δ) rule (improved conversion, never larger)
        from hushnet.privacy.conversions import linear_rdp_to_dp

        e, al = linear_rdp_to_dp(a, delta, a_max)
        eps, alpha = float(e), float(al)
        clamped = alpha >= a_max * (1 - 1e-12)
    return Guarantee(
        eps,
        delta,
        CERTIFIED if variant == "exact" else PAPER,
        "P-AD Lemma 1 + RDP conversion",
        "complete graph, hidden sender and receiver",
        {
            "alpha": alpha,
            "alpha_max": a_max,
            "alpha_clamped": clamped,
            "sigma": sigma,
            "N_u": N_u,
            "variant": variant,
        },
    )


def sgd_sigma_search(
    eps_target: float,
    delta: float,
    n: int,
    N_u: float,
    L: float,
    *,
    variant: str = "exact",
    sigma_start: float = 1e-3,
    rtol: float = 1e-9,
) -> Guarantee:
    """Remark 5: the smallest σ whose best admissible ε (see :func:`sgd_epsilon`) meets the target.

    ε(σ) is decreasing in σ, so we grow σ geometrically from ``sigma_start`` until the target is
    met, then bisect (the paper's "increase σ until" rule, made exact).  ``details["sigma"]`` is σ.
    """
    if eps_target <= 0:
        raise ValueError("eps_target must be > 0")
    f = lambda s: sgd_epsilon(n, N_u, L, s, delta, variant=variant).epsilon  # noqa: E731
    lo = hi = sigma_start
    if f(lo) <= eps_target:
        hi = lo
    else:
        while f(hi) > eps_target:
            lo, hi = hi, hi * 2.0
            if hi > 1e12:
                raise ValidityError(f"target eps={eps_target} unreachable")
        while hi - lo > rtol * hi:
            mid = 0.5 * (lo + hi)
            lo, hi = (lo, mid) if f(mid) <= eps_target else (mid, hi)
    g = sgd_epsilon(n, N_u, L, hi, delta, variant=variant)
    return Guarantee(
        g.epsilon,
        delta,
        g.bound,
        "P-AD Remark 5 sigma search",
        g.view_model,
        {**g.details, "sigma": hi, "eps_target": eps_target},
    )


def sgd_thm4_epsilon(eps: float, delta: float, n: int, T: int, delta_hat: float) -> Guarantee:
    """P-AD Theorem 4 closed form: ``ε' = √(2q ln(1/δ)) ε/√(ln(1.25/δ))``,
    ``q = max(2 N_u ln n / n, 2 ln(1/δ))``, δ' = δ + δ̂, for σ² = 8L² ln(1.25/δ)/ε².
    Needs ε < 1 and δ < 1/2.  Labelled ``"paper"`` (uses the printed /n of Lemma 1)."""
    if not 0.0 < eps < 1.0 or not 0.0 < delta < 0.5:
        raise ValidityError("Thm 4 needs eps < 1 and delta < 1/2")
    N_u, how = contributions_bound(T, n, delta_hat)
    q = max(2.0 * N_u * math.log(n) / n, 2.0 * math.log(1.0 / delta))
    e = math.sqrt(2.0 * q * math.log(1.0 / delta)) * eps / math.sqrt(math.log(1.25 / delta))
    return Guarantee(
        e,
        delta + delta_hat,
        PAPER,
        "P-AD Thm 4",
        "complete graph, hidden sender and receiver",
        {"q": q, "N_u": N_u, "N_u_method": how},
    )


def sgd_utility_bound(diameter: float, L: float, d: int, eps: float, delta: float, T: int) -> float:
    """P-AD Proposition 1 (Shamir & Zhang 2013 Thm 2): with ``G² = L² + 8 d L² ln(1.25/δ)/ε²`` and
    ``η_t = D/(G√t)``, Algorithm 4 has ``E[F(τ) − F(w*)] ≤ 2 D G (2 + ln T)/√T``.  A utility bound
    (no privacy label); the network-DP gain comes from the smaller per-step ε it allows."""
    G = math.sqrt(L * L + 8.0 * d * L * L * math.log(1.25 / delta) / (eps * eps))
    return 2.0 * diameter * G * (2.0 + math.log(T)) / math.sqrt(T)


# ----------------------------------------------------------------------------------------------
# Reference-code procedures behind the figures ("paper")
# ----------------------------------------------------------------------------------------------


def fig1a_code_curves(
    n: float, eps0: float = 0.1, delta: float = 1e-7, per_node: float = 100.0
) -> dict[str, float]:
    """Fig. 1a curves with the reference-code formulas (A.6.1; erratum 21), ``T = per_node·n``.

    ``N = T/n + √(3T/2 ln(1/δ))`` (code: 3T/2, paper: 3T/n) or ``N = per_node`` (fixed);
    LDP = optiCompo(ε₀, δ, N), NDP = optiCompo(3ε₀/√n, δ, N + T/n).  All ``"paper"`` values.
    """
    T = per_node * n
    N_rand = T / n + math.sqrt(3.0 * T / 2.0 * math.log(1.0 / delta))
    out = {}
    for tag, N in (("random", N_rand), ("fixed", per_node)):
        out[f"ldp_{tag}"] = opti_compo(eps0, delta, N)
        out[f"ndp_{tag}"] = opti_compo(3.0 * eps0 / math.sqrt(n), delta, N + T / n)
    return out


@dataclass(frozen=True)
class EmpiricalWalkLoss:
    """Result of the A.6.2 empirical walk accountant for one walk.

    ``ndp[o, x]`` is the loss of x's data seen by observer o (diagonal NaN); ``ldp[x]`` the
    local-DP loss of x for its actual number of contributions.  ``bound="paper"``: it follows
    the reference code (known sender and receiver counted as contributions) and is an
    empirical, walk-specific number, not a guarantee.
    """

    ndp: np.ndarray
    ldp: np.ndarray
    visits: np.ndarray
    bound: str = PAPER

    def offdiag(self) -> np.ndarray:
        return self.ndp[~np.eye(self.ndp.shape[0], dtype=bool)]


def empirical_walk_accountant(
    n: int,
    T: int,
    eps0: float,
    delta: float,
    rng: np.random.Generator,
    mass_fn: Callable[[np.ndarray], np.ndarray] | None = None,
) -> EmpiricalWalkLoss:
    """The Fig. 1b empirical accountant (docs/design/spec/randomwalk.md §A.6.2) for one uniform walk of T steps on K_n.

    At each arrival of the token at observer o (cycle length m since o's previous arrival), o
    gets a record for every user x: ``mass = ε₀/√m`` (Gaussian aggregation; ``mass_fn`` overrides
    it, e.g. with a shuffling bound for histograms), turned into the subsampled
    ``ln(1 + (1 − (1−1/n)^m)(e^mass − 1))`` if x is not known to be in the cycle, ``mass`` if known
    once (the current sender, or the user o last sent to) and ``2·mass`` if known twice.  The
    records of each pair are composed with the heterogeneous advanced composition.

    Vectorised: every quantity the composition needs is an additive sum over records, so each
    observer's "unknown" records are summed once and the ≤ 2 known users per arrival are
    corrected with scatter-adds.
    """
    if mass_fn is None:
        mass_fn = lambda m: eps0 / np.sqrt(m)  # noqa: E731
    nxt = rng.integers(0, n, size=T - 1)  # next holder at steps 1..T-1; the walk starts at node 0
    cur = np.concatenate([[0], nxt[:-1]])  # sender at each step
    steps = np.arange(1, T)
    # previous arrival time of the receiver (0 if none)
    prev_time = np.zeros(T - 1, dtype=np.int64)
    last_time = np.zeros(n, dtype=np.int64)
    # last node the receiver sent the token to (initially 0): o's last send happens at its previous
    # departure, i.e. the step right after its previous arrival (or step 1 for the start node 0).
    last_recv = np.zeros(T - 1, dtype=np.int64)
    last_send = np.zeros(n, dtype=np.int64)
    for i in range(T - 1):  # O(T) scalar loop over integer arrays; cheap relative to the rest
        o, s = nxt[i], cur[i]
        prev_time[i] = last_time[o]
        last_recv[i] = last_send[o]
        last_send[s] = o
        last_time[o] = steps[i]
    m = (steps - prev_time).astype(float)
    mass = np.asarray(mass_fn(m), dtype=float)
    p_in = -np.expm1(m * math.log1p(-1.0 / n))
    e0 = np.log1p(p_in * np.expm1(mass))  # known = 0
    e1 = mass
    e2 = 2.0 * mass

    def parts(e):
        return e, np.expm1(e) * e / (np.exp(e) + 1.0), e * e

    base = [np.bincount(nxt, weights=p, minlength=n) for p in parts(e0)]
    k = np.bincount(nxt, minlength=n).astype(float)
    sums = [np.repeat(b[:, None], n, axis=1) for b in base]  # [observer, contributor]
    same = cur == last_recv
    for who, e_known in ((cur, np.where(same, e2, e1)), (last_recv[~same], e1[~same])):
        obs = nxt if who is cur else nxt[~same]
        for s_arr, new, old in zip(sums, parts(e_known), parts(e0 if who is cur else e0[~same])):
            np.add.at(s_arr, (obs, who), new - old)
    worst, first, q = sums
    ndp = _kairouz_from_sums(np.repeat(k[:, None], n, axis=1), worst, first, q, delta)
    np.fill_diagonal(ndp, np.nan)
    ldp = np.sqrt(2.0 * k * math.log(1.0 / delta)) * eps0 + k * eps0 * math.expm1(eps0)
    return EmpiricalWalkLoss(ndp=ndp, ldp=ldp, visits=k.astype(np.int64))


# --- Fig. 2 calibration of the reference code (A.6.3) -----------------------------------------

_CODE_CONF = 1.2


def _code_K(T: int, n: int) -> int:
    return math.ceil(_CODE_CONF * T / n)


def fig2_sigma_local_code(
    L_clip: float, n: int, eps_tot: float, delta: float, T: int
) -> tuple[float, float]:
    """Local DP-SGD σ of the reference code: K = ⌈1.2T/n⌉ steps at δ/K each, advanced composition
    solved for ε₀, then ``σ = √(2 ln(1.25K/δ)) L_clip/ε₀``.  Returns ``(σ, ε₀)``; ``"paper"``."""
    K = _code_K(T, n)
    d_ = delta / K
    f = lambda e0: math.sqrt(2 * K * math.log(1 / d_)) * e0 + K * e0 * math.expm1(e0) - eps_tot  # noqa: E731
    eps0 = optimize.brentq(f, 0.0, eps_tot / math.sqrt(K), xtol=1e-15)
    return math.sqrt(2.0 * math.log(1.25 / d_)) * L_clip / eps0, eps0


def fig2_sigma_central_code(L_clip: float, n: int, eps_tot: float, delta: float, T: int) -> float:
    """Centralized DP-SGD σ of the reference code (Bassily et al. 2014 bound); ``"paper"``."""
    return (
        16.0
        * L_clip
        * math.sqrt(T * math.log(2.0 / delta) * math.log(1.25 * T / (delta * n)))
        / (n * eps_tot)
    )


def fig2_sigma_network_code(
    L_clip: float, n: int, eps_tot: float, delta: float, T: int
) -> tuple[float, dict]:
    """Network DP-SGD σ of the reference code (A.6.3, ``findSigma.net``); ``"paper"``.

    Splits ε_tot between the spotted contributions (Lemma 2, K_s from the code) and the others
    (Lemma 1 with the code's factor 2 instead of 4, α pinned at α_max, σ grown ×1.15; or the
    Thm 4 closed form in the large-K regime), adjusting the split until both σ agree within 5%.
    Returns ``(σ, details)``.
    """
    K = _code_K(T, n)
    d_ = delta / K
    K_s = math.ceil(K * 2.0 / n + math.sqrt(6.0 * K * math.log(1.0 / delta) / n))
    beta = 0.5
    sigma_spot, sigma_cand = 50.0, 1.0
    for _ in range(100_000):
        eps_spot = beta * eps_tot

        def g(e0):
            adv = math.sqrt(2 * K_s * math.log(1 / d_)) * e0 + K_s * e0 * math.expm1(e0)
            return min(adv, K_s * e0) - eps_spot

        e0s = optimize.brentq(g, 0.0, eps_spot / math.sqrt(K_s), xtol=1e-15)
        sigma_spot = math.sqrt(2.0 * math.log(1.25 / d_)) * L_clip / e0s
        eps_other = eps_tot - eps_spot
        if K < n * math.log(1.0 / delta) / (2.0 * math.log(n)):
            regime = "numerical"
            sigma_cand = math.sqrt(2.0 * math.log(1.25 / delta)) * L_clip / eps_other
            while True:
                alpha = sgd_alpha_max(sigma_cand, L_clip)
                e = 2 * K * L_clip**2 * alpha * math.log(n) / (sigma_cand**2 * n) + math.log(
                    1 / delta
                ) / (alpha - 1)
                if e < eps_other:
                    break
                sigma_cand *= 1.15
        else:
            regime = "closed-form"
            sigma_cand = (
                4.0
                * L_clip
                * math.sqrt(2.0 * K * math.log(n) * math.log(1.0 / delta) / n)
                / eps_other
            )
        if sigma_spot / sigma_cand > 1.05:
            beta *= 1.01
        elif sigma_cand / sigma_spot > 1.05:
            beta *= 0.99
        else:
            return max(sigma_cand, sigma_spot), {
                "K": K,
                "K_s": K_s,
                "beta": beta,
                "sigma_spotted": sigma_spot,
                "sigma_other": sigma_cand,
                "regime": regime,
            }
    raise RuntimeError("reference-code budget split did not converge")
