"""What a protocol family is: the one object the run machinery asks about a protocol.

A family groups the protocols that share machines, parameters and accounting (the walk, P-AD,
gossip, the anonymity layer, secure summation, the central baseline).  Everything protocol-specific
that the generic code needs — the machine of one node, the spec → machine parameter mapping, the
node's acceptance projection, the ledger cost of a data action, the paper's (uncertified) bound, a
durable journal, extra operator commands — is a method here, so the generic code (the registry,
the run service, the driver, the accountant's entry points) never compares protocol names.

Family modules import their heavy dependencies (scipy, the privacy library) inside the methods:
the family list is imported by every node process, and a node that runs a walk should not pay for
the gossip accountant (issue 12's import weight).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Callable, Mapping, runtime_checkable
from typing import Protocol as TypingProtocol

import numpy as np

if TYPE_CHECKING:  # pragma: no cover - types only
    from hushnet.engine.protocol import NodeContext, Protocol
    from hushnet.runs.spec import Budget, PolicyDecision, RunSpec


@runtime_checkable
class RunCost(TypingProtocol):
    """What the driver charges on the node's persistent ledger for each data action of a run.

    ``targets`` are the node ids the charges are toward (every other node); ``orders`` the Rényi
    orders of the ledger.  :meth:`curves` gives the certified per-contribution RDP, one row per
    target, for a contribution with noise multiplier ``sigma``; :meth:`entry` turns one engine
    ledger action into a persistent ledger entry.  Implementations: the walk / local-DP
    :class:`~hushnet.runs.accounting.ContributionCost`, P-AD's ``PadCost``, gossip's ``GossipCost``.
    """

    targets: list[str]
    orders: np.ndarray
    bound_name: str

    def curves(self, sigma: float) -> np.ndarray: ...

    def entry(self, ev: Any, run_id: str, node_id: str) -> Any: ...


class Family(ABC):
    """Base class of a protocol family (one subclass per family, one instance in :data:`FAMILIES`).

    Subclasses set :attr:`name` and :attr:`protocols` and implement :meth:`machine_params` and
    :meth:`make_machine`; the other methods have the defaults most families want.
    """

    #: short family name (``"walk"``, ``"gossip"``, …)
    name: str = ""
    #: protocol name → one-line description (shown by CLIs; the node refuses any other name)
    protocols: Mapping[str, str] = {}
    #: the operator's process drives the run (a trusted aggregator), not the nodes' own start
    operator_driven: bool = False

    def __contains__(self, protocol: object) -> bool:
        return protocol in self.protocols

    # ---- what a spec of this family must give (checked by RunSpec.validate) ------------------------

    def task_kind(self, protocol: str) -> str | None:
        """``"gradient"``, ``"sum"`` or ``"histogram"``: the kind of task the protocol's machines need
        (built-in tasks of another kind are refused), or None when any task may do."""
        return None

    def graph_kind(self, protocol: str) -> str | None:
        """``"ring"`` or ``"complete"`` when the protocol only runs on that graph family, else None."""
        return None

    def rounds_per_node(self, protocol: str) -> bool:
        """Whether the run's length is ``rounds`` per node (a ring's laps, ``rounds·n`` steps) instead of ``steps``."""
        return False

    def needs_sigma(self, protocol: str) -> bool:
        """Whether the spec's ``sigma`` (the noise multiplier) must be a positive number."""
        return self.task_kind(protocol) in ("gradient", "sum")

    def needs_gamma(self, protocol: str) -> bool:
        """Whether the spec's ``gamma`` (randomized-response probability) must lie in (0, 1)."""
        return self.task_kind(protocol) == "histogram"

    # ---- machines -------------------------------------------------------------------------------

    @abstractmethod
    def machine_params(self, spec: "RunSpec") -> dict[str, Any]:
        """The machine's public parameters, from the spec's public fields."""

    def contexts(self, protocol: str, n: int) -> int:
        """How many machines a run of ``n`` data nodes has (the central baseline adds its aggregator)."""
        return n

    def needs_transition_matrix(self, protocol: str) -> bool:
        """Whether :meth:`make_machine` needs the public W built from the spec's graph."""
        return False

    @abstractmethod
    def make_machine(
        self,
        protocol: str,
        ctx: "NodeContext",
        task: Any,
        params: dict[str, Any],
        *,
        W: Any,
        options: Any,
        run_seed: int,
    ) -> "Protocol":
        """One node's machine; ``ctx`` carries its vertex, n, run id, generator and view model."""

    def node_machine(
        self,
        node: Any,
        spec: "RunSpec",
        vertex: int,
        ids: list[str],
        task: Any,
        W: Any,
        options: Any,
    ) -> "Protocol":
        """The machine a networked node runs (families that need node-local material — keys, the
        directory — override this); by default the simulator's machine with the node's own generator."""
        from hushnet.protocols.registry import make_machine

        return make_machine(
            spec.protocol,
            vertex,
            len(ids),
            task,
            run_seed=spec.seed,
            run_id=spec.run_id,
            params=spec.machine_params(),
            W=W if self.needs_transition_matrix(spec.protocol) else None,
            view_model=spec.view_model,
            options=options,
            rng=spec.node_rng(vertex, len(ids)),
        )

    # ---- accounting -----------------------------------------------------------------------------

    def project(
        self, spec: "RunSpec", vertex: int, local: "Budget | None", W: Any
    ) -> "PolicyDecision":
        """The node's projected certified loss before it accepts the run (and its decision); by default
        a refusal — a node accepts only what some certified accountant of the family bounds."""
        from hushnet.runs.spec import PolicyDecision

        return PolicyDecision(
            False,
            f"cannot project this node's privacy loss: no certified node-side accountant for "
            f"protocol {spec.protocol!r} yet; the node cannot project its loss",
            None,
            spec.budget.delta,
            "certified",
        )

    def cost(self, spec: "RunSpec", vertex: int, ids: list[str], W: Any, orders: Any) -> RunCost:
        """The certified ledger charge per data action; by default the contribution seen in the clear
        (local-DP Gaussian bound), which is sound for every protocol."""
        from hushnet.runs.accounting import local_dp_cost

        return local_dp_cost(vertex, ids, orders)

    def paper_bound(
        self, spec: "RunSpec", vertex: int, contributions: float, W: Any
    ) -> tuple[np.ndarray, str] | None:
        """The published (uncertified) bound of this node's row and its label; None if the papers give none."""
        return None

    # ---- operator-side ----------------------------------------------------------------------------

    def prepare_submit(self, spec: "RunSpec", directory: Any) -> "RunSpec":
        """The spec the operator signs, given the network's directory: a family fills in what every
        node must agree on and cannot pick alone (default: the spec unchanged)."""
        return spec

    # ---- node-side plumbing ---------------------------------------------------------------------

    def journal(
        self, service: Any, spec: "RunSpec", vertex: int, ids: list[str]
    ) -> Callable[[Any], None] | None:
        """A durable per-ledger-entry journal the driver writes before the next actions, or None."""
        return None

    def commands(self) -> Mapping[str, Callable[..., Any]]:
        """Extra operator commands of the run service: name → ``async fn(service, payload) -> bytes``."""
        return {}
