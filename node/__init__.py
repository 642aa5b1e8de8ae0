"""hushnet: peer-to-peer learning with a pairwise privacy accountant on every node.

The public API, importable from the top-level package::

    import hushnet

    c = hushnet.Client("state/net")                     # operator client (sync facade, works in Jupyter)
    spec = hushnet.parse_spec_toml(open("examples/rw_breast_cancer.toml").read())
    m = hushnet.privacy_matrix("hypercube:6", "rw", alpha=2, sigma=2, steps=200)
    result = hushnet.Simulator(machines).run()          # the same machines the nodes run

Names resolve lazily (PEP 562): ``import hushnet`` loads nothing heavy; a node process that runs a
walk never pays for the client, the plotting code or the whole privacy library.  The internal
packages (``hushnet.net``, ``hushnet.engine``, ``hushnet.protocols``, ``hushnet.privacy``, ...)
stay importable for what the public API does not cover; their layout is in ``docs/design/``.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: public name -> module that defines it
_EXPORTS: dict[str, str] = {
    # operator client
    "Client": "hushnet.client.sync",
    "AsyncClient": "hushnet.client.core",
    "ClientError": "hushnet.client.core",
    "RunRefusedError": "hushnet.client.core",
    "RunOutcome": "hushnet.client.core",
    "RunResult": "hushnet.client.core",
    "RunReport": "hushnet.client.report",
    # run specifications
    "RunSpec": "hushnet.runs.spec",
    "Budget": "hushnet.runs.spec",
    "SpecError": "hushnet.runs.spec",
    "parse_spec_toml": "hushnet.runs.spec",
    # privacy accountant (certified values) and the result type
    "PrivacyMatrix": "hushnet.privacy.matrix",
    "privacy_matrix": "hushnet.privacy.api",
    "privacy_pair": "hushnet.privacy.api",
    "parse_graph": "hushnet.privacy.graphs",
    "Ledger": "hushnet.privacy.ledger",
    # simulator
    "Simulator": "hushnet.sim.simulator",
    "SimResult": "hushnet.sim.simulator",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'hushnet' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
