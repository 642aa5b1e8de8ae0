"""The papers' houses experiments over a real network, checked against the simulator (issue 12).

``python -m hushnet.runs.net_experiments --protocol P --nodes N`` starts a local network of N
hosted nodes (real processes, mutual TLS, ``LocalCluster(per_process=K)``) on the papers' graph
(``hypercube:log2 N``), gives node i its shard of the papers' houses split (80/20 stratified, seed
42), runs protocol P with **public-seed noise** (``noise = "public-seed"``: reproducible from the run
seed, for experiments only — NOT private) to the end, then runs the *same* spec in the simulator
(the same machines, the same seed) and checks parity:

* models: every node's network model equals the simulator's to 1e-12 (a walk: the holder's model);
* contributions: each node made as many data contributions as in the simulator;
* ledgers: each checked node's certified row in the run report (what its ledger charged) equals the
  replay of the simulator's ledger entries through the same cost (``contribution_cost``) and the
  same RDP → (ε, δ) conversion.

It writes ``net_<protocol>_<N>.json`` and ``.png`` (default ``benchmarks/figures/out``): certified
mean-pair and worst-pair ε from the nodes' reports, local DP at the same noise and the same
contributions (each node's N_u contributions seen in the clear: RDP ``N_u·α/(2σ²)``, converted by
the same rule), their ratio, the test accuracy beside the non-private and local-DP baselines, and
the wall times.  Progress lines go to stdout while it runs.

Protocols (why these settings, see :data:`CONFIGS`): ``rw-dpsgd`` — the configuration of ``make
demo-large`` (σ = 8, clip 0.1, cap 50, T = steps_per_node·n); ``muffliato-gd`` — [M] Alg. 3 on the
papers' model (8 weights + intercept, clip 1, step 0.7, 8 rows per node as in [M] Fig. 1c), a few
gradient steps of K synchronous gossip rounds on the hypercube (the network runs the node's own
links; [M] Fig. 1c's fresh Erdős–Rényi graph per step needs a complete topology).

Scale limits measured on this code (docs/runs.md "The papers' experiments over the network"): the
walk's hop rate is bounded by the per-hop ledger charge; Muffliato-GD's certified projection is
computed once per host process for the public parameters (:mod:`hushnet.families.gossip.allpairs`;
on the hypercube one observer's view serves every pair, by verified symmetry): 0.5 s per process at
n = 1024 instead of an estimated 10–20 minutes per node.  The round timeout (a neighbour's silence
that counts as a dropout) grows with n (``max(10, n/8)`` seconds): hosted nodes share an event loop.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import numpy as np

from hushnet.families.gossip.params import MUFFLIATO_GD
from hushnet.families.walk.params import RW_DPSGD
from hushnet.runs.demo import LARGE_CONFIGS

REPO = pathlib.Path(__file__).resolve().parents[2]
DELTA = 1e-5
#: parity tolerance of the models (float summation order differs between the simulator and the nodes)
MODEL_ATOL = 1e-12
#: parity tolerance of the ledgers' ε (the same computation on the same entries: float error only)
EPS_RTOL = 1e-9


@dataclass(frozen=True)
class ExperimentConfig:
    """One protocol's experiment: public spec fields, the split, the node budget, the defaults."""

    spec: dict[str, Any]
    per_node: int | None  # training rows per node (None: all training rows, evenly)
    node_budget: float
    steps: int | None = None  # fixed number of steps (GD steps)
    steps_per_node: int | None = None  # T = steps_per_node · n (a walk)
    protocol_params: dict[str, Any] = field(default_factory=dict)
    task_params: dict[str, Any] = field(default_factory=dict)


CONFIGS: dict[str, ExperimentConfig] = {
    # make demo-large's walk, taken from it (node/runs/demo.py LARGE_CONFIGS: why these numbers);
    # the length (steps_per_node · n) and the node budget are this runner's, the noise is seeded
    RW_DPSGD: ExperimentConfig(
        spec={k: v for k, v in LARGE_CONFIGS["houses"].spec.items() if k != "steps"},
        per_node=None,
        node_budget=100.0,
        steps_per_node=2,
        task_params=dict(LARGE_CONFIGS["houses"].task_params),
    ),
    # [M] Alg. 3 with the papers' model and [M] Fig. 1c's step size, clip and rows per node; σ = 1
    # (noise std 2 per step, sensitivity 2·clip) and K = 3 rounds per step keep the projection and
    # the rounds affordable at the sizes the accountant allows (steps·n ≤ 4096)
    MUFFLIATO_GD: ExperimentConfig(
        spec=dict(protocol=MUFFLIATO_GD, task="logreg", seed=7, sigma=1.0, step_size=0.7),
        per_node=8,
        node_budget=1000.0,
        steps=4,
        protocol_params={"K": 3, "timeout": 10.0},
        task_params={"clip": 1.0},  # a gossip task's clip is a task parameter (docs/runs.md)
    ),
}


def log(t0: float, msg: str) -> None:
    """A progress line: seconds since the start, then the message (flushed: runs take minutes)."""
    print(f"[{time.perf_counter() - t0:7.1f} s] {msg}", flush=True)


def graph_for(n: int) -> str:
    """The papers' graph: the hypercube of dimension log2 n (n must be a power of two)."""
    dim = int(round(math.log2(n))) if n > 1 else 0
    if 2**dim != n:
        raise SystemExit(
            f"net_experiments: error: --nodes must be a power of two (the hypercube), got {n}"
        )
    return f"hypercube:{dim}"


def prepare(
    protocol: str,
    n: int,
    *,
    steps: int | None = None,
    K: int | None = None,
    seed: int | None = None,
):
    """``(spec, partition)``: the validated public spec (public-seed noise) and the houses split for n nodes."""
    from hushnet.runs.demo import _houses_data_dir
    from hushnet.runs.spec import Budget, RunSpec
    from hushnet.tasks.data import houses_partition

    if protocol not in CONFIGS:
        raise SystemExit(
            f"net_experiments: error: --protocol must be one of {sorted(CONFIGS)}, got {protocol!r}"
        )
    cfg = CONFIGS[protocol]
    if steps is not None and steps < 1:
        raise SystemExit(f"net_experiments: error: --steps must be positive, got {steps}")
    if steps is None:
        steps = cfg.steps if cfg.steps is not None else int(cfg.steps_per_node or 1) * n
    pp = dict(cfg.protocol_params)
    if K is not None:
        if protocol != MUFFLIATO_GD or K < 1:
            raise SystemExit(
                "net_experiments: error: --K (gossip rounds per step) needs muffliato-gd and K >= 1"
            )
        pp["K"] = int(K)
    if "timeout" in pp:
        # a neighbour's silence that counts as a dropout: one host process serves n/K nodes on one event
        # loop, so under load a live neighbour can stay silent for longer as n grows (n = 256, load 16:
        # 18 live nodes dropped after 10 s of silence, rounds of 11-19 s); a dropout ends the parity
        pp["timeout"] = max(float(pp["timeout"]), n / 8.0)
    _houses_data_dir()
    P = houses_partition(n, per_node=cfg.per_node, seed=42)
    spec = (
        RunSpec(
            **{**cfg.spec, **({"seed": int(seed)} if seed is not None else {})},
            steps=int(steps),
            graph=graph_for(n),
            budget=Budget(cfg.node_budget, DELTA),
            noise="public-seed",
            protocol_params=pp,
            task_params=dict(cfg.task_params),
        )
        .with_run_id()
        .validate()
    )
    return spec, P


def make_tasks(spec, shards: Sequence[tuple[np.ndarray, np.ndarray]]) -> list:
    """Each node's task exactly as a node builds it from its data file (the simulator's input)."""
    from hushnet.tasks.registry import make_task

    return [make_task(spec.task, {"X": X, "y": y}, spec.task_kwargs()) for X, y in shards]


# ---- the network run ----------------------------------------------------------------------------


@dataclass
class NetworkRun:
    models: dict[int, np.ndarray]  # vertex → its final model (a walk: the holder's only)
    report: Any  # hushnet.client.report.RunReport
    id_of: dict[int, str]  # vertex → node id
    shard_of: dict[int, int]  # vertex → index of the shard its node holds
    timings: dict[str, float]
    per_process: int
    state: str


def run_network(
    spec,
    P,
    *,
    per_process: int | None,
    t0: float,
    state_dir: pathlib.Path | None = None,
    rpc_timeout: float = 600.0,
) -> NetworkRun:
    """Start the cluster, run ``spec`` to the end, collect every node's model and the report; always stopped."""
    from hushnet.client import Client, ClientError
    from hushnet.net.cluster import LocalCluster
    from hushnet.net.host import default_per_process
    from hushnet.runs.policy import NodePolicy

    n = spec.n
    cfg = CONFIGS[spec.protocol]
    tmp = None
    if state_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="hushnet-netexp-")
        state_dir = pathlib.Path(tmp.name)
    for i, (X, y) in enumerate(P.shards):
        d = state_dir / "nodes" / f"n{i}"
        d.mkdir(parents=True, exist_ok=True)
        np.savez(d / "data.npz", X=X, y=y)
        NodePolicy.write(d, epsilon=cfg.node_budget, delta=DELTA, data_path="data.npz")
    per_process = per_process or default_per_process(n)
    cluster = LocalCluster(state_dir, n, spec.graph, restart=False, per_process=per_process)
    timings: dict[str, float] = {}
    last = [0.0]

    def note(ready: int, members: int, total: int) -> None:
        now = time.perf_counter()
        if now - last[0] >= 10.0:
            last[0] = now
            log(t0, f"{members}/{total} joined, {ready}/{total} serving with every link up")

    rounds = (
        spec.steps * int(spec.protocol_params.get("K", 1)) if spec.protocol == MUFFLIATO_GD else 0
    )

    def progress(step: int, total: int) -> None:
        now = time.perf_counter()
        if now - last[0] >= 10.0:
            last[0] = now
            what = f"round {step}/{rounds}" if rounds else f"hop {step}/{total}"
            log(t0, f"{spec.protocol}: {what}")

    log(
        t0,
        f"starting {n} nodes ({spec.graph}) in {-(-n // per_process)} processes of {per_process} ...",
    )
    try:
        ts = time.perf_counter()
        cluster.start(timeout=90 + 0.1 * n)
        cluster.wait_healthy(timeout=120 + 0.5 * n, on_sweep=note)
        timings["healthy_seconds"] = time.perf_counter() - ts
        log(t0, f"network healthy after {timings['healthy_seconds']:.1f} s")
        # every node projects its certified row inside its host's event loop before it answers the
        # spec: K hosted nodes answer one after the other (Muffliato-GD at n = 128, 64 per process: the
        # default 120 s deadline passed before half of them had answered)
        with Client(state_dir, timeout=rpc_timeout) as client:
            ta = time.perf_counter()
            log(
                t0,
                "delivering the spec: every node projects its certified loss before it accepts ...",
            )
            try:
                run_id = client.start_run(spec)
            except (
                ClientError
            ) as exc:  # one line: a refusal lists every node, which can be thousands
                raise SystemExit(f"net_experiments: error: {str(exc)[:400]}") from None
            timings["accept_seconds"] = time.perf_counter() - ta
            log(
                t0,
                f"run {run_id} accepted by all {n} nodes after {timings['accept_seconds']:.1f} s",
            )
            tr = time.perf_counter()
            if spec.protocol == MUFFLIATO_GD:
                round_timeout = float(spec.protocol_params.get("timeout", 10.0))
                _wait_rounds_done(client, run_id, n, round_timeout, lambda m: log(t0, m))
            outcome = client.watch(run_id, progress=progress, timeout=3600.0)
            timings["run_seconds"] = time.perf_counter() - tr
            timings["load_average_1min_at_run_end"] = os.getloadavg()[0]
            if outcome.state != "finished":
                raise RuntimeError(f"network run {outcome.state}: {outcome.reason}")
            log(
                t0,
                f"run finished after {timings['run_seconds']:.1f} s; collecting models and reports",
            )
            # watch returns when the run has finished somewhere; a gossip node still in its last round
            # has no model yet (at n = 128, 2 of 128 nodes answered without one): wait until every
            # node that should hold a model holds it (gossip: all; a walk: the holder)
            want = n if spec.protocol == MUFFLIATO_GD else 1
            deadline = time.monotonic() + rpc_timeout
            models_by_id = client.models(run_id)
            while len(models_by_id) < want and time.monotonic() < deadline:
                if _ended_without_model(client.statuses(run_id), models_by_id):
                    break  # a node that has ended without a model will never hold one: do not wait
                time.sleep(1.0)
                models_by_id = client.models(run_id)
            if len(models_by_id) < want:
                log(
                    t0,
                    f"only {len(models_by_id)} of {want} nodes hold a model after {rpc_timeout:.0f} s",
                )
            report = client.report(run_id)
            timings.update(start_spreads(report.per_node))
    finally:
        cluster.stop(timeout=15)
        if tmp is not None:
            tmp.cleanup()
    id_of = {int(r["vertex"]): i for i, r in report.per_node.items() if "vertex" in r}
    if len(id_of) != n:
        raise RuntimeError(
            f"only {len(id_of)} of {n} nodes answered the report: {report.summary()['errors']}"
        )
    shard_of = {v: int(i[1:]) for v, i in id_of.items()}  # node n{i} holds shard i
    by_id = {i: v for v, i in id_of.items()}
    return NetworkRun(
        {by_id[i]: m for i, m in models_by_id.items()},
        report,
        id_of,
        shard_of,
        timings,
        per_process,
        outcome.state,
    )


def start_spreads(per_node: dict[str, Any]) -> dict[str, float]:
    """Seconds from the first node's start to the last one's, from the nodes' report timings: the
    operator's ``run.start`` acknowledged (``started``) and the machines' first rounds run (``begun``;
    the same moment before ``run.start`` was split, issue 12)."""
    out: dict[str, float] = {}
    for key, name in (("started", "start_spread_seconds"), ("begun", "first_round_spread_seconds")):
        ts = [
            float(r["timings"][key])
            for r in per_node.values()
            if isinstance(r, dict) and (r.get("timings") or {}).get(key) is not None
        ]
        if ts:
            out[name] = round(max(ts) - min(ts), 3)
    return out


def _wait_rounds_done(client, run_id: str, n: int, round_timeout: float, say) -> None:
    """Synchronous gossip: before ``watch`` closes the run, wait until every node has ended its rounds.

    Why: ``Client.watch`` closes a run everywhere as soon as one node has finished it, and a gossip node
    still waiting for its last round's messages is then closed without a model — 22 of 1 024 nodes in
    one run of this runner (each had 239 of its 240 messages), so their models were missing from the
    parity.  Every node's status is polled at most every ``n / 128`` s (watch's own pace); once one node
    has finished, the others get one round timeout to finish too (a silent neighbour is dropped within
    it), then ``watch`` goes ahead whatever they say.  A stopped, cancelled or paused node ends the wait:
    ``watch`` reports it."""
    first_done: float | None = None
    period = max(2.0, n / 128.0)
    while True:
        states = [s.get("state") for s in client.statuses(run_id).values() if isinstance(s, dict)]
        if any(s in ("stopped", "cancelled", "paused") for s in states):
            return
        done = sum(s in ("finished", "closed") for s in states)
        if done == n:
            return
        if done and first_done is None:
            first_done = time.monotonic()
        if first_done is not None and time.monotonic() - first_done > round_timeout:
            say(
                f"{n - done} of {n} nodes still in their rounds {round_timeout:.0f} s after the first finished"
            )
            return
        time.sleep(period)


def _ended_without_model(statuses: dict[str, Any], models: dict[str, Any]) -> list[str]:
    """Nodes whose run has ended (closed, stopped, cancelled) without a model: waiting cannot help them."""
    return sorted(
        i
        for i, st in statuses.items()
        if isinstance(st, dict)
        and i not in models
        and st.get("state") in ("closed", "stopped", "cancelled")
        and not st.get("holds_model")
    )


def save_network(net: NetworkRun, spec, path: pathlib.Path) -> None:
    """Write what the network run returned (models, every node's report, timings) as JSON, so the
    simulator side can be redone without the network (``--from-network``): the heavy part is the network."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "run_id": spec.run_id,
        "models": {str(v): m.tolist() for v, m in net.models.items()},
        "per_node": net.report.per_node,
        "id_of": {str(v): i for v, i in net.id_of.items()},
        "shard_of": {str(v): i for v, i in net.shard_of.items()},
        "timings": net.timings,
        "per_process": net.per_process,
        "state": net.state,
    }
    path.write_text(json.dumps(doc, default=float))


def load_network(spec, path: pathlib.Path) -> NetworkRun:
    """The network run saved by :func:`save_network`; refused if it was another spec's run."""
    from hushnet.client.report import RunReport

    doc = json.loads(path.read_text())
    if doc["run_id"] != spec.run_id:
        raise SystemExit(
            f"net_experiments: error: {path} holds run {doc['run_id']}, these arguments give run {spec.run_id}"
        )
    return NetworkRun(
        {int(v): np.asarray(m, dtype=float) for v, m in doc["models"].items()},
        RunReport(doc["run_id"], doc["per_node"], None),
        {int(v): i for v, i in doc["id_of"].items()},
        {int(v): int(i) for v, i in doc["shard_of"].items()},
        dict(doc["timings"]),
        int(doc["per_process"]),
        str(doc["state"]),
    )


# ---- the simulator twin -------------------------------------------------------------------------


@dataclass
class SimulatorTwin:
    models: dict[int, np.ndarray]  # vertex → final model (a walk: the holder's)
    entries: dict[int, list]  # vertex → its engine ledger entries (what a node charges)
    seconds: float
    engine: str


def run_simulator(spec, tasks: Sequence, *, engine: str = "event") -> SimulatorTwin:
    """The same spec in the simulator (``tasks[v]`` = vertex v's task): the event simulator runs the
    machines a node runs; ``batch`` (Muffliato-GD only) the array driver equal to them
    (:mod:`hushnet.families.gossip.batch`), for sizes where the event simulator is slow."""
    from hushnet.protocols.registry import build_from_spec, transition_matrix
    from hushnet.sim import Simulator

    ts = time.perf_counter()
    if spec.protocol == MUFFLIATO_GD:
        from hushnet.families.gossip.params import gossip_params

        W = transition_matrix(spec.graph, spec.weights)
        if engine == "batch":
            from hushnet.families.gossip.batch import run_gossip_batch

            b = run_gossip_batch(
                spec.protocol,
                tasks,
                run_seed=spec.seed,
                params=gossip_params(spec),
                W=W,
                run_id=spec.run_id,
                view_model=spec.view_model,
            )
            return SimulatorTwin(
                {v: b.models[v] for v in range(len(tasks))},
                {v: list(e) for v, e in enumerate(b.entries)},
                time.perf_counter() - ts,
                engine,
            )
        from hushnet.families.gossip.build import build_gossip_machines, run_gossip

        ms = build_gossip_machines(
            spec.protocol,
            tasks,
            run_seed=spec.seed,
            run_id=spec.run_id,
            params=gossip_params(spec),
            W=W,
            view_model=spec.view_model,
        )
        g = run_gossip(ms)
        if g.status != "finished":
            raise RuntimeError(f"simulated run ended {g.status}")
        return SimulatorTwin(
            {v: g.models[v] for v in range(len(tasks))},
            {v: list(e) for v, e in g.sim.ledgers.items()},
            time.perf_counter() - ts,
            engine,
        )
    if engine != "event":
        raise SystemExit(f"net_experiments: error: --engine batch runs {MUFFLIATO_GD} only")
    res = Simulator(build_from_spec(spec, tasks)).run()
    if res.status != "finished":
        raise RuntimeError(f"simulated run ended {res.status}")
    holder = max(((e.step, e.node) for led in res.ledgers.values() for e in led), default=(0, 0))
    return SimulatorTwin(
        {int(holder[1]): np.asarray(res.model)},
        {v: list(e) for v, e in res.ledgers.items()},
        time.perf_counter() - ts,
        engine,
    )


def contributions(entries: Sequence) -> int:
    """Data contributions among a node's ledger entries (what its ledger is charged for)."""
    return sum(1 for e in entries if e.uses_data)


def replay_row(spec, vertex: int, ids: list[str], entries: Sequence) -> dict[str, float]:
    """The certified (ε, δ) row node ``vertex`` reports after these ledger entries: each data entry
    through the node's cost (:func:`~hushnet.runs.accounting.contribution_cost`), the curves summed per
    target, converted by the ledger's rule — the node driver's computation, on the simulator's entries."""
    from hushnet.runs.accounting import contribution_cost, dp_from_rdp

    cost = contribution_cost(spec, vertex, ids)
    rdp = None
    for ev in entries:
        if ev.uses_data:
            e = cost.entry(ev, spec.run_id, ids[vertex])
            curves = np.stack([e.rdp[t] for t in cost.targets])
            rdp = curves if rdp is None else rdp + curves
    return {
        t: (0.0 if rdp is None else dp_from_rdp(cost.orders, rdp[j], spec.budget.delta))
        for j, t in enumerate(cost.targets)
    }


def localdp_row(counts: Sequence[int], sigma: float, delta: float) -> np.ndarray:
    """Each node's local-DP ε (the same toward every other node) at its contribution count: every
    contribution seen in the clear, RDP ``N_u·α/(2σ²)`` on the ledger's orders, converted by the ledger's
    rule (:func:`~hushnet.runs.accounting.dp_from_rdp`) — what a node's ledger would hold under local DP,
    so the certified row (capped by local DP per order) is never above it."""
    from hushnet.privacy.conversions import DEFAULT_ORDERS
    from hushnet.runs.accounting import dp_from_rdp

    o = np.asarray(DEFAULT_ORDERS, dtype=float)
    by_count = {
        int(c): dp_from_rdp(o, int(c) * o / (2.0 * sigma**2), delta) for c in set(map(int, counts))
    }
    return np.array([by_count[int(c)] for c in counts], dtype=float)


def check_parity(
    spec, net: NetworkRun, sim: SimulatorTwin, check_vertices: Sequence[int]
) -> dict[str, Any]:
    """Models, contributions and the checked nodes' certified rows: network vs simulator."""
    n = spec.n
    common = sorted(set(net.models) & set(sim.models))
    diffs = [float(np.max(np.abs(net.models[v] - sim.models[v]))) for v in common]
    ids = [net.id_of[v] for v in range(n)]
    rep = net.report.per_node
    net_counts = [int(rep[ids[v]].get("contributions") or 0) for v in range(n)]
    sim_counts = [contributions(sim.entries.get(v, [])) for v in range(n)]
    ledger_diff = 0.0
    for v in check_vertices:
        want = replay_row(spec, v, ids, sim.entries.get(v, []))
        got = rep[ids[v]]["certified"]
        for t, e in want.items():
            d = abs(float(got[t]) - e) / max(1.0, abs(e))
            ledger_diff = max(ledger_diff, d)
    out = {
        "models_missing_network": sorted(set(sim.models) - set(net.models)),
        "model_holders_network": len(net.models),
        "model_holders_simulator": len(sim.models),
        "models_compared": len(common),
        "max_abs_model_diff": max(diffs) if diffs else None,
        "contributions_equal": net_counts == sim_counts,
        "ledger_checked_vertices": list(map(int, check_vertices)),
        "ledger_max_rel_eps_diff": ledger_diff,
        "simulator": sim.engine,
    }
    out["ok"] = bool(
        common
        and set(net.models) == set(sim.models)
        and max(diffs) <= MODEL_ATOL
        and out["contributions_equal"]
        and ledger_diff <= EPS_RTOL
    )
    return out


def walk_certified_from_counts(spec, counts: Sequence[int]) -> tuple[float, float, np.ndarray]:
    """``(mean pair ε, worst pair ε, per-node mean ε)`` a walk's nodes certify when node u made
    ``counts[u]`` contributions — what their run reports would say, without running a network.

    Each contribution charges the node's per-σ rows (:func:`~hushnet.runs.accounting.contribution_cost`),
    summed as the node's driver sums them (the first row copied, then added in place, one addition per
    contribution), converted by the report's rule (``dp_from_rdp_rows``).  A target's row depends only
    on its slope ``s_uv`` (the curve is elementwise in it), so each distinct slope is summed and
    converted once: a hypercube row of 2 048 targets has a few hundred (the 2 048 nodes' rows take
    seconds instead of the hours a per-target conversion loop would).  Why: choosing the walk length T
    whose amplification reaches a target needs these numbers for many T before any network run."""
    from hushnet.runs.accounting import contribution_cost, dp_from_rdp_rows

    n = spec.n
    ids = [f"v{v}" for v in range(n)]
    total, worst = 0.0, 0.0
    node_mean = np.zeros(n)
    for u, count in enumerate(counts):
        if int(count) <= 0:
            continue
        cost = contribution_cost(spec, u, ids)
        rows = cost.rows(float(spec.sigma))
        _, first, inv = np.unique(cost.walk_slope, return_index=True, return_inverse=True)
        base = rows[first]
        acc = base.copy()
        for _ in range(int(count) - 1):
            acc += base
        eps = dp_from_rdp_rows(cost.orders, acc, spec.budget.delta)[inv.reshape(-1)]
        total += float(eps.sum())
        worst = max(worst, float(eps.max()))
        node_mean[u] = float(eps.mean())
    return total / (n * (n - 1)), worst, node_mean


def sweep_walk_length(
    n: int, per_node: Sequence[float], *, seed: int | None = None, t0: float | None = None
) -> list[dict[str, Any]]:
    """For each T = k·n (k in ``per_node``): the walk in the simulator (the network run's spec, public-seed
    noise), each node's contributions, the certified mean / worst pair ε they give
    (:func:`walk_certified_from_counts`), local DP at the same noise and contributions, the ratios and
    the simulator's accuracy — to choose T *before* a network run (``--sweep``).  Simulator only."""
    t0 = time.perf_counter() if t0 is None else t0
    rows = []
    for k in per_node:
        steps = int(round(float(k) * n))
        spec, P = prepare(RW_DPSGD, n, steps=steps, seed=seed)
        tasks = make_tasks(spec, P.shards)
        sim = run_simulator(spec, tasks)
        counts = np.array([contributions(sim.entries.get(v, [])) for v in range(n)])
        mean, worst, _ = walk_certified_from_counts(spec, counts)
        ldp = localdp_row(counts, spec.sigma, spec.budget.delta)
        row = {
            "steps_per_node": float(k),
            "steps": steps,
            "contributions": {
                "min": int(counts.min()),
                "mean": float(counts.mean()),
                "max": int(counts.max()),
            },
            "certified_mean_pair_epsilon": mean,
            "certified_worst_pair_epsilon": worst,
            "localdp_mean_pair_epsilon": float(ldp.mean()),
            "localdp_worst_pair_epsilon": float(ldp.max()),
            "ratio_mean_pair": float(ldp.mean()) / mean if mean > 0 else None,
            "ratio_worst_pair": float(ldp.max()) / worst if worst > 0 else None,
            "accuracy_simulator": mean_accuracy(sim.models, tasks[0], P),
            "simulator_seconds": round(sim.seconds, 2),
        }
        rows.append(row)
        log(
            t0,
            f"T={steps} ({k:g}·n): contributions {row['contributions']['min']}/"
            f"{row['contributions']['mean']:.1f}/{row['contributions']['max']}, certified mean/worst "
            f"{mean:.3f}/{worst:.3f}, local DP {ldp.mean():.3f}/{ldp.max():.3f}, ratio "
            f"{row['ratio_mean_pair'] or 0:.2f}/{row['ratio_worst_pair'] or 0:.2f}, accuracy "
            f"{row['accuracy_simulator']:.3f}",
        )
    return rows


# ---- accuracy baselines -------------------------------------------------------------------------


def mean_accuracy(models: dict[int, np.ndarray], task, P) -> float:
    """Test accuracy averaged over the models (gossip: every node's own model, as [M] Fig. 1c)."""
    return float(
        np.mean([task.evaluate(w, P.X_test, P.y_test)["accuracy"] for w in models.values()])
    )


def localdp_sigma(target_eps: float, count: int, delta: float) -> float:
    """The smallest noise multiplier whose local-DP ε at ``count`` contributions is at most ``target_eps``."""
    lo, hi = 1e-3, 1e4
    for _ in range(80):
        mid = math.sqrt(lo * hi)
        if localdp_row([count], mid, delta)[0] > target_eps:
            lo = mid
        else:
            hi = mid
    return hi


def simulated_accuracy(spec, tasks: Sequence, P, seeds: Sequence[int], **changes: Any) -> float:
    """Mean test accuracy over ``seeds`` of the spec (with ``changes``) in the simulator (gossip: the batch
    driver, every node's model); a comparison, not part of the network run."""
    accs = []
    for s in seeds:
        sp = replace(spec, **changes, seed=int(s), run_id="").with_run_id()
        engine = "batch" if sp.protocol == MUFFLIATO_GD else "event"
        accs.append(mean_accuracy(run_simulator(sp, tasks, engine=engine).models, tasks[0], P))
    return float(np.mean(accs))


def localdp_baseline(
    spec, tasks: Sequence, P, target_eps: float, counts: Sequence[int], seeds: Sequence[int]
) -> tuple[float, float]:
    """Accuracy of local DP at the certified ε ``target_eps``: the same configuration with σ raised until
    local DP at the run's largest contribution count reaches it (a walk: ``local-dp-sgd``, the walk
    whose every contribution is protected on its own); mean over ``seeds`` in the simulator.
    Returns ``(accuracy, σ)``."""
    from hushnet.families.walk.params import LOCAL_DP_SGD

    sig = localdp_sigma(target_eps, max(int(x) for x in counts), spec.budget.delta)
    proto = LOCAL_DP_SGD if spec.protocol == RW_DPSGD else spec.protocol
    return simulated_accuracy(spec, tasks, P, seeds, protocol=proto, sigma=sig), sig


# ---- the experiment -----------------------------------------------------------------------------


def experiment(args, t0: float) -> dict[str, Any]:
    from hushnet.runs.demo import majority_accuracy, nonprivate_accuracy

    spec, P = prepare(args.protocol, args.nodes, steps=args.steps, K=args.K, seed=args.seed)
    n = spec.n
    log(
        t0,
        f"{spec.protocol} on houses, n={n}, {spec.graph}, T={spec.steps}, σ={spec.sigma}, clip={spec.clip}, "
        f"step={spec.step_size}, noise {spec.noise}; {P.shards[0][0].shape[0]} training rows per node",
    )
    if args.from_network is not None:
        net = load_network(spec, args.from_network)
        log(t0, f"network run {spec.run_id} read from {args.from_network}")
    else:
        net = run_network(
            spec,
            P,
            per_process=args.per_process,
            t0=t0,
            state_dir=args.state_dir,
            rpc_timeout=args.rpc_timeout,
        )
        if args.save_network is not None:
            save_network(net, spec, args.save_network)
            log(t0, f"network run saved to {args.save_network}")
        if args.network_only:
            return {}
    tasks = make_tasks(spec, [P.shards[net.shard_of[v]] for v in range(n)])
    engine = args.engine or ("event" if n <= 256 or spec.protocol != MUFFLIATO_GD else "batch")
    log(t0, f"the same spec in the simulator ({engine}) ...")
    sim = run_simulator(spec, tasks, engine=engine)
    checks = (
        list(range(n))
        if args.ledger_check is None or args.ledger_check >= n
        else sorted({int(v) for v in np.linspace(0, n - 1, args.ledger_check)})
    )
    log(t0, f"simulator done in {sim.seconds:.1f} s; parity (ledgers of {len(checks)} nodes) ...")
    parity = check_parity(spec, net, sim, checks)
    log(
        t0,
        f"parity: {json.dumps({k: parity[k] for k in ('ok', 'max_abs_model_diff', 'contributions_equal', 'ledger_max_rel_eps_diff')})}",
    )

    summary = net.report.summary()
    ids = [net.id_of[v] for v in range(n)]
    counts = [int(summary["contributions"].get(i) or 0) for i in ids]
    ldp = localdp_row(counts, spec.sigma, spec.budget.delta)
    worst, mean = float(summary["worst_pair_epsilon"]), float(summary["mean_pair_epsilon"])
    ldp_worst, ldp_mean = float(ldp.max()), float(ldp.mean())
    M = net.report.matrix("certified")
    node_mean = np.nanmean(np.where(np.eye(n, dtype=bool), np.nan, M), axis=1)
    privacy = {
        "delta": spec.budget.delta,
        "bound": "certified (the nodes' run reports: what their ledgers charged)",
        "certified_worst_pair_epsilon": worst,
        "certified_mean_pair_epsilon": mean,
        "localdp_worst_pair_epsilon": ldp_worst,
        "localdp_mean_pair_epsilon": ldp_mean,
        "ratio_mean_pair": ldp_mean / mean if mean > 0 else None,
        "ratio_worst_pair": ldp_worst / worst if worst > 0 else None,
        "localdp_rule": "each node's N_u contributions seen in the clear: RDP N_u*alpha/(2 sigma^2) on the "
        "ledger's orders, the ledger's conversion",
        "contributions": {
            "min": int(min(counts)),
            "max": int(max(counts)),
            "mean": float(np.mean(counts)),
            "total": int(sum(counts)),
        },
        "per_node_mean_epsilon_quantiles": {
            q: float(np.quantile(node_mean, float(q))) for q in ("0.0", "0.5", "1.0")
        },
    }
    if summary.get("paper_mean_pair_epsilon") is not None:
        privacy["paper_mean_pair_epsilon"] = summary["paper_mean_pair_epsilon"]
        privacy["paper_worst_pair_epsilon"] = summary["paper_worst_pair_epsilon"]
        privacy["paper_bound"] = summary.get("paper_bound")
    log(
        t0,
        f"privacy (δ={spec.budget.delta:g}): certified mean pair ε={mean:.4f}, worst {worst:.4f}; local DP at the "
        f"same noise and contributions mean {ldp_mean:.4f}, worst {ldp_worst:.4f}; ratio {privacy['ratio_mean_pair']:.3f}x",
    )
    seeds = [spec.seed + 1 + k for k in range(args.baseline_seeds)]
    intercept = bool(spec.task_kwargs().get("intercept", True))
    log(t0, f"baselines in the simulator over seeds {seeds} ...")
    ldp_acc, ldp_sigma = (
        localdp_baseline(spec, tasks, P, worst, counts, seeds) if seeds else (None, None)
    )
    ldpm_acc, ldpm_sigma = (
        localdp_baseline(spec, tasks, P, mean, counts, seeds) if seeds else (None, None)
    )
    accuracy = {
        "network": mean_accuracy(net.models, tasks[0], P),
        "simulator": mean_accuracy(sim.models, tasks[0], P),
        "private_over_seeds": simulated_accuracy(spec, tasks, P, seeds) if seeds else None,
        "nonprivate": float(nonprivate_accuracy(P, intercept=intercept)),
        "majority": float(majority_accuracy(P)),
        "localdp_same_worst_pair_epsilon": ldp_acc,
        "localdp_sigma_worst": ldp_sigma,
        "localdp_same_mean_pair_epsilon": ldpm_acc,
        "localdp_sigma_mean": ldpm_sigma,
        "seeds": seeds,
        "note": "network/simulator: test accuracy of this run's final model(s), averaged over nodes for gossip; "
        "private_over_seeds: the same configuration over the seeds (simulator), what to compare the baselines "
        "with; local DP: the same configuration with sigma raised until local DP at the run's largest "
        "contribution count reaches the run's certified worst-pair (or mean-pair) epsilon (walk: local-dp-sgd), "
        "mean over the seeds, simulator",
    }
    if spec.protocol == MUFFLIATO_GD:
        avg = np.mean(np.stack(list(net.models.values())), axis=0)
        accuracy["network_node_average_model"] = float(
            tasks[0].evaluate(avg, P.X_test, P.y_test)["accuracy"]
        )
    log(
        t0,
        f"accuracy: network {accuracy['network']:.4f} (simulator {accuracy['simulator']:.4f}), non-private "
        f"{accuracy['nonprivate']:.4f}; over seeds {seeds}: private {accuracy['private_over_seeds']}, local DP at the "
        f"same worst-pair ε {ldp_acc}, at the same mean-pair ε {ldpm_acc}",
    )
    timings = {k: round(v, 2) for k, v in net.timings.items()}
    timings["simulator_seconds"] = round(sim.seconds, 2)
    # from a saved network run: this process did the simulator side only (the network's own timings are kept)
    key = "simulator_side_seconds" if args.from_network is not None else "total_seconds"
    timings[key] = round(time.perf_counter() - t0, 2)
    if spec.protocol == RW_DPSGD:
        timings["hops_per_second"] = round(spec.steps / net.timings["run_seconds"], 2)
    return {
        "experiment": f"{spec.protocol} on houses over the network, n={n}, with simulator parity (issue 12)",
        "command": "python -m hushnet.runs.net_experiments " + " ".join(public_argv(args.argv)),
        "protocol": spec.protocol,
        "n": n,
        "graph": spec.graph,
        "per_process": net.per_process,
        "processes": -(-n // net.per_process),
        "spec": {
            k: getattr(spec, k)
            for k in ("steps", "seed", "sigma", "clip", "step_size", "cap", "noise", "view_model")
        }
        | {"protocol_params": dict(spec.protocol_params), "task_params": dict(spec.task_params)},
        "data": {
            "set": "houses (hushnet.datasets.load_houses), 80/20 stratified split, seed 42",
            "rows_per_node": int(P.shards[0][0].shape[0]),
            "test_rows": int(len(P.y_test)),
        },
        "parity": parity,
        "privacy": privacy,
        "accuracy": accuracy,
        "timings": timings,
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "blas_threads": os.environ.get("OMP_NUM_THREADS", "default"),
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


#: options whose value is a path of this machine: the JSON keeps only the file name
PATH_OPTIONS = ("--out", "--save-network", "--from-network", "--state-dir")


def public_argv(argv: Sequence[str]) -> list[str]:
    """The command line as the JSON records it: path values reduced to their file name (a committed
    result must not carry this machine's directories)."""
    out: list[str] = []
    for a in argv:
        if out and out[-1] in PATH_OPTIONS:
            a = pathlib.Path(a).name
        elif "=" in a and a.split("=", 1)[0] in PATH_OPTIONS:
            a = a.split("=", 1)[0] + "=" + pathlib.Path(a.split("=", 1)[1]).name
        out.append(a)
    return out


def write_outputs(result: dict[str, Any], out: pathlib.Path, png: bool = True) -> pathlib.Path:
    """``net_<protocol>_<n>.json`` (+ ``.png``: ε bars and accuracy bars) in ``out``; returns the JSON path."""
    out.mkdir(parents=True, exist_ok=True)
    stem = f"net_{result['protocol']}_{result['n']}"
    path = out / f"{stem}.json"
    path.write_text(json.dumps(result, indent=2, default=float) + "\n")
    if png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        pr, acc = result["privacy"], result["accuracy"]
        fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
        labels = [
            "certified\nmean pair",
            "local DP\nmean pair",
            "certified\nworst pair",
            "local DP\nworst pair",
        ]
        vals = [
            pr["certified_mean_pair_epsilon"],
            pr["localdp_mean_pair_epsilon"],
            pr["certified_worst_pair_epsilon"],
            pr["localdp_worst_pair_epsilon"],
        ]
        a.bar(labels, vals, color=["C0", "C3", "C0", "C3"])
        a.set_ylabel(f"ε at δ={pr['delta']:g}")
        a.set_title(
            f"{result['protocol']}, n={result['n']} ({result['graph']}): ratio {pr['ratio_mean_pair']:.2f}x (mean pair)",
            fontsize=9,
        )
        names = [
            "this run\n(network)",
            "private\n(seeds)",
            "local DP\nworst ε",
            "local DP\nmean ε",
            "non-\nprivate",
            "majority",
        ]
        accs = [
            acc["network"],
            acc["private_over_seeds"] or 0.0,
            acc["localdp_same_worst_pair_epsilon"] or 0.0,
            acc["localdp_same_mean_pair_epsilon"] or 0.0,
            acc["nonprivate"],
            acc["majority"],
        ]
        b.bar(names, accs, color=["C0", "C0", "C3", "C3", "C2", "C7"])
        b.set_ylim(0, 1)
        b.set_ylabel("test accuracy")
        par = result["parity"]
        b.set_title(
            f"parity {'ok' if par['ok'] else 'FAILED'}: models within {par['max_abs_model_diff']:.1e}, "
            f"network run {result['timings']['run_seconds']:.0f} s",
            fontsize=9,
        )
        fig.tight_layout()
        fig.savefig(out / f"{stem}.png", dpi=80)
        plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(
        prog="python -m hushnet.runs.net_experiments", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--protocol", choices=sorted(CONFIGS), required=True)
    ap.add_argument("--nodes", type=int, required=True, help="network size (a power of two)")
    ap.add_argument(
        "--steps",
        type=int,
        default=None,
        help="walk length T / gradient steps (default: the config's)",
    )
    ap.add_argument(
        "--K", type=int, default=None, help="muffliato-gd: gossip rounds per gradient step"
    )
    ap.add_argument("--seed", type=int, default=None, help="the run seed (default 7)")
    ap.add_argument("--per-process", type=int, default=None, help="nodes hosted by each OS process")
    ap.add_argument(
        "--engine",
        choices=("event", "batch"),
        default=None,
        help="simulator: event (the nodes' machines) or batch (muffliato-gd's array driver); default event up to 256 nodes",
    )
    ap.add_argument(
        "--ledger-check",
        type=int,
        default=8,
        help="nodes whose certified row is replayed in the simulator (default 8, spread over the vertices)",
    )
    ap.add_argument(
        "--baseline-seeds",
        type=int,
        default=2,
        help="simulator seeds of the local-DP baseline (0: skip)",
    )
    ap.add_argument(
        "--out",
        type=pathlib.Path,
        default=REPO / "benchmarks" / "figures" / "out",
        help="where net_<protocol>_<n>.json/.png go",
    )
    ap.add_argument(
        "--rpc-timeout",
        type=float,
        default=600.0,
        help="seconds the operator client waits for a node's answer (spec delivery includes its projection)",
    )
    ap.add_argument("--no-png", action="store_true")
    ap.add_argument(
        "--save-network",
        type=pathlib.Path,
        help="also write what the network run returned here (JSON), for --from-network",
    )
    ap.add_argument(
        "--network-only",
        action="store_true",
        help="stop after the network run (with --save-network: the heavy part alone, e.g. under a lock)",
    )
    ap.add_argument(
        "--from-network",
        type=pathlib.Path,
        help="skip the network: take its run from --save-network's file, redo the simulator side",
    )
    ap.add_argument(
        "--state-dir", type=pathlib.Path, help="keep the network state here (default: a temp dir)"
    )
    ap.add_argument(
        "--sweep",
        default=None,
        help="rw-dpsgd, simulator only: comma-separated steps per node k (T = k·n); prints and writes "
        "sweep_rw-dpsgd_<n>.json with each T's certified mean/worst pair ε against local DP",
    )
    args = ap.parse_args(argv)
    args.argv = argv
    if args.per_process is not None and args.per_process < 1:
        raise SystemExit(
            f"net_experiments: error: --per-process must be at least 1, got {args.per_process}"
        )
    if args.ledger_check is not None and args.ledger_check < 1:
        raise SystemExit("net_experiments: error: --ledger-check must be at least 1")
    # the node processes (started below, they inherit the environment) run one BLAS thread each unless
    # told otherwise: hosted nodes are already one process per core, and a Muffliato-GD projection row
    # at n = 64 took 39 s with the default threads on this loaded 2-core machine, 0.47 s with one
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    t0 = time.perf_counter()
    import logging

    logging.basicConfig(level=logging.WARNING)
    if args.network_only and args.save_network is None:
        raise SystemExit("net_experiments: error: --network-only needs --save-network")
    if args.sweep is not None:
        return _sweep_main(args, t0)
    result = experiment(args, t0)
    if not result:
        return 0
    path = write_outputs(result, args.out, png=not args.no_png)
    log(t0, f"wrote {path}")
    print(
        "net_experiments: protocol={protocol} n={n} parity={ok} mean_pair_epsilon={m:.4f} worst_pair_epsilon={w:.4f} "
        "localdp_epsilon={l:.4f} ratio={r:.3f} accuracy={a:.4f} seconds={s:.1f}".format(
            protocol=result["protocol"],
            n=result["n"],
            ok=result["parity"]["ok"],
            m=result["privacy"]["certified_mean_pair_epsilon"],
            w=result["privacy"]["certified_worst_pair_epsilon"],
            l=result["privacy"]["localdp_mean_pair_epsilon"],
            r=result["privacy"]["ratio_mean_pair"],
            a=result["accuracy"]["network"],
            s=result["timings"].get(
                "total_seconds", result["timings"].get("simulator_side_seconds")
            ),
        )
    )
    return 0 if result["parity"]["ok"] else 1


def _sweep_main(args, t0: float) -> int:
    """``--sweep k1,k2,…``: :func:`sweep_walk_length`, printed and written as JSON (no network)."""
    if args.protocol != RW_DPSGD:
        raise SystemExit(f"net_experiments: error: --sweep needs --protocol {RW_DPSGD}")
    if args.steps is not None or args.from_network is not None or args.save_network is not None:
        raise SystemExit(
            "net_experiments: error: --sweep chooses T itself and runs no network "
            "(no --steps, --save-network or --from-network)"
        )
    try:
        ks = [float(x) for x in args.sweep.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(
            f"net_experiments: error: --sweep takes numbers like 16,20,24, got {args.sweep!r}"
        ) from None
    if not ks or min(ks) <= 0:
        raise SystemExit(
            f"net_experiments: error: --sweep needs positive numbers, got {args.sweep!r}"
        )
    graph_for(args.nodes)
    rows = sweep_walk_length(args.nodes, ks, seed=args.seed, t0=t0)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"sweep_{RW_DPSGD}_{args.nodes}.json"
    doc = {
        "experiment": f"{RW_DPSGD} walk length sweep at n={args.nodes} (simulator only; the "
        "certified values the nodes' reports would give at the simulated contributions)",
        "command": "python -m hushnet.runs.net_experiments " + " ".join(public_argv(args.argv)),
        "rows": rows,
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")
    log(t0, f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
