"""Container healthcheck of the hushnet image: is *this* bootstrap or node serving?

Docker runs it inside the container (``HEALTHCHECK`` in deploy/Dockerfile). The role is read
from the state directory, because a healthcheck does not see the entry point's variables:

* bootstrap (``bootstrap.json`` + ``ca.key``): a ``GetDirectory`` call over TLS to the local
  listen address must answer — the same call every node makes to join and renew its lease;
* node (``identity.json``): a ``Health`` call over mutual TLS, with the node's own certificate,
  to the address it advertises to its peers must return its own node id. That proves the
  node has joined, holds a valid certificate, and is reachable where its neighbours dial it;
* node host (``HUSHNET_NODES_PER_CONTAINER=K``, states in ``node-000`` ...): that call for every
  one of the K nodes; the container is healthy only when all K are.

Exit 0 = healthy, 1 = unhealthy (one line on stdout says why; ``docker inspect`` shows it).
Kept outside the ``node`` package on purpose: it is image plumbing, not product API.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
from concurrent.futures import ThreadPoolExecutor


def _local(address: str) -> str:
    host, port = address.rsplit(":", 1)
    return f"127.0.0.1:{port}" if host in ("0.0.0.0", "", "[::]", "::") else address


def check_bootstrap(state: pathlib.Path, timeout: float) -> str:
    import grpc

    from hushnet.net import pki
    from hushnet.v1 import bootstrap_pb2 as bpb
    from hushnet.v1 import bootstrap_pb2_grpc as bpb_grpc

    info = json.loads((state / "bootstrap.json").read_text())
    address = _local(info["address"])
    with grpc.secure_channel(
        address,
        pki.channel_credentials((state / "ca.pem").read_bytes()),
        options=[("grpc.ssl_target_name_override", pki.BOOTSTRAP_DNS)],
    ) as ch:
        d = bpb_grpc.BootstrapStub(ch).GetDirectory(bpb.DirectoryRequest(), timeout=timeout)
    alive = sum(1 for m in d.members if m.alive)
    return f"bootstrap {address}: topology {d.topology}, {alive}/{d.n_vertices} members alive, epoch {d.epoch}"


def check_node(state: pathlib.Path, timeout: float) -> str:
    import grpc

    from hushnet.net import pki
    from hushnet.v1 import peer_pb2 as ppb
    from hushnet.v1 import peer_pb2_grpc as ppb_grpc

    ident = json.loads((state / "identity.json").read_text())
    node_id, address = ident["node_id"], ident["address"]
    creds = pki.channel_credentials(
        (state / "ca.pem").read_bytes(),
        (state / "node.key").read_bytes(),
        (state / "node.pem").read_bytes(),
    )
    with grpc.secure_channel(
        address, creds, options=[("grpc.ssl_target_name_override", pki.node_dns(node_id))]
    ) as ch:
        reply = ppb_grpc.PeerStub(ch).Health(ppb.HealthRequest(), timeout=timeout)
    if not reply.ok or reply.node_id != node_id:
        raise RuntimeError(
            f"{address} answered as {reply.node_id!r} (ok={reply.ok}), expected {node_id}"
        )
    return f"node {node_id} serving on {address}"


def check_host(state: pathlib.Path, count: int, timeout: float) -> str:
    """A node-host container: every one of its ``count`` nodes must pass :func:`check_node`
    (one failing node makes the container unhealthy, and the line names it)."""
    dirs = [state / f"node-{i:03d}" for i in range(count)]
    missing = [d.name for d in dirs if not (d / "identity.json").exists()]
    if missing:
        raise RuntimeError(
            f"{len(missing)}/{count} hosted nodes not joined yet: {', '.join(missing[:5])}"
        )

    def probe(d: pathlib.Path) -> str | None:
        try:
            check_node(d, timeout)
            return None
        except Exception as exc:
            return f"{d.name}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"

    # in parallel, so that a host of many nodes answers within Docker's healthcheck timeout
    with ThreadPoolExecutor(max_workers=min(16, count)) as pool:
        failed = [r for r in pool.map(probe, dirs) if r]
    if failed:
        raise RuntimeError(f"{len(failed)}/{count} hosted nodes not serving; {failed[0]}")
    first = json.loads((dirs[0] / "identity.json").read_text())
    return (
        f"node host: {count}/{count} nodes serving, first {first['node_id']} on {first['address']}"
    )


def main() -> int:
    state = pathlib.Path(os.environ.get("HUSHNET_STATE_DIR", "/var/lib/hushnet"))
    timeout = float(os.environ.get("HUSHNET_HEALTH_TIMEOUT", "3"))
    # Docker runs the healthcheck with the container's environment: K is known here
    count = int(os.environ.get("HUSHNET_NODES_PER_CONTAINER", "1") or "1")
    try:
        if (state / "ca.key").exists() and (state / "bootstrap.json").exists():
            print(check_bootstrap(state, timeout))
        elif count > 1:
            print(check_host(state, count, timeout))
        elif (state / "identity.json").exists():
            print(check_node(state, timeout))
        else:
            print(
                f"not ready: no bootstrap.json or identity.json in {state} yet (starting or joining)"
            )
            return 1
    except Exception as exc:  # any failure is "unhealthy", with the reason on one line
        print(f"unhealthy: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
