"""The CPU cost of one link: TCP connection, TLS handshake, HTTP/2 set-up and first RPC (issue 12).

Why: a 2048-node hypercube has 22 528 directed links, and in ``bench_hosting`` gRPC's event-engine
threads spend ~3.7 ms of CPU per link until the network is healthy — about half of all the CPU the
start-up needs. This benchmark splits that cost on one process (both ends of every link in it, as in a
host process, on uvloop with the hosts' allocator setting), comparing in one run:

* ``insecure``: plaintext channels (a baseline only, to tell TLS from gRPC's own connection cost);
* ``tls``: server-authenticated TLS (the client presents no certificate);
* ``mtls``: mutual TLS exactly as hushnet's links are (each node's ECDSA P-256 certificate from
  :mod:`hushnet.net.pki`, the server requiring a client certificate that chains to the network CA, the
  client pinning the server's node name), one connection per directed link, confirmed by a unary
  Health call (how hushnet confirmed a new link before the sixth pass);
* ``mtls-ready``: the same links confirmed by the channel reaching READY, as hushnet's are now (gRPC's
  client says READY only after the server's HTTP/2 SETTINGS, sent once the server's handshake accepted
  the client certificate; see ``ChannelsMixin._probe``);
* ``mtls-edge``: the same mutual TLS with ONE connection per pair of directed links: the dialing end
  opens a bidirectional stream, the dialed end answers on it and sends its own message back, which the
  dialer acknowledges (what one connection per edge would cost; hushnet does not do this, see
  docs/network.md "Fourth pass: where a link's CPU goes");
* ``mtls-edge-proof``: the same, and the dialed end proves its directory key in-band (gRPC's Python client
  cannot read the server's certificate): it reads the dialer's identity from its TLS certificate (as
  ``Deliver`` does), signs ``(dialer, itself, the dialer's nonce)`` with its node key, and the dialer
  verifies the signature with the key it expects for that node.

Each mode builds ``servers`` servers (a node identity each) and dials each from ``per`` other nodes'
channels; measured from the first channel to the last confirmed link: CPU seconds of the whole process
(user + system) per directed link, split into the event loop (Python) and gRPC's event-engine threads,
then the CPU of one further unary RPC on each link. The modes run interleaved for ``rounds`` rounds
(so machine load affects each alike) and the median is reported with the ratios to ``insecure`` and of
``mtls-edge`` to ``mtls``. Nothing is asserted (``HUSHNET_BENCH_LINKS=servers,per,rounds`` to resize).
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import statistics
import time

from hushnet.net.load import cpu_split

MODES = ("insecure", "tls", "mtls", "mtls-ready", "mtls-edge", "mtls-edge-proof")
SERVICE = "bench.links.Peer"


def _sizes() -> tuple[int, int, int]:
    raw = os.environ.get("HUSHNET_BENCH_LINKS")
    if not raw:
        return 100, 10, 3
    servers, per, rounds = (int(x) for x in raw.split(","))
    if servers < 2 or not (1 <= per < servers) or rounds < 1:
        raise ValueError(
            f"HUSHNET_BENCH_LINKS: expected servers,per,rounds with 1 <= per < servers, got {raw!r}"
        )
    return servers, per, rounds


def _identities(n: int) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The network CA and n node identities (key PEM, certificate PEM), as the bootstrap issues them."""
    from hushnet.net import pki

    ca_key, ca_cert = pki.create_ca()
    ids = []
    for i in range(n):
        key = pki.generate_key()
        cert = pki.issue_cert(
            ca_key,
            ca_cert,
            key.public_key(),
            kind="node",
            name=f"n{i}",
            dns_names=[pki.node_dns(f"n{i}")],
        )
        ids.append((pki.key_to_pem(key), pki.cert_to_pem(cert)))
    return pki.cert_to_pem(ca_cert), ids


async def _health(request: bytes, context) -> bytes:
    return b"ok"


def _proof_message(dialer: str, dialed: str, nonce: bytes) -> bytes:
    return b"|".join((b"hushnet-link-proof", dialer.encode(), dialed.encode(), nonce))


def _link_handler(node_id: str, key_pem: bytes | None):
    """The dialed end of a one-connection edge: answer the dialer (with a proof of our key when we have
    one), then send our own message on its stream."""
    from hushnet.net import pki

    key = pki.load_key(key_pem) if key_pem is not None else None

    async def link(requests, context):
        async for message in requests:
            if not message.startswith(b"hello"):
                return
            if key is None:
                yield b"ok"
            else:
                dialer = pki.peer_identity(context)
                if dialer is None:
                    return
                yield pki.sign(key, _proof_message(dialer.name, node_id, message[5:]))
            yield b"from-the-dialed-end"

    return link


async def _trial(
    mode: str, servers: int, per: int, ca: bytes, ids: list[tuple[bytes, bytes]]
) -> dict:
    import grpc

    from hushnet.net import pki

    proof = mode == "mtls-edge-proof"
    running, ports = [], []
    for i in range(servers):
        link = _link_handler(f"n{i}", ids[i][0] if proof else None)
        handlers = {
            "Health": grpc.unary_unary_rpc_method_handler(_health),
            "Link": grpc.stream_stream_rpc_method_handler(link),
        }
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        if mode == "insecure":
            port = server.add_insecure_port("127.0.0.1:0")
        else:
            key, cert = ids[i]
            creds = pki.server_credentials(key, cert, ca, require_client_auth=mode != "tls")
            port = server.add_secure_port("127.0.0.1:0", creds)
        await server.start()
        running.append(server)
        ports.append(port)
    # one credentials object per node identity, as hushnet's links (ChannelsMixin._open_link)
    creds = [
        None
        if mode == "insecure"
        else pki.channel_credentials(ca)
        if mode == "tls"
        else pki.channel_credentials(ca, *ids[i])
        for i in range(servers)
    ]
    edge = mode.startswith("mtls-edge")
    # the keys the dialers expect (a node holds the directory's entries, parsed once)
    expected = [pki.load_cert(cert).public_key() for _, cert in ids] if proof else []
    await asyncio.sleep(0.2)
    c0, t0 = time.process_time(), cpu_split(os.getpid())
    channels, targets = [], []
    for i in range(servers):
        for j in range(per):
            if edge and j % 2:
                continue  # this pair's other direction rides the connection of the one before
            target = (i + j + 1) % servers
            targets.append((i, target))
            options = [("grpc.use_local_subchannel_pool", 1)]
            address = f"127.0.0.1:{ports[target]}"
            if mode == "insecure":
                channels.append(grpc.aio.insecure_channel(address, options=options))
            else:
                options.append(("grpc.ssl_target_name_override", pki.node_dns(f"n{target}")))
                channels.append(grpc.aio.secure_channel(address, creds[i], options=options))

    async def confirm(channel, ends: tuple[int, int]) -> None:
        if mode == "mtls-ready":
            await channel.channel_ready()
            return
        if not edge:
            await channel.unary_unary(f"/{SERVICE}/Health")(b"?", timeout=120, wait_for_ready=True)
            return
        call = channel.stream_stream(f"/{SERVICE}/Link")(timeout=120, wait_for_ready=True)
        nonce = os.urandom(16) if proof else b""
        await call.write(b"hello" + nonce)
        answer = await call.read()
        if proof:
            message = _proof_message(f"n{ends[0]}", f"n{ends[1]}", nonce)
            if not pki.verify_key(expected[ends[1]], message, answer):
                raise RuntimeError("the dialed end did not prove its key")
        elif answer != b"ok":
            raise RuntimeError("unexpected reply on a link stream")
        if await call.read() != b"from-the-dialed-end":
            raise RuntimeError("unexpected reply on a link stream")
        await call.write(b"ack")
        await call.done_writing()
        await call.code()

    await asyncio.gather(*(confirm(c, e) for c, e in zip(channels, targets)))
    c1, t1 = time.process_time(), cpu_split(os.getpid())
    await asyncio.gather(
        *(c.unary_unary(f"/{SERVICE}/Health")(b"?", timeout=120) for c in channels)
    )
    c2 = time.process_time()
    links = servers * per
    for c in channels:
        await c.close()
    for s in running:
        await s.stop(None)
    return {
        "ms_per_link": 1000 * (c1 - c0) / links,
        "loop_ms": 1000 * (t1["loop"] - t0["loop"]) / links,
        "grpc_ms": 1000 * (t1["grpc"] - t0["grpc"]) / links,
        "next_rpc_ms": 1000 * (c2 - c1) / len(channels),
    }


async def _all(servers: int, per: int, rounds: int) -> dict[str, list[dict]]:
    ca, ids = _identities(servers)
    out: dict[str, list[dict]] = {m: [] for m in MODES}
    for _ in range(rounds):
        for mode in MODES:
            out[mode].append(await _trial(mode, servers, per, ca, ids))
    return out


def main(out_dir: pathlib.Path) -> dict:
    import uvloop

    from hushnet.net.wire import tune_allocator

    tune_allocator()  # as in host processes
    servers, per, rounds = _sizes()
    load0 = [round(x, 2) for x in os.getloadavg()]
    trials = uvloop.run(_all(servers, per, rounds))
    rows = {}
    for mode, runs in trials.items():
        rows[mode] = {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]}
        rows[mode]["ms_per_link_runs"] = [round(r["ms_per_link"], 3) for r in runs]
    base = rows["insecure"]["ms_per_link"]
    for mode, row in rows.items():
        row["vs_insecure"] = round(row["ms_per_link"] / base, 2)
        print(
            f"   {mode:10s}: {row['ms_per_link']:.2f} ms of CPU per directed link (loop {row['loop_ms']:.2f}, "
            f"gRPC threads {row['grpc_ms']:.2f}; runs {row['ms_per_link_runs']}), {row['vs_insecure']:.2f}× "
            f"insecure; a further RPC {row['next_rpc_ms']:.2f} ms",
            flush=True,
        )
    ready_vs = round(rows["mtls-ready"]["ms_per_link"] / rows["mtls"]["ms_per_link"], 2)
    edge_vs = round(rows["mtls-edge"]["ms_per_link"] / rows["mtls"]["ms_per_link"], 2)
    proof_vs = round(rows["mtls-edge-proof"]["ms_per_link"] / rows["mtls"]["ms_per_link"], 2)
    print(
        f"   links confirmed by READY / by a Health RPC (mutual TLS): {ready_vs:.2f}; "
        f"one connection per edge / one per directed link (mutual TLS): {edge_vs:.2f}, "
        f"with the in-band key proof: {proof_vs:.2f}",
        flush=True,
    )
    return {
        "benchmark": "links",
        "servers": servers,
        "per_server": per,
        "directed_links": servers * per,
        "rounds": rounds,
        "modes": rows,
        "ready_vs_mtls": ready_vs,
        "edge_vs_mtls": edge_vs,
        "edge_proof_vs_mtls": proof_vs,
        "load_average_start": load0,
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
    }


if __name__ == "__main__":
    import json
    import sys

    print(
        json.dumps(
            main(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/out")), indent=2
        )
    )
