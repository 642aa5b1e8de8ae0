"""hushnet's privacy library: the certified pairwise accountant and what a researcher calls.

Every value here is **certified** (hushnet stands behind it as an upper bound in the general
case: vector models, collusion, crashes) unless it says otherwise.  The papers' formulas as printed
(uncertified; kept for labelled reproductions of their figures) live apart, in
:mod:`hushnet.privacy.paper`, and are not exported from here.

Usage::

    import hushnet.privacy as hp

    g = hp.parse_graph("hypercube:6")                           # or "ring:64", "er:100:0.1:seed=1", ...
    m = hp.privacy_matrix(g, "rw", alpha=2, sigma=2, steps=200)  # PrivacyMatrix, row = contributor
    print(m.matrix.max(), m.bound, m.view)                       # worst pair, "certified", view model
    p = hp.privacy_pair(g, "muffliato", source=0, observer=5, alpha=4, sigma=1, steps=30)
    eps, order = hp.rdp_to_dp(hp.DEFAULT_ORDERS, hp.DEFAULT_ORDERS / 8, delta=1e-6)  # 0.5-GDP
    with hp.Ledger(":memory:", budget=hp.LedgerBudget(epsilon=3, delta=1e-6)) as led:
        led.charge(hp.PrivacyEntry.gaussian("run-1", "rw", "anonymous", "certified", {"7": 0.5}))
        print(led.spent("7").epsilon, led.remaining())

Names resolve lazily (PEP 562): ``import hushnet.privacy`` imports neither numpy-heavy accountants
nor scipy; a node process pays only for the modules it touches.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> module that defines it
_EXPORTS: dict[str, str] = {
    # one call per question (what the CLI runs too)
    "privacy_matrix": "hushnet.privacy.api",
    "privacy_pair": "hushnet.privacy.api",
    "make_query": "hushnet.privacy.api",
    "Query": "hushnet.privacy.api",
    "QueryOptions": "hushnet.privacy.api",
    "PROTOCOLS": "hushnet.privacy.api",
    "PrivacyMatrix": "hushnet.privacy.matrix",
    # graphs and gossip matrices
    "Graph": "hushnet.privacy.graphs",
    "GraphSpecError": "hushnet.privacy.graphs",
    "parse_graph": "hushnet.privacy.graphs",
    "graph_from_edges": "hushnet.privacy.graphs",
    "metropolis_hastings": "hushnet.privacy.graphs",
    # certified accountants, one per protocol family
    "WalkLossOptions": "hushnet.privacy.randomwalk",
    "rw_pndp_matrix": "hushnet.privacy.randomwalk",
    "rw_pair_loss": "hushnet.privacy.randomwalk",
    "rw_collusion_loss": "hushnet.privacy.randomwalk",
    "muffliato_loss_matrix": "hushnet.privacy.muffliato",
    "muffliato_pair": "hushnet.privacy.muffliato",
    "MuffliatoOptions": "hushnet.privacy.muffliato",
    "gossip_stream_loss_matrix": "hushnet.privacy.koskela",
    "gossip_stream_pair": "hushnet.privacy.koskela",
    "StreamOptions": "hushnet.privacy.koskela",
    "SecureSumView": "hushnet.privacy.secure_sum",
    "calibrate_sigma": "hushnet.privacy.calibration",
    "CalibrationResult": "hushnet.privacy.calibration",
    "CalibrationOptions": "hushnet.privacy.calibration",
    # conversions between RDP, GDP and (eps, delta)
    "DEFAULT_ORDERS": "hushnet.privacy.conversions",
    "rdp_to_dp": "hushnet.privacy.conversions",
    "rdp_epsilon": "hushnet.privacy.conversions",
    "linear_rdp_to_dp": "hushnet.privacy.conversions",
    "gdp_epsilon": "hushnet.privacy.conversions",
    "gdp_delta": "hushnet.privacy.conversions",
    "gdp_mu": "hushnet.privacy.conversions",
    "gaussian_sigma_tight": "hushnet.privacy.conversions",
    # a node's ledger (maths in ledger_math, SQLite persistence in ledger)
    "Ledger": "hushnet.privacy.ledger",
    "LedgerBudget": "hushnet.privacy.ledger",
    "PrivacyEntry": "hushnet.privacy.ledger",
    "Spent": "hushnet.privacy.ledger",
    "LedgerError": "hushnet.privacy.ledger",
    "BudgetExceeded": "hushnet.privacy.ledger",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'hushnet.privacy' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
