"""Koskela et al. Theorem 15 (streaming gossip), in the spec's corrected form: **not a guarantee**.

The spec (gossip.md §2.5) flags the theorem's explicit constants as not following from its proof,
and the theorem counts the observers' own noise although an observer knows it.  The certified
accountant is :mod:`hushnet.privacy.koskela` (exact divergence of the whole Gaussian view).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["thm15_sensitivities"]


def thm15_sensitivities(W, T: int, *, aggregate: bool = False) -> np.ndarray:
    """(n,) unit-free ``Δ²(u → v)/Δ²`` of [K] Thm 15 toward each observer v (the same from every
    source): ``m T/n + 2/(1−ρ)² √(m T/n) + 2/(1−ρ)⁴`` with ``m = |N̄_v|`` (closed neighbourhood;
    1 in the aggregate view, where secure summation shows one row) and ``ρ = max(|λ₂|, |λ_n|)``;
    ∞ if W is not primitive (ρ = 1)."""
    Wc = sp.csr_matrix(W, dtype=float)
    n = Wc.shape[0]
    lam = np.sort(np.abs(np.linalg.eigvalsh(Wc.toarray())))[::-1]
    rho = float(lam[1]) if n > 1 else 0.0
    m = np.diff(Wc.indptr) + (
        Wc.diagonal() == 0
    )  # closed neighbourhood (the diagonal is in W's support)
    if aggregate:  # secure summation: one observer row, S = e_iᵀ (Thm 15 with m = 1)
        m = np.ones(n)
    if rho >= 1.0 - 1e-12:
        return np.full(n, np.inf)
    x = m * T / n
    return x + 2.0 / (1.0 - rho) ** 2 * np.sqrt(x) + 2.0 / (1.0 - rho) ** 4
