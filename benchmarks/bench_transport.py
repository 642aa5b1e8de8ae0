"""Transport overhead: one envelope hop between two node processes vs a bare ``grpc.aio`` unary call.

Setup (all on loopback, all over the same mutual-TLS credentials):

* a bootstrap process (graph ``complete:2``) and node ``n1`` as a separate process
  (``hushnet node serve``) whose ``net.discard`` handler accepts and drops envelopes;
* node ``n0`` in this process (a real :class:`~hushnet.net.node.Node`), sending with
  ``Node.send`` — the full path: envelope construction, sender/neighbour/membership/duplicate
  checks at the receiver, handler dispatch, delivery receipt;
* the baseline: a bare ``grpc.aio`` server in another process with one unary method that takes
  the payload as raw bytes and returns an empty reply, called from this process over a channel
  with the same TLS credentials and message-size options. Both server processes run on uvloop
  with the same malloc tuning (:func:`hushnet.net.wire.tune_allocator`), and the client side of both
  is this process, so the ratio isolates hushnet's own per-hop work.

For payloads of 1 KB, 80 KB and 8 MB the two calls are measured interleaved in blocks (so that
machine load affects both equally). Reported: median round trip, throughput (payload bytes /
median RTT) and the ratio hop/bare; the goal is ≤ 1.3×. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

SIZES = [("1 KB", 1024), ("80 KB", 80 * 1024), ("8 MB", 8 * 1024 * 1024)]
REPS = {1024: 400, 80 * 1024: 300, 8 * 1024 * 1024: 60}
BLOCK = 10
GOAL = 1.3
MiB = 1024 * 1024
REPO = pathlib.Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ bare server process


async def _bare_server(listen: str, key: str, cert: str, ca: str, ready_file: str) -> None:
    import grpc

    from hushnet.net import pki
    from hushnet.net.wire import tune_allocator

    tune_allocator()  # same allocator setting as the nodes: the baseline gets every advantage they get

    async def echo(request: bytes, context) -> bytes:
        return b""

    limit = 128 * MiB + 64 * 1024
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
        ]
    )
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "bench.Bare", {"Call": grpc.unary_unary_rpc_method_handler(echo)}
            ),
        )
    )
    port = server.add_secure_port(
        listen,
        pki.server_credentials(
            pathlib.Path(key).read_bytes(),
            pathlib.Path(cert).read_bytes(),
            pathlib.Path(ca).read_bytes(),
        ),
    )
    await server.start()
    pathlib.Path(ready_file).write_text(str(port))
    await server.wait_for_termination()


# ------------------------------------------------------------------ measurement


def _spawn(argv: list[str], log: pathlib.Path) -> subprocess.Popen:
    fh = open(log, "wb")
    return subprocess.Popen(argv, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT)


def _wait(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


async def _measure(tmp: pathlib.Path, bootstrap: str, bare_addr: str) -> list[dict]:
    import grpc

    from hushnet.net import pki
    from hushnet.net.node import Node, NodeConfig

    node = Node(
        NodeConfig(
            tmp / "n0",
            "127.0.0.70:0",
            bootstrap,
            ca_file=tmp / "b" / "ca.pem",
            node_id="n0",
            token=(tmp / "b" / "join_token").read_text().strip(),
        )
    )
    await node.start()
    try:
        for _ in range(300):
            link = node.links.get("n1")
            if link is not None and link.healthy:
                break
            await asyncio.sleep(0.1)
        else:
            raise RuntimeError("node n1 never became reachable")
        ident = node.identity
        limit = node.config.max_message_bytes + 64 * 1024
        channel = grpc.aio.secure_channel(
            bare_addr,
            pki.channel_credentials(ident.ca_pem, ident.key_pem, ident.cert_pem),
            options=[
                ("grpc.ssl_target_name_override", pki.node_dns("bare")),
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
            ],
        )
        bare = channel.unary_unary("/bench.Bare/Call")
        rows = []
        for label, size in SIZES:
            payload = os.urandom(size)
            hop_t: list[float] = []
            bare_t: list[float] = []
            for _ in range(3):  # warm-up (connections, allocator)
                await node.send("n1", payload, protocol="net.discard", run_id="bench")
                await bare(payload, timeout=60)
            reps = REPS[size]
            while len(hop_t) < reps:
                for _ in range(BLOCK):
                    t0 = time.perf_counter()
                    await node.send("n1", payload, protocol="net.discard", run_id="bench")
                    hop_t.append(time.perf_counter() - t0)
                for _ in range(BLOCK):
                    t0 = time.perf_counter()
                    await bare(payload, timeout=60)
                    bare_t.append(time.perf_counter() - t0)
            hop_med, bare_med = statistics.median(hop_t), statistics.median(bare_t)
            rows.append(
                {
                    "payload": label,
                    "bytes": size,
                    "samples": len(hop_t),
                    "hop_rtt_ms_median": hop_med * 1e3,
                    "bare_rtt_ms_median": bare_med * 1e3,
                    "hop_throughput_MBps": size / hop_med / 1e6,
                    "bare_throughput_MBps": size / bare_med / 1e6,
                    "ratio": hop_med / bare_med,
                    "meets_goal": hop_med / bare_med <= GOAL,
                }
            )
        await channel.close()
        return rows
    finally:
        await node.stop(leave=False)


def main(out_dir: pathlib.Path) -> dict:
    import uvloop

    from hushnet.bootstrap.authority import load_or_create
    from hushnet.net import pki
    from hushnet.net.cluster import pick_port

    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="hushnet-bench-") as tmpname:
        tmp = pathlib.Path(tmpname)
        auth = load_or_create(tmp / "b")
        bport = pick_port(["127.0.0.1"])
        bootstrap = f"127.0.0.1:{bport}"
        try:
            procs.append(
                _spawn(
                    [
                        sys.executable,
                        "-m",
                        "hushnet.cli",
                        "bootstrap",
                        "serve",
                        "--state-dir",
                        str(tmp / "b"),
                        "--listen",
                        bootstrap,
                        "--topology",
                        "complete:2",
                        "--log-level",
                        "WARNING",
                    ],
                    tmp / "bootstrap.log",
                )
            )
            _wait(lambda: (tmp / "b" / "bootstrap.json").exists(), 60, "bootstrap")
            nport = pick_port(["127.0.0.71"])
            procs.append(
                _spawn(
                    [
                        sys.executable,
                        "-m",
                        "hushnet.cli",
                        "node",
                        "serve",
                        "--state-dir",
                        str(tmp / "n1"),
                        "--listen",
                        f"127.0.0.71:{nport}",
                        "--bootstrap",
                        bootstrap,
                        "--ca",
                        str(tmp / "b" / "ca.pem"),
                        "--token-file",
                        str(tmp / "b" / "join_token"),
                        "--node-id",
                        "n1",
                        "--log-level",
                        "WARNING",
                    ],
                    tmp / "n1.log",
                )
            )
            # the bare server gets its own certificate from the same CA (name "bare")
            key = pki.generate_key()
            cert = auth.issue_node_cert(key.public_key(), "bare", "127.0.0.72")
            pki.write_secret(tmp / "bare.key", pki.key_to_pem(key))
            pki.write_public(tmp / "bare.pem", pki.cert_to_pem(cert))
            xport = pick_port(["127.0.0.72"])
            procs.append(
                _spawn(
                    [
                        sys.executable,
                        "-m",
                        "benchmarks.bench_transport",
                        "--bare-server",
                        f"127.0.0.72:{xport}",
                        str(tmp / "bare.key"),
                        str(tmp / "bare.pem"),
                        str(tmp / "b" / "ca.pem"),
                        str(tmp / "bare.ready"),
                    ],
                    tmp / "bare.log",
                )
            )
            _wait(lambda: (tmp / "bare.ready").exists(), 60, "bare server")
            rows = uvloop.run(_measure(tmp, bootstrap, f"127.0.0.72:{xport}"))
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
    header = f"{'payload':>8} {'hop RTT ms':>11} {'bare RTT ms':>12} {'hop MB/s':>9} {'bare MB/s':>10} {'ratio':>6}"
    print("one envelope hop (node -> node, mTLS) vs bare grpc.aio unary call (same TLS), medians")
    print(header)
    for r in rows:
        print(
            f"{r['payload']:>8} {r['hop_rtt_ms_median']:>11.3f} {r['bare_rtt_ms_median']:>12.3f} "
            f"{r['hop_throughput_MBps']:>9.1f} {r['bare_throughput_MBps']:>10.1f} {r['ratio']:>5.2f}x"
        )
    print(
        f"goal: ratio <= {GOAL}x; met for {sum(r['meets_goal'] for r in rows)}/{len(rows)} payload sizes"
    )
    return {
        "benchmark": "transport",
        "goal_ratio": GOAL,
        "rows": rows,
        "all_meet_goal": all(r["meets_goal"] for r in rows),
        "setup": "bootstrap + node n1 as processes, node n0 in the benchmark process, bare grpc.aio server "
        "process; loopback 127.0.0.x; mutual TLS (ECDSA P-256) for both; interleaved blocks of "
        f"{BLOCK}",
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--bare-server", nargs=5, metavar=("LISTEN", "KEY", "CERT", "CA", "READY_FILE")
    )
    args = parser.parse_args()
    if args.bare_server:
        import uvloop

        uvloop.run(_bare_server(*args.bare_server))
        sys.exit(0)
    out = pathlib.Path(__file__).resolve().parent / "out"
    out.mkdir(exist_ok=True)
    result = main(out)
    (out / "bench_transport.json").write_text(json.dumps(result, indent=2))
