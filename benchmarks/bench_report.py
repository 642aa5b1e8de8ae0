"""A node's report and ledger answer at network size n, in process (issue 12: the operator at scale).

Collecting 2 048 reports after a run cost the hosts ~11.6 ms of event-loop CPU per node (n = 1024 over
the network), about 70 % of it ``Ledger.spent`` over the lifetime totals: every target's curve converted
and one ``Spent`` object per target, read back field by field into the report.  This benchmark builds
one node as a host does — a walk node after its first visit, and a Muffliato-GD node after its run's
charges — and times, per call (CPU time of this thread), what the node's ``run.report`` (packed, as the
client asks) and ``run.ledger`` handlers do (plain, and packed as the client asks): the document and
its JSON.  The old path (a copy of the report and ledger answer as they were, kept here) and the new one
run interleaved in pairs in one process, so their ratio survives the machine's load; the ratio is
reported, never asserted.  A breakdown of the new report follows (certified row, paper row, lifetime
columns without the run row's conversion).

Not in the numbers: gRPC, TLS and the operator's side (unpacking).  No network.  Quote the load average
(``uptime``) with any number taken from here.
"""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import tempfile
import time
from typing import Any, Callable

import numpy as np

SIZES = (1024, 2048)
#: interleaved (old, new) pairs per measurement
PAIRS = 15


def _old_spent(ledger, delta):
    """``Ledger.spent(delta=…)`` as it was: every target's curve converted, one Spent per target."""
    st = ledger._state  # noqa: SLF001 - the reference path over the same state
    keys = st.targets()
    d = [st.default_delta(t) if delta is None else delta for t in keys]
    return st.spent_many(keys, np.asarray(d, dtype=float))


def _old_paper_gd(spec, vertex: int, W):
    """Muffliato-GD's paper row as it was: each step's Theorem 1 term rebuilt (norms, adjacency) and
    every entry converted."""
    import math

    import scipy.sparse as sp

    from hushnet.families.gossip.accounting import PAPER_LABELS, _public_eigh, resolved
    from hushnet.privacy.paper.muffliato import thm1_from_source
    from hushnet.runs.spec import _best_order_dp

    Wc = sp.csr_matrix(W, dtype=float)
    eig = _public_eigh(Wc)
    sens = sum(thm1_from_source(Wc, vertex, int(k), eig=eig) for k in resolved(spec, Wc)["ks"])
    sens = np.array(sens, dtype=float)
    sens[vertex] = 0.0
    row = _best_order_dp(sens / (2.0 * spec.sigma**2), math.inf, math.log(1.0 / spec.budget.delta))
    row[sens <= 0] = 0.0
    row[vertex] = 0.0
    return row, PAPER_LABELS[spec.protocol]


def _old_report(drv) -> dict[str, Any]:
    """``RunDriver.report()`` as it was (rows as dicts, lifetime from :func:`_old_spent`, Muffliato-GD's
    paper row from :func:`_old_paper_gd`)."""
    from hushnet.runs.accounting import dp_from_rdp_rows, paper_bound

    delta = drv.spec.budget.delta
    certified: dict[str, float] = {}
    if drv.cost is not None:
        charged = drv.run_rdp
        eps = (
            np.zeros(len(drv.cost.targets))
            if charged is None
            else dp_from_rdp_rows(drv.cost.orders, charged, delta)
        )
        certified = {t: float(e) for t, e in zip(drv.cost.targets, eps)}
    paper, paper_label = None, None
    if drv.spec.protocol == "muffliato-gd":
        pb = _old_paper_gd(drv.spec, drv.vertex, drv.W)
    else:
        pb = paper_bound(drv.spec, drv.vertex, float(drv.contributions), drv.W)
    if pb is not None:
        pr, paper_label = pb
        paper = {drv.ids[v]: float(pr[v]) for v in range(len(drv.ids)) if v != drv.vertex}
    lifetime = {}
    if drv.ledger is not None:
        for t, s in _old_spent(drv.ledger, delta).items():
            lifetime[t] = {"epsilon": s.epsilon, "bound": s.bound, "method": s.method}
    return drv._report_doc(delta, certified, paper, paper_label, lifetime)  # noqa: SLF001


def _old_ledger_doc(ledger, node_id: str, delta) -> dict[str, Any]:
    """The ``run.ledger`` answer as it was (one Spent per target, read back field by field)."""
    spent = _old_spent(ledger, delta)
    counts = ledger.entry_counts()
    runs = {rid: {"protocol": proto, "entries": n} for rid, proto, n in counts}
    b = ledger.budget
    return {
        "node": node_id,
        "spent": {
            t: {"epsilon": s.epsilon, "delta": s.delta, "bound": s.bound, "entries": s.entries}
            for t, s in spent.items()
        },
        "entries": sum(n for _, _, n in counts),
        "runs": runs,
        "budget": None if b is None else {"epsilon": b.epsilon, "delta": b.delta},
    }


def _walk_node(n: int, state: pathlib.Path):
    """A walk node (rw-dpsgd, the amplified walk's length) after its acceptance and first visit."""
    from hushnet.engine.actions import LedgerEntry as EngineEntry
    from hushnet.families import family_of
    from hushnet.privacy.ledger import Ledger, LedgerBudget
    from hushnet.protocols.registry import transition_matrix
    from hushnet.runs.accounting import contribution_cost
    from hushnet.runs.driver import RunDriver
    from hushnet.runs.net_experiments import prepare

    spec, _ = prepare("rw-dpsgd", n, steps=23 * n)
    ids = [f"n{i}" for i in range(n)]
    v = n // 3
    ledger = Ledger(state / "walk.sqlite", node_id=ids[v])
    ledger.set_budget(LedgerBudget(spec.budget.epsilon, spec.budget.delta))
    W = transition_matrix(spec.graph, spec.weights)
    dec = family_of(spec.protocol).project(spec, v, None, W)
    row = {ids[u]: float(dec.epsilon_row[u]) for u in range(n) if u != v}
    cost = contribution_cost(spec, v, ids, W, ledger.orders)
    out = {"node": ids[v], "accept": True, "row": row}
    drv = RunDriver(spec, v, ids, None, None, ledger=ledger, cost=cost, W=W, decision=out)
    ev = EngineEntry(
        v, 0, "gradient", spec.view_model, 2.0, 2.0 * spec.sigma, spec.sigma,
        spec.protocol, spec.run_id,
    )  # fmt: skip
    if not drv._charge(ev):  # noqa: SLF001 - the node's charge path itself
        raise SystemExit(f"bench_report: the walk node refused its visit: {drv.reason}")
    return drv, ledger


def _gossip_node(n: int, state: pathlib.Path):
    """A Muffliato-GD node after its run's gradient steps were charged."""
    from hushnet.engine.actions import LedgerEntry as EngineEntry
    from hushnet.families.gossip.accounting import gossip_cost
    from hushnet.privacy.ledger import Ledger
    from hushnet.protocols.registry import transition_matrix
    from hushnet.runs.driver import RunDriver
    from hushnet.runs.net_experiments import prepare

    spec, _ = prepare("muffliato-gd", n)
    ids = [f"n{i}" for i in range(n)]
    v = n // 3
    W = transition_matrix(spec.graph, spec.weights)
    ledger = Ledger(state / "gossip.sqlite", node_id=ids[v])
    drv = RunDriver(spec, v, ids, None, None, ledger=ledger, cost=gossip_cost(spec, v, ids, W), W=W)
    for step in range(int(spec.steps)):
        ev = EngineEntry(
            v, step, "gradient", spec.view_model, 2.0, 2.0 * spec.sigma, spec.sigma,
            spec.protocol, spec.run_id,
        )  # fmt: skip
        if not drv._charge(ev):  # noqa: SLF001
            raise SystemExit(f"bench_report: the gossip node refused step {step}: {drv.reason}")
    return drv, ledger


def _cpu_ms(f: Callable[[], Any]) -> float:
    t0 = time.thread_time()
    f()
    return (time.thread_time() - t0) * 1e3


def _pairs(old: Callable[[], Any], new: Callable[[], Any], pairs: int) -> dict:
    """Interleaved (old, new) CPU times: medians and the median of the paired ratios."""
    old(), new()  # warm
    o, w = [], []
    for i in range(pairs):
        if i % 2:  # alternate which goes first
            w.append(_cpu_ms(new))
            o.append(_cpu_ms(old))
        else:
            o.append(_cpu_ms(old))
            w.append(_cpu_ms(new))
    return {
        "old_ms": round(statistics.median(o), 2),
        "new_ms": round(statistics.median(w), 2),
        "ratio": round(statistics.median(b / a for a, b in zip(o, w)), 3),
    }


def _breakdown(drv, pairs: int) -> dict:
    """Median CPU of the new report's parts: the certified row, the paper row, the lifetime columns."""
    from hushnet.runs.accounting import dp_from_rdp_rows, paper_bound

    delta = drv.spec.budget.delta
    parts = {
        "certified": lambda: dp_from_rdp_rows(drv.cost.orders, drv.run_rdp, delta),
        "paper": lambda: paper_bound(drv.spec, drv.vertex, float(drv.contributions), drv.W),
        "lifetime": lambda: drv.ledger.spent_columns(delta),
    }
    out = {}
    for k, f in parts.items():
        f()
        out[k] = round(statistics.median(_cpu_ms(f) for _ in range(pairs)), 2)
    return out


def measure(n: int, pairs: int = PAIRS) -> dict:
    """Old vs new report (packed, JSON) and ledger answer of a walk node and a Muffliato-GD node at n."""
    from hushnet.runs.report_wire import pack_report, unpack_ledger, unpack_report
    from hushnet.runs.service import _json, ledger_doc

    out: dict[str, Any] = {"n": n}
    with tempfile.TemporaryDirectory(prefix="hushnet-bench-report-") as tmp:
        for name, build in (("walk", _walk_node), ("muffliato-gd", _gossip_node)):
            drv, ledger = build(n, pathlib.Path(tmp))
            try:
                old_wire = _json(pack_report(_old_report(drv)))
                new_wire = _json(drv.report(packed=2))
                if unpack_report(json.loads(new_wire)) != unpack_report(json.loads(old_wire)):
                    raise SystemExit(f"bench_report: {name} n = {n}: the new report differs")
                node = drv.node_id
                old_led = _json(_old_ledger_doc(ledger, node, None))
                packed_led = json.loads(_json(ledger_doc(ledger, node, None, packed=True)))
                if _json(ledger_doc(ledger, node, None)) != old_led or (
                    _json(unpack_ledger(packed_led)) != old_led
                ):
                    raise SystemExit(f"bench_report: {name} n = {n}: the ledger answer differs")
                st = ledger._state  # noqa: SLF001
                rows = st._rdp[: len(st._keys)]  # noqa: SLF001
                out[name] = {
                    "targets": len(st._keys),  # noqa: SLF001
                    "distinct_lifetime_curves": len({r.tobytes() for r in rows}),
                    "report_packed": _pairs(
                        lambda: _json(pack_report(_old_report(drv))),
                        lambda: _json(drv.report(packed=2)),
                        pairs,
                    ),
                    "report_plain": _pairs(
                        lambda: _json(_old_report(drv)), lambda: _json(drv.report()), pairs
                    ),
                    "ledger": _pairs(
                        lambda: _json(_old_ledger_doc(ledger, node, None)),
                        lambda: _json(ledger_doc(ledger, node, None)),
                        pairs,
                    ),
                    "ledger_packed": _pairs(  # what the client asks now
                        lambda: _json(_old_ledger_doc(ledger, node, None)),
                        lambda: _json(ledger_doc(ledger, node, None, packed=True)),
                        pairs,
                    ),
                    "new_report_parts_ms": _breakdown(drv, pairs),
                    "packed_kb": round(len(new_wire) / 1024, 1),
                    "plain_kb": round(len(_json(drv.report())) / 1024, 1),
                }
            finally:
                ledger.close()
    return out


def main(out_dir: pathlib.Path | None = None) -> dict:
    """``make bench``: each size of ``HUSHNET_BENCH_REPORT_N`` (default 1024,2048)."""
    sizes = tuple(
        int(x)
        for x in os.environ.get("HUSHNET_BENCH_REPORT_N", ",".join(map(str, SIZES))).split(",")
    )
    res: dict[str, Any] = {"load_before": os.getloadavg()[0], "sizes": {}}
    for n in sizes:
        doc = measure(n)
        res["sizes"][str(n)] = doc
        for name in ("walk", "muffliato-gd"):
            d = doc[name]
            print(
                f"   n = {n} {name}: report packed {d['report_packed']}, plain {d['report_plain']}, "
                f"ledger {d['ledger']}, packed {d['ledger_packed']}; parts {d['new_report_parts_ms']} ms; "
                f"{d['distinct_lifetime_curves']} distinct of {d['targets']} curves; "
                f"{d['packed_kb']} / {d['plain_kb']} KB",
                flush=True,
            )
    res["load_after"] = os.getloadavg()[0]
    return res


if __name__ == "__main__":
    print(json.dumps(main(), indent=1))
