"""Source-anonymous random-walk learning (Egger et al.; docs/design/spec/anonymity.md §2, §6.3 Mode A, §6.4).

The token holder updates the model, draws a destination ``j`` from the privacy core's ``p*_{κ,δ}``
(:func:`hushnet.privacy.anonymity_setup.sample_destination`: ``ℓ ~ p*`` over non-empty shells with
``ℓ ≥ ℓ1 ≥ 2``, so never itself or a neighbour, then ``j`` uniform in the shell), seals the model to
``j``'s destination key (:func:`hushnet.crypto.sealed.seal_token`) and hands the sealed token to a
uniform neighbour.  Every receiver trial-opens the token's 80-byte header: on failure it is a relay
and forwards the *same bytes* to a uniform neighbour (simple random walk, backtracking allowed, not
lazy — decision D2); the first visit of ``j`` opens it, updates, and becomes the next source.

Nothing in the token names the source, the destination, an iteration or a hop count (D4, D5): the
token is ``kem ‖ AEAD(model)``, bound to the run and key epoch by the sealing ``info``, and travels
as ``kind ‖ hop id ‖ token`` in fixed-size cells.  Each handoff is acknowledged (the fresh random
hop id marks retransmissions, so a lost ack never duplicates the walk); a neighbour that stays
silent gets the token re-sent, then the token goes to another uniform neighbour, recorded as a
``Deviation`` (walk loss, docs/design/spec/anonymity.md §6.6 / D6).  The run ends at the first node asked to update beyond its local cap
``updates_per_node`` (a local rule, so no global counter has to ride in the token).

Hitting times are recorded *outside* the token, as metrics (``anon-hop`` per forward,
``anon-open`` per opening) that the simulator or the node driver logs; :func:`iterations` turns a
metric stream back into (source, destination, hops) rows.  Destination choice and forwarding use
``secret_rng`` (default: seeded from the OS CSPRNG): with the public run seed they would be
predictable by everyone.  DP noise comes from the node's run generator like every other machine.

Bad input: cells that are truncated/oversized, a token from a non-neighbour, a token whose header
opens here but whose body fails authentication (tampered, or moved under another header), a token
replayed to its destination, a model of the wrong length — each a typed, counted Fault; the
token is dropped and nothing enters the ledger.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar

import numpy as np

from hushnet.crypto.cells import CELL_BODY, from_cells, n_cells, to_cells
from hushnet.crypto.keys import KeyDirectory, KeyPair
from hushnet.crypto.replay import ReplayCache
from hushnet.crypto.sealed import seal_token, token_length, token_replay_tag, try_open_token
from hushnet.engine.actions import (
    Action,
    CancelTimer,
    Deviation,
    Fault,
    Finish,
    LedgerEntry,
    Metric,
    Paused,
    Send,
    SetTimer,
)
from hushnet.engine.errors import (
    MalformedMessage,
    ReplayedMessage,
    UnexpectedSender,
    WrongDimension,
)
from hushnet.engine.protocol import NodeContext, Protocol
from hushnet.engine.rng import secret_generator
from hushnet.families.anonymity.params import ANON_WALK_SGD
from hushnet.families.anonymity.wire import HOP_ID, KIND_HOP_ACK, KIND_SEALED
from hushnet.families.views import VIEWS
from hushnet.privacy.anonymity_setup import AnonymitySetup, sample_destination
from hushnet.tasks.base import GradientTask

_TIMER = "anon-retx:"
_WORK = (
    "anon-work:"  # the role's work (forward or update) runs on a zero timer, after the hop ack left
)
_RECENT = 4096  # hop ids remembered for duplicate detection
ACCOUNTING_VIEW = VIEWS["source-anonymous-walk"]


@dataclass(frozen=True)
class AnonWalkParams:
    """Public parameters: local update cap, step size, noise multiplier σ (std = sensitivity·σ),
    start node, initial model, key epoch, the network-wide cell size, hop-level reliability, and
    the walk ``mode`` ("A": the sealed token walks; "B": the source samples the walk and sends it
    as an onion, :mod:`hushnet.families.anonymity.onion_walk`) with Mode B's header slots ``l_max``."""

    updates_per_node: int
    step_size: float
    sigma: float
    start: int = 0
    x0: tuple[float, ...] | None = None
    epoch: int = 0
    cell_body: int = CELL_BODY
    reliable: bool = True
    ack_timeout: float = 0.05
    max_retries: int = 3
    pause_retry: float = 1.0
    mode: str = "A"
    l_max: int = 0

    def __post_init__(self) -> None:
        if self.updates_per_node < 1 or not self.step_size > 0 or not self.sigma >= 0:
            raise ValueError("need updates_per_node >= 1, step_size > 0, sigma >= 0")
        if self.mode not in ("A", "B"):
            raise ValueError(
                f"walk mode {self.mode!r}: 'A' (walk forwarding) or 'B' (onion random walk)"
            )
        if self.l_max < 0:
            raise ValueError("l_max must be >= 0 (0: the spec's default for the graph)")
        if self.ack_timeout <= 0 or self.pause_retry <= 0 or self.max_retries < 0:
            raise ValueError("ack_timeout and pause_retry must be > 0, max_retries >= 0")


def sealing_info(run_id: str, epoch: int) -> bytes:
    return b"hushnet/v1/anon-walk|" + run_id.encode() + b"|" + int(epoch).to_bytes(8, "big")


class AnonymousWalk(Protocol):
    """One node of the source-anonymous walk (Mode A).

    Mode B (:class:`hushnet.families.anonymity.onion_walk.OnionWalk`) shares everything but what travels
    (:attr:`kind`, :meth:`_wire_len`), what a receiver does with it (:meth:`_receive`) and how the
    source sends the sealed token (:meth:`_dispatch`).
    """

    name: ClassVar[str] = ANON_WALK_SGD
    mode: ClassVar[str] = "A"
    kind: ClassVar[int] = KIND_SEALED
    #: a silent neighbour's token may go to another uniform neighbour (Mode A: the next hop is a
    #: fresh uniform draw anyway; Mode B: the path is fixed inside the onion, so it cannot)
    can_reroute: ClassVar[bool] = True

    def __init__(
        self,
        ctx: NodeContext,
        setup: AnonymitySetup,
        task: GradientTask,
        params: AnonWalkParams,
        dest_key: KeyPair,
        directory: KeyDirectory,
        *,
        secret_rng: np.random.Generator | None = None,
        replay: ReplayCache | None = None,
    ) -> None:
        super().__init__(ctx)
        if setup.n != ctx.n:
            raise ValueError(f"setup has {setup.n} nodes, run has {ctx.n}")
        if directory.epoch != params.epoch:
            raise ValueError(
                f"directory is for epoch {directory.epoch}, run uses epoch {params.epoch}"
            )
        self.setup = setup
        self.task = task
        self.p = params
        self.key = dest_key
        self.directory = directory
        self.dim = int(task.dim)
        self.sens = float(task.sensitivity())
        self.noise_std = self.sens * params.sigma
        adj = setup.adjacency
        self.neighbours = np.asarray(
            adj.indices[adj.indptr[ctx.node] : adj.indptr[ctx.node + 1]], dtype=np.int64
        )
        self._nbset = frozenset(int(x) for x in self.neighbours)
        self.info = sealing_info(ctx.run_id, params.epoch)
        self.token_len = token_length(8 * self.dim)
        self._init_mode()
        self.cells = n_cells(1 + HOP_ID + self._wire_len(), params.cell_body)
        self._pending: dict[
            bytes, tuple[int, bytes, bytes, int]
        ] = {}  # hop id -> (dst, token, payload, attempts)
        self._recent: dict[bytes, None] = {}  # hop ids received (insertion-ordered, bounded)
        self._work: dict[
            bytes, Callable[[], list[Action]]
        ] = {}  # hop id -> the role's deferred work
        # the node's persistent cache when deployed (replays refused for the key's whole epoch, across runs
        # and restarts); a fresh one per machine in the simulator
        self.replay = replay if replay is not None else ReplayCache({params.epoch})
        if replay is not None:
            replay.open_epoch(params.epoch)
        self.secret_rng = secret_rng if secret_rng is not None else secret_generator()
        self.updates = 0
        self.relayed = 0
        self.chosen: list[int] = []  # destinations this node chose (its own knowledge)
        if params.x0 is not None and len(params.x0) != self.dim:
            raise ValueError(f"x0 has {len(params.x0)} entries, the model has {self.dim}")

    @property
    def contribution_sigma(self) -> float:
        """The noise multiplier of its updates' ledger entries (the entry is built from this very value):
        the driver prepares the run's charges at it, so every update is charged by reference (issue 12)."""
        return self.noise_std / self.sens if self.sens > 0 else float("inf")

    # events -------------------------------------------------------------------------------------

    def on_start(self) -> list[Action]:
        if self.ctx.node != self.p.start:
            return []
        x0 = np.zeros(self.dim) if self.p.x0 is None else np.asarray(self.p.x0, dtype=np.float64)
        return self._source_step(x0)

    def on_message(self, src: int, payload: bytes) -> list[Action]:
        if payload[:1] == bytes([KIND_HOP_ACK]):
            return self._on_ack(src, payload)
        if src not in self._nbset:
            raise UnexpectedSender(
                f"sealed token from node {src}, not a neighbour of node {self.ctx.node}"
            )
        data = from_cells(payload, self.p.cell_body, expected_cells=self.cells)
        if len(data) != 1 + HOP_ID + self._wire_len() or data[0] != self.kind:
            raise MalformedMessage(
                f"not a Mode-{self.mode} walk message of this run ({len(data)} bytes, kind {data[:1].hex()})"
            )
        hop_id, wire = bytes(data[1 : 1 + HOP_ID]), bytes(data[1 + HOP_ID :])
        ack: list[Action] = [Send(src, bytes([KIND_HOP_ACK]) + hop_id)] if self.p.reliable else []
        if (
            hop_id in self._recent
        ):  # a retransmission (our ack was lost) or a replay: acknowledge, never process
            return ack + [
                Fault(
                    self.ctx.node,
                    ReplayedMessage("handoff already received here: acknowledged, not processed"),
                )
            ]
        work = self._receive(hop_id, wire)  # the checks every role makes; raises on bad input
        if isinstance(work, list):  # refused after the checks (e.g. routed to a non-neighbour)
            return work + ack
        # the ack leaves here, at the same point and before any role-specific work, whether this node
        # relays or updates (issue 11 finding 5): its timing must not tell the predecessor which one it is;
        # the forward or the update runs right after, on a zero timer
        self._remember(hop_id)
        if not ack:  # no hop ack (unreliable links): nothing to keep apart from the role's work
            return work()
        self._work[hop_id] = work
        return ack + [SetTimer(_WORK + hop_id.hex(), 0.0)]

    # what differs between the modes ---------------------------------------------------------------

    def _init_mode(self) -> None:
        """Mode-specific state (Mode A: none)."""

    def _wire_len(self) -> int:
        """Bytes of what travels between hops (Mode A: the sealed token itself)."""
        return self.token_len

    def _receive(self, hop_id: bytes, token: bytes) -> Callable[[], list[Action]] | list[Action]:
        """Mode A: trial-open; not for me → (later) relay the *same* bytes to a uniform neighbour.
        Returns the role's work, run after the hop ack (or actions to send at once, with the ack)."""
        body = try_open_token(
            self.key, token, self.info
        )  # IntegrityError if it opens but was tampered
        if body is None:
            return lambda: self._relayed(hop_id) + self._hand_off(token)
        return self._deliver(hop_id, token, body)

    def _dispatch(self, token: bytes, j: int) -> list[Action]:
        """Mode A: the source hands the sealed token to a uniform neighbour."""
        return self._hand_off(token)

    def _mode_report(self) -> dict:
        return {"walk_mode": self.mode}

    # shared by both modes ---------------------------------------------------------------------------

    def _relayed(self, hop_id: bytes) -> list[Action]:
        self._remember(hop_id)
        self.relayed += 1
        return [Metric("anon-hop", 1, -1, self.ctx.node)]

    def _deliver(self, hop_id: bytes, token: bytes, body: bytes) -> Callable[[], list[Action]]:
        """The destination opened ``token``: check the model, refuse a replay; the update and the
        send-on are returned as the deferred work."""
        if len(body) != 8 * self.dim:
            raise WrongDimension(
                f"sealed model of {len(body)} bytes, the run's model has {8 * self.dim}"
            )
        x = np.frombuffer(body, dtype="<f8").copy()
        if not np.all(np.isfinite(x)):
            raise MalformedMessage("sealed model contains NaN or infinity")
        self.replay.check_and_add(
            self.p.epoch, token_replay_tag(token)
        )  # a replayed token stops here
        self._remember(hop_id)

        def update() -> list[Action]:
            if self.finished:
                return []
            return [Metric("anon-open", self.ctx.node, -1, self.ctx.node)] + self._source_step(x)

        return update

    def on_timer(self, name: str) -> list[Action]:
        if name.startswith(_WORK):
            work = self._work.pop(bytes.fromhex(name[len(_WORK) :]), None)
            return work() if work is not None else []
        if not name.startswith(_TIMER):
            return []
        hop_id = bytes.fromhex(name[len(_TIMER) :])
        if hop_id not in self._pending:
            return []
        dst, token, payload, attempts = self._pending[hop_id]
        attempts += 1
        if attempts <= self.p.max_retries:
            self._pending[hop_id] = (dst, token, payload, attempts)
            return [Send(dst, payload), SetTimer(name, self.p.ack_timeout)]
        # the neighbour stays silent: hand the token to another uniform neighbour (docs/design/spec/anonymity.md §6.6 walk loss),
        # recorded as a deviation from the simple random walk; alone with it, keep retrying (paused)
        others = (
            self.neighbours[self.neighbours != dst] if self.can_reroute else self.neighbours[:0]
        )
        if others.size == 0:
            self._pending[hop_id] = (dst, token, payload, attempts)
            acts: list[Action] = [Send(dst, payload), SetTimer(name, self.p.pause_retry)]
            if attempts == self.p.max_retries + 1:
                why = "the onion's next hop" if not self.can_reroute else "only neighbour"
                acts.insert(
                    0, Paused(self.ctx.node, -1, f"{why} {dst} does not acknowledge the token")
                )
            return acts
        del self._pending[hop_id]
        nxt = int(others[int(self.secret_rng.integers(others.size))])
        dev = Deviation(self.ctx.node, -1, "anon-walk-reroute", {"silent": dst, "to": nxt})
        return [dev] + self._hand_off(token, nxt)

    def _on_ack(self, src: int, payload: bytes) -> list[Action]:
        hop_id = payload[1:]
        if len(hop_id) != HOP_ID or hop_id not in self._pending or self._pending[hop_id][0] != src:
            return []  # late or duplicate ack: harmless
        attempts = self._pending.pop(hop_id)[3]
        acts: list[Action] = [CancelTimer(_TIMER + hop_id.hex())]
        # a hop acknowledged after this node reported itself paused ends the pause (the driver leaves
        # "paused" only on a ``resumed`` metric; without one the status stayed "paused" to the end)
        late = self.p.max_retries
        if attempts > late and all(p[3] <= late for p in self._pending.values()):
            acts.append(Metric("resumed", -1, -1, self.ctx.node))
        return acts

    def _remember(self, hop_id: bytes) -> None:
        self._recent[hop_id] = None
        if len(self._recent) > _RECENT:
            del self._recent[next(iter(self._recent))]

    def _hand_off(self, token: bytes, dst: int | None = None) -> list[Action]:
        """Send ``token`` (Mode B: the onion packet) to ``dst`` (default: a uniform neighbour) under a
        fresh per-hop id."""
        dst = self._uniform_neighbour() if dst is None else dst
        hop_id = self.ctx.csprng(
            HOP_ID
        )  # unlinkable across hops; only marks retransmissions of this handoff
        payload = to_cells(bytes([self.kind]) + hop_id + token, self.p.cell_body)
        if not self.p.reliable:
            return [Send(dst, payload)]
        self._pending[hop_id] = (dst, token, payload, 0)
        return [Send(dst, payload), SetTimer(_TIMER + hop_id.hex(), self.p.ack_timeout)]

    # the scheme ---------------------------------------------------------------------------------

    def _uniform_neighbour(self) -> int:
        return int(self.neighbours[int(self.secret_rng.integers(self.neighbours.size))])

    def _source_step(self, x: np.ndarray) -> list[Action]:
        node = self.ctx.node
        if self.updates >= self.p.updates_per_node:
            self.finished = True
            return [
                Finish(
                    node,
                    self.updates,
                    x,
                    {
                        "reason": "local update cap reached",
                        "updates": self.updates,
                        **self._mode_report(),
                    },
                )
            ]
        self.updates += 1
        eta = self.ctx.rng.standard_normal(self.dim) * self.noise_std
        x = x - self.p.step_size * (self.task.gradient(x) + eta)
        led = LedgerEntry(
            node,
            self.updates,
            "gradient",
            ACCOUNTING_VIEW.view_model,
            self.sens,
            self.noise_std,
            self.contribution_sigma,
            self.name,
            self.ctx.run_id,
            {"mechanism": ACCOUNTING_VIEW.mechanism, "anonymity_credited": False},
        )
        j = sample_destination(self.setup, node, self.secret_rng)
        self.chosen.append(j)
        token = seal_token(
            self.directory.public(j), np.ascontiguousarray(x, dtype="<f8").tobytes(), self.info
        )
        return [led, Metric("anon-hop", 1, -1, node)] + self._dispatch(token, j)


def iterations(metrics: list[Metric], start: int) -> dict[str, np.ndarray]:
    """(source, destination, hops) of every completed iteration, from a run's metric stream in time order."""
    src, dst, hops = [], [], []
    cur, h = start, 0
    for m in metrics:
        if m.name == "anon-hop":
            h += 1
        elif m.name == "anon-open":
            src.append(cur)
            dst.append(int(m.value))
            hops.append(h)
            cur, h = int(m.value), 0
    return {
        "source": np.asarray(src, dtype=np.int64),
        "destination": np.asarray(dst, dtype=np.int64),
        "hops": np.asarray(hops, dtype=np.int64),
    }


def build_walk(
    setup: AnonymitySetup,
    tasks: list[GradientTask],
    params: AnonWalkParams,
    *,
    run_seed: int,
    run_id: str = "sim",
    keys: list[KeyPair] | None = None,
    secret_seed: int | None = None,
) -> tuple[list[AnonymousWalk], list[KeyPair]]:
    """All n machines (simulator helper) of the walk in ``params.mode``.  ``keys=None`` derives
    simulation keys from the run seed (never in a deployment; Mode B's onion keys likewise, as a
    separate purpose); ``secret_seed`` makes destination/forwarding/path draws reproducible in tests."""
    from hushnet.crypto.keys import simulation_directory, simulation_keypairs
    from hushnet.engine.rng import node_generators

    n = setup.n
    keys = keys if keys is not None else simulation_keypairs(run_seed, n, "dest")
    directory = simulation_directory(keys, params.epoch)
    onion = simulation_keypairs(run_seed, n, "onion") if params.mode == "B" else None
    onion_dir = simulation_directory(onion, params.epoch) if onion is not None else None
    rngs = node_generators(run_seed, n)
    ms = []
    for v in range(n):
        srng = None if secret_seed is None else np.random.default_rng([secret_seed, v])
        ctx = NodeContext(v, n, run_id, rngs[v])
        ms.append(
            walk_machine(
                ctx,
                setup,
                tasks[v],
                params,
                keys[v],
                directory,
                secret_rng=srng,
                onion_key=onion[v] if onion is not None else None,
                onion_directory=onion_dir,
            )
        )
    return ms, keys


def walk_machine(
    ctx: NodeContext,
    setup: AnonymitySetup,
    task: GradientTask,
    params: AnonWalkParams,
    dest_key: KeyPair,
    directory: KeyDirectory,
    *,
    onion_key: KeyPair | None = None,
    onion_directory: KeyDirectory | None = None,
    secret_rng: np.random.Generator | None = None,
    replay: ReplayCache | None = None,
) -> AnonymousWalk:
    """One node's machine of the walk in ``params.mode`` (Mode B needs the onion key and directory)."""
    if params.mode == "A":
        return AnonymousWalk(
            ctx, setup, task, params, dest_key, directory, secret_rng=secret_rng, replay=replay
        )
    from hushnet.families.anonymity.onion_walk import OnionWalk

    if onion_key is None or onion_directory is None:
        raise ValueError(
            "Mode B (onion random walk) needs the node's onion key and the onion-key directory"
        )
    return OnionWalk(
        ctx,
        setup,
        task,
        params,
        dest_key,
        directory,
        onion_key,
        onion_directory,
        secret_rng=secret_rng,
        replay=replay,
    )
