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
import collections
import functools
import hashlib
import json
import logging
import os
import pathlib
import sqlite3
import threading
import time
import weakref
from typing import Any

import numpy as np
from cryptography import x509

from hushnet.engine.errors import ProtocolError
from hushnet.families import FAMILIES, family_of
from hushnet.families.walk.walker import WalkOptions
from hushnet.net import pki
from hushnet.net.errors import NodeStopping
from hushnet.privacy.ledger import Ledger, LedgerBudget, LedgerError, StoredBudgetError
from hushnet.protocols.registry import transition_matrix
from hushnet.runs.accounting import contribution_cost, rows_limit
from hushnet.runs.driver import RunDriver, RunRefused
from hushnet.runs.policy import POLICY_FILE, NodePolicy, PolicyError, check_task, load_task
from hushnet.runs.report_wire import PACKED_SPENT, pack_spent
from hushnet.runs.report_wire import VERSION as REPORT_VERSION
from hushnet.runs.run_store import STORE_FILE as RUN_STORE_FILE
from hushnet.runs.run_store import RunStore
from hushnet.runs.spec import SignedRunSpec, SpecError, loads_bounded, verify_spec
from hushnet.tasks.base import TaskError
from hushnet.tasks.data import DataFileMissing, DataShapeError, load_public_eval

log = logging.getLogger("hushnet.runs")

#: set to ``0`` in a node's environment to run new walks without checkpoints (the durability benchmark's
#: baseline only: a node killed then loses the token it holds, as before issue 14)
DURABLE_ENV = "HUSHNET_RUNS_DURABLE"

RUN_PROTOCOL = "hushnet.run"
#: signed specs already verified in this process (see RunService._verify)
_VERIFIED: "collections.OrderedDict[str, None]" = collections.OrderedDict()


def _verified_key(signed: SignedRunSpec, ca_pem: bytes) -> str:
    h = hashlib.sha256()
    # the run id is not among the signed bytes (it is derived from them and checked): it is part of the key
    for part in (
        ca_pem,
        signed.certificate_pem,
        signed.signature,
        signed.spec.canonical_bytes(),
        signed.spec.run_id.encode(),
    ):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()


LEDGER_FILE = "privacy_ledger.sqlite"


def network_walk_options(spec, *, progress_every: int | None = None) -> WalkOptions:
    """Walk options for a real network: acks within seconds, not the simulator's 50 ms."""
    total = spec.total_steps()
    every = progress_every if progress_every is not None else max(1, total // 200)
    return WalkOptions(
        reliable=True,
        ack_timeout=2.0,
        max_retries=3,
        on_peer_down=spec.on_peer_down,
        pause_retry=1.0,
        progress_every=every,
        prefetch_noise=True,
    )


class RunService:
    """All runs of one node.  ``node`` is a started or starting :class:`hushnet.net.node.Node`."""

    #: how long one delivery of a run's envelope may take (the transport retries UNAVAILABLE within it);
    #: a machine that asks for it (``RunDriver``'s ``redeliver_for``) has a failed one sent again
    send_timeout_s: float = 30.0

    def __init__(self, node, *, state_dir: pathlib.Path | None = None) -> None:
        # a bad HUSHNET_COST_ROWS_MB stops the service here, not at a report or top-up mid-run
        rows_limit()
        self.node = node
        self.state_dir = pathlib.Path(state_dir or node.state_dir)
        self.runs: dict[str, RunDriver] = {}
        self.refused: dict[str, dict[str, Any]] = {}
        self.unrestored: dict[
            str, str
        ] = {}  # durable runs this node could not take up again after a restart
        self._ledger: Ledger | None = None
        self._store: RunStore | None = None
        self._store_lock = (
            threading.Lock()
        )  # the store may be opened from a worker thread (c_submit)
        self._restore_task: asyncio.Task | None = None
        self._close_tasks: list[asyncio.Task] = []
        self._closed = False

    # ------------------------------------------------------------------ wiring
    def install(self) -> "RunService":
        self.node.register_handler(self, replace=True)
        self.node.register_handler(CloseRecords(self), replace=True)
        for name, fn in self.commands().items():
            self.node.register_control(name, fn, replace=True)
        if (self.state_dir / RUN_STORE_FILE).exists():
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            if (
                loop is not None
            ):  # a restarted node: take its runs up again once it knows the network
                self._restore_task = loop.create_task(self.restore_runs())
        return self

    def commands(self) -> dict[str, Any]:
        return {
            "run.submit": self.c_submit,
            "run.start": self.c_start,
            "run.events": self.c_events,
            "run.status": self.c_status,
            "run.list": self.c_list,
            "run.report": self.c_report,
            "run.model": self.c_model,
            "run.cancel": self.c_cancel,
            "run.close": self.c_close,
            "run.ledger": self.c_ledger,
            "run.resume": self.c_resume,
            **{
                name: functools.partial(fn, self)
                for f in FAMILIES
                for name, fn in f.commands().items()
            },
        }

    def _open(self, what: str) -> None:
        """Refuse work once closed: the node is stopping, and a store opened now would outlive it."""
        if self._closed:
            raise NodeStopping(f"node {self.node.node_id} stopping: its {what} is closed")

    @property
    def ledger(self) -> Ledger:
        self._open("privacy ledger")
        if self._ledger is None:
            path = self.state_dir / LEDGER_FILE
            try:
                self._ledger = Ledger(path, node_id=self.node.node_id)
            except StoredBudgetError as exc:
                # a budget an older build stored (a NaN ε …): the node's policy says what it is now;
                # without a policy budget the node stops here rather than enforce nothing
                try:
                    budget = NodePolicy.load(self.state_dir).budget
                except PolicyError:
                    budget = None
                if budget is None:
                    raise StoredBudgetError(
                        f"{path}: {exc}; give the node a [budget] in its {POLICY_FILE} to replace it"
                    ) from None
                self._ledger = Ledger(
                    path,
                    node_id=self.node.node_id,
                    budget=LedgerBudget(budget.epsilon, budget.delta),
                )
                log.warning(
                    "%s: the stored ledger budget could not be read (%s); replaced by the node "
                    "policy's epsilon=%g delta=%g, all spending kept",
                    self.node.node_id,
                    exc,
                    budget.epsilon,
                    budget.delta,
                )
        return self._ledger

    @property
    def store(self) -> RunStore:
        self._open("run store")
        if self._store is None:
            self._store = RunStore(self.state_dir / RUN_STORE_FILE)
        return self._store

    # ------------------------------------------------------------------ restart
    async def restore_runs(self, *, wait: float = 120.0) -> list[str]:
        """Take up every durable run of this node again after a restart (waits for the directory).

        Each run is rebuilt from its stored signed spec (signature checked again), then its driver
        and machine are loaded from the last checkpoint; a walk that had not had its handoff
        acknowledged re-sends the token.  A run that cannot be rebuilt is listed in ``run list``
        under ``unrestored`` with the reason."""
        end = time.monotonic() + wait
        while self.node.directory is None and time.monotonic() < end:
            await asyncio.sleep(0.1)
        if self.node.directory is None:
            log.warning("runs not restored: the node has no directory after %.0f s", wait)
            return []
        done = []
        loop = asyncio.get_running_loop()
        for row in self.store.runs():
            rid = row["run_id"]
            if rid in self.runs:
                continue
            try:
                run = await loop.run_in_executor(None, self._rebuild, row)
            except Exception as exc:  # noqa: BLE001 - reported, never silently dropped
                self.unrestored[rid] = f"{type(exc).__name__}: {exc}"[:500]
                log.warning(
                    "run %s could not be restored after the restart: %s", rid, self.unrestored[rid]
                )
                continue
            self.runs[rid] = run
            charged = sum(
                1 for e in self.ledger.entries(rid) if not e["note"].startswith("deviation top-up")
            )
            run.restore(row["driver"], row["machine"], row["state"], row["reason"], charged)
            log.info("restored run %s at step %d (state %s)", rid, run.last_step, run.state)
            done.append(rid)
            if run.state not in (
                "closed",
                "cancelled",
            ):  # closed while this node was down? ask around
                self._ask_close_soon(rid)
        return done

    def _rebuild(self, row: dict[str, Any]) -> RunDriver:
        signed = SignedRunSpec.from_bytes(row["signed"])
        spec = self._verify(signed).validate()
        ids = self._ids()
        vertex = int(row["vertex"])
        if vertex != self.node.identity.vertex:
            raise SpecError(
                f"stored run was accepted as vertex {vertex}, this node is now vertex {self.node.identity.vertex}"
            )
        W = transition_matrix(spec.graph, spec.weights)
        policy = NodePolicy.load(self.state_dir)
        task = load_task(spec, policy)
        check_task(task, spec)
        public_eval = load_public_eval(self.state_dir, spec.protocol_params.get("eval_data"), task)
        family = family_of(spec.protocol)
        cost = contribution_cost(spec, vertex, ids, W, self.ledger.orders)
        machine = family.node_machine(
            self.node, spec, vertex, ids, task, W, network_walk_options(spec)
        )
        journal = family.journal(self, spec, vertex, ids)
        return self._driver(
            spec,
            vertex,
            ids,
            machine,
            self._sender(spec),
            ledger=self.ledger,
            cost=cost,
            W=W,
            decision=row["decision"],
            public_eval=public_eval,
            journal=journal,
            store=self.store,
        )

    def _sender(self, spec):
        node = self.node

        async def send(dst: str, data: bytes, *, seq: int | None = None, started=None):
            # ``seq``: the envelope's number when the driver sends the same bytes again after a failed
            # delivery — the receiver drops a copy it already took by it (never delivered twice);
            # ``started``: called once the delivery is under way (see hushnet.runs.driver.SendFn)
            return await node.send(
                dst,
                data,
                protocol=RUN_PROTOCOL,
                run_id=spec.run_id,
                seq=seq,
                timeout=self.send_timeout_s,
                started=started,
            )

        return send

    # handler API of hushnet.net.handlers
    protocol = RUN_PROTOCOL

    def handle(self, envelope) -> None:
        # closed: its runs' stores and ledger are too — UNAVAILABLE "node stopping" to the sender
        self._open("run service")
        run = self.runs.get(envelope.run_id)
        if run is None:
            raise RunRefused("unknown-run", f"no run {envelope.run_id!r} at {self.node.node_id}")
        run.on_message(
            envelope.sender, bytes(envelope.payload)
        )  # RunRefused → the sender sees the reason
        return None

    # ------------------------------------------------------------------ helpers
    def _ids(self) -> list[str]:
        d = self.node.directory
        if d is None:
            raise RuntimeError("node has no directory yet")
        by_vertex = {m.vertex: m.node_id for m in d.members}
        return [by_vertex.get(v, f"vertex{v}") for v in range(d.n_vertices)]

    def _verify(self, signed: SignedRunSpec):
        """Signature under an operator certificate issued by this network's CA.

        A success is remembered per process (:data:`_VERIFIED`, keyed by the SHA-256 of the CA, the
        certificate, the signature, the signed bytes and the run id): the K nodes a process hosts receive the same
        signed spec, and K certificate-chain and signature checks of identical bytes would give K
        identical answers.  Failures are not remembered (each is re-checked and refused with its reason).
        """
        if not signed.certificate_pem:
            raise SpecError("run spec carries no operator certificate")
        key = _verified_key(signed, self.node.identity.ca_pem)
        if key in _VERIFIED:
            _VERIFIED.move_to_end(key)
            return signed.spec
        spec = self._verify_once(signed)
        _VERIFIED[key] = None
        while len(_VERIFIED) > 1024:
            _VERIFIED.popitem(last=False)
        return spec

    def _verify_once(self, signed: SignedRunSpec):
        try:
            cert = x509.load_pem_x509_certificate(signed.certificate_pem)
            ca = x509.load_pem_x509_certificate(self.node.identity.ca_pem)
            cert.verify_directly_issued_by(ca)
        except Exception as exc:  # noqa: BLE001 - any failure means "not our operator"
            raise SpecError(
                f"the spec's certificate was not issued by this network's CA ({type(exc).__name__})"
            ) from None
        who = pki.identity_of(cert)
        if who is None or not who.is_operator:
            raise SpecError(
                "the spec is signed by a certificate that is not an operator certificate"
            )
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
                return _json(
                    {
                        "node": self.node.node_id,
                        "run_id": run_id,
                        "accept": False,
                        "reason": f"resubmission refused: {exc}",
                        "state": r.state,
                    }
                )
            return _json(
                {
                    "node": self.node.node_id,
                    "run_id": run_id,
                    "accept": True,
                    "reason": "already accepted",
                    "state": r.state,
                    **{k: v for k, v in r.decision.items() if k != "row"},
                }
            )
        decision = await asyncio.get_running_loop().run_in_executor(None, self._decide, signed)
        decision["seconds"] = time.perf_counter() - t0
        out = {k: v for k, v in decision.items() if not k.startswith("_")}
        if not decision["accept"]:
            self.refused[decision.get("run_id", run_id)] = out
            log.info("refused run %s: %s", run_id, decision["reason"])
            return _json(out)
        spec, machine, cost, W = (
            decision.pop("_spec"),
            decision.pop("_machine"),
            decision.pop("_cost"),
            decision.pop("_W"),
        )
        public_eval = decision.pop("_public_eval", None)
        send = self._sender(spec)

        ids = self._ids()

        def durable() -> tuple[Any, RunStore | None]:
            # durable per-entry record (gossip schedule rows), if the family keeps one, and the run on disk
            # before the acceptance is answered.  In a worker thread (both stores lock their connection):
            # opening a node's two SQLite files and the fsync'd writes took ~77 ms of the event loop per
            # node (cProfile, Muffliato-GD, 32 nodes a process), 26 s of a 342-node host's loop per run
            journal = family_of(spec.protocol).journal(self, spec, decision["vertex"], ids)
            if not getattr(machine, "durable", False) or os.environ.get(DURABLE_ENV, "1") == "0":
                return journal, None
            with self._store_lock:
                store = self.store
            store.accept(spec.run_id, payload, decision["vertex"], out)
            return journal, store

        journal, store = await asyncio.get_running_loop().run_in_executor(None, durable)
        self.runs[spec.run_id] = run = self._driver(
            spec,
            decision["vertex"],
            self._ids(),
            machine,
            send,
            ledger=self.ledger,
            cost=cost,
            W=W,
            decision=out,
            public_eval=public_eval,
            journal=journal,
            store=store,
        )
        # a walk's charges proven within budget now, off the token's path (issue 12); a failure here
        # only leaves them to the exact path
        try:
            await asyncio.get_running_loop().run_in_executor(None, run.prepare_charges)
        except (LedgerError, ValueError, sqlite3.Error) as exc:
            log.warning(
                "run %s: charges not prepared (%s); each is checked at its visit", spec.run_id, exc
            )
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
            return {
                **base,
                "reason": f"spec graph {spec.graph} has {graph.n} vertices, this network has {len(ids)}",
            }
        want = {ids[int(v)] for v in graph.neighbors(vertex)}
        missing = sorted(want - set(self.node.neighbors))
        if missing:
            return {
                **base,
                "reason": f"the spec's graph makes {', '.join(missing)} neighbours of {me}, "
                "but the network does not connect them",
            }
        try:
            policy = NodePolicy.load(self.state_dir)
        except PolicyError as exc:
            return {**base, "reason": str(exc)}
        W = transition_matrix(spec.graph, spec.weights)
        local = policy.budget
        family = family_of(spec.protocol)
        dec = family.project(spec, vertex, local, W)
        row = (
            None
            if dec.epsilon_row is None
            else {ids[v]: float(dec.epsilon_row[v]) for v in range(len(ids)) if v != vertex}
        )
        base.update(
            row=row,
            worst_epsilon=dec.worst_epsilon if dec.epsilon_row is not None else None,
            bound=dec.bound,
            budget={
                "epsilon": (local or spec.budget).epsilon,
                "delta": (local or spec.budget).delta,
            },
        )
        if (
            dec.details.get("accounting_view") is not None
        ):  # which view the accountant uses, and why
            base["accounting_view"] = dec.details["accounting_view"]
        if not dec.accept:
            return {**base, "reason": dec.reason}
        # lifetime budget: what this node already spent plus the projected run must fit
        ledger = self.ledger
        if local is not None and (
            ledger.budget is None
            or ledger.budget.epsilon != local.epsilon
            or ledger.budget.delta != local.delta
        ):
            ledger.set_budget(LedgerBudget(local.epsilon, local.delta))
        cost = contribution_cost(spec, vertex, ids, W, ledger.orders)
        n_u = dec.details.get("N_u", 0.0)
        if ledger.budget is not None and n_u > 0:
            from hushnet.privacy.ledger import PrivacyEntry

            proj = PrivacyEntry.from_row(
                spec.run_id,
                spec.protocol,
                spec.view_model,
                "certified",
                cost.targets,
                cost.curves(spec.sigma) * float(np.ceil(n_u)),
            )
            over = ledger.would_exceed(proj)
            if over:
                worst = max(over, key=over.get)
                return {
                    **base,
                    "reason": f"over budget: with what this node already spent, the run would bring its "
                    f"certified loss toward {worst} to ε={over[worst]:.4g} "
                    f"(lifetime budget ε={ledger.budget.epsilon:g})",
                }
        try:
            task = load_task(spec, policy)
            check_task(task, spec)
            public_eval = load_public_eval(
                self.state_dir, spec.protocol_params.get("eval_data"), task
            )
        except (DataFileMissing, DataShapeError, TaskError, ValueError) as exc:
            return {**base, "reason": f"local data/task: {exc}"}
        try:
            machine = family.node_machine(
                self.node, spec, vertex, ids, task, W, network_walk_options(spec)
            )
        except (ValueError, TypeError, TaskError) as exc:
            return {**base, "reason": f"cannot build the {spec.protocol} machine: {exc}"}
        return {
            **base,
            "accept": True,
            "reason": dec.reason,
            "model_dim": getattr(task, "dim", None),
            "_spec": spec,
            "_machine": machine,
            "_cost": cost,
            "_W": W,
            "_public_eval": public_eval,
        }

    def _run(self, payload: bytes) -> tuple[RunDriver, dict[str, Any]]:
        args = loads_bounded(payload or b"{}", "run command arguments")
        if not isinstance(args, dict):
            raise ValueError("run command arguments must be a JSON object")
        run_id = str(args.get("run_id", ""))
        run = self.runs.get(run_id)
        if run is None:
            if run_id in self.refused:
                raise KeyError(f"run {run_id} was refused here: {self.refused[run_id]['reason']}")
            if run_id in self.unrestored:
                raise KeyError(
                    f"run {run_id} could not be restored here after a restart: {self.unrestored[run_id]}"
                )
            raise KeyError(f"no run {run_id!r} at {self.node.node_id}")
        return run, args

    async def c_start(self, payload: bytes) -> bytes:
        """Mark the run started and answer; its first round runs afterwards on the host's
        :class:`StartQueue` (so a host answers every ``run.start`` of a batch before any first round)."""
        run, _ = self._run(payload)
        if run.mark_started() and run.state == "running":
            start_queue().put(self, run)
        return _json(run.status())

    async def c_events(self, payload: bytes) -> bytes:
        """``{"run_id", "after", "wait"?, "brief"?, "seen"?}``: the events from ``after`` on and the status.

        ``brief``: the status without what a visit changes (:meth:`RunDriver.status`), and its
        ``digest``.  With ``seen`` (the digest of the brief status the watcher holds) and no new event,
        the answer is empty: nothing to say (issue 12: a 2048-node watch had every node build, sign and
        send its status every sweep, about half of a host's busy time during the walk it watched)."""
        run, args = self._run(payload)
        after = int(args.get("after", 0))
        wait = min(float(args.get("wait", 0.0)), 30.0)
        brief = bool(args.get("brief", False))
        events = await run.wait_events(after, wait)
        nxt = events[-1]["seq"] + 1 if events else after
        doc: dict[str, Any] = {"node": self.node.node_id, "events": events, "next": nxt}
        if not brief:
            return _json({**doc, "status": run.status()})
        status = run.status(brief=True)
        digest = hashlib.sha256(_json(status)).hexdigest()[:32]
        if not events and args.get("seen") == digest:
            return b""
        return _json({**doc, "digest": digest, "status": status})

    async def c_status(self, payload: bytes) -> bytes:
        run, _ = self._run(payload)
        return _json(run.status())

    async def c_list(self, payload: bytes) -> bytes:
        return _json(
            {
                "node": self.node.node_id,
                "runs": [r.status() for r in self.runs.values()],
                "refused": list(self.refused.values()),
                "unrestored": [{"run_id": k, "reason": v} for k, v in self.unrestored.items()],
            }
        )

    async def c_report(self, payload: bytes) -> bytes:
        run, args = self._run(payload)
        # packed: per-target rows as float64 bytes (hushnet.runs.report_wire), written from the arrays;
        # the flag is the version the client reads (true: 1)
        p = args.get("packed")
        version = 0 if not p else (min(p, REPORT_VERSION) if type(p) is int and p > 1 else 1)
        return _json(run.report(packed=version))

    async def c_model(self, payload: bytes) -> bytes:
        run, _ = self._run(payload)
        m = run.model
        # state, reason and the finish record ride along so the operator learns *why* there is no
        # model here (not finished, stopped, a secure sum that aborted) in the same round trip
        return _json(
            {
                "node": self.node.node_id,
                "run_id": run.run_id,
                "step": run.finish_step,
                "model_b64": None
                if m is None
                else base64.b64encode(m.astype("<f8").tobytes()).decode(),
                "dim": None if m is None else int(m.shape[0]),
                "protocol": run.spec.protocol,
                "state": run.state,
                "reason": run.reason,
                "last_step": run.last_step,
                "steps": run.spec.total_steps(),
                "result": run.finish_result,
            }
        )

    async def c_cancel(self, payload: bytes) -> bytes:
        run, args = self._run(payload)
        run.cancel(str(args.get("reason") or "cancelled by the operator"))
        return _json(run.status())

    async def c_resume(self, payload: bytes) -> bytes:
        """``{"run_id", "lost": [node ids]}``: the operator declares holders that never came back; see
        :meth:`RunDriver.resume` (the node holding the last durable copy takes the walk up again)."""
        run, args = self._run(payload)
        lost = args.get("lost")
        if not isinstance(lost, list) or not lost or not all(isinstance(n, str) for n in lost):
            raise ValueError("run.resume needs 'lost': a non-empty list of node ids")
        from_step = args.get("from_step")
        return _json(
            run.resume(
                lost,
                take_up=bool(args.get("take_up", True)),
                from_step=None if from_step is None else int(from_step),
            )
        )

    async def c_close(self, payload: bytes) -> bytes:
        run, args = self._run(payload)
        record = args.get("record")
        if (
            record is not None
        ):  # the operator's signed close: kept for neighbours that are down right now
            rid, deviated = self._verify_close(str(record))
            if rid != run.run_id or deviated != bool(args.get("deviated", False)):
                raise ValueError("the close record does not match the close request")
            self.store.put_close(rid, str(record))
        run.close(deviated=bool(args.get("deviated", False)))
        return _json(run.status())

    def _verify_close(self, record: str) -> tuple[str, bool]:
        """A close record signed by an operator certificate of this network's CA: ``(run_id, deviated)``."""
        from hushnet.runs.spec import parse_close, verify_close

        _, _, _, cert_pem = parse_close(record)
        cert = self._operator_cert(cert_pem)
        return verify_close(record, cert)

    def _operator_cert(self, cert_pem: bytes):
        if not cert_pem:
            raise SpecError("no operator certificate")
        try:
            cert = x509.load_pem_x509_certificate(cert_pem)
            cert.verify_directly_issued_by(
                x509.load_pem_x509_certificate(self.node.identity.ca_pem)
            )
        except Exception as exc:  # noqa: BLE001 - any failure means "not our operator"
            raise SpecError(
                f"the certificate was not issued by this network's CA ({type(exc).__name__})"
            ) from None
        who = pki.identity_of(cert)
        if who is None or not who.is_operator:
            raise SpecError("signed by a certificate that is not an operator certificate")
        return cert

    # ---- close records between neighbours (issue 14: a top-up reaches a node that was down) ----------
    def _driver(self, spec, *args: Any, **kw: Any) -> RunDriver:
        """A run's driver, wired to ask the neighbours for the close record when one says the run is closed."""
        node = self.node
        run = RunDriver(
            spec,
            *args,
            next_seq=lambda dst, rid=spec.run_id: node.next_seq(RUN_PROTOCOL, rid, dst),
            **kw,
        )
        run.on_peer_closed = lambda _peer, rid=spec.run_id: self._ask_close_soon(rid)
        return run

    def _ask_close_soon(self, run_id: str) -> None:
        """Start :meth:`ask_close` for ``run_id`` unless it is already asking."""
        if self._closed or any(
            t.get_name() == f"ask-close:{run_id}" and not t.done() for t in self._close_tasks
        ):
            return
        self._close_tasks = [t for t in self._close_tasks if not t.done()]
        self._close_tasks.append(
            asyncio.get_event_loop().create_task(self.ask_close(run_id), name=f"ask-close:{run_id}")
        )

    async def ask_close(self, run_id: str, *, attempts: int = 12, every: float = 5.0) -> None:
        """A restored run that may have been closed while this node was down: ask the run's neighbours for
        the operator's signed close record until the run is closed here (the answer arrives as a
        :class:`CloseRecords` envelope and is applied there) or ``attempts`` rounds passed."""
        for _ in range(attempts):
            run = self.runs.get(run_id)
            if run is None or run.state in ("closed", "cancelled"):
                return
            ask = json.dumps({"ask": run_id}).encode()
            nbrs = [n for n in self.node.neighbors if n in run.vertex_of]
            await asyncio.gather(
                *(
                    self.node.send(n, ask, protocol=CLOSE_PROTOCOL, run_id=run_id, timeout=every)
                    for n in nbrs
                ),
                return_exceptions=True,
            )
            await asyncio.sleep(every)

    async def c_ledger(self, payload: bytes) -> bytes:
        args = json.loads(payload or b"{}")
        packed = bool(args.get("packed"))  # totals as columns (report_wire.pack_spent)
        return _json(ledger_doc(self.ledger, self.node.node_id, args.get("delta"), packed=packed))

    def close(self) -> None:
        """Stop the runs' timers and senders, then close the ledger and the run store (once).

        A node closes it after its server stopped accepting (:meth:`hushnet.net.node.Node.attach`); a
        handler or command that still reaches the service afterwards gets :class:`NodeStopping`
        (UNAVAILABLE "node stopping" to its caller), and nothing reopens the stores."""
        for f in self._detach():
            f.close()

    async def aclose(self) -> None:
        """:meth:`close`, with the ledger and the run store closed in a worker thread.

        Why: closing a SQLite file checkpoints and fsyncs it; a host stopping hundreds of nodes did that on its
        event loop for every node in turn (see :func:`hushnet.net.node.close_off_loop`).  The runs' timers and
        workers are stopped first, on the loop, so nothing writes the files while they close."""
        files = self._detach()
        if files:
            from hushnet.net.node import close_off_loop

            await close_off_loop(*files)

    def _detach(self) -> list[Any]:
        """Stop the runs' timers and senders and refuse further work (once); returns the files to close."""
        if self._closed:
            return []
        self._closed = True
        if self._restore_task is not None:
            self._restore_task.cancel()
        for t in self._close_tasks:
            t.cancel()
        for r in self.runs.values():
            r.shutdown()
        files = [f for f in (self._ledger, self._store) if f is not None]
        self._ledger = self._store = None
        return files


class StartQueue:
    """The first rounds of the runs started in one host process (one event loop), one at a time, in order.

    Why (issue 12): ``run.start`` used to run the machine's first round inline — Muffliato-GD's gradient,
    noise, ledger charge toward every node, checkpoint and first messages — so a host answering the
    operator's batched ``run.start`` for its 410 nodes acknowledged them one first round after the other
    (82 s from the first start to the last at n = 2048), and its early nodes waited for its late ones.
    Now :meth:`RunService.c_start` only marks the run started (:meth:`RunDriver.mark_started`) and queues
    it here; one worker task per loop runs the queued first rounds (:meth:`RunDriver.begin`), one per
    turn of the loop: between two of them the loop serves its links and commands (first messages leave,
    neighbours' arrive, a batch's answers go out).  One at a time is the bound on concurrency per host: a
    first round is synchronous work on the loop, and several per turn would only lengthen its stalls."""

    def __init__(self) -> None:
        self._queue: collections.deque[tuple[RunService, RunDriver]] = collections.deque()
        self._worker: asyncio.Task | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        #: first rounds run by this queue (the machine's RunStarted delivered)
        self.begun = 0
        #: since the queue was last empty: first rounds run, their seconds on the loop (sum, longest), and
        #: when the first of them was queued — logged when it drains (what a host's starts cost)
        self._drain_stats = [0, 0.0, 0.0, 0.0]

    def __len__(self) -> int:
        return len(self._queue)

    def put(self, service: RunService, run: RunDriver) -> None:
        """Queue ``run``'s first round (``service``: its node's, skipped if that node stops meanwhile)."""
        if not self._queue and self._idle.is_set():
            self._drain_stats = [0, 0.0, 0.0, time.monotonic()]
        self._queue.append((service, run))
        self._idle.clear()
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._work())

    async def idle(self) -> None:
        """Return once every queued first round has run (or been skipped)."""
        await self._idle.wait()

    async def _work(self) -> None:
        try:
            while self._queue:
                await asyncio.sleep(0)  # the start's answer (and the loop's other work) first
                service, run = self._queue.popleft()
                if service._closed:  # the node is stopping: its ledger and store are closed
                    continue
                t = time.perf_counter()
                try:
                    was = run.begun
                    run.begin()  # nothing for a run cancelled, stopped or begun meanwhile
                    self.begun += run.begun and not was
                except Exception as exc:  # noqa: BLE001 - one run's bug must not stop the others' starts
                    log.exception("run %s at %s: first round failed", run.run_id, run.node_id)
                    run._stop(f"its first round failed: {type(exc).__name__}: {exc}")
                took = time.perf_counter() - t
                st = self._drain_stats
                st[0], st[1], st[2] = st[0] + 1, st[1] + took, max(st[2], took)
        finally:
            if not self._queue:
                self._idle.set()
                k, total, longest, since = self._drain_stats
                if k:
                    log.info(
                        "first rounds of %d started runs in %.2f s: %.2f s of it in them "
                        "(%.1f ms each on average, longest %.1f ms)",
                        k,
                        time.monotonic() - since,
                        total,
                        1e3 * total / k,
                        1e3 * longest,
                    )


#: one start queue per event loop (a host process runs all its nodes on one)
_START_QUEUES: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, StartQueue]" = (
    weakref.WeakKeyDictionary()
)


def start_queue() -> StartQueue:
    """The running loop's :class:`StartQueue`."""
    loop = asyncio.get_running_loop()
    q = _START_QUEUES.get(loop)
    if q is None:
        q = _START_QUEUES[loop] = StartQueue()
    return q


CLOSE_PROTOCOL = "hushnet.run-close"


class CloseRecords:
    """Peer protocol: ``{"ask": run_id}`` → the operator's signed close record of that run, if this node
    has it; ``{"record": …}`` → verified (operator certificate of this network's CA, signature), then the
    run is closed here — with its deviation top-up, applied once (the driver's ``topped_up``).  A
    neighbour cannot forge a close: only what the operator signed is applied."""

    protocol = CLOSE_PROTOCOL

    def __init__(self, service: RunService) -> None:
        self.service = service

    def handle(self, envelope):
        from hushnet.net.handlers import OutgoingEnvelope

        svc = self.service
        doc = loads_bounded(bytes(envelope.payload) or b"{}", "close record message")
        if not isinstance(doc, dict):
            raise ValueError("close record message must be a JSON object")
        if "ask" in doc:
            rec = svc.store.close_record(str(doc["ask"]))
            if rec is None:
                return None
            return [
                OutgoingEnvelope(
                    to=envelope.sender,
                    payload=json.dumps({"record": rec}).encode(),
                    run_id=str(doc["ask"]),
                    protocol=CLOSE_PROTOCOL,
                )
            ]
        rid, deviated = svc._verify_close(str(doc.get("record", "")))  # noqa: SLF001
        run = svc.runs.get(rid)
        if run is None or run.state in ("closed", "cancelled"):
            return None
        svc.store.put_close(rid, str(doc["record"]))
        log.info(
            "run %s closed from the operator's signed record relayed by %s (deviated=%s)",
            rid,
            envelope.sender,
            deviated,
        )
        run.close(deviated=deviated)
        return None


def install(node) -> RunService:
    """Give ``node`` the run service (call before or after ``node.start()``)."""
    return RunService(node).install()


def ledger_doc(
    ledger: Ledger, node_id: str, delta: float | None, *, packed: bool = False
) -> dict[str, Any]:
    """A node's ``run.ledger`` answer: its lifetime totals toward every target (at ``delta``, default each
    target's budget δ), entries by run, and its budget; ``packed``: the totals as columns
    (:func:`hushnet.runs.report_wire.pack_spent`, read back by ``unpack_ledger``).

    The totals are the ledger's columns, each distinct curve converted once: one :class:`Spent` per
    target and every curve converted were most of this answer's CPU at n = 2048 (issue 12); the numbers
    are :meth:`Ledger.spent`'s, bit for bit."""
    cols = ledger.spent_columns(delta)
    # which runs the lifetime totals come from (counted in SQL: reading every entry's costs for this was
    # most of the answer's time at n = 1024)
    counts = ledger.entry_counts()
    budget = ledger.budget
    if packed:
        spent: dict[str, Any] = pack_spent(cols)
    else:
        spent = {
            t: {"epsilon": e, "delta": d, "bound": bound, "entries": k}
            for t, e, d, bound, k in zip(
                cols.keys,
                cols.epsilon.tolist(),
                cols.delta.tolist(),
                cols.bounds(),
                cols.entries.tolist(),
            )
        }
    doc = {
        "node": node_id,
        "spent": spent,
        "entries": sum(n for _, _, n in counts),
        "runs": {rid: {"protocol": proto, "entries": n} for rid, proto, n in counts},
        "budget": None if budget is None else {"epsilon": budget.epsilon, "delta": budget.delta},
    }
    if packed:
        doc[PACKED_SPENT] = 1
    return doc


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
