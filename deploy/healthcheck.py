"""Container healthcheck of the hushnet image: is *this* bootstrap or node serving?

Docker runs it inside the container (``HEALTHCHECK`` in deploy/Dockerfile). The role is read
from the state directory, because a healthcheck does not see the entry point's variables:

* bootstrap (``bootstrap.json`` + ``ca.key``): a ``GetDirectory`` call over TLS to the local
  listen address must answer — the same call every node makes to join and renew its lease;
* node (``identity.json``): a ``Health`` call over mutual TLS, with the node's own certificate,
  to the address it advertises to its peers must return its own node id. That proves the
  node has joined, holds a valid certificate, and is reachable where its neighbours dial it.

Exit 0 = healthy, 1 = unhealthy (one line on stdout says why; ``docker inspect`` shows it).
Kept outside the ``node`` package on purpose: it is image plumbing, not product API.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys


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


def main() -> int:
    state = pathlib.Path(os.environ.get("HUSHNET_STATE_DIR", "/var/lib/hushnet"))
    timeout = float(os.environ.get("HUSHNET_HEALTH_TIMEOUT", "3"))
    try:
        if (state / "ca.key").exists() and (state / "bootstrap.json").exists():
            print(check_bootstrap(state, timeout))
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
