"""The run service of a node: operator commands for runs, and the transport handler that feeds them.

Installed on a :class:`hushnet.net.node.Node` with :func:`install`, which every node process runs
before it starts: it is the ``runs`` plugin of the ``hushnet.node_plugins`` entry point
(:mod:`hushnet.net.plugins`).  It adds

* one protocol handler, ``hushnet.run``: every envelope of every run; ``envelope.run_id`` picks
  the run, the authenticated ``envelope.sender`` is the machine's ``src``;
* operator commands (the ``Control`` RPC, operator certificates only), JSON in and out:

  ============== ====================================================================================
  ``run.submit`` signed spec → verify signature (operator certificate issued by this network's CA),
                 check it fits the network (graph size, this node's neighbours), the node's own
                 budget (projected certified row, lifetime ledger), load local data, build the
                 machine → ``{"accept": bool, "reason": str, ...}``
  ``run.start``  deliver ``RunStarted``
  ``run.events`` long-poll the run's event stream (progress, pauses, deviations, faults, finish)
  ``run.status`` / ``run.list`` / ``run.report`` / ``run.model``
  ``run.cancel`` stop the run here;  ``run.close`` end it after it finished somewhere
  ============== ====================================================================================
"""
from __future__ import annotations

import asyncio
import base64
import functools
import json
import logging
import pathlib
import time
from typing import Any

import numpy as np
from cryptography import x509

from hushnet.engine.errors import ProtocolError
from hushnet.net import pki
from hushnet.privacy.ledger import Ledger, LedgerBudget
from hushnet.protocols.registry import transition_matrix
from hushnet.protocols.walk import WalkOptions
from hushnet.families import FAMILIES, family_of
from hushnet.runs.accounting import contribution_cost
from hushnet.runs.driver import RunDriver, RunRefused
from hushnet.runs.policy import NodePolicy, PolicyError, check_task, load_task
from hushnet.runs.spec import SignedRunSpec, SpecError, loads_bounded, verify_spec
from hushnet.tasks.base import TaskError
from hushnet.tasks.data import DataFileMissing, DataShapeError, load_public_eval

log = logging.getLogger("hushnet.runs")

RUN_PROTOCOL = "hushnet.run"
LEDGER_FILE = "privacy_ledger.sqlite"

def network_walk_options(spec, *, progress_every: int | None = None) -> WalkOptions:
    """Walk options for a real network: acks within seconds, not the simulator's 50 ms."""
    total = spec.total_steps()
    every = progress_every if progress_every is not None else max(1, total // 200)
    return WalkOptions(reliable=True, ack_timeout=2.0, max_retries=3, on_peer_down=spec.on_peer_down,
                       pause_retry=1.0, progress_every=every, prefetch_noise=True)


class RunService:
    """All runs of one node.  ``node`` is a started or starting :class:`hushnet.net.node.Node`."""

    def __init__(self, node, *, state_dir: pathlib.Path | None = None) -> None:
        self.node = node
        self.state_dir = pathlib.Path(state_dir or node.state_dir)
        self.runs: dict[str, RunDriver] = {}
        self.refused: dict[str, dict[str, Any]] = {}
        self._ledger: Ledger | None = None

    # ------------------------------------------------------------------ wiring
    def install(self) -> "RunService":
        self.node.register_handler(self, replace=True)
        for name, fn in self.commands().items():
            self.node.register_control(name, fn, replace=True)
        return self

    def commands(self) -> dict[str, Any]:
        return {"run.submit": self.c_submit, "run.start": self.c_start, "run.events": self.c_events,
                "run.status": self.c_status, "run.list": self.c_list, "run.report": self.c_report,
                "run.model": self.c_model, "run.cancel": self.c_cancel, "run.close": self.c_close,
                "run.ledger": self.c_ledger,
                **{name: functools.partial(fn, self) for f in FAMILIES for name, fn in f.commands().items()}}

    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:
            self._ledger = Ledger(self.state_dir / LEDGER_FILE, node_id=self.node.node_id)
        return self._ledger

    # handler API of hushnet.net.handlers
    protocol = RUN_PROTOCOL

    def handle(self, envelope) -> None:
        run = self.runs.get(envelope.run_id)
        if run is None:
            raise RunRefused("unknown-run", f"no run {envelope.run_id!r} at {self.node.node_id}")
        run.on_message(envelope.sender, bytes(envelope.payload))  # RunRefused → the sender sees the reason
        return None

    # ------------------------------------------------------------------ helpers
    def _ids(self) -> list[str]:
        d = self.node.directory
        if d is None:
            raise RuntimeError("node has no directory yet")
        by_vertex = {m.vertex: m.node_id for m in d.members}
        return [by_vertex.get(v, f"vertex{v}") for v in range(d.n_vertices)]

    def _verify(self, signed: SignedRunSpec):
        """Signature under an operator certificate issued by this network's CA."""
        if not signed.certificate_pem:
            raise SpecError("run spec carries no operator certificate")
        try:
            cert = x509.load_pem_x509_certificate(signed.certificate_pem)
            ca = x509.load_pem_x509_certificate(self.node.identity.ca_pem)
            cert.verify_directly_issued_by(ca)
        except Exception as exc:  # noqa: BLE001 - any failure means "not our operator"
            raise SpecError(f"the spec's certificate was not issued by this network's CA ({type(exc).__name__})") from None
        who = pki.identity_of(cert)
        if who is None or not who.is_operator:
            raise SpecError("the spec is signed by a certificate that is not an operator certificate")
        return verify_spec(signed, cert)

    # ------------------------------------------------------------------ commands
    async def c_submit(self, payload: bytes) -> bytes:
        t0 = time.perf_counter()
        try:
            signed = SignedRunSpec.from_bytes(payload)
        except SpecError as exc:
            return _json({"node": self.node.node_id, "accept": False, "reason": str(exc)})
        run_id = signed.spec.run_id
        if run_id in self.runs:
            r = self.runs[run_id]
            try:  # a resubmission proves its signature again: the run id alone is public
                self._verify(signed)
            except SpecError as exc:
                log.info("refused resubmission of run %s: %s", run_id, exc)
                return _json({"node": self.node.node_id, "run_id": run_id, "accept": False,
                              "reason": f"resubmission refused: {exc}", "state": r.state})
            return _json({"node": self.node.node_id, "run_id": run_id, "accept": True, "reason": "already accepted",
                          "state": r.state, **{k: v for k, v in r.decision.items() if k != "row"}})
        decision = await asyncio.get_running_loop().run_in_executor(None, self._decide, signed)
        decision["seconds"] = time.perf_counter() - t0
        out = {k: v for k, v in decision.items() if not k.startswith("_")}
        if not decision["accept"]:
            self.refused[decision.get("run_id", run_id)] = out
            log.info("refused run %s: %s", run_id, decision["reason"])
            return _json(out)
        spec, machine, cost, W = decision.pop("_spec"), decision.pop("_machine"), decision.pop("_cost"), decision.pop("_W")
        public_eval = decision.pop("_public_eval", None)
        node = self.node

        async def send(dst: str, data: bytes):
            return await node.send(dst, data, protocol=RUN_PROTOCOL, run_id=spec.run_id, timeout=30.0)

        # durable per-entry record (gossip schedule rows), if the family keeps one
        journal = family_of(spec.protocol).journal(self, spec, decision["vertex"], self._ids())
        self.runs[spec.run_id] = RunDriver(spec, decision["vertex"], self._ids(), machine, send, ledger=self.ledger,
                                           cost=cost, W=W, decision=out, public_eval=public_eval, journal=journal)
        log.info("accepted run %s (%s): %s", spec.run_id, spec.protocol, decision["reason"])
        return _json(out)

    def _decide(self, signed: SignedRunSpec) -> dict[str, Any]:
        """Everything that may take a while (spectrum, data loading) runs off the event loop."""
        me = self.node.node_id
        base: dict[str, Any] = {"node": me, "run_id": signed.spec.run_id, "accept": False}
        try:
            spec = self._verify(signed).validate()
        except SpecError as exc:
            return {**base, "reason": str(exc)}
        ids = self._ids()
        vertex = self.node.identity.vertex
        base["vertex"] = vertex
        from hushnet.privacy.graphs import parse_graph

        graph = parse_graph(spec.graph)
        if graph.n != len(ids):
            return {**base, "reason": f"spec graph {spec.graph} has {graph.n} vertices, this network has {len(ids)}"}
        want = {ids[int(v)] for v in graph.neighbors(vertex)}
        missing = sorted(want - set(self.node.neighbors))
        if missing:
            return {**base, "reason": f"the spec's graph makes {', '.join(missing)} neighbours of {me}, "
                                      "but the network does not connect them"}
        try:
            policy = NodePolicy.load(self.state_dir)
        except PolicyError as exc:
            return {**base, "reason": str(exc)}
        W = transition_matrix(spec.graph, spec.weights)
        local = policy.budget
        family = family_of(spec.protocol)
        dec = family.project(spec, vertex, local, W)
        row = None if dec.epsilon_row is None else {ids[v]: float(dec.epsilon_row[v]) for v in range(len(ids)) if v != vertex}
        base.update(row=row, worst_epsilon=dec.worst_epsilon if dec.epsilon_row is not None else None, bound=dec.bound,
                    budget={"epsilon": (local or spec.budget).epsilon, "delta": (local or spec.budget).delta})
        if dec.details.get("accounting_view") is not None:  # which view the accountant uses, and why
            base["accounting_view"] = dec.details["accounting_view"]
        if not dec.accept:
            return {**base, "reason": dec.reason}
        # lifetime budget: what this node already spent plus the projected run must fit
        ledger = self.ledger
        if local is not None and (ledger.budget is None or ledger.budget.epsilon != local.epsilon
                                  or ledger.budget.delta != local.delta):
            ledger.set_budget(LedgerBudget(local.epsilon, local.delta))
        cost = contribution_cost(spec, vertex, ids, W, ledger.orders)
        n_u = dec.details.get("N_u", 0.0)
        if ledger.budget is not None and n_u > 0:
            from hushnet.privacy.ledger import PrivacyEntry

            proj = PrivacyEntry.from_row(spec.run_id, spec.protocol, spec.view_model, "certified", cost.targets,
                                         cost.curves(spec.sigma) * float(np.ceil(n_u)))
            over = ledger.would_exceed(proj)
            if over:
                worst = max(over, key=over.get)
                return {**base, "reason": f"over budget: with what this node already spent, the run would bring its "
                                          f"certified loss toward {worst} to ε={over[worst]:.4g} "
                                          f"(lifetime budget ε={ledger.budget.epsilon:g})"}
        try:
            task = load_task(spec, policy)
            check_task(task, spec)
            public_eval = load_public_eval(self.state_dir, spec.protocol_params.get("eval_data"), task)
        except (DataFileMissing, DataShapeError, TaskError, ValueError) as exc:
            return {**base, "reason": f"local data/task: {exc}"}
        try:
            machine = family.node_machine(self.node, spec, vertex, ids, task, W, network_walk_options(spec))
        except (ValueError, TypeError, TaskError) as exc:
            return {**base, "reason": f"cannot build the {spec.protocol} machine: {exc}"}
        return {**base, "accept": True, "reason": dec.reason, "model_dim": getattr(task, "dim", None),
                "_spec": spec, "_machine": machine, "_cost": cost, "_W": W, "_public_eval": public_eval}

    def _run(self, payload: bytes) -> tuple[RunDriver, dict[str, Any]]:
        args = loads_bounded(payload or b"{}", "run command arguments")
        if not isinstance(args, dict):
            raise ValueError("run command arguments must be a JSON object")
        run_id = str(args.get("run_id", ""))
        run = self.runs.get(run_id)
        if run is None:
            if run_id in self.refused:
                raise KeyError(f"run {run_id} was refused here: {self.refused[run_id]['reason']}")
            raise KeyError(f"no run {run_id!r} at {self.node.node_id}")
        return run, args

    async def c_start(self, payload: bytes) -> bytes:
        run, _ = self._run(payload)
        run.start()
        return _json(run.status())

    async def c_events(self, payload: bytes) -> bytes:
        run, args = self._run(payload)
        after = int(args.get("after", 0))
        wait = min(float(args.get("wait", 0.0)), 30.0)
        events = await run.wait_events(after, wait)
        return _json({"node": self.node.node_id, "events": events, "next": after + len(events), "status": run.status()})

    async def c_status(self, payload: bytes) -> bytes:
        run, _ = self._run(payload)
        return _json(run.status())

    async def c_list(self, payload: bytes) -> bytes:
        return _json({"node": self.node.node_id, "runs": [r.status() for r in self.runs.values()],
                      "refused": list(self.refused.values())})

    async def c_report(self, payload: bytes) -> bytes:
        run, _ = self._run(payload)
        return _json(run.report())

    async def c_model(self, payload: bytes) -> bytes:
        run, _ = self._run(payload)
        m = run.model
        # state, reason and the finish record ride along so the operator learns *why* there is no
        # model here (not finished, stopped, a secure sum that aborted) in the same round trip
        return _json({"node": self.node.node_id, "run_id": run.run_id, "step": run.finish_step,
                      "model_b64": None if m is None else base64.b64encode(m.astype("<f8").tobytes()).decode(),
                      "dim": None if m is None else int(m.shape[0]), "protocol": run.spec.protocol,
                      "state": run.state, "reason": run.reason, "last_step": run.last_step,
                      "steps": run.spec.total_steps(), "result": run.finish_result})

    async def c_cancel(self, payload: bytes) -> bytes:
        run, args = self._run(payload)
        run.cancel(str(args.get("reason") or "cancelled by the operator"))
        return _json(run.status())

    async def c_close(self, payload: bytes) -> bytes:
        run, args = self._run(payload)
        run.close(deviated=bool(args.get("deviated", False)))
        return _json(run.status())

    async def c_ledger(self, payload: bytes) -> bytes:
        args = json.loads(payload or b"{}")
        delta = args.get("delta")
        spent = self.ledger.spent(delta=delta)
        entries = self.ledger.entries()
        runs: dict[str, dict[str, Any]] = {}
        for e in entries:  # which runs the lifetime totals come from
            r = runs.setdefault(e["run_id"], {"protocol": e["protocol"], "entries": 0})
            r["entries"] += 1
        b = self.ledger.budget
        return _json({"node": self.node.node_id, "spent": {t: {"epsilon": s.epsilon, "delta": s.delta, "bound": s.bound,
                                                             "entries": s.entries} for t, s in spent.items()},
                      "entries": len(entries), "runs": runs,
                      "budget": None if b is None else {"epsilon": b.epsilon, "delta": b.delta}})

    def close(self) -> None:
        for r in self.runs.values():
            r.shutdown()
        if self._ledger is not None:
            self._ledger.close()
            self._ledger = None


def install(node) -> RunService:
    """Give ``node`` the run service (call before or after ``node.start()``)."""
    return RunService(node).install()


def _json(doc: Any) -> bytes:
    return json.dumps(doc, default=_default, allow_nan=True).encode()


def _default(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, ProtocolError):
        return str(x)
    return str(x)
