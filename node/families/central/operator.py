"""Operator-side driver of **baseline: central DP-SGD with a trusted aggregator (NOT decentralized)**.

The aggregator is the sans-IO :class:`~hushnet.families.central.machines.CentralAggregator`, run here, in the
operator's process, by the same event rules as the simulator: ``RunStarted``, then every reply as
``MessageArrived(node, reply)``; its actions become effects through
:func:`hushnet.engine.execute.execute`.  Its ``Send(node, request)`` becomes the node's ``run.gradient``
command over the operator's authenticated control channel (mutual TLS, operator certificate of the
network's CA); the node's :class:`~hushnet.families.central.machines.CentralClient` charges its ledger and
answers with its clipped gradient.  The aggregator adds the noise and keeps the model: the final
model exists only here (and in :meth:`AsyncClient.model` of this client afterwards).

Its vertex is n (nodes are 0..n−1) and its generator ``spec.node_rng(n, n + 1)`` — with
``noise = "public-seed"`` exactly the simulator's ``node_generators(seed, n + 1)[n]``, so the
networked run equals :func:`hushnet.protocols.registry.build_from_spec` + the simulator bit for bit.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from hushnet.engine.actions import (
    CancelTimer,
    Deviation,
    Fault,
    Finish,
    LedgerEntry,
    Metric,
    Paused,
    Send,
    SetTimer,
)
from hushnet.engine.events import MessageArrived, RunStarted
from hushnet.engine.execute import execute
from hushnet.engine.protocol import NodeContext
from hushnet.families.central.machines import CentralAggregator
from hushnet.families.central.params import LABEL, PROTOCOL, CentralParams
from hushnet.families.central.wire import GRADIENT_COMMAND
from hushnet.runs.spec import RunSpec

if TYPE_CHECKING:  # pragma: no cover
    from hushnet.client.core import AsyncClient

log = logging.getLogger("hushnet.runs")


@dataclass
class CentralOutcome:
    """The end of a central run: the model (held by the operator), per-node request counts, timings."""

    run_id: str
    state: str  # finished | stopped
    step: int
    steps: int
    model: np.ndarray | None
    requests: dict[str, int]
    seconds: float
    reason: str = ""
    label: str = LABEL
    holder: str = "operator (trusted aggregator)"
    deviations: list[dict[str, Any]] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    #: requests asked again after a call failed in transport (the same bytes, see ``_ask``)
    redeliveries: int = 0


def aggregator_for(spec: RunSpec, n: int, dim: int) -> CentralAggregator:
    """The aggregator machine of ``spec`` for n nodes and a model of dimension ``dim``."""
    ctx = NodeContext(n, n + 1, spec.run_id, spec.node_rng(n, n + 1), spec.view_model)
    return CentralAggregator(ctx, n, dim, CentralParams(**spec.machine_params()))


async def run_central(
    client: "AsyncClient",
    spec: RunSpec,
    *,
    progress: bool | Callable[[int, int], None] = True,
    request_timeout: float = 30.0,
) -> CentralOutcome:
    """Submit ``spec`` (every node must accept), then drive the aggregator to the end."""
    from hushnet.client.core import ClientError, RunRefusedError

    if spec.protocol != PROTOCOL:
        raise ClientError(f"run_central drives {PROTOCOL}, not {spec.protocol}")
    spec, decisions = await client.submit(spec)
    if not all(d.get("accept") for d in decisions.values()):
        accepted = [i for i, d in decisions.items() if d.get("accept")]
        if accepted:
            await client._all(
                "run.cancel",
                {"run_id": spec.run_id, "reason": "refused by another node"},
                nodes=accepted,
            )
        raise RunRefusedError(spec.run_id, decisions)
    ids = sorted(client._members, key=lambda i: client._members[i].vertex)
    dims = {d.get("model_dim") for d in decisions.values()}
    if len(dims) != 1 or None in dims:
        await client._all(
            "run.cancel", {"run_id": spec.run_id, "reason": "model dimensions differ"}, nodes=ids
        )
        raise ClientError(
            f"the nodes' models have different dimensions {sorted(map(str, dims))}: declare [task] dim"
        )
    res = await client._all("run.start", {"run_id": spec.run_id})
    errs = {i: str(r) for i, r in res.items() if isinstance(r, ClientError)}
    if errs:
        raise ClientError(f"run {spec.run_id} could not be started on {sorted(errs)}: {errs}")

    n = len(ids)
    agg = aggregator_for(spec, n, int(dims.pop()))
    requests = {i: 0 for i in ids}
    t0 = time.monotonic()
    bar = None
    if progress is True:
        from tqdm.auto import tqdm

        bar = tqdm(total=spec.steps, desc=f"{spec.run_id} ({LABEL})", unit="step")
    fx = _AggregatorEffects()
    step = 0
    redeliveries = 0
    try:
        acts = agg.handle(RunStarted())
        while True:
            execute(acts, fx)
            acts = []
            while fx.state == "running" and fx.requests:
                dst, request = fx.requests.pop(0)
                node = ids[dst]
                requests[node] += 1
                try:
                    r, again = await _ask(
                        client, node, spec.run_id, request, request_timeout, agg.redeliver_for
                    )
                    redeliveries += again
                except ClientError as exc:
                    fx.state, fx.reason = "stopped", f"{node}: {exc}"
                    break
                acts += agg.handle(MessageArrived(dst, base64.b64decode(r["reply_b64"])))
            step = max(step, fx.step, agg.step)
            if bar is not None:
                bar.update(max(0, step - bar.n))
            elif callable(progress):
                progress(step, spec.steps)
            if fx.state != "running" or not acts:
                break
    finally:
        if bar is not None:
            bar.close()
    state, reason, model = fx.state, fx.reason, fx.model
    if state == "running":  # the machine went quiet without finishing: never silent
        state, reason = "stopped", f"aggregator stalled at step {agg.step}"
    if state == "finished":
        await client._all("run.close", {"run_id": spec.run_id}, nodes=ids)
        client._central_models[spec.run_id] = model
    else:
        await client._all("run.cancel", {"run_id": spec.run_id, "reason": reason}, nodes=ids)
    return CentralOutcome(
        spec.run_id,
        state,
        step,
        spec.steps,
        model,
        requests,
        time.monotonic() - t0,
        reason,
        deviations=fx.deviations,
        faults=fx.faults,
        redeliveries=redeliveries,
    )


async def _ask(
    client: "AsyncClient",
    node: str,
    run_id: str,
    request: bytes,
    timeout: float,
    window: float,
) -> tuple[Any, int]:
    """One gradient request: its reply, and how many times it was asked again.

    A call that failed in transport (:data:`~hushnet.runs.driver.TRANSIENT_CODES`: unreachable, deadline
    passed) is asked again with the same bytes, with backoff, for ``window`` seconds from the first call
    (the aggregator's ``redeliver_for``) — the node answers a repeat of its last request with the same
    reply and no second charge.  A node's refusal is not asked again."""
    from hushnet.client.core import ClientError
    from hushnet.runs.driver import REDELIVER_FIRST_S, REDELIVER_MAX_S, TRANSIENT_CODES

    args = {"run_id": run_id, "request_b64": base64.b64encode(request).decode()}
    start, pause, again = time.monotonic(), REDELIVER_FIRST_S, 0
    while True:
        try:
            return await client._control(node, GRADIENT_COMMAND, args, timeout=timeout), again
        except ClientError as exc:
            if exc.code not in TRANSIENT_CODES or time.monotonic() + pause - start > window:
                raise
            log.warning(
                "run %s: gradient request to %s failed (%s); asking again", run_id, node, exc
            )
        await asyncio.sleep(pause)
        pause = min(2 * pause, REDELIVER_MAX_S)
        again += 1


class _AggregatorEffects:
    """The operator-side effects of the aggregator machine (see :mod:`hushnet.engine.execute`).

    A ``Send`` is a gradient request, queued here and carried out by :func:`run_central` as a
    ``run.gradient`` control call (an await, which an effect cannot do); ``Finish`` keeps the model;
    a ``Fault`` stops the run.  Metrics are not released (``snapshot_every`` is 0 here).  The
    aggregator uses no timers, no ledger and never pauses: such an action stops the run with a
    reason rather than being ignored.
    """

    def __init__(self) -> None:
        self.state, self.reason = "running", ""
        self.model: np.ndarray | None = None
        self.step = 0
        self.requests: list[tuple[int, bytes]] = []
        self.deviations: list[dict[str, Any]] = []
        self.faults: list[dict[str, Any]] = []

    def _unsupported(self, act: object) -> bool:
        self.state, self.reason = (
            "stopped",
            f"the aggregator emitted {type(act).__name__}, which it never should",
        )
        return False

    def send(self, act: Send) -> None:
        self.requests.append((act.dst, act.payload))

    def set_timer(self, act: SetTimer) -> bool:
        return self._unsupported(act)

    def cancel_timer(self, act: CancelTimer) -> bool:
        return self._unsupported(act)

    def charge(self, act: LedgerEntry) -> bool:
        return self._unsupported(act)

    def pause(self, act: Paused) -> bool:
        return self._unsupported(act)

    def metric(self, act: Metric) -> None:
        pass  # model snapshots are not released

    def deviation(self, act: Deviation) -> None:
        self.deviations.append({"step": int(act.step), "reason": act.reason})

    def fault(self, act: Fault) -> bool:
        self.faults.append(
            {"code": getattr(act.error, "code", "protocol-error"), "message": str(act.error)}
        )
        self.state, self.reason = "stopped", f"aggregator refused a reply: {act.error}"
        return False

    def finish(self, act: Finish) -> None:
        self.state, self.model, self.step = (
            "finished",
            np.asarray(act.model, dtype=np.float64).copy(),
            int(act.step),
        )


def outcome_json(o: CentralOutcome) -> str:
    d = dict(o.__dict__)
    d["model"] = None if o.model is None else o.model.tolist()
    return json.dumps(d)
