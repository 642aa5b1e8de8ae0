"""``make demo``: start an 8-node network on loopback, show it, and exchange a message on every edge.

Run as ``python -m hushnet.demo [--nodes N] [--topology SPEC] [--state-dir DIR]``. Every node sends
one ``net.ping`` envelope (random bytes) to each neighbour, through the real mutual-TLS
transport; the operator then reads each node's inbox and checks that every directed edge
carried exactly one envelope whose SHA-256 matches what the sender sent. Exit code 0 on
success, 1 otherwise; the network is always shut down.
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import statistics
import sys
import tempfile
import time
import uuid


async def exchange_on_every_edge(
    state_dir: pathlib.Path, run_id: str | None = None, size: int = 1024, timeout: float = 60.0
) -> dict:
    """Have every node ping each neighbour once; verify delivery from the receivers' inboxes.

    Returns ``{"run_id", "edges", "sent", "delivered", "missing", "duplicates", "corrupted",
    "failed", "rtt_ms", "ok"}``; ``ok`` means every directed edge delivered exactly once, intact.
    """
    from hushnet.net.operator import Operator, OperatorCredentials

    run_id = run_id or f"demo-{uuid.uuid4().hex[:8]}"
    async with Operator(OperatorCredentials.from_state_dir(state_dir)) as op:
        directory = await op.directory()
        members = {m.node_id: m for m in directory.members}
        by_vertex = {m.vertex: m.node_id for m in directory.members}
        edges = [
            (by_vertex[e.u], by_vertex[e.v])
            for e in directory.edges
            if e.u in by_vertex and e.v in by_vertex
        ]
        sent_reports = await asyncio.gather(
            *(
                op.control(
                    nid,
                    m.address,
                    "ping_neighbors",
                    {"run_id": run_id, "size": size, "timeout": timeout},
                    timeout=timeout + 5,
                )
                for nid, m in members.items()
            )
        )
        expected: dict[tuple[str, str], str] = {}
        failed: list[str] = []
        rtts: list[float] = []
        for report in sent_reports:
            for peer, res in report["sent"].items():
                if res.get("ok"):
                    expected[(report["node"], peer)] = res["sha256"]
                    rtts.append(res["rtt_ms"])
                else:
                    failed.append(f"{report['node']}->{peer}: {res.get('error')}")
        inboxes = await asyncio.gather(
            *(
                op.control(nid, m.address, "inbox", {"protocol": "net.ping", "run_id": run_id})
                for nid, m in members.items()
            )
        )
    counts: dict[tuple[str, str], int] = {}
    corrupted: list[str] = []
    for box in inboxes:
        for row in box["inbox"]:
            key = (row["sender"], box["node"])
            counts[key] = counts.get(key, 0) + 1
            if key in expected and row["sha256"] != expected[key]:
                corrupted.append(f"{key[0]}->{key[1]}")
    directed = [(u, v) for u, v in edges] + [(v, u) for u, v in edges]
    missing = [f"{u}->{v}" for u, v in directed if counts.get((u, v), 0) == 0]
    duplicates = [f"{u}->{v}" for (u, v), c in counts.items() if c > 1]
    unexpected = [f"{u}->{v}" for (u, v) in counts if (u, v) not in set(directed)]
    ok = not (missing or duplicates or corrupted or failed or unexpected) and len(counts) == len(
        directed
    )
    return {
        "run_id": run_id,
        "edges": len(edges),
        "directed_edges": len(directed),
        "sent": len(expected),
        "delivered": sum(counts.values()),
        "missing": missing,
        "duplicates": duplicates,
        "corrupted": corrupted,
        "unexpected": unexpected,
        "failed": failed,
        "rtt_ms_median": statistics.median(rtts) if rtts else None,
        "ok": ok,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hushnet.demo", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument(
        "--topology", default=None, help="graph SPEC (default hypercube:3 for 8 nodes, else ring:N)"
    )
    parser.add_argument(
        "--state-dir",
        type=pathlib.Path,
        default=None,
        help="keep state and logs here (default: a temporary directory, removed afterwards)",
    )
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)

    import uvloop

    from hushnet.net.cluster import LocalCluster
    from hushnet.net.operator import format_table

    topology = args.topology or ("hypercube:3" if args.nodes == 8 else f"ring:{args.nodes}")
    tmp = None
    state_dir = args.state_dir
    if state_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="hushnet-demo-")
        state_dir = pathlib.Path(tmp.name)
    cluster = LocalCluster(state_dir, args.nodes, topology)
    t0 = time.monotonic()
    try:
        print(
            f"starting a bootstrap and {args.nodes} nodes ({topology}) on 127.0.0.x ...", flush=True
        )
        cluster.start()
        doc = cluster.wait_healthy(timeout=args.timeout)
        print(f"all nodes healthy and connected after {time.monotonic() - t0:.1f} s\n", flush=True)
        print(format_table(doc), "\n", flush=True)
        result = uvloop.run(exchange_on_every_edge(state_dir))
        print(
            f"message exchange (run {result['run_id']}): {result['edges']} edges, {result['directed_edges']} "
            f"directed envelopes sent, {result['delivered']} delivered; median hop RTT "
            f"{result['rtt_ms_median']:.2f} ms"
            if result["rtt_ms_median"] is not None
            else "no envelope sent"
        )
        for key in ("missing", "duplicates", "corrupted", "unexpected", "failed"):
            if result[key]:
                print(f"  {key}: {', '.join(result[key])}")
        if result["ok"]:
            print(
                "OK: every edge carried exactly one envelope in each direction, SHA-256 verified."
            )
            return 0
        print("FAILED: see the problems above and the logs in", state_dir / "logs")
        return 1
    except (RuntimeError, TimeoutError, ValueError) as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return 1
    finally:
        cluster.stop()
        print("network stopped.", flush=True)
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
