"""The gossip family's public parameters: its protocol names (the only place they are spelled), the
network defaults, and the spec → machine parameter mapping (no secrets, no accounting).

Light on purpose: the family object (:mod:`hushnet.families.gossip`) imports the names from here and
every node process imports the family list.  The public schedules derived from these parameters are
in :mod:`hushnet.families.gossip.schedule`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hushnet.runs.spec import RunSpec

MUFFLIATO = "muffliato"
MUFFLIATO_RANDOMIZED = "muffliato-randomized"
MUFFLIATO_GD = "muffliato-gd"
GOSSIP_STREAM = "gossip-stream"

#: every gossip protocol → its description (the family's ``protocols``)
LABELS: dict[str, str] = {
    MUFFLIATO: "Muffliato averaging ([M] Alg. 1): noise once, synchronous gossip rounds, optional Chebyshev",
    MUFFLIATO_RANDOMIZED: "randomized Muffliato ([M] Alg. 2): pairwise averaging on a seeded public activation schedule",
    MUFFLIATO_GD: "Muffliato-GD ([M] Alg. 3): noisy local gradient step then K gossip rounds (optional fresh ER graph per step)",
    GOSSIP_STREAM: "streaming gossip DP-GD (Koskela-Kulkarni §5): fresh noise every round, theta <- W(theta + x + u)",
}

#: gossip protocols a networked node runs
NET_GOSSIP = (MUFFLIATO, MUFFLIATO_GD, GOSSIP_STREAM, MUFFLIATO_RANDOMIZED)
#: the one protocol whose rounds are pairwise activations, not synchronous rounds of W
PAIRWISE = MUFFLIATO_RANDOMIZED
#: network round defaults: a neighbour silent this long (seconds, heartbeats reset it) is dropped for the round
NET_TIMEOUT = 2.0
NET_GIVE_UP = 3
NET_MAX_AHEAD = 2
#: stream accounting is dense in (rounds × n): keep the node's projection cheap
STREAM_MAX_CELLS = 4096
#: settlement tolerance: a realised loss within this of what was charged is the same loss (float error)
SETTLE_RTOL, SETTLE_ATOL = 1e-9, 1e-12


# ---- typed round options -----------------------------------------------------------------------


@dataclass(frozen=True)
class GossipOptions:
    """Transport-facing options of a round (public, part of the run spec).

    ``timeout``: how long a neighbour may stay *silent* while awaited before it counts as dropped for
    the round (virtual seconds in the simulator).  Silence, not phase length: a node that is itself
    waiting sends ``HEARTBEAT`` every ``timeout/ticks`` seconds, so a live neighbour held up by a dead
    one further away is never mistaken for a dropout (fixed phase deadlines would cascade);
    ``max_ahead``: how many rounds ahead a message may be and still be buffered;
    ``give_up_after``: consecutive silent rounds after which a neighbour is declared gone;
    ``ticks``: timer ticks per timeout; ``record_steps``: Muffliato-GD emits its model after every
    gradient step as a ``model`` metric (simulation traces only);
    ``dropout``: probability that this node announces itself unavailable for a round (the
    *simulated* user dropouts of [M] App. H.6, drawn from a child of the node's generator so the
    noise stream is unchanged); ``record_states``: emit the state after every round as a
    ``state`` metric (simulation traces only — a state is an extra release, docs/design/spec/randomwalk.md §E.1).
    """

    timeout: float = 0.05
    max_ahead: int = 2
    give_up_after: int = 3
    dropout: float = 0.0
    record_states: bool = False
    ticks: int = 4
    record_steps: bool = False

    def __post_init__(self) -> None:
        if not self.timeout > 0:
            raise ValueError(f"gossip: timeout must be > 0, got {self.timeout!r}")
        for name in ("max_ahead", "give_up_after", "ticks"):
            if getattr(self, name) < 1:
                raise ValueError(f"gossip: {name} must be >= 1, got {getattr(self, name)!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"gossip: dropout must lie in [0, 1), got {self.dropout!r}")


# ---- machine parameters -------------------------------------------------------------------------


def gossip_params(spec: RunSpec) -> dict[str, Any]:
    """Public machine parameters of a gossip spec (the same dict the simulator gets: the parity input).

    ``steps`` is the number of rounds (averaging, streaming) or of gradient steps (Muffliato-GD, with
    ``protocol_params.K`` rounds per step); ``sigma`` the noise multiplier; ``protocol_params`` may set
    ``chebyshev``/``gamma``, ``K``, and the round options ``timeout``, ``max_ahead``,
    ``give_up_after``, ``ticks`` and ``dropout`` (simulated unavailability, seeded per node).
    """
    pp = dict(spec.protocol_params)
    out: dict[str, Any] = {"sigma": float(spec.sigma)}
    if spec.protocol == MUFFLIATO_GD:
        out.update(
            steps=int(spec.steps),
            step_size=float(spec.step_size),
            K=int(pp.get("K", 1)),
            chebyshev=bool(pp.get("chebyshev", False)),
        )
        if (
            pp.get("graph", "fixed") == "er-per-step"
        ):  # public: every node draws the same step graphs
            out.update(graph="er-per-step", graph_seed=int(pp.get("graph_seed", spec.seed)))
            if "q" in pp:
                out["q"] = float(pp["q"])
    elif spec.protocol == PAIRWISE:  # T ticks of the public activation schedule, seeded by the run
        out.update(
            rounds=int(pp.get("rounds", spec.steps)),
            schedule_seed=int(pp.get("schedule_seed", spec.seed)),
        )
    else:
        out["rounds"] = int(pp.get("rounds", spec.steps))
        if spec.protocol == GOSSIP_STREAM:
            out["step_size"] = float(spec.step_size)
        elif pp.get("chebyshev"):
            out["chebyshev"] = True
    if "gamma" in pp:
        out["gamma" if spec.protocol != MUFFLIATO_GD else "gammas"] = (
            float(pp["gamma"])
            if spec.protocol != MUFFLIATO_GD
            else [float(pp["gamma"])] * int(spec.steps)
        )
    out["timeout"] = float(pp.get("timeout", NET_TIMEOUT))
    out["max_ahead"] = int(pp.get("max_ahead", NET_MAX_AHEAD))
    out["give_up_after"] = int(pp.get("give_up_after", NET_GIVE_UP))
    for k in ("ticks",):
        if k in pp:
            out[k] = int(pp[k])
    if "dropout" in pp:
        out["dropout"] = float(pp["dropout"])
    if (
        view_of(spec) == "aggregate"
    ):  # the aggregate view is licensed only by the mechanism: both or neither
        out["secure_summation"] = True
        if "frac_bits" in pp:
            out["frac_bits"] = int(pp["frac_bits"])
    return out


def view_of(spec: RunSpec) -> str:
    return str(spec.protocol_params.get("view", "neighbourhood"))
