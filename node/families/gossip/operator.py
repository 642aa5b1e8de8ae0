"""Operator side of networked gossip runs: gather every node's schedule records and settle."""

from __future__ import annotations

from typing import Any


async def settle_run(client, run_id: str, node_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Operator side (an :class:`~hushnet.client.core.AsyncClient`): gather every reachable node's records
    (``run.schedule``), then settle every reachable node (``run.settle``).  An unreachable node
    contributes no records: its rows stay identity and its sent values are missing from its neighbours'
    views — the settlement says which vertices' records it used (``records_from``)."""
    recs: dict[str, list] = {}
    for nid in node_ids:
        try:
            doc = await client._control(nid, "run.schedule", {"run_id": run_id})  # noqa: SLF001
        except Exception:  # noqa: BLE001 - unreachable: no records
            continue
        recs[str(doc["vertex"])] = doc["records"]
    out: dict[str, dict[str, Any]] = {}
    for nid in node_ids:
        try:
            out[nid] = await client._control(
                nid,
                "run.settle",
                {"run_id": run_id, "records": recs},  # noqa: SLF001
                timeout=60.0,
            )
        except Exception as exc:  # noqa: BLE001
            out[nid] = {"error": str(exc)}
    return out
