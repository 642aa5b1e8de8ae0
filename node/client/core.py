"""The operator client (asyncio): connect, list nodes and the graph, start/watch/cancel runs, fetch results.

It talks to the bootstrap (directory) and to every node's ``Control`` RPC with the operator
certificate — the same calls ``hushnet run …`` makes, so the CLI and the notebook show the same
information.  Every failure a user can cause or meet (wrong certificate, a node that refuses,
a network that goes away during ``watch``) is a :class:`ClientError` with a readable message.
"""

from __future__ import annotations

import asyncio
import base64
import json
import pathlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import grpc
import numpy as np

from hushnet.families.central.params import PROTOCOL as CENTRAL_DPSGD
from hushnet.net.hostcontrol import BATCHABLE, DISCOVERY_WAVE, spread_order  # noqa: F401
from hushnet.net.operator import Operator, OperatorCredentials, OperatorError
from hushnet.runs.spec import RunSpec, SpecError, parse_spec_toml, sign_spec

#: node calls a second that :meth:`AsyncClient.watch` spends on its sweeps at most (a sweep asks every
#: node; networks above ``2 × this`` nodes are swept less often than every ``poll`` seconds)
WATCH_CALLS_PER_S = 128.0

#: node answers a second a watch asks for at most, however they travel (a host answers for all its nodes
#: in one call, but each answer is still that node's own command and signature on the host's loop)
WATCH_ANSWERS_PER_S = 512.0


def watch_pacing(
    n: int, poll: float, pause_timeout: float, answers: int = 0
) -> tuple[float, float]:
    """``(sweep period, pause timeout)`` of a watch making ``n`` calls a sweep for ``answers`` nodes.

    A sweep asks every node for its events: at n = 1024 a 2 s sweep was 512 Control RPCs a second (mutual
    TLS, served on the hosts' event loops) during the very run it watched.  So a sweep spends at most
    :data:`WATCH_CALLS_PER_S` calls a second.  Batched per host, n = 2048 is 5 calls a sweep, but its
    2 048 answers every 2 s still took 14 % of a host's samples during the walk they watched (0.7 ms
    each), so the answers have their own budget, :data:`WATCH_ANSWERS_PER_S`.  A pause (no progress)
    must outlast two sweeps, or a slower sweep alone would look like one."""
    period = max(poll, n / WATCH_CALLS_PER_S, answers / WATCH_ANSWERS_PER_S)
    return period, max(pause_timeout, 2 * period)


class ClientError(RuntimeError):
    """An expected failure, with a message meant for the user (no traceback needed).

    ``code``: the gRPC status name when a node could not be reached or did not answer in time
    (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``, …), so a caller can tell a transport failure worth asking
    again from a node's refusal (``""``)."""

    code: str = ""


class RunRefusedError(ClientError):
    """At least one node refused the run; ``decisions`` holds every node's answer."""

    def __init__(self, run_id: str, decisions: dict[str, dict[str, Any]]) -> None:
        self.run_id = run_id
        self.decisions = decisions
        bad = {n: d.get("reason", "?") for n, d in decisions.items() if not d.get("accept")}
        lines = "; ".join(f"{n}: {r}" for n, r in sorted(bad.items()))
        super().__init__(f"run {run_id} refused by {len(bad)} node(s): {lines}")


@dataclass
class RunOutcome:
    """What :meth:`AsyncClient.watch` returns: the final state and where the model is."""

    run_id: str
    #: finished | paused | stopped | cancelled | timeout | holder-lost | leader-lost (a secagg-dpsgd round
    #: leader never answered: the run ended without a model, ``reason`` names the node and the round)
    state: str
    step: int
    steps: int
    holder: str | None
    seconds: float
    deviations: list[dict[str, Any]] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    reason: str = ""
    #: loss of the final model on the spec's public evaluation data (``eval_data``), from the holder's
    #: progress event; ``None`` when the spec names none (a loss on private data is never reported)
    loss: float | None = None
    loss_data: str | None = None
    #: the walk's token holder that stopped answering (state ``holder-lost``), where the last durable copy is
    lost_holder: dict[str, Any] | None = None
    #: nodes whose deviation top-up is still owed (they did not receive the close): node → why
    unaccounted: dict[str, str] = field(default_factory=dict)


def find_lost_holder(states: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The walk's token holder that does not answer, from the nodes' run statuses (``token`` field).

    The newest handoff any answering node knows of (acknowledged or still pending) names the node
    the token went to; if that node is not among those that answered about the run (unreachable,
    or restarted without the run), the token is with a node that is gone: ``{"holder", "step",
    "copy_at", "acknowledged"}``.  ``copy_at`` keeps the last durable copy (``run resume`` takes the
    walk up from there).  None when the token is with an answering node, or nobody handed it off yet.
    """
    best = None
    for node, st in states.items():
        tok = st.get("token") if isinstance(st, dict) else None
        if not tok or tok.get("finished"):
            if tok and tok.get("finished"):
                return None
            continue
        for kind in ("pending", "passed"):
            if f"{kind}_to" in tok:
                cand = (int(tok[f"{kind}_step"]), kind == "pending", node, tok[f"{kind}_to"])
                best = cand if best is None or cand > best else best
    if best is None:
        return None
    step, pending, frm, to = best
    if to in states:
        return None
    if any(
        isinstance(st, dict) and (st.get("token") or {}).get("last_step", -1) >= step
        for st in states.values()
    ):
        return None  # someone answering has already gone past that handoff
    return {"holder": to, "step": step, "copy_at": frm, "acknowledged": not pending}


@dataclass
class RunResult:
    """What a run released to the operator (:meth:`AsyncClient.result`): a walk's or a gossip node's final
    model, a P-AD or secure sum / histogram, or the central baseline's model (held by this client).

    ``values`` is the vector itself; ``info`` is the protocol's finish record as the holder reported it
    (e.g. a secure sum's ``status``, ``survivors`` and fixed-point ``error_bound``, a P-AD ``estimate``).
    ``holders`` lists every node that holds a final model (one for a walk, every node for gossip, the
    leader and the members a secure sum was broadcast to); ``holder`` is the one ``values`` came from.
    """

    run_id: str
    protocol: str
    holder: str
    step: int | None
    values: np.ndarray
    info: dict[str, Any] = field(default_factory=dict)
    holders: list[str] = field(default_factory=list)

    def metadata(self) -> dict[str, Any]:
        """Everything but the values, JSON-ready (what ``hushnet run model --json`` prints)."""
        return {
            "run_id": self.run_id,
            "protocol": self.protocol,
            "holder": self.holder,
            "holders": self.holders,
            "step": self.step,
            "dim": int(self.values.shape[0]),
            "dtype": "float64",
            "info": json.loads(json.dumps(self.info, default=str)),
        }


def _load_spec(spec: RunSpec | str | pathlib.Path) -> RunSpec:
    if isinstance(spec, RunSpec):
        return spec.with_run_id().validate()
    p = pathlib.Path(spec) if not isinstance(spec, str) or "\n" not in spec else None
    if p is not None and p.exists():
        return parse_spec_toml(p.read_text())
    if isinstance(spec, str) and "[run]" in spec:
        return parse_spec_toml(spec)
    raise ClientError(f"run spec {spec!s} does not exist")


class AsyncClient:
    """Async operator client.  ``await AsyncClient.connect(state_dir)``; ``await close()`` at the end."""

    def __init__(
        self, creds: OperatorCredentials, *, timeout: float = 10.0, batch: bool = True
    ) -> None:
        self.creds = creds
        self.timeout = timeout
        self.op = Operator(creds)
        self._members: dict[str, Any] = {}
        self._specs: dict[str, RunSpec] = {}
        self._central_models: dict[
            str, np.ndarray
        ] = {}  # central-dpsgd: the model lives with the operator
        #: ask batchable commands one call per host process (``host.batch``); False: node by node
        self.batch = batch
        #: ask reports in the packed form (hushnet.runs.report_wire); False: the plain JSON rows
        self.packed_reports = True
        #: the host-batch caller (which process hosts which node, learnt from the hosts' replies)
        self.hosts = self.op.hosts
        self.hosts.error = ClientError
        self._host_of = self.hosts.host_of  # node id → the host id its process answered under
        #: RPCs the last :meth:`_all` made (a batch counts once), and how many of them were batches
        self.last_calls = self.last_batches = 0
        #: seconds the hosts' loops spent on the last :meth:`_all`'s batches: commands, signing
        self.host_work_s: dict[str, float] = {}

    # ------------------------------------------------------------------ connection
    @classmethod
    async def connect(
        cls,
        state_dir: str | pathlib.Path | None = None,
        *,
        bootstrap: str | None = None,
        ca: str | pathlib.Path | None = None,
        cert: str | pathlib.Path | None = None,
        key: str | pathlib.Path | None = None,
        timeout: float = 10.0,
        batch: bool = True,
    ) -> "AsyncClient":
        """Connect with the operator identity: a ``hushnet up``/bootstrap state directory, or explicit
        ``bootstrap`` address + ``ca``/``cert``/``key`` PEM files.  Checks the bootstrap answers.
        ``batch=False``: ask every node on its own instead of one ``host.batch`` call per host process."""
        try:
            if state_dir is not None:
                creds = OperatorCredentials.from_state_dir(
                    pathlib.Path(state_dir), bootstrap=bootstrap
                )
            else:
                if not (bootstrap and ca and cert and key):
                    raise ClientError("give a state directory, or bootstrap + ca + cert + key")
                creds = OperatorCredentials(
                    pathlib.Path(ca).read_bytes(),
                    pathlib.Path(key).read_bytes(),
                    pathlib.Path(cert).read_bytes(),
                    bootstrap,
                )
        except (OperatorError, OSError, KeyError, ValueError) as exc:
            raise ClientError(f"cannot load the operator identity: {exc}") from None
        client = cls(creds, timeout=timeout, batch=batch)
        await client.refresh()
        return client

    async def close(self) -> None:
        await self.op.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def refresh(self) -> None:
        try:
            directory = await self.op.directory(timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            raise ClientError(
                f"bootstrap {self.creds.bootstrap} unreachable or refused us: "
                f"{exc.code().name}: {exc.details()}"
            ) from None
        self._directory = directory
        self._members = {m.node_id: m for m in directory.members}

    async def _control(
        self, node_id: str, command: str, args: Any = None, timeout: float | None = None
    ) -> Any:
        m = self._members.get(node_id)
        if m is None:
            raise ClientError(f"no node {node_id!r} in the directory")
        try:
            return await self.op.control(
                node_id, m.address, command, args, timeout=timeout or self.timeout
            )
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.PERMISSION_DENIED:
                raise ClientError(f"{node_id} refused our certificate: {exc.details()}") from None
            if code == grpc.StatusCode.UNIMPLEMENTED:
                raise ClientError(
                    f"{node_id} does not serve runs ({exc.details()}); start nodes with "
                    "'hushnet node serve' / 'hushnet up' from this version"
                ) from None
            err = ClientError(f"{node_id} at {m.address} unreachable: {code.name}: {exc.details()}")
            err.code = code.name
            raise err from None
        except OperatorError as exc:
            raise ClientError(str(exc).replace("OperatorError: ", "")) from None

    async def _all(
        self,
        command: str,
        args: Any = None,
        timeout: float | None = None,
        nodes: list[str] | None = None,
        per_node: dict[str, Any] | None = None,
        wait: float = 0.0,
    ) -> dict[str, Any]:
        """``command`` at every node (or ``nodes``): node id → its answer, or the :class:`ClientError` that
        says why there is none.  ``per_node``: arguments for some nodes instead of ``args``.

        Batchable commands (:data:`hushnet.net.hostcontrol.BATCHABLE`) go as one ``host.batch`` call per
        host process (:meth:`_batched`); what no host answered for goes node by node.  ``wait``: a
        ``run.events`` long poll held by each host (the per-node calls carry their own in ``per_node``)."""
        ids = nodes or sorted(self._members, key=lambda i: self._members[i].vertex)
        got: dict[str, Any] = {}
        self.last_calls = self.last_batches = 0
        self.host_work_s = {}
        if self.batch and command in BATCHABLE and not isinstance(args, (bytes, bytearray)):
            got = await self._batched(command, args, ids, timeout, per_node or {}, wait)
        rest = [i for i in ids if i not in got]
        # the calls queue for the operator's slots in the order they are made: in vertex order the first
        # 64 all went to the first host process (hosts run consecutive vertices) and the others idled —
        # accepting Muffliato-GD at n = 1024 (3 hosts) took 173 s with the hosts answering one after the
        # other; spread, every host works on its share at once
        order = spread_order(rest, {i: self._members[i].vertex for i in rest if i in self._members})
        self.last_calls += len(order)
        res = await asyncio.gather(
            *(self._control(i, command, (per_node or {}).get(i, args), timeout) for i in order),
            return_exceptions=True,
        )
        got.update(zip(order, res))
        out = {}
        for i in ids:
            r = got[i]
            if isinstance(r, BaseException) and not isinstance(r, ClientError):
                raise r
            out[i] = r
        return out

    async def _batched(
        self,
        command: str,
        args: Any,
        ids: list[str],
        timeout: float | None,
        per_node: dict[str, Any],
        wait: float,
    ) -> dict[str, Any]:
        """The answers of ``ids`` through ``host.batch``: one call per host process, each answer checked
        against its node's key (:class:`~hushnet.net.hostcontrol.HostBatchClient`)."""
        self.hosts.reset()
        base = max(timeout or self.timeout, 30.0)
        out = await self.hosts.ask(self._members, command, args, ids, base, per_node, wait)
        self.last_calls += self.hosts.calls
        self.last_batches += self.hosts.batches
        for k, v in self.hosts.host_work_s.items():
            self.host_work_s[k] = self.host_work_s.get(k, 0.0) + v
        return out

    # ------------------------------------------------------------------ network
    async def nodes(self) -> list[dict[str, Any]]:
        """Every node of the directory with its health and neighbours (``hushnet status``)."""
        try:
            doc = await self.op.network_status(timeout=min(self.timeout, 5.0))
        except grpc.aio.AioRpcError as exc:
            raise ClientError(
                f"bootstrap {self.creds.bootstrap} unreachable: {exc.code().name}"
            ) from None
        return doc["nodes"]

    async def graph(self):
        """The network graph as a :class:`networkx.Graph` (node attribute ``id`` = node id)."""
        import networkx as nx

        await self.refresh()
        g = nx.Graph()
        for m in self._directory.members:
            g.add_node(m.vertex, id=m.node_id, address=m.address)
        g.add_edges_from((e.u, e.v) for e in self._directory.edges)
        g.graph["topology"] = self._directory.topology
        return g

    # ------------------------------------------------------------------ runs
    def sign(self, spec: RunSpec) -> bytes:
        from hushnet.net import pki

        key = pki.load_key(self.creds.key_pem)
        return sign_spec(spec, key, self.creds.cert_pem).to_bytes()

    async def submit(
        self, spec: RunSpec | str | pathlib.Path
    ) -> tuple[RunSpec, dict[str, dict[str, Any]]]:
        """Sign and deliver the spec to every node; returns (spec, each node's decision)."""
        try:
            spec = _load_spec(spec)
        except SpecError as exc:
            raise ClientError(str(exc)) from None
        await self.refresh()
        from hushnet.families import family_of

        spec = family_of(spec.protocol).prepare_submit(spec, self._directory)
        self._specs[spec.run_id] = spec
        payload = self.sign(spec)
        res = await self._all("run.submit", payload, timeout=max(self.timeout, 60.0))
        decisions = {}
        for i, r in res.items():
            decisions[i] = {"accept": False, "reason": str(r)} if isinstance(r, ClientError) else r
        return spec, decisions

    async def start_run(self, spec: RunSpec | str | pathlib.Path) -> str:
        """Submit; if every node accepts, start the run everywhere and return its id, else raise
        :class:`RunRefusedError` (the run does not start)."""
        from hushnet.families import family_of

        if isinstance(spec, RunSpec) and family_of(spec.protocol).operator_driven:
            raise ClientError(
                f"{spec.protocol} is driven by the operator's aggregator: use run_central(spec) "
                "('hushnet run start' does so)"
            )
        spec, decisions = await self.submit(spec)
        if family_of(spec.protocol).operator_driven:
            await self._all(
                "run.cancel",
                {"run_id": spec.run_id, "reason": f"{spec.protocol} needs run_central"},
            )
            raise ClientError(
                f"{spec.protocol} is driven by the operator's aggregator: use run_central(spec) "
                "('hushnet run start' does so)"
            )
        if not all(d.get("accept") for d in decisions.values()):
            accepted = [i for i, d in decisions.items() if d.get("accept")]
            if accepted:  # nobody keeps a half-accepted run around
                await self._all(
                    "run.cancel",
                    {"run_id": spec.run_id, "reason": "refused by another node"},
                    nodes=accepted,
                )
            raise RunRefusedError(spec.run_id, decisions)
        res = await self._all("run.start", {"run_id": spec.run_id})
        errs = {i: str(r) for i, r in res.items() if isinstance(r, ClientError)}
        if errs:
            raise ClientError(f"run {spec.run_id} could not be started on {sorted(errs)}: {errs}")
        return spec.run_id

    async def run_central(
        self,
        spec: RunSpec | str | pathlib.Path,
        *,
        progress: bool | Callable[[int, int], None] = True,
        request_timeout: float = 30.0,
    ):
        """Baseline: central DP-SGD with a trusted aggregator (NOT decentralized) — this client *is* the
        aggregator: it submits the spec, asks the sampled node for its clipped gradient at every step,
        adds the noise and keeps the model (:mod:`hushnet.families.central.operator`).  Returns a ``CentralOutcome``."""
        from hushnet.families.central.operator import run_central

        try:
            spec = _load_spec(spec)
        except SpecError as exc:
            raise ClientError(str(exc)) from None
        return await run_central(self, spec, progress=progress, request_timeout=request_timeout)

    async def statuses(self, run_id: str) -> dict[str, Any]:
        return await self._all("run.status", {"run_id": run_id})

    async def watch(
        self,
        run_id: str,
        *,
        progress: bool | Callable[[int, int], None] = True,
        timeout: float = 600.0,
        pause_timeout: float = 15.0,
        poll: float = 2.0,
    ) -> RunOutcome:
        """Follow the run until it finishes (or stops, is cancelled, or stays paused ``pause_timeout`` s).

        Progress: a live bar (``tqdm.auto``: a widget in Jupyter, text in a terminal) when
        ``progress`` is True, or a callback ``fn(step, total)``.  When the run has finished somewhere,
        every node is told to close it (with whether a deviation happened, so it is accounted).
        """
        await self.refresh()
        ids = sorted(self._members, key=lambda i: self._members[i].vertex)
        asked = (poll, pause_timeout)
        n_calls = len(ids)  # RPCs a sweep makes: one per host once the hosts are known (see _all)
        cursors = {i: 0 for i in ids}
        # each node's last status and its digest: a brief sweep's node with nothing new answers nothing
        # (``run.events`` with ``seen``) and keeps the status it gave last
        seen: dict[str, dict[str, Any]] = {}
        digests: dict[str, str] = {}
        full = True  # ask whole statuses (with the token's whereabouts): the first sweep, and while stalled
        t0 = time.monotonic()
        total = 0
        step = 0
        holder = None
        loss: float | None = None
        loss_data: str | None = None
        deviations: list[dict[str, Any]] = []
        faults: list[dict[str, Any]] = []
        paused_since: float | None = None
        last_step = -1
        state = "running"
        reason = ""
        bar = None
        unreachable: dict[str, str] = {}
        unknown: dict[str, str] = {}
        stalled_since = time.monotonic()
        lost_info: dict[str, Any] | None = None
        end_as: tuple[str, str] | None = None
        try:
            while True:
                poll, pause_timeout = watch_pacing(n_calls, *asked, answers=len(ids))
                # a node holds run.events up to `wait` s; with more calls than the operator's concurrency a
                # held call would keep the others queued, so a large network is swept without holding.  A
                # host process answers for all its nodes in one call, held until one of them has news.
                hold = poll if n_calls <= self.op.max_concurrent else 0.0
                swept = time.monotonic()
                got = await self._all(
                    "run.events",
                    timeout=poll + 10,
                    nodes=ids,
                    per_node={
                        i: {"run_id": run_id, "after": cursors[i], "wait": hold}
                        if full
                        else {
                            "run_id": run_id,
                            "after": cursors[i],
                            "wait": hold,
                            "brief": True,
                            **({"seen": digests[i]} if i in digests else {}),
                        }
                        for i in ids
                    },
                    wait=poll,
                )
                n_calls, batched = max(1, self.last_calls), self.last_batches > 0
                res = [got[i] for i in ids]  # answers read in vertex order, as before
                states = {}
                for i, r in zip(ids, res):
                    if isinstance(r, ClientError):
                        unreachable[i] = str(r)
                        continue
                    if isinstance(r, BaseException):
                        raise r
                    unreachable.pop(i, None)
                    if r is None:  # nothing new since the status it gave last (a brief sweep)
                        if i in seen:
                            states[i] = seen[i]
                        continue
                    cursors[i] = r["next"]
                    st = r["status"]
                    total = st.get("steps") or total
                    states[i] = seen[i] = st
                    if "digest" in r:
                        digests[i] = r["digest"]
                    else:
                        digests.pop(i, None)
                    for ev in r["events"]:
                        if ev["type"] in ("progress", "finished", "resumed", "paused"):
                            step = max(step, int(ev.get("step", 0)))
                        if ev["type"] == "deviation":
                            deviations.append(ev)
                        if ev["type"] == "fault":
                            faults.append(ev)
                        if ev["type"] == "finished" and ev.get("holds_model"):
                            holder = i
                        if ev["type"] == "progress" and ev.get("loss") is not None:
                            loss, loss_data = float(ev["loss"]), ev.get("loss_data")
                unknown = {
                    i: e for i, e in unreachable.items() if "no run" in e or "refused here" in e
                }
                if unknown and len(unknown) + len(states) == len(ids) and not states:
                    raise ClientError(
                        f"no run {run_id} on this network ({next(iter(unknown.values()))})"
                    )
                for i in unknown:
                    unreachable.pop(i, None)
                if len(unreachable) == len(ids):
                    raise ClientError(
                        "the network went away during watch: "
                        + "; ".join(f"{i}: {e}" for i, e in sorted(unreachable.items())[:3])
                    )
                if progress is True and bar is None and total:
                    from tqdm.auto import tqdm

                    bar = tqdm(total=total, desc=run_id, unit="step")
                if bar is not None:
                    if loss is not None:
                        bar.set_postfix_str(
                            f"loss={loss:.4f} (final model, public {loss_data})", refresh=False
                        )
                    bar.update(max(0, step - bar.n))
                elif callable(progress) and total:
                    progress(step, total)
                if any(s["state"] == "finished" for s in states.values()):
                    state = "finished"
                    ended = [s for s in states.values() if s.get("ended")]
                    if (
                        ended
                    ):  # finished without completing (a secagg-dpsgd leader that never answered)
                        e = ended[0]
                        gone = (
                            f"{e['lost_node']} (leader of round {e.get('lost_round')}) is gone; "
                            if e.get("lost_node")
                            else ""
                        )
                        end_as = (e["ended"], f"{gone}{e['node']}: {e['ended_reason']}")
                    break
                if states and all(s["state"] == "closed" for s in states.values()):
                    state = "finished"  # ended everywhere without a node-held model (central-dpsgd: the operator has it)
                    break
                stopped = [s for s in states.values() if s["state"] in ("stopped", "cancelled")]
                if stopped:
                    state, reason = (
                        stopped[0]["state"],
                        f"{stopped[0]['node']}: {stopped[0].get('reason', '')}",
                    )
                    break
                # a sweep with progress can be brief: the token's whereabouts (left out of a brief status)
                # are read only when the walk stalls or pauses, so those sweeps ask whole statuses
                full = step == last_step
                if step != last_step:
                    last_step, paused_since, stalled_since = step, None, time.monotonic()
                if total and step < total and time.monotonic() - stalled_since > pause_timeout:
                    lost = find_lost_holder(states)
                    if (
                        lost is not None and lost["acknowledged"]
                    ):  # unacknowledged: the sender pauses on it
                        why = (
                            unreachable.get(lost["holder"])
                            or unknown.get(lost["holder"])
                            or "does not answer"
                        )
                        state = "holder-lost"
                        reason = (
                            f"{lost['holder']} holds the token since step {lost['step']} and is gone ({why[:200]}); "
                            f"the last durable copy is at {lost['copy_at']}: restart {lost['holder']} on its state "
                            f"directory, or 'hushnet run resume {run_id}' to continue without it"
                        )
                        lost_info = lost
                        break
                if any(s["state"] == "paused" for s in states.values()) or (
                    unreachable and step < total
                ):
                    paused_since = paused_since or time.monotonic()
                    if time.monotonic() - paused_since > pause_timeout:
                        state = "paused"
                        who = [s["node"] for s in states.values() if s["state"] == "paused"]
                        reason = (
                            f"paused at step {step} (held by {', '.join(who) or '?'}; unreachable: "
                            f"{', '.join(sorted(unreachable)) or 'none'})"
                        )
                        lost_info = find_lost_holder(states)
                        if lost_info is not None and lost_info["acknowledged"]:
                            state = "holder-lost"
                            reason = (
                                f"{lost_info['holder']} holds the token since step {lost_info['step']} and "
                                f"does not answer; the last durable copy is at {lost_info['copy_at']}: "
                                f"restart {lost_info['holder']}, or 'hushnet run resume {run_id}'"
                            )
                        break
                else:
                    paused_since = None
                if time.monotonic() - t0 > timeout:
                    state, reason = (
                        "timeout",
                        f"no finish within {timeout:.0f} s (last step {step})",
                    )
                    break
                if (
                    hold == 0.0 or batched
                ):  # a host's reply came early only with news: a sweep a poll
                    await asyncio.sleep(max(0.0, poll - (time.monotonic() - swept)))
        finally:
            if bar is not None:
                bar.close()
        unaccounted: dict[str, str] = {}
        if state == "finished":
            unaccounted = await self.close_run(run_id, deviated=bool(deviations))
            if not deviations:
                unaccounted = {}  # nothing to top up: a node that missed the close owes nothing
            if end_as is not None:
                state, reason = end_as
        return RunOutcome(
            run_id,
            state,
            step,
            total,
            holder,
            time.monotonic() - t0,
            deviations,
            faults,
            reason,
            loss,
            loss_data,
            lost_info,
            unaccounted,
        )

    async def close_run(self, run_id: str, *, deviated: bool = False) -> dict[str, str]:
        """Tell every node the run is over (``deviated``: top every contribution up to the local-DP bound).

        Returns the nodes that did not get the close, with why: their top-up is owed until they do
        (a node restarted on its state directory keeps the run, so calling this again reaches it;
        the top-up is applied once).  Idempotent."""
        from hushnet.net import pki
        from hushnet.runs.spec import sign_close

        await self.refresh()
        # signed: a node that was down keeps asking its neighbours for this record when it is back, and
        # applies the close (its deviation top-up) from it without the operator calling again
        record = sign_close(run_id, deviated, pki.load_key(self.creds.key_pem), self.creds.cert_pem)
        res = await self._all(
            "run.close", {"run_id": run_id, "deviated": bool(deviated), "record": record}
        )
        return {i: str(r) for i, r in res.items() if isinstance(r, ClientError)}

    async def resume(self, run_id: str, *, from_node: str | None = None) -> dict[str, Any]:
        """Resume a walk whose token holder never came back, from the last durable copy of the token.

        The holder is found from the nodes' statuses (:func:`find_lost_holder`); every answering node
        is told to refuse its tokens from now on and to leave it out of its row; the node with the
        copy (or ``from_node``, whose own copy is used — the other nodes then drop what they did
        after that copy's step) hands the token on.  This is a deviation: the copy's token reaches a
        second next holder, so on close every node is topped up to the local-DP bound (each node's
        noisy contributions, observed by any number of nodes, stay within it)."""
        await self.refresh()
        res = await self._all("run.status", {"run_id": run_id})
        states = {i: r for i, r in res.items() if isinstance(r, dict)}
        if not states:
            raise ClientError(why_no_run(run_id, {i: str(r) for i, r in res.items()}))
        lost = find_lost_holder(states)
        if lost is None:
            raise ClientError(
                f"run {run_id}: no lost holder — the token is with a node that answers "
                "(watch it, or restart the node that is down)"
            )
        src = from_node or lost["copy_at"]
        if src not in states:
            raise ClientError(
                f"{src} does not answer about run {run_id}: it cannot resume the walk"
            )
        tok = states[src].get("token") or {}
        step = (
            tok.get("pending_step")
            if tok.get("pending_to") == lost["holder"]
            else tok.get("passed_step")
        )
        if step is None or (
            tok.get("passed_to") != lost["holder"] and tok.get("pending_to") != lost["holder"]
        ):
            raise ClientError(f"{src} holds no copy of the token it handed to {lost['holder']}")
        others = [i for i in states if i != src]
        fence = (
            await self._all(
                "run.resume",
                {
                    "run_id": run_id,
                    "lost": [lost["holder"]],
                    "take_up": False,
                    "from_step": int(step),
                },
                nodes=others,
            )
            if others
            else {}
        )
        r = await self._control(
            src, "run.resume", {"run_id": run_id, "lost": [lost["holder"]], "take_up": True}
        )
        if not r.get("resumed_here"):
            raise ClientError(f"{src} did not take the walk up (state {r.get('state')})")
        return {
            "run_id": run_id,
            "lost": lost["holder"],
            "from": src,
            "step": int(step),
            "not_told": sorted(i for i, v in fence.items() if isinstance(v, ClientError)),
        }

    async def cancel(
        self, run_id: str, reason: str = "cancelled by the operator"
    ) -> dict[str, Any]:
        await self.refresh()
        res = await self._all("run.cancel", {"run_id": run_id, "reason": reason})
        return {i: (str(r) if isinstance(r, ClientError) else r["state"]) for i, r in res.items()}

    async def list_runs(self) -> list[dict[str, Any]]:
        """One row per run known to any node: id, protocol, state (most advanced), step, nodes."""
        await self.refresh()
        res = await self._all("run.list")
        runs: dict[str, dict[str, Any]] = {}
        per_run: dict[str, dict[str, dict[str, Any]]] = {}
        order = {
            "accepted": 0,
            "running": 1,
            "paused": 2,
            "closed": 3,
            "finished": 4,
            "cancelled": 5,
            "stopped": 6,
        }
        for i, r in res.items():
            if isinstance(r, ClientError):
                continue
            for st in r["runs"]:
                row = runs.setdefault(
                    st["run_id"],
                    {
                        "run_id": st["run_id"],
                        "protocol": st["protocol"],
                        "state": "accepted",
                        "step": -1,
                        "steps": st["steps"],
                        "nodes": 0,
                    },
                )
                row["nodes"] += 1
                row["step"] = max(row["step"], st["step"])
                per_run.setdefault(st["run_id"], {})[i] = st
                if order.get(st["state"], 0) > order.get(row["state"], 0):
                    row["state"] = st["state"]
            for rf in r.get("refused", []):
                runs.setdefault(
                    rf.get("run_id", "?"),
                    {
                        "run_id": rf.get("run_id", "?"),
                        "protocol": "?",
                        "state": "refused",
                        "step": -1,
                        "steps": 0,
                        "nodes": 0,
                    },
                )
            for u in r.get("unrestored", []):
                row = runs.setdefault(
                    u["run_id"],
                    {
                        "run_id": u["run_id"],
                        "protocol": "?",
                        "state": "running",
                        "step": -1,
                        "steps": 0,
                        "nodes": 0,
                    },
                )
                row.setdefault("unrestored", {})[i] = u["reason"]
        for rid, row in runs.items():
            ended = [st for st in per_run.get(rid, {}).values() if st.get("ended")]
            if row["state"] == "finished" and ended:  # e.g. leader-lost: name the node that is gone
                row["state"] = ended[0]["ended"]
                row["ended_reason"] = ended[0].get("ended_reason", "")
                if ended[0].get("lost_node"):
                    row["lost_node"] = ended[0]["lost_node"]
                    row["lost_round"] = ended[0].get("lost_round")
            if row["state"] in ("running", "paused"):
                lost = find_lost_holder(per_run.get(rid, {}))
                if lost is not None:
                    row["state"] = "holder-lost"
                    row["lost_holder"] = lost
        return sorted(runs.values(), key=lambda d: d["run_id"])

    async def report(self, run_id: str):
        """The run's privacy report (every node's certified row, paper values labelled) and timings."""
        from hushnet.client.report import RunReport
        from hushnet.runs.report_wire import VERSION as REPORT_VERSION
        from hushnet.runs.report_wire import unpack_report

        await self.refresh()
        # packed: each node's per-target rows as float64 bytes (the same numbers; a third of the bytes)
        # (version 2 packs the projected row too; an older node answers the version it knows)
        res = await self._all(
            "run.report",
            {"run_id": run_id, "packed": REPORT_VERSION if self.packed_reports else False},
        )
        per = {}
        for i, r in res.items():
            if isinstance(r, ClientError):
                per[i] = {"error": str(r)}
            else:
                per[i] = unpack_report(r)
        graph = await self.graph()
        return RunReport(run_id, per, graph)

    async def model(self, run_id: str, *, node: str | None = None) -> np.ndarray:
        """The final model or released result (a sum, a histogram) of the run; see :meth:`result`."""
        return (await self.result(run_id, node=node)).values

    async def models(self, run_id: str) -> dict[str, np.ndarray]:
        """Every node's own final model of the run, by node id (gossip: each node holds one; a walk: the
        holder only).  Nodes without a model (not finished, unreachable) are left out; :meth:`result`
        says why one node has none."""
        await self.refresh()
        res = await self._all("run.model", {"run_id": run_id}, timeout=max(self.timeout, 60.0))
        return {
            i: np.frombuffer(base64.b64decode(r["model_b64"]), dtype="<f8").copy()
            for i, r in res.items()
            if isinstance(r, dict) and r.get("model_b64")
        }

    async def result(self, run_id: str, *, node: str | None = None) -> RunResult:
        """What the run released to the operator, with where it came from (:class:`RunResult`).

        Asks every node (or only ``node``, e.g. one gossip node's own model) and takes the first
        holder in vertex order; central-dpsgd's model is held by this client, the aggregator.  When
        there is nothing to return the :class:`ClientError` says why: no such run, refused, not
        finished yet, stopped or cancelled, a secure sum that aborted, or a certificate the nodes
        refuse.
        """
        if run_id in self._central_models and node is None:
            spec = self._specs.get(run_id)
            return RunResult(
                run_id,
                spec.protocol if spec else CENTRAL_DPSGD,
                "operator",
                spec.steps if spec else None,
                self._central_models[run_id].copy(),
                {"baseline": "central (trusted aggregator)"},
                ["operator"],
            )
        await self.refresh()
        if node is not None and node not in self._members:
            raise ClientError(
                f"no node {node!r} in the directory (nodes: {', '.join(sorted(self._members))})"
            )
        res = await self._all(
            "run.model",
            {"run_id": run_id},
            timeout=max(self.timeout, 60.0),
            nodes=None if node is None else [node],
        )
        ok = {i: r for i, r in res.items() if isinstance(r, dict)}
        if not ok:
            raise ClientError(why_no_run(run_id, {i: str(r) for i, r in res.items()}))
        holders = [i for i, r in ok.items() if r.get("model_b64")]
        if holders:
            r = ok[holders[0]]
            values = np.frombuffer(base64.b64decode(r["model_b64"]), dtype="<f8").copy()
            return RunResult(
                run_id,
                str(r.get("protocol", "?")),
                holders[0],
                r.get("step"),
                values,
                dict(r.get("result") or {}),
                holders,
            )
        raise ClientError(_why_no_model(run_id, list(ok.values()), node))

    async def ledgers(self, *, delta: float | None = None) -> dict[str, Any]:
        """Each node's lifetime privacy ledger: (ε, δ) spent toward every other node (certified
        totals; at ``delta``, default the node's budget δ), entries by run, and the node's budget.
        A node that cannot be asked maps to its :class:`ClientError`."""
        from hushnet.runs.report_wire import unpack_ledger

        await self.refresh()
        # packed: the totals as columns, unpacked here to the same numbers (an older node answers plain)
        args: dict[str, Any] = {"packed": True}
        if delta is not None:
            args["delta"] = float(delta)
        res = await self._all("run.ledger", args)
        return {i: unpack_ledger(r) for i, r in res.items()}


def why_no_run(run_id: str, errors: dict[str, str]) -> str:
    """One line for "no node answered about this run": unknown, refused, or refused *us*."""
    msgs = list(errors.values())
    if msgs and all("refused our certificate" in m for m in msgs):
        return f"not allowed: {msgs[0]} (run commands need the network's operator identity)"
    refused = [m for m in msgs if "refused here" in m]
    if refused:
        return f"run {run_id} was refused, it never ran ({refused[0]})"
    if msgs and all("no run" in m for m in msgs):
        return f"no run {run_id} on this network"
    return f"cannot fetch run {run_id}: " + "; ".join(
        f"{i}: {m}" for i, m in sorted(errors.items())[:3]
    )


def _why_no_model(run_id: str, replies: list[dict[str, Any]], node: str | None) -> str:
    """One line for "the run exists but no node holds a result", from the nodes' states."""
    where = f" at {node}" if node else ""
    protocol = replies[0].get("protocol", "?")
    if protocol == CENTRAL_DPSGD:
        return (
            f"run {run_id} is {protocol}: its model stays with the operator process that aggregated it "
            "(save it with 'hushnet run start SPEC --model-out FILE', or use the outcome of run_central)"
        )
    states = [r.get("state", "?") for r in replies]
    for live in ("running", "paused", "accepted"):
        if live in states:
            step = max(int(r.get("last_step", -1)) for r in replies)
            total = replies[0].get("steps", "?")
            return f"run {run_id} has not finished ({live} at step {max(step, 0)}/{total}): no final model yet"
    for over in ("stopped", "cancelled"):
        for r in replies:
            if r.get("state") == over:
                return f"run {run_id} was {over} ({r.get('node')}: {r.get('reason') or 'no reason given'}): no final model"
    for r in replies:
        info = r.get("result") or {}
        if info.get("status") == "aborted":
            return f"run {run_id} finished without releasing a result{where}: {info.get('reason', 'aborted')}"
    return f"run {run_id} finished but no node{where} holds a final model ({protocol})"


def outcome_dict(o: RunOutcome) -> dict[str, Any]:
    return json.loads(json.dumps(o.__dict__, default=str))
