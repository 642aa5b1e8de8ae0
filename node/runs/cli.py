"""``hushnet run …``: start, watch, report, list and cancel private runs.

``--state-dir`` is a ``hushnet up`` directory or a bootstrap state directory (the operator
certificate lives there); the commands use :class:`hushnet.client.AsyncClient`, the same API the
notebook uses, so both show the same information.  Expected failures print one line, exit 1.

Node processes serve runs through the ``hushnet.node_plugins`` entry point (``pyproject.toml``),
which installs :class:`hushnet.runs.service.RunService` on every node before it starts.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys


def _state(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state-dir", required=True, type=pathlib.Path,
                   help="'hushnet up' state directory or bootstrap state directory (operator identity)")
    p.add_argument("--bootstrap", help="bootstrap HOST:PORT (default: from the state directory)")


def register(subparsers) -> None:
    rp = subparsers.add_parser("run", help="private runs: start, watch, report, list, cancel",
                               description="Operate private runs on a hushnet network.")
    rsub = rp.add_subparsers(dest="run_command", metavar="COMMAND")
    rp.set_defaults(handler=lambda a: (rp.print_help(), 2)[1])

    st = rsub.add_parser("start", help="sign a run spec, deliver it, start when every node accepts",
                         description="Sign SPEC.toml with the operator key, deliver it to every node; each node checks "
                                     "the signature, its own budget and its data, and accepts or refuses with a reason. "
                                     "The run starts only if all accept. Prints the run id.")
    st.add_argument("spec", type=pathlib.Path, help="run spec (TOML; see examples/)")
    st.add_argument("--watch", action="store_true", help="then watch it like 'hushnet run watch'")
    st.add_argument("--json", action="store_true")
    st.add_argument("--model-out", type=pathlib.Path,
                    help="central-dpsgd (the operator is the trusted aggregator): save the final model here (.npy)")
    _state(st)
    st.set_defaults(handler=cmd_start)

    wa = rsub.add_parser("watch", help="live progress bar until the run ends")
    wa.add_argument("run_id")
    wa.add_argument("--timeout", type=float, default=600.0)
    wa.add_argument("--pause-timeout", type=float, default=15.0, help="give up after the run stays paused this long")
    wa.add_argument("--json", action="store_true")
    _state(wa)
    wa.set_defaults(handler=cmd_watch)

    re_ = rsub.add_parser("report", help="privacy report (table; optional heatmap PNG)")
    re_.add_argument("run_id")
    re_.add_argument("--png", type=pathlib.Path, help="write the pairwise heatmap + loss-by-distance plot here")
    re_.add_argument("--json", action="store_true", help="print the per-node reports as JSON")
    _state(re_)
    re_.set_defaults(handler=cmd_report)

    li = rsub.add_parser("list", help="runs known to the nodes")
    li.add_argument("--json", action="store_true")
    _state(li)
    li.set_defaults(handler=cmd_list)

    ca = rsub.add_parser("cancel", help="cancel a run on every node")
    ca.add_argument("run_id")
    _state(ca)
    ca.set_defaults(handler=cmd_cancel)


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
        if _protocol_of(args.spec) == "central-dpsgd":
            return await _central(c, args)
        run_id = await c.start_run(args.spec)
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
    from hushnet.client.central import outcome_json

    o = await c.run_central(args.spec, progress=not args.json)
    if args.model_out and o.model is not None:
        import numpy as np

        np.save(args.model_out, o.model)
    if args.json:
        print(outcome_json(o))
    else:
        print(f"run {o.run_id} ({o.label}): {o.state} at step {o.step}/{o.steps} in {o.seconds:.1f} s; model held by "
              f"the operator" + (f", saved to {args.model_out}" if args.model_out and o.model is not None else "")
              + (f" — {o.reason}" if o.reason else ""))
        print("  privacy: central model — the trusted aggregator saw every clipped gradient in the clear; other nodes "
              f"saw only noisy models (see 'hushnet run report {o.run_id}')")
    return 0 if o.state == "finished" else 3


async def _watch(c, run_id: str, args) -> int:
    o = await c.watch(run_id, progress=not getattr(args, "json", False), timeout=getattr(args, "timeout", 600.0),
                      pause_timeout=getattr(args, "pause_timeout", 15.0))
    if getattr(args, "json", False):
        from hushnet.client.core import outcome_dict

        print(json.dumps(outcome_dict(o)))
    else:
        print(f"run {run_id}: {o.state} at step {o.step}/{o.steps} in {o.seconds:.1f} s"
              + (f", model held by {o.holder}" if o.holder else "") + (f" — {o.reason}" if o.reason else ""))
        if o.loss is not None:
            print(f"  loss of the final model on the public evaluation data {o.loss_data}: {o.loss:.4f}")
        for d in o.deviations:
            print(f"  deviation at step {d.get('step')}: {d.get('reason')} (dead: {d.get('dead_node', '?')}); "
                  "accounted with the local-DP bound")
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
            rep.save_heatmap(args.png)
            if not args.json:
                print(f"heatmap written to {args.png}")
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
        rows += [(r["run_id"], r["protocol"], r["state"], f"{max(r['step'], 0)}/{r['steps']}", str(r["nodes"])) for r in runs]
        w = [max(len(r[k]) for r in rows) for k in range(5)]
        for r in rows:
            print("  ".join(x.ljust(wk) for x, wk in zip(r, w)).rstrip())
        return 0

    return _go(args, fn)


def cmd_cancel(args) -> int:
    async def fn(c):
        res = await c.cancel(args.run_id)
        for node, state in sorted(res.items()):
            print(f"{node}: {state}")
        return 0

    return _go(args, fn)
