"""The anonymity layer's protocol names and the mapping of a spec to its machines' parameters.

:func:`onion_params` / :func:`anon_walk_params` map a spec's public fields and ``protocol_params`` to
the machine's parameters, with network timings for the hop-level reliability.  The typed parameter
classes, checked at construction, sit beside their machines because their sizes come from the
crypto layer's cells (importing it here would load ``cryptography`` into every process that imports
the family list): :class:`~hushnet.families.anonymity.onion.OnionParams` (onion relaying around any
machine) and :class:`~hushnet.families.anonymity.anonymous_walk.AnonWalkParams` (the
source-anonymous walk; their defaults are simulator timings: 50 ms acks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - types only
    from hushnet.runs.spec import RunSpec

RW_DPSGD_ONION = "rw-dpsgd-onion"
ANON_WALK_SGD = "anon-walk-sgd"

#: network defaults for the anonymity machines' hop-level reliability
NET_ACK_TIMEOUT = 2.0
NET_MAX_RETRIES = 3
NET_PAUSE_RETRY = 1.0


ONION_OPTIONS = (
    "hops",
    "slots",
    "cell_body",
    "payload_len",
    "epoch",
    "ack_timeout",
    "max_retries",
    "pause_retry",
)


def onion_params(spec: "RunSpec") -> dict[str, Any]:
    pp = dict(spec.protocol_params)
    out: dict[str, Any] = {
        "steps": spec.steps,
        "step_size": spec.step_size,
        "sigma": spec.sigma,
        "cap": spec.cap,
        "start": spec.start,
    }
    out["onion_hops"] = int(pp.get("hops", 3))
    out["onion_ack_timeout"] = float(pp.get("ack_timeout", NET_ACK_TIMEOUT))
    out["onion_max_retries"] = int(pp.get("max_retries", NET_MAX_RETRIES))
    out["onion_pause_retry"] = float(pp.get("pause_retry", NET_PAUSE_RETRY))
    for k in ("slots", "cell_body", "payload_len", "epoch"):
        if k in pp:
            out[f"onion_{k}"] = int(pp[k])
    return out


def anon_walk_params(spec: "RunSpec") -> dict[str, Any]:
    pp = dict(spec.protocol_params)
    out: dict[str, Any] = {
        "updates_per_node": int(pp.get("updates_per_node", spec.cap or 1)),
        "step_size": spec.step_size,
        "sigma": spec.sigma,
        "start": spec.start,
        "epoch": int(pp.get("epoch", 0)),
        "ack_timeout": float(pp.get("ack_timeout", NET_ACK_TIMEOUT)),
        "max_retries": int(pp.get("max_retries", NET_MAX_RETRIES)),
        "pause_retry": float(pp.get("pause_retry", NET_PAUSE_RETRY)),
    }
    for k in ("ell1", "ell2", "delta", "kappa", "delta_prime", "cell_body", "l_max"):
        if k in pp:
            out[k] = pp[k]
    out["mode"] = str(
        pp.get("mode", "A")
    ).upper()  # "A": the sealed token walks; "B": onion random walk
    return out


# ---- projectors --------------------------------------------------------------------------------
