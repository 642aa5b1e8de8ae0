"""Write a container node's run policy (``runs.toml``) from environment variables.

Why: in docker-compose/Swarm every replica of the ``node`` service is configured by the same
environment, but each node must read *its own* data shard, and which shard is "its own" is
only known after the bootstrap has assigned the node a vertex. The entry point therefore runs
this script in the background once ``identity.json`` exists, and it fills ``<vertex>`` /
``<node_id>`` in ``HUSHNET_DATA_PATH``. The node reads the policy when a run spec arrives, so
writing it shortly after the join is in time for every run. A node-host container
(``HUSHNET_NODES_PER_CONTAINER=K``) gets one policy per hosted node, each with its own vertex.

Variables: ``HUSHNET_DATA_PATH`` (e.g. ``/data/node-<vertex>.npz``; CSV with the label last,
or NPZ with ``X``, ``y``), ``HUSHNET_BUDGET_EPSILON`` and ``HUSHNET_BUDGET_DELTA`` (this node's
lifetime budget toward every other node). A ``runs.toml`` written by the node's owner (one
without the marker file ``runs.toml.from-env``) is never overwritten.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time


def state_dirs(state: pathlib.Path) -> list[pathlib.Path]:
    """The container's node state directories: one, or ``node-000`` ... for a node host."""
    per = int(os.environ.get("HUSHNET_NODES_PER_CONTAINER", "1") or "1")
    return [state] if per <= 1 else [state / f"node-{i:03d}" for i in range(per)]


def write_policy(state: pathlib.Path, data: str, eps: str, delta: str, deadline: float) -> int:
    """One node's ``runs.toml`` once it has joined (its vertex is known)."""
    policy, marker = state / "runs.toml", state / "runs.toml.from-env"
    if policy.exists() and not marker.exists():
        print(f"hushnet-entrypoint: keeping the owner's {policy}", file=sys.stderr)
        return 0
    ident_path = state / "identity.json"
    while not ident_path.exists():
        if time.monotonic() > deadline:
            print(
                f"hushnet-entrypoint: node in {state} never joined; no run policy written",
                file=sys.stderr,
            )
            return 1
        time.sleep(0.5)
    ident = json.loads(ident_path.read_text())
    try:
        from hushnet.runs.policy import NodePolicy
    except ImportError:
        print(
            "hushnet-entrypoint: this hushnet has no run service; HUSHNET_DATA_PATH ignored",
            file=sys.stderr,
        )
        return 0
    path = (
        data.replace("<vertex>", str(ident["vertex"])).replace("<node_id>", ident["node_id"])
        if data
        else None
    )
    NodePolicy.write(
        state,
        epsilon=float(eps) if eps else None,
        delta=float(delta) if delta else None,
        data_path=path,
    )
    marker.write_text(
        "runs.toml was written from HUSHNET_* variables by the container entry point\n"
    )
    print(
        f"hushnet-entrypoint: run policy for {ident['node_id']}: data={path} epsilon={eps or '-'} "
        f"delta={delta or '-'}",
        file=sys.stderr,
    )
    return 0


def main() -> int:
    state = pathlib.Path(os.environ.get("HUSHNET_STATE_DIR", "/var/lib/hushnet"))
    data = os.environ.get("HUSHNET_DATA_PATH", "").strip()
    eps = os.environ.get("HUSHNET_BUDGET_EPSILON", "").strip()
    delta = os.environ.get("HUSHNET_BUDGET_DELTA", "").strip()
    if not (data or eps):
        return 0
    deadline = time.monotonic() + float(os.environ.get("HUSHNET_POLICY_WAIT", "600"))
    return max(write_policy(d, data, eps, delta, deadline) for d in state_dirs(state))


if __name__ == "__main__":
    sys.exit(main())
