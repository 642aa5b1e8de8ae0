"""``hushnet run …``: start, watch, report, list and cancel private runs; fetch a run's model or
released result; read every node's privacy ledger.

``--state-dir`` is a ``hushnet up`` directory or a bootstrap state directory (the operator
certificate lives there); the commands use :class:`hushnet.client.AsyncClient`, the same API the
notebook uses, so both show the same information.  Expected failures print one line, exit 1.
``--json`` (every command a script would parse) prints one JSON document on stdout.

Node processes serve runs through the ``hushnet.node_plugins`` entry point (``pyproject.toml``),
which installs :class:`hushnet.runs.service.RunService` on every node before it starts.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys


def _state(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--state-dir",
        required=True,
        type=pathlib.Path,
        help="'hushnet up' state directory or bootstrap state directory (operator identity)",
    )
    p.add_argument("--bootstrap", help="bootstrap HOST:PORT (default: from the state directory)")


def register(subparsers) -> None:
    rp = subparsers.add_parser(
        "run",
        help="private runs: start, watch, status, report, model, ledger, list, cancel",
        description="Operate private runs on a hushnet network.",
    )
    rsub = rp.add_subparsers(dest="run_command", metavar="COMMAND")
    rp.set_defaults(handler=lambda a: (rp.print_help(), 2)[1])

    st = rsub.add_parser(
        "start",
        help="sign a run spec, deliver it, start when every node accepts",
        description="Sign SPEC.toml with the operator key, deliver it to every node; each node checks "
        "the signature, its own budget and its data, and accepts or refuses with a reason. "
        "The run starts only if all accept. Prints the run id.",
    )
    st.add_argument("spec", type=pathlib.Path, help="run spec (TOML; see examples/)")
    st.add_argument("--watch", action="store_true", help="then watch it like 'hushnet run watch'")
    st.add_argument(
        "--json",
        action="store_true",
        help="print {run_id} as JSON; with --watch only the final outcome (as 'run watch --json')",
    )
    st.add_argument(
        "--model-out",
        type=pathlib.Path,
        help="central-dpsgd (the operator is the trusted aggregator): save the final model here (.npy)",
    )
    _state(st)
    st.set_defaults(handler=cmd_start)

    wa = rsub.add_parser("watch", help="live progress bar until the run ends")
    wa.add_argument("run_id")
    wa.add_argument("--timeout", type=float, default=600.0)
    wa.add_argument(
        "--pause-timeout",
        type=float,
        default=15.0,
        help="give up after the run stays paused this long",
    )
    wa.add_argument(
        "--json", action="store_true", help="no progress bar; print the final outcome as JSON"
    )
    _state(wa)
    wa.set_defaults(handler=cmd_watch)

    re_ = rsub.add_parser("report", help="privacy report (table; optional heatmap PNG)")
    re_.add_argument("run_id")
    re_.add_argument(
        "--png", type=pathlib.Path, help="write the pairwise heatmap + loss-by-distance plot here"
    )
    re_.add_argument("--json", action="store_true", help="print the per-node reports as JSON")
    _state(re_)
    re_.set_defaults(handler=cmd_report)

    li = rsub.add_parser("list", help="runs known to the nodes")
    li.add_argument("--json", action="store_true", help="print a JSON list of runs")
    _state(li)
    li.set_defaults(handler=cmd_list)

    rs = rsub.add_parser(
        "resume",
        help="continue a walk whose token holder never came back, from the last "
        "durable copy of the token (a deviation: every node is topped up on close)",
    )
    rs.add_argument("run_id")
    rs.add_argument(
        "--from",
        dest="from_node",
        default=None,
        help="node whose copy to resume from (default: the one with the newest copy)",
    )
    rs.add_argument("--json", action="store_true")
    _state(rs)
    rs.set_defaults(handler=cmd_resume)

    cl = rsub.add_parser(
        "close", help="end a run on every node (again): reaches nodes that were down at the close"
    )
    cl.add_argument("run_id")
    cl.add_argument(
        "--deviated", action="store_true", help="top every contribution up to the local-DP bound"
    )
    cl.add_argument("--json", action="store_true")
    _state(cl)
    cl.set_defaults(handler=cmd_close)

    ca = rsub.add_parser("cancel", help="cancel a run on every node")
    ca.add_argument("run_id")
    ca.add_argument("--json", action="store_true", help="print {node: state} as JSON")
    _state(ca)
    ca.set_defaults(handler=cmd_cancel)

    ss = rsub.add_parser(
        "status",
        help="one run's state on every node",
        description="Each node's state of the run: state, step, contributions, whether it holds "
        "the final model, deviations and faults.  Exit 0 if some node answered.",
    )
    ss.add_argument("run_id")
    ss.add_argument(
        "--json", action="store_true", help="print {run_id, nodes: {node: status}} as JSON"
    )
    _state(ss)
    ss.set_defaults(handler=cmd_status)

    mo = rsub.add_parser(
        "model",
        help="the final model or released result of a finished run",
        description="Fetch what the run released to the operator: a walk's final model, a gossip "
        "node's model (--node), a P-AD sum or histogram, a secure sum.  Prints where it "
        "came from; --out saves the values.  Fails with the reason when there is none "
        "(unknown run, not finished, stopped, aborted, not the operator).",
    )
    mo.add_argument("run_id")
    mo.add_argument(
        "--out",
        type=pathlib.Path,
        help="save the values: .npy (NumPy), .txt/.csv (one value per line, exact), .json (values + metadata)",
    )
    mo.add_argument(
        "--node", help="take the model this node holds (gossip: every node holds its own)"
    )
    mo.add_argument(
        "--json",
        action="store_true",
        help="print the metadata (holder, step, dim, finish record) as JSON; the values too unless --out",
    )
    _state(mo)
    mo.set_defaults(handler=cmd_model)

    le = rsub.add_parser(
        "ledger",
        help="each node's lifetime privacy ledger (spent ε toward every other node)",
        description="Each node's certified (ε, δ) spent toward every other node over all runs, its "
        "budget and its entries by run — the numbers each node checks new runs against.",
    )
    le.add_argument("--node", help="only this node, one row per target")
    le.add_argument("--delta", type=float, help="convert at this δ (default: each node's budget δ)")
    le.add_argument("--json", action="store_true", help="print {nodes: {node: ledger}} as JSON")
    _state(le)
    le.set_defaults(handler=cmd_ledger)


def _fail(msg: str) -> int:
    print(f"hushnet: error: {msg}", file=sys.stderr)
    return 1


def _go(args, fn) -> int:
    import asyncio

    from hushnet.client.core import AsyncClient, ClientError

    async def main():
        client = await AsyncClient.connect(args.state_dir, bootstrap=args.bootstrap)
        try:
            return await fn(client)
        finally:
            await client.close()

    try:
        return asyncio.run(main())
    except ClientError as exc:
        return _fail(str(exc))


def cmd_start(args) -> int:
    from hushnet.runs.spec import SpecError, parse_spec_toml

    try:  # a bad spec is refused here, in one line, before anything connects (the nodes check again)
        parse_spec_toml(args.spec.read_text())
    except OSError as exc:
        return _fail(f"cannot read the run spec {args.spec}: {exc.strerror or exc}")
    except SpecError as exc:
        return _fail(str(exc))

    async def fn(c):
        from hushnet.families import family_of, protocols

        proto = _protocol_of(args.spec)
        if proto in protocols() and family_of(proto).operator_driven:
            return await _central(c, args)
        run_id = await c.start_run(args.spec)
        if not (
            args.json and args.watch
        ):  # --json --watch: one document, the final outcome (it has the run id)
            print(json.dumps({"run_id": run_id}) if args.json else f"run {run_id} started")
        if args.watch:
            return await _watch(c, run_id, args)
        return 0

    return _go(args, fn)


def _protocol_of(path: pathlib.Path) -> str | None:
    import tomllib

    try:
        return tomllib.loads(path.read_text()).get("run", {}).get("protocol")
    except (OSError, tomllib.TOMLDecodeError, AttributeError):
        return None  # start_run reports the problem with the spec


async def _central(c, args) -> int:
    """central-dpsgd: this process is the trusted aggregator; it runs the whole baseline, then prints
    where the model went (``--model-out``) — the nodes never hold it."""
    from hushnet.families.central.operator import outcome_json

    o = await c.run_central(args.spec, progress=not args.json)
    if args.model_out and o.model is not None:
        import numpy as np

        np.save(args.model_out, o.model)
    if args.json:
        print(outcome_json(o))
    else:
        print(
            f"run {o.run_id} ({o.label}): {o.state} at step {o.step}/{o.steps} in {o.seconds:.1f} s; model held by "
            f"the operator"
            + (f", saved to {args.model_out}" if args.model_out and o.model is not None else "")
            + (f" — {o.reason}" if o.reason else "")
        )
        print(
            "  privacy: central model — the trusted aggregator saw every clipped gradient in the clear; other nodes "
            f"saw only noisy models (see 'hushnet run report {o.run_id}')"
        )
    return 0 if o.state == "finished" else 3


async def _watch(c, run_id: str, args) -> int:
    o = await c.watch(
        run_id,
        progress=not getattr(args, "json", False),
        timeout=getattr(args, "timeout", 600.0),
        pause_timeout=getattr(args, "pause_timeout", 15.0),
    )
    if getattr(args, "json", False):
        from hushnet.client.core import outcome_dict

        print(json.dumps(outcome_dict(o)))
    else:
        print(
            f"run {run_id}: {o.state} at step {o.step}/{o.steps} in {o.seconds:.1f} s"
            + (f", model held by {o.holder}" if o.holder else "")
            + (f" — {o.reason}" if o.reason else "")
        )
        if o.loss is not None:
            print(
                f"  loss of the final model on the public evaluation data {o.loss_data}: {o.loss:.4f}"
            )
        for d in o.deviations:
            print(
                f"  deviation at step {d.get('step')}: {d.get('reason')} (dead: {d.get('dead_node', '?')}); "
                + (
                    "its round released nothing, inputs that left for it stay charged"
                    if d.get("reason") == "leader-lost"
                    else "accounted with the local-DP bound"
                )
                + (" where the close reached" if o.unaccounted else "")
            )
        for node, why in sorted(o.unaccounted.items()):
            print(
                f"  NOT YET ACCOUNTED at {node}: the close did not reach it ({why[:200]}); "
                f"'hushnet run close {run_id} --deviated' when it is back"
            )
        for f in o.faults:
            print(f"  refused message at {f.get('node')}: {f.get('code')}: {f.get('message')}")
    return 0 if o.state == "finished" else 3


def cmd_watch(args) -> int:
    return _go(args, lambda c: _watch(c, args.run_id, args))


def cmd_report(args) -> int:
    async def fn(c):
        rep = await c.report(args.run_id)
        if args.json:
            print(json.dumps({"summary": rep.summary(), "nodes": rep.per_node}, default=str))
        else:
            print(rep.format_table())
        if args.png:
            import matplotlib

            matplotlib.use("Agg")
            numbers = rep.save_heatmap(args.png)
            if not args.json:
                print(f"heatmap written to {args.png} (its numbers: {numbers})")
        return 0

    return _go(args, fn)


def cmd_list(args) -> int:
    async def fn(c):
        runs = await c.list_runs()
        if args.json:
            print(json.dumps(runs))
            return 0
        if not runs:
            print("no runs")
            return 0
        rows = [("RUN", "PROTOCOL", "STATE", "STEP", "NODES")]
        rows += [
            (
                r["run_id"],
                r["protocol"],
                r["state"],
                f"{max(r['step'], 0)}/{r['steps']}",
                str(r["nodes"]),
            )
            for r in runs
        ]
        w = [max(len(r[k]) for r in rows) for k in range(5)]
        for r in rows:
            print("  ".join(x.ljust(wk) for x, wk in zip(r, w)).rstrip())
        for r in runs:
            if r.get("lost_holder"):
                lh = r["lost_holder"]
                print(
                    f"  {r['run_id']}: {lh['holder']} holds the token since step {lh['step']} and does not answer; "
                    f"copy at {lh['copy_at']} ('hushnet run resume {r['run_id']}')"
                )
            for node, why in (r.get("unrestored") or {}).items():
                print(
                    f"  {r['run_id']}: {node} could not take the run up again after a restart: {why}"
                )
        return 0

    return _go(args, fn)


def cmd_resume(args) -> int:
    async def fn(c):
        res = await c.resume(args.run_id, from_node=args.from_node)
        if args.json:
            print(json.dumps(res))
        else:
            print(
                f"run {args.run_id}: resumed from {res['from']}'s copy of step {res['step']} without {res['lost']}"
                + (f" (not told: {', '.join(res['not_told'])})" if res["not_told"] else "")
            )
        return 0

    return _go(args, fn)


def cmd_close(args) -> int:
    async def fn(c):
        missing = await c.close_run(args.run_id, deviated=args.deviated)
        if args.json:
            print(json.dumps({"not_reached": missing}))
        elif missing:
            for node, why in sorted(missing.items()):
                print(f"{node}: not reached ({why}); close again when it is back")
        else:
            print(f"run {args.run_id} closed on every node")
        return 0 if not missing else 3

    return _go(args, fn)


def cmd_cancel(args) -> int:
    async def fn(c):
        res = await c.cancel(args.run_id)
        if args.json:
            print(json.dumps(res))
            return 0
        for node, state in sorted(res.items()):
            print(f"{node}: {state}")
        return 0

    return _go(args, fn)


def _table(rows: list[tuple[str, ...]]) -> None:
    w = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    for r in rows:
        print("  ".join(x.ljust(wk) for x, wk in zip(r, w)).rstrip())


def cmd_status(args) -> int:
    async def fn(c):
        from hushnet.client.core import ClientError

        res = await c.statuses(args.run_id)
        answered = {i: r for i, r in res.items() if not isinstance(r, ClientError)}
        if not answered:
            from hushnet.client.core import why_no_run

            return _fail(why_no_run(args.run_id, {i: str(r) for i, r in res.items()}))
        nodes = {i: (r if i in answered else {"error": str(r)}) for i, r in res.items()}
        if args.json:
            print(json.dumps({"run_id": args.run_id, "nodes": nodes}, default=str))
            return 0
        rows = [("NODE", "STATE", "STEP", "CONTRIB", "MODEL", "DEV", "FAULTS", "REASON")]
        for i, r in nodes.items():
            if "error" in r:
                rows.append((i, "?", "", "", "", "", "", r["error"]))
                continue
            rows.append(
                (
                    i,
                    r["state"] + (f" ({r['ended']})" if r.get("ended") else ""),
                    f"{max(r['step'], 0)}/{r['steps']}",
                    str(r["contributions"]),
                    "yes" if r["holds_model"] else "",
                    str(r["deviations"]),
                    str(r["faults"]),
                    r.get("reason") or r.get("ended_reason") or "",
                )
            )
        _table(rows)
        return 0

    return _go(args, fn)


_OUT_FORMATS = (".npy", ".txt", ".csv", ".json")


def cmd_model(args) -> int:
    if args.out is not None and args.out.suffix.lower() not in _OUT_FORMATS:
        return _fail(
            f"--out {args.out}: unknown format {args.out.suffix or '(no suffix)'!r}; "
            f"use one of {', '.join(_OUT_FORMATS)}"
        )

    async def fn(c):
        r = await c.result(args.run_id, node=args.node)
        meta = r.metadata()
        if args.out is not None:
            try:
                _save(args.out, r.values, meta)
            except OSError as exc:
                return _fail(f"cannot write {args.out}: {exc.strerror or exc}")
            meta["out"] = str(args.out)
        if args.json:
            if args.out is None:
                meta["values"] = r.values.tolist()  # repr floats: exact round trip
            print(json.dumps(meta))
            return 0
        src = (
            "held by this client (the aggregator)" if r.holder == "operator" else f"from {r.holder}"
        )
        print(
            f"run {r.run_id} ({r.protocol}): {meta['dim']} value(s) {src}"
            + (f" at step {r.step}" if r.step is not None else "")
            + (f", saved to {args.out}" if args.out is not None else "")
        )
        if args.out is None:
            import numpy as np

            print(np.array2string(r.values, precision=6, threshold=20))
        status = r.info.get("status")
        if status:
            print(
                f"  {status}"
                + (
                    f": {len(r.info['survivors'])} contributions summed"
                    if isinstance(r.info.get("survivors"), list)
                    else ""
                )
            )
        return 0

    return _go(args, fn)


def _save(path: pathlib.Path, values, meta: dict) -> None:
    """Write ``values`` in the format ``path``'s suffix names (checked before the fetch)."""
    import numpy as np

    suffix = path.suffix.lower()
    if suffix == ".npy":
        np.save(path, values)
    elif suffix == ".json":
        path.write_text(json.dumps({**meta, "values": values.tolist()}))
    else:
        np.savetxt(path, values, fmt="%.17g")


def cmd_ledger(args) -> int:
    if args.delta is not None and not 0.0 < args.delta < 1.0:
        return _fail(f"--delta must be in (0, 1), got {args.delta}")

    async def fn(c):
        from hushnet.client.core import ClientError

        res = await c.ledgers(delta=args.delta)
        if args.node is not None:
            if args.node not in res:
                return _fail(
                    f"no node {args.node!r} in the directory (nodes: {', '.join(sorted(res))})"
                )
            res = {args.node: res[args.node]}
        nodes = {
            i: ({"error": str(r)} if isinstance(r, ClientError) else r) for i, r in res.items()
        }
        if all("error" in r for r in nodes.values()):
            return _fail(
                "no node answered: "
                + "; ".join(f"{i}: {r['error']}" for i, r in list(nodes.items())[:3])
            )
        if args.json:
            print(json.dumps({"delta": args.delta, "nodes": nodes}, default=str))
            return 0
        if args.node is not None:
            r = nodes[args.node]
            if "error" in r:
                return _fail(f"{args.node}: {r['error']}")
            b = r.get("budget")
            print(
                f"{args.node}: {r['entries']} entries from {len(r.get('runs', {}))} run(s); budget "
                + (f"ε={b['epsilon']:g} at δ={b['delta']:g}" if b else "none (each run's own)")
            )
            rows = [("TARGET", "EPSILON", "DELTA", "ENTRIES", "BOUND")]
            rows += [
                (t, f"{s['epsilon']:.6g}", f"{s['delta']:g}", str(s["entries"]), s["bound"])
                for t, s in sorted(r["spent"].items())
            ]
            if len(rows) > 1:
                _table(rows)
            for run_id, rr in sorted(r.get("runs", {}).items()):
                print(f"  run {run_id} ({rr['protocol']}): {rr['entries']} entries")
            return 0
        rows = [("NODE", "ENTRIES", "RUNS", "MAX EPSILON", "TOWARD", "DELTA", "BUDGET", "BOUND")]
        for i, r in nodes.items():
            if "error" in r:
                rows.append((i, "?", "", "", "", "", "", r["error"]))
                continue
            spent = r["spent"]
            worst = max(spent.items(), key=lambda kv: kv[1]["epsilon"]) if spent else None
            b = r.get("budget")
            rows.append(
                (
                    i,
                    str(r["entries"]),
                    str(len(r.get("runs", {}))),
                    f"{worst[1]['epsilon']:.6g}" if worst else "0",
                    worst[0] if worst else "",
                    f"{worst[1]['delta']:g}" if worst else "",
                    f"{b['epsilon']:g}" if b else "-",
                    (
                        "paper"
                        if any(s["bound"] != "certified" for s in spent.values())
                        else "certified"
                    )
                    if spent
                    else "",
                )
            )
        _table(rows)
        return 0

    return _go(args, fn)
