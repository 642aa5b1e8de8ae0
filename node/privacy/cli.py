"""``hushnet privacy …``: pairwise privacy losses from the command line.

This is also how other people check hushnet's numbers, so every output names the bound
("certified" — what hushnet stands behind — or "paper" — a labelled reproduction of a
published formula), the view model and the conventions used.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from hushnet.privacy.api import (
    PROTOCOLS,
    Query,
    QueryOptions,
    make_query,
    matrix_fn,
    pair,
    protocol_labels,
)
from hushnet.privacy.graphs import GraphSpecError
from hushnet.privacy.matrix import PrivacyMatrix, json_number


def _query(args: argparse.Namespace) -> Query:
    try:
        return make_query(
            args.graph,
            args.protocol,
            QueryOptions(
                alpha=args.alpha,
                sigma=args.sigma,
                steps=args.steps,
                bound=args.bound,
                horizon=args.horizon,
                contributions=args.contributions,
                constraint=args.constraint,
                chebyshev=args.chebyshev,
                weights=args.weights,
            ),
        )
    except (GraphSpecError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None


def _describe(q: Query, labels: dict[str, Any]) -> dict[str, Any]:
    out = {
        "graph": q.graph.spec,
        "n": q.graph.n,
        "protocol": q.protocol,
        "alpha": q.alpha,
        "sigma": q.sigma,
        "steps": q.steps,
        "bound": q.bound,
        "weights": q.weights,
        "chebyshev": q.chebyshev,
        "quantity": "Renyi DP of order alpha, eps[u->v]: row u = contributor, column v = observer",
        **protocol_labels(q.protocol),
    }
    out.update(labels)
    return out


def cmd_matrix(args: argparse.Namespace) -> int:
    q = _query(args)
    try:
        pm: PrivacyMatrix = matrix_fn(q)()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    matrix = np.array(pm.matrix, dtype=float)
    np.fill_diagonal(matrix, 0.0)
    if args.out:
        np.save(args.out, matrix)
    summary = pm.summary(q.graph)
    report = _describe(q, {"bound": pm.bound, "view": pm.view, "notes": summary.pop("notes")})
    report["summary"] = summary
    if args.out:
        report["out"] = str(args.out)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        s = report["summary"]
        print(f"{q.protocol} on {q.graph.spec} (n={q.graph.n}), bound={pm.bound}, view={pm.view}")
        if "label" in report:
            print(f"label: {report['label']}")
        print(
            f"RDP(alpha={q.alpha}) over {s['pairs']} pairs: min {s['min']}  mean {s['mean']}  max {s['max']}"
        )
        print(
            "mean by distance: "
            + ", ".join(
                f"{d}: {v:.4g}" if isinstance(v, float) else f"{d}: {v}"
                for d, v in s["mean_by_distance"].items()
            )
        )
        for note in report["notes"]:
            if note != report.get("label"):  # printed above
                print(f"note: {note}")
    return 0


def cmd_pair(args: argparse.Namespace) -> int:
    q = _query(args)
    for name in ("source", "observer"):
        v = getattr(args, name)
        if not 0 <= v < q.graph.n:
            raise SystemExit(f"error: --{name} must be in 0..{q.graph.n - 1}")
    if args.source == args.observer:
        raise SystemExit(
            "error: --source and --observer must differ (a node's loss to itself is not a privacy loss)"
        )
    result = pair(q, args.source, args.observer)
    if args.delta is not None:
        if not 0 < args.delta < 1:
            raise SystemExit("error: --delta must be in (0, 1)")
        from hushnet.privacy.conversions import CONVERSION_LABEL, rdp_to_dp

        rdp = result["rdp"]
        result["delta"] = args.delta
        result["epsilon"] = (
            rdp_to_dp([q.alpha], [rdp], args.delta)[0] if math.isfinite(rdp) else math.inf
        )
        result["epsilon_classic"] = (
            rdp_to_dp([q.alpha], [rdp], args.delta, method="classic")[0]
            if math.isfinite(rdp)
            else math.inf
        )
        result["conversion"] = f"{CONVERSION_LABEL}, at the given alpha; epsilon_classic: Mironov's"
        mu = result.get("mu_gdp")
        if mu is not None and math.isfinite(mu):
            from hushnet.privacy.conversions import gdp_epsilon

            result["epsilon_tight_gdp"] = gdp_epsilon(mu, args.delta)
    out = _describe(q, {})
    out.update({k: (json_number(v) if isinstance(v, float) else v) for k, v in result.items()})
    if args.json:
        print(json.dumps(out, indent=2, default=str))
    else:
        won = out.get("certified_by") or out.get("method")
        line = (
            f"eps[{args.source}->{args.observer}] = {out['rdp']} (RDP alpha={q.alpha}, bound={out.get('bound')}"
            + (f", by {won}" if won else "")
            + ")"
        )
        if "epsilon" in out:
            line += f"; (eps, delta) = ({out['epsilon']}, {args.delta})"
        print(line)
        if "label" in out:
            print(f"label: {out['label']}")
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--graph",
        required=True,
        help="graph spec: complete:N ring:N hypercube:D grid:RxC er:N:P:SEED "
        "regular:N:K:SEED geometric:N:R:SEED sbm:S1,S2:PIN:POUT:SEED edgelist:PATH",
    )
    p.add_argument(
        "--protocol",
        required=True,
        choices=PROTOCOLS,
        help="rw (anonymous sender), rw-sender-known, muffliato (observer sees its closed neighbourhood; "
        "what hushnet certifies its gossip with, secure or not), muffliato-aggregate (the exact "
        "real-arithmetic neighbourhood sum: a reproduction, not hushnet's secure gossip), gossip-stream",
    )
    p.add_argument("--alpha", type=float, required=True, help="Rényi order (> 1)")
    p.add_argument(
        "--sigma", type=float, required=True, help="noise (multiplier for rw; std for gossip)"
    )
    p.add_argument("--steps", type=int, required=True, help="walk length T (rw) or gossip rounds T")
    p.add_argument(
        "--bound",
        choices=("certified", "paper"),
        default="certified",
        help="certified (default): the value hushnet stands behind; paper: the published formula",
    )
    p.add_argument(
        "--horizon",
        choices=("exact", "harmonic", "lnT"),
        default=None,
        help="rw finite-T treatment",
    )
    p.add_argument(
        "--contributions",
        type=float,
        default=None,
        help="rw contributions per node N_u (default T/n)",
    )
    p.add_argument(
        "--constraint",
        choices=("strict", "proof", "none"),
        default="strict",
        help="rw noise condition on sigma: strict (printed), proof, none (figures only)",
    )
    p.add_argument(
        "--weights",
        choices=("hamilton", "paper"),
        default="hamilton",
        help="Metropolis-Hastings 1/(1+max d) (default) or the printed 1/max d",
    )
    p.add_argument("--chebyshev", action="store_true", help="muffliato with Chebyshev acceleration")
    p.add_argument("--json", action="store_true", help="print JSON")


def register(sub: argparse._SubParsersAction) -> None:
    priv = sub.add_parser(
        "privacy",
        help="pairwise privacy losses (accountant tools)",
        description="Pairwise network-DP losses computed from public parameters.",
    )
    psub = priv.add_subparsers(dest="privacy_command", metavar="COMMAND")
    m = psub.add_parser("matrix", help="all-pairs loss matrix and its summary")
    _common(m)
    m.add_argument("--out", type=Path, default=None, help="write the n×n matrix as .npy")
    m.set_defaults(handler=cmd_matrix)
    p = psub.add_parser("pair", help="the loss of one pair")
    _common(p)
    p.add_argument("--source", type=int, required=True, help="the contributor u")
    p.add_argument("--observer", type=int, required=True, help="the observer v")
    p.add_argument("--delta", type=float, default=None, help="also convert to (epsilon, delta)")
    p.set_defaults(handler=cmd_pair)
    priv.set_defaults(handler=lambda a: (priv.print_help(), 2)[1])
