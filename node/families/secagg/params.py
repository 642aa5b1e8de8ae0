"""The secagg family's public parameters: its protocol names (the only place they are spelled), the
typed parameters of its machines (frozen dataclasses checked at construction, one-line errors) and
the spec → machine parameter mapping (public: every node computes the same; no secrets).

Light on purpose: the family object (:mod:`hushnet.families.secagg`) and the accounting views import
the names from here, and every node process imports the family list.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hushnet.crypto.masks import FixedPoint
    from hushnet.runs.spec import RunSpec

SECAGG_SUM = "secagg-sum"
SECAGG_DPSGD = "secagg-dpsgd"

#: every secagg protocol → its description (the family's ``protocols``)
LABELS: dict[str, str] = {
    SECAGG_SUM: "secure summation with pairwise masks, Shamir dropout recovery and a threshold (aggregate view)",
    SECAGG_DPSGD: "secure-aggregation DP-SGD: every round the (sampled) nodes' clipped gradients plus their noise "
    "shares are summed by secure summation under a rotating leader; distributed DP, no trusted party",
}

#: network default: a secure-sum phase waits this long for stragglers (seconds)
#: (and the network default of ``secagg-sum``)
NET_ROUND_TIMEOUT = 5.0
_OPTIONS = (
    "collusion",
    "threshold",
    "sample",
    "aggregation",
    "round_timeout",
    "frac_bits",
    "bits",
    "mask_degree",
    "average",
    "leader_timeout",
)


def ddp_params(spec: RunSpec) -> dict[str, Any]:
    """Machine parameters of a ``secagg-dpsgd`` spec (public: every node computes the same)."""
    pp = dict(spec.protocol_params)
    out: dict[str, Any] = {
        "rounds": int(spec.steps),
        "step_size": float(spec.step_size),
        "sigma": float(spec.sigma),
        "sample_seed": int(spec.seed),
        "round_timeout": float(pp.get("round_timeout", NET_ROUND_TIMEOUT)),
    }
    for k in _OPTIONS:
        if k in pp and k != "round_timeout":
            v = pp[k]
            out[k] = (
                str(v)
                if k == "aggregation"
                else bool(v)
                if k == "average"
                else float(v)
                if k == "leader_timeout"
                else int(v)
            )
    return out


def sum_params(spec: RunSpec) -> dict[str, Any]:
    """Machine parameters of a ``secagg-sum`` spec (public: every node computes the same)."""
    pp = dict(spec.protocol_params)
    n = spec.n
    members = tuple(int(m) for m in pp.get("members", range(n)))
    out: dict[str, Any] = {
        "members": members,
        "leader": int(pp.get("leader", spec.start)),
        "threshold": int(pp.get("threshold", len(members) // 2 + 1)),
        "round_timeout": float(pp.get("round_timeout", NET_ROUND_TIMEOUT)),
        "broadcast": bool(pp.get("broadcast", True)),
        "round_id": int(pp.get("round_id", 0)),
    }
    for k in ("frac_bits", "bits", "mask_degree"):
        if k in pp:
            out[k] = int(pp[k])
    if "consistency_check" in pp:  # off only with threshold > n/2 (SecAggParams refuses otherwise)
        out["consistency_check"] = bool(pp["consistency_check"])
    return out


@dataclass(frozen=True)
class SecAggParams:
    """Public parameters of one secure-summation round."""

    members: tuple[int, ...]
    leader: int
    threshold: int
    dim: int
    frac_bits: int = 24
    bits: int = 64
    round_timeout: float = 0.05
    noise_std: float = 0.0
    sensitivity: float = 1.0
    broadcast: bool = True
    round_id: int = 0
    mask_degree: int | None = (
        None  # None: complete masking graph (plain SecAgg); k: Harary graph H_{k,n}
    )
    # members sign the survivor set and refuse to unmask without a quorum of matching signatures
    # (SecAgg's malicious-leader consistency round); False: the honest-but-curious protocol, t > n/2 only
    consistency_check: bool = True
    # the leader announces a fresh nonce that every mask of the execution is bound to (issue 11, finding 6)
    fresh_nonce: bool = True

    def __post_init__(self) -> None:
        m = self.members
        if len(set(m)) != len(m) or len(m) < 2:
            raise ValueError("members must be at least two distinct nodes")
        if not 2 <= self.threshold <= len(m):
            raise ValueError(f"threshold must be in 2..{len(m)}")
        if not self.consistency_check and 2 * self.threshold <= len(m):
            raise ValueError(
                f"threshold {self.threshold} <= n/2 = {len(m) / 2:g} without the consistency check: a leader "
                "that tells two halves different survivor sets could unmask a member; use threshold >= "
                f"{len(m) // 2 + 1} or consistency_check"
            )
        if self.dim < 1 or self.round_timeout <= 0 or self.noise_std < 0:
            raise ValueError("need dim >= 1, round_timeout > 0, noise_std >= 0")
        if self.mask_degree is not None:
            lo = len(m) - self.threshold + 1
            if not lo <= self.mask_degree:
                raise ValueError(
                    f"mask_degree {self.mask_degree} < n − t + 1 = {lo}: dropouts allowed by the threshold "
                    "could cut the masking graph and expose partial sums"
                )

    @property
    def fixed_point(self) -> FixedPoint:
        from hushnet.crypto.masks import FixedPoint

        return FixedPoint(self.frac_bits, self.bits)

    def collusion_tolerance(self) -> int:
        """How many members may collude with the leader while the surviving honest inputs stay hidden
        except through their sum (see the module docstring)."""
        n, t = len(self.members), self.threshold
        shamir = t - 1  # t colluders would hold t shares of every secret
        if self.mask_degree is None or self.mask_degree >= n - 1:
            return shamir
        return min(shamir, self.mask_degree - 1 - (n - t))

    @property
    def consistency_quorum(self) -> int:
        """Matching survivor-set signatures a member needs before it unmasks: ``max(t, ⌊n/2⌋ + 1)`` with the
        consistency check (two quorums then share a member, who signs one set per round), ``t`` without."""
        n, t = len(self.members), self.threshold
        return max(t, n // 2 + 1) if self.consistency_check else t

    def malicious_collusion_tolerance(self) -> int:
        """How many members may collude with a *malicious* leader (one that equivocates on the survivor set)
        while the honest inputs stay hidden except through one survivor set's sum: two quorums of q signers
        (or, without the check, two unmasking groups of t) intersect in ``2q − n`` members, so fewer than
        ``2q − n`` colluders leave an honest member in the intersection, who signs (answers) only once."""
        n, q = len(self.members), self.consistency_quorum
        return min(self.collusion_tolerance(), 2 * q - n - 1)


@dataclass(frozen=True)
class DDPParams:
    """Public parameters of a ``secagg-dpsgd`` run (all from the signed spec)."""

    rounds: int
    step_size: float
    sigma: float  # certified noise multiplier of the aggregate view
    collusion: int = (
        1  # c: members in the largest certified observer coalition (the observer counts)
    )
    threshold: int | None = None  # t (default: ⌊m/2⌋ + 1 of the m members of a round)
    sample: int | None = None  # members per round (None: every node)
    sample_seed: int = 0  # public: the run seed
    aggregation: str = "secure"
    round_timeout: float = 0.05
    #: seconds a node waits for its round's outcome before it declares the leader lost (None: the default
    #: :func:`leader_timeout`, 10 round timeouts and at least 30 s)
    leader_timeout: float | None = None
    frac_bits: int = 24
    bits: int = 64
    mask_degree: int | None = None
    average: bool = True  # apply S/|U| (else S)
    extra: dict[str, Any] = field(default_factory=dict)

    def members_per_round(self, n: int) -> int:
        return n if self.sample is None else int(self.sample)

    def t(self, n: int) -> int:
        m = self.members_per_round(n)
        return int(self.threshold) if self.threshold is not None else m // 2 + 1
