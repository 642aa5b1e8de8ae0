"""Accounting views: what an observer sees when a mechanism is on, and which accountant bound that
licenses — as data a run report shows.  Shared by the families (the walk's plain links, gossip's
neighbourhood and secure-summation views, the anonymity layer's onion relaying and sealed walk)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class AccountingView:
    """What an observer sees when a mechanism is on, and which accountant bound that licenses."""

    mechanism: str
    view_model: str
    accountant: str
    reason: str
    dp_credit: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


VIEWS: dict[str, AccountingView] = {
    "plain-links": AccountingView(
        "plain-links",
        "sender-known",
        "random-walk paper App. B.1 sender-known bound (max over the receiver's neighbours), certified",
        "without onion relaying the receiver's gRPC peer is the token's sender (docs/design/spec/randomwalk.md E.2)",
        True,
    ),
    "onion-relay": AccountingView(
        "onion-relay",
        "local",
        "local-DP Gaussian bound per contribution (the contribution seen in the clear), certified",
        "per delivery the relay plan hides the sender from the receiver, but every node also relays the same "
        "walk's other hops and so sees its link peers and next hops: part of the token's trajectory, which "
        "neither the random-walk paper's anonymous-sender view (its eq. 7) nor the sender-known view covers "
        "(exact on K4: a node's relay observations raise its best guess of the next sender from 1/3 to 0.47). "
        "No walk bound is certified; the anonymous-sender value is shown only as a labelled paper reproduction",
        False,
    ),
    "neighbourhood": AccountingView(
        "plain-gossip",
        "neighbourhood",
        "Muffliato certified exact loss, view='neighbourhood'",
        "without secure summation a node sees every message of its closed neighbourhood",
        True,
    ),
    "secure-summation": AccountingView(
        "secure-summation",
        "aggregate",
        "Muffliato certified exact loss, view='aggregate' (S = e_i^T: the observer sees only its sums)",
        "pairwise-masked secure summation is on: the aggregating node learns only the sum of its "
        "closed neighbourhood (threshold-bounded; a round below threshold releases nothing)",
        True,
    ),
    "secure-gossip": AccountingView(
        "secure-summation",
        "neighbourhood",
        "Muffliato certified exact loss, view='neighbourhood' (the aggregate view S = e_i^T is shown "
        "uncertified, as real arithmetic)",
        "pairwise-masked secure summation is on: the aggregating node learns only the sum of its closed "
        "neighbourhood, but each member's term W_ij·m_j (data and noise mixed) is rounded to the "
        "fixed-point grid on its own, so the sum is a function of the individual messages, which the "
        "neighbourhood view shows (docs/design/spec/secagg.md §6)",
        True,
    ),
    "source-anonymous-walk": AccountingView(
        "source-anonymous-walk",
        "sender-known",
        "every update charged as attributable to its node (no amplification credited), certified",
        "the destination sees the model after one update; source anonymity has no DP theorem and leaks "
        "by chain of custody (docs/design/spec/anonymity.md §6.6-6.7): entropy is reported as a diagnostic only",
        False,
    ),
}


def accounting_view(
    protocol: str,
    *,
    onion_hops: int = 0,
    secure_summation: bool = False,
    relay_independent: bool = True,
) -> AccountingView:
    """The view the accountant must use for a run (and why): aggregate only for a secure sum of noisy
    inputs (gossip over secure sums stays on the neighbourhood view: its members' rounding); onion
    relaying is charged at local DP (its relays observe the walk's trajectory, see ``VIEWS["onion-relay"]``),
    whatever its relay plan; no anonymity credit for the source-anonymous walk."""
    from hushnet.families.anonymity.params import ANON_WALK_SGD
    from hushnet.families.gossip.params import LABELS as GOSSIP_PROTOCOLS
    from hushnet.families.secagg.params import SECAGG_SUM

    if protocol == ANON_WALK_SGD:
        return VIEWS["source-anonymous-walk"]
    if protocol in GOSSIP_PROTOCOLS or protocol == "gossip":
        return VIEWS["secure-gossip"] if secure_summation else VIEWS["neighbourhood"]
    if protocol == SECAGG_SUM or secure_summation:
        return VIEWS["secure-summation"]
    if onion_hops < 1:
        return VIEWS["plain-links"]
    return VIEWS["onion-relay"]  # local DP whatever the plan: relays see the walk's trajectory
