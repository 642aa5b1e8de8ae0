"""The anonymity layer, operator side: what a run's event streams say about the source-anonymous walk."""

from __future__ import annotations

from typing import Any

import numpy as np


def walk_iterations(event_streams: list[list[dict[str, Any]]], start: int) -> dict[str, np.ndarray]:
    """(source, destination, hops) of every completed iteration of an ``anon-walk-sgd`` run, from the
    nodes' event streams (``run.events``): the ``anon-hop``/``anon-open`` metrics merged by time.

    Hitting times are recorded *outside* the token (nothing in the token counts hops); merging by
    wall-clock time is exact on one host and needs synchronised clocks across hosts.
    """
    from hushnet.engine.actions import Metric as _M
    from hushnet.families.anonymity.anonymous_walk import iterations

    evs = sorted(
        (
            e
            for es in event_streams
            for e in es
            if e.get("type") == "metric" and e.get("name") in ("anon-hop", "anon-open")
        ),
        key=lambda e: (e["t"], e["seq"]),
    )
    return iterations([_M(e["name"], e["value"], -1, -1) for e in evs], start)
