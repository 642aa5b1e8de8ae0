"""Node side of networked gossip runs: the machine builder, the durable schedule journal, and the
settlement a node applies to its own ledger (``run.schedule`` / ``run.settle`` commands).
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

import numpy as np

from hushnet.engine.actions import LedgerEntry as EngineEntry
from hushnet.families.gossip.accounting import (
    GossipCost,
    certified_view,
    check_network_spec,
    realised_curves,
    settled_schedule,
)
from hushnet.families.gossip.params import SETTLE_ATOL, SETTLE_RTOL, gossip_params, view_of
from hushnet.privacy.ledger import BudgetExceeded, PrivacyEntry
from hushnet.runs.spec import RunSpec

# ---- machine builder ----------------------------------------------------------------------------


def build_gossip(node, spec: RunSpec, vertex: int, ids: list[str], task, W, options):
    """This node's gossip machine, with the public gossip matrix (the network's links are its support)."""
    from hushnet.protocols.registry import make_machine, transition_matrix

    why = check_network_spec(spec)
    if why:
        raise ValueError(why)
    W = W if W is not None else transition_matrix(spec.graph, spec.weights)
    node_rng = getattr(
        spec, "node_rng", None
    )  # secret noise unless the spec asks for the public seed
    rng = node_rng(vertex, len(ids)) if node_rng is not None else None
    params = gossip_params(spec)
    if params.get(
        "secure_summation"
    ):  # the node's own long-term X25519 key and the directory's public keys
        from hushnet.runs.node_keys import node_key_directory, node_keypair

        kp, directory = node_keypair(node), node_key_directory(node)
        missing = [ids[v] for v in range(len(ids)) if v not in directory.keys]
        if missing:
            raise ValueError(
                f"secure summation: the directory has no X25519 key for {', '.join(missing[:5])}"
            )
        params.update(share_key=kp, share_directory=directory)
    return make_machine(
        spec.protocol,
        vertex,
        len(ids),
        task,
        run_seed=spec.seed,
        run_id=spec.run_id,
        params=params,
        W=W,
        view_model=spec.view_model,
        rng=rng,
    )


# ---- schedule records and settlement ------------------------------------------------------------


def schedule_records(entries: Iterable[EngineEntry]) -> list[dict[str, Any]]:
    """The node's ``schedule`` records (JSON-able: row keys are strings on the wire)."""
    out = []
    for e in entries:
        if (
            e.kind == "schedule" and "partner" in e.detail
        ):  # randomized Muffliato: one pairwise activation
            d = dict(e.detail)
            out.append(
                {
                    "round": int(d["round"]),
                    "partner": int(d["partner"]),
                    "used": bool(d["used"]),
                    "sent": bool(d["sent"]),
                }
            )
        elif e.kind == "schedule":
            d = dict(e.detail)
            out.append(
                {
                    "round": int(d["round"]),
                    "up": bool(d["up"]),
                    "self": float(d["self"]),
                    "row": {str(k): float(v) for k, v in d["row"].items()},
                    "sent_value": [int(j) for j in d["sent_value"]],
                    "missing": [int(j) for j in d["missing"]],
                    "step": int(d.get("step", 0)),
                    **({"secure": d["secure"]} if d.get("secure") is not None else {}),
                }
            )
    return out


def _missing_records(recs: Mapping[int, list[dict[str, Any]]]) -> list[int]:
    """Vertices absent from the records that some recorded node heard from (used their value or saw them
    up).  A vertex present with fewer rounds (even none) gave its durable prefix: it is completed safely."""
    referenced: set[int] = set()
    for r in (r for rs in recs.values() for r in rs):
        if "partner" in r:  # an activation: the partner's value was used
            if r["used"]:
                referenced.add(int(r["partner"]))
            continue
        referenced.update(int(j) for j in r["row"])
        referenced.update(int(j) for j in r["sent_value"])
    return sorted(v for v in referenced if v not in recs)


def _same_records(given: list[dict[str, Any]] | None, mine: list[dict[str, Any]]) -> None:
    if given is not None and json.dumps(given, sort_keys=True) != json.dumps(mine, sort_keys=True):
        raise ValueError(
            "the settlement's records for this node differ from what this node recorded"
        )


def _settle_ledger(
    spec: RunSpec,
    vertex: int,
    ids: list[str],
    W,
    targets: list[str],
    orders: np.ndarray,
    charged: np.ndarray,
    recs: Mapping[int, list[dict[str, Any]]],
    ledger,
    run_id: str,
    node_id: str,
    real: np.ndarray | None,
) -> tuple[dict[str, Any], np.ndarray]:
    """The settlement itself: replay, top the ledger up to ``max(charged, realised)``, say what was done."""
    missing = _missing_records(recs)
    if missing:
        raise ValueError(
            f"records of vertices {missing} missing: other nodes used or announced values they sent, "
            "so the replay would leave those values out of the views; settle with their records"
        )
    _, completed = settled_schedule(spec, recs, len(ids), W)  # also refuses a record set with a gap
    if real is None:
        real = realised_curves(spec, vertex, ids, recs, orders, W)
    # differences within the accountant's own floating-point error (the projection's rank tolerance is
    # ~1e-12 relative) are not a change of schedule: only a real excess is topped up
    top = np.where(real > charged * (1.0 + SETTLE_RTOL) + SETTLE_ATOL, real - charged, 0.0)
    top[~np.isfinite(top)] = np.inf
    over = None
    if np.any(top > 0) and ledger is not None:
        entry = PrivacyEntry.from_row(
            run_id,
            spec.protocol,
            certified_view(spec),
            "certified",
            targets,
            top,
            note="gossip settlement: top-up to the certified loss on the realised schedule",
        )
        try:
            ledger.charge(entry)
        except BudgetExceeded as exc:
            over = str(exc)
            ledger.charge(entry, enforce_budget=False)  # the realised rounds already happened
    from hushnet.runs.accounting import dp_from_rdp

    delta = spec.budget.delta
    total = charged + top
    doc = {
        "run_id": run_id,
        "node": node_id,
        "view": certified_view(spec),  # the certified view (secure sums too: the rounding)
        "gossip_view": view_of(spec),
        "records_from": sorted(int(v) for v in recs),
        "completed": {str(v): c for v, c in completed.items()},
        "realised": {t: dp_from_rdp(orders, real[j], delta) for j, t in enumerate(targets)},
        "charged": {t: dp_from_rdp(orders, total[j], delta) for j, t in enumerate(targets)},
        "topped_up": bool(np.any(top > 0)),
        "over_budget": over,
        "bound": "certified",
    }
    if completed:
        doc["notes"] = [
            f"vertices {sorted(completed)} stopped recording (crash): each is assumed to have sent its "
            "value of the round it died in to every neighbour, which can only enlarge the views"
        ]
    return doc, top


def _own_records(service, run) -> list[dict[str, Any]]:
    """The node's own schedule records of a run it holds: from memory, or — for a run restored after a
    restart, whose rounds before the crash are no longer in memory — from its durable store."""
    if getattr(run, "restored", 0):
        from hushnet.families.gossip.store import store_for

        return store_for(service.state_dir).records(run.run_id)
    return schedule_records(run.engine_entries)


def settle(
    run,
    records: Mapping[int, list[dict[str, Any]]],
    real: np.ndarray | None = None,
    own: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Top the node's ledger up to its certified loss on the realised schedule (never refund).

    ``run`` is the node's :class:`~hushnet.runs.driver.RunDriver`; ``records`` vertex → that node's
    schedule records.  The node's own records must equal what it recorded itself.
    """
    cost = run.cost
    if not isinstance(cost, GossipCost):
        raise ValueError(f"run {run.run_id} is not a networked gossip run")
    if cost.settled:
        return {**cost.settled, "again": True}
    mine = schedule_records(run.engine_entries) if own is None else own
    _same_records(records.get(run.vertex), mine)
    recs = {**{int(k): v for k, v in records.items()}, run.vertex: mine}
    if (
        getattr(run, "restored", 0) and run.ledger is not None
    ):  # charges before the restart: on the ledger only
        charged = _run_charged(run.ledger, run.run_id, cost.targets)
    else:
        charged = (
            cost.charged
            if cost.charged is not None
            else np.zeros((len(cost.targets), cost.orders.size))
        )
    doc, top = _settle_ledger(
        run.spec,
        run.vertex,
        run.ids,
        run.W,
        cost.targets,
        cost.orders,
        charged,
        recs,
        run.ledger,
        run.run_id,
        run.node_id,
        real,
    )
    if np.any(top > 0):
        run.run_rdp = top if run.run_rdp is None else run.run_rdp + top
        cost.charged = charged + top
    cost.settled = doc
    run._emit("settled", topped_up=cost.settled["topped_up"])  # noqa: SLF001 - the run's event stream
    return cost.settled


def _run_charged(ledger, run_id: str, targets: list[str]) -> np.ndarray:
    """(targets, orders) everything the persistent ledger holds for ``run_id`` (charges and top-ups)."""
    out = np.zeros((len(targets), ledger.orders.size))
    pos = {t: j for j, t in enumerate(targets)}
    for e in ledger.entries(run_id):
        for t, v in e["rdp"].items():
            if t in pos:
                out[pos[t]] += v
    return out


def settle_recovered(
    service,
    run_id: str,
    records: Mapping[int, list[dict[str, Any]]],
    real: np.ndarray | None = None,
) -> dict[str, Any]:
    """Settle a run this node no longer holds in memory (its process restarted): the spec and the node's
    own records come from its durable store, what it was charged from its persistent ledger (so settling
    twice tops up nothing the second time)."""
    from hushnet.families.gossip.store import store_for
    from hushnet.protocols.registry import transition_matrix

    st = store_for(service.state_dir)
    got = st.run(run_id)
    if got is None:
        raise KeyError(
            f"no run {run_id!r} at {service.node.node_id} (not in memory nor in its schedule store)"
        )
    spec, vertex, ids = got
    W = transition_matrix(spec.graph, spec.weights)
    mine = st.records(run_id)
    _same_records(records.get(vertex), mine)
    recs = {**{int(k): v for k, v in records.items()}, vertex: mine}
    ledger = service.ledger
    targets = [ids[v] for v in range(len(ids)) if v != vertex]
    charged = _run_charged(ledger, run_id, targets)
    doc, _ = _settle_ledger(
        spec,
        vertex,
        ids,
        W,
        targets,
        ledger.orders,
        charged,
        recs,
        ledger,
        run_id,
        service.node.node_id,
        real,
    )
    return {**doc, "recovered": True}


def _stored_run(service, payload: bytes):
    """``(run_id, spec, vertex, ids)`` of a run only the node's durable store still knows, or None."""
    from hushnet.families.gossip.store import store_for

    run_id = str(json.loads(payload or b"{}").get("run_id", ""))
    got = store_for(service.state_dir).run(run_id)
    return None if got is None else (run_id, *got)


async def c_schedule(service, payload: bytes) -> bytes:
    """``run.schedule``: this node's recorded gossip rows of a run (for the operator's settlement).  After a
    restart the run is gone from memory; its durable records answer (``state: "lost"``)."""
    from hushnet.families.gossip.store import store_for

    try:
        run, _ = service._run(payload)  # noqa: SLF001
    except KeyError:
        got = _stored_run(service, payload)
        if got is None:
            raise
        run_id, _spec, vertex, _ids = got
        return json.dumps(
            {
                "node": service.node.node_id,
                "vertex": vertex,
                "run_id": run_id,
                "state": "lost",
                "records": store_for(service.state_dir).records(run_id),
                "durable": True,
            }
        ).encode()
    return json.dumps(
        {
            "node": service.node.node_id,
            "vertex": run.vertex,
            "run_id": run.run_id,
            "state": run.state,
            "records": _own_records(service, run),
        }
    ).encode()


async def c_settle(service, payload: bytes) -> bytes:
    """``run.settle``: ``{"run_id", "records": {vertex: [record…]}}`` → top-up on the realised schedule."""
    import asyncio

    loop = asyncio.get_running_loop()
    args = json.loads(payload or b"{}")
    recs = {int(k): v for k, v in dict(args.get("records") or {}).items()}
    try:
        run, _ = service._run(payload)  # noqa: SLF001
    except KeyError:
        if _stored_run(service, payload) is None:
            raise
        run_id = str(args.get("run_id", ""))
        try:  # the replay and the ledger charge run off the event loop
            out = await loop.run_in_executor(None, settle_recovered, service, run_id, recs)
        except ValueError as exc:
            return json.dumps(
                {"node": service.node.node_id, "run_id": run_id, "error": str(exc)}
            ).encode()
        return json.dumps(out, default=float).encode()
    own = _own_records(service, run)
    mine = {**recs, run.vertex: own}
    real = None
    if isinstance(run.cost, GossipCost) and not run.cost.settled and not _missing_records(mine):
        try:  # the replay runs off the event loop
            real = await loop.run_in_executor(
                None, realised_curves, run.spec, run.vertex, run.ids, mine, run.cost.orders, run.W
            )
        except ValueError:
            real = None  # settle() reports the reason
    try:
        out = settle(run, recs, real, own)
    except ValueError as exc:
        return json.dumps(
            {"node": service.node.node_id, "run_id": run.run_id, "error": str(exc)}
        ).encode()
    return json.dumps(out, default=float).encode()


def gossip_journal(service, spec: RunSpec, vertex: int, ids: list[str]):
    """The driver's journal of a networked gossip run: its schedule records, durable in the node's state."""
    from hushnet.families.gossip.store import store_for

    st = store_for(service.state_dir)
    st.open_run(spec, vertex, ids)
    return st.journal(spec.run_id)
