"""P-AD, node side: the node's own machine, refused when its data would exceed what the spec made
public (the projection and every charge use the public sensitivity and bins)."""

from __future__ import annotations

from hushnet.families.pad.accounting import public_sensitivity
from hushnet.families.pad.params import HISTOGRAMS, SUMS
from hushnet.runs.spec import RunSpec


def build_machine(node, spec: RunSpec, vertex: int, ids: list[str], task, W, options):
    """The node's own P-AD machine; refuses data whose sensitivity exceeds what the spec made public
    (the projection and every charge use the public value)."""
    from hushnet.protocols.registry import make_machine

    if spec.protocol in SUMS and task.sensitivity() > public_sensitivity(spec) * (1.0 + 1e-12):
        raise ValueError(
            f"this node's values have dimension {task.dim} (sensitivity {task.sensitivity():.4g}), "
            f"the spec's public sensitivity is {public_sensitivity(spec):.4g}: declare [task] dim"
        )
    if spec.protocol in HISTOGRAMS and task.bins != int(spec.task_params.get("bins", -1)):
        raise ValueError(
            f"this node's histogram has {task.bins} bins, the spec declares {spec.task_params.get('bins')}"
        )
    return make_machine(
        spec.protocol,
        vertex,
        len(ids),
        task,
        run_seed=spec.seed,
        run_id=spec.run_id,
        params=spec.machine_params(),
        view_model=spec.view_model,
        options=options,
        rng=spec.node_rng(vertex, len(ids)),
    )
