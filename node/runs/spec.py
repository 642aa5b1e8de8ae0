"""The run spec: what an operator asks the network to run, signed, checked by every node.

A spec fixes every *public* parameter of a run — protocol, task, graph view, σ, clipping, step
size, steps, per-node contribution cap, seed, view model and budget — so that each node can
(1) verify the operator's ECDSA P-256 signature, (2) compute its own projected privacy row with
the accountant from these public numbers alone, and (3) accept or refuse with a reason.

Signing is over a canonical JSON encoding (sorted keys, no whitespace, floats in ``repr``
form), so a spec parsed from TOML on the operator's machine and the same spec rebuilt from the
wire on a node produce the same bytes.  Keys are passed in; this module never reads key files.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509 import Certificate, load_pem_x509_certificate

from hushnet.engine.protocol import VIEW_MODELS
from hushnet.engine.rng import node_generator, secret_generator

ON_PEER_DOWN = ("pause", "deviate")
CONSTRAINTS = ("strict", "proof")
#: where a node's DP noise and walk randomness come from (see :meth:`RunSpec.node_rng`)
NOISE_SOURCES = ("secret", "public-seed")


#: Largest network a run may name (vertices; the papers' experiments go to 4000, hypercube:12 is 4096).  Checked on the spec string *before* the graph is
#: built: a node must not spend a minute of CPU or gigabytes (``hypercube:20``, ``complete:10^6``)
#: only to find out that the spec does not fit.  docs/runs.md ("Limits") documents these.
MAX_RUN_NODES = 8192
#: Longest run (walk steps, or rounds·n for ring protocols, or a contribution cap): per-step state
#: is kept by several machines and accountants, so 10^12 steps would exhaust every node's memory.
MAX_RUN_STEPS = 1_000_000
#: Deepest JSON nesting a node parses from the wire (a spec is 3 levels deep; task/protocol
#: parameters add a few); deeper documents are refused before ``json.loads`` recurses.
MAX_JSON_DEPTH = 32


class SpecError(ValueError):
    """A run spec that is malformed or inconsistent (the node refuses it with this message)."""


class SpecSignatureError(SpecError):
    """The spec is unsigned, or its signature does not verify under the operator's key."""


@dataclass(frozen=True)
class Budget:
    """The (ε, δ) the operator declares for the run; each node also applies its own local budget."""

    epsilon: float
    delta: float


@dataclass(frozen=True)
class RunSpec:
    """Public parameters of one run (see the module docstring).

    ``sigma``: noise multiplier for gradient protocols (noise std = 2·clip·σ), the absolute noise
    std σ_loc for the P-AD summations, unused for histograms (which use ``gamma``).
    ``steps``: walk length T (ring protocols use ``rounds`` K instead; T = K·n).
    ``cap``: per-node contribution cap N_max (None: no cap).  ``task_params``: public task
    parameters (e.g. ``lo``/``hi``/``bins``); ``clip`` is passed to gradient tasks.
    ``constraint``: the accountant's noise condition (``strict`` printed, ``proof``).
    """

    protocol: str
    task: str
    graph: str
    steps: int
    seed: int
    budget: Budget
    sigma: float = 0.0
    clip: float = 1.0
    step_size: float = 0.1
    cap: int | None = None
    view_model: str = "sender-known"
    weights: str = "hamilton"
    start: int = 0
    rounds: int | None = None
    gamma: float | None = None
    on_peer_down: str = "pause"
    constraint: str = "strict"
    operator: str = ""
    run_id: str = ""
    task_params: dict[str, Any] = field(default_factory=dict)
    #: public protocol options beyond the common fields (e.g. onion ``hops``, secure-summation
    #: ``threshold``/``members``/``leader``); ``[run.protocol_params]`` in TOML; omitted when empty
    protocol_params: dict[str, Any] = field(default_factory=dict)
    #: ``secret`` (default): each node draws its noise and walk steps from its own OS entropy, so
    #: nobody who knows the public seed can predict or subtract them.  ``public-seed``: from the
    #: run seed, reproducible bit for bit (simulator parity, tests) and therefore NOT private.
    noise: str = "secret"

    # ---- derived ----------------------------------------------------------------------------------

    @property
    def n(self) -> int:
        from hushnet.privacy.graphs import parse_graph

        return parse_graph(self.graph).n

    def total_steps(self, n: int | None = None) -> int:
        from hushnet.families import family_of

        if family_of(self.protocol).rounds_per_node(self.protocol):
            return int(self.rounds or 0) * (self.n if n is None else n)
        return int(self.steps)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["budget"] = {"epsilon": self.budget.epsilon, "delta": self.budget.delta}
        if not d.get("protocol_params"):
            d.pop(
                "protocol_params", None
            )  # specs without protocol options keep their bytes (and run ids)
        if d.get("noise") == "secret":
            d.pop(
                "noise"
            )  # the default: specs that do not ask for reproducible noise keep their bytes
        return d

    def canonical_bytes(self) -> bytes:
        """The bytes that are signed: canonical JSON of every field except ``run_id`` (derived from them)."""
        d = self.to_dict()
        d.pop("run_id")
        try:
            return json.dumps(d, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
        except ValueError:  # NaN/inf somewhere (a spec built in code, not through spec_from_dict)
            raise SpecError(
                f"invalid run spec: {', '.join(_non_finite(d)) or 'a value'} must be a finite number "
                "(NaN and infinity are refused)"
            ) from None
        except RecursionError:
            raise SpecError(
                f"invalid run spec: parameters nested deeper than {MAX_JSON_DEPTH} levels"
            ) from None

    def with_run_id(self) -> "RunSpec":
        """Fill ``run_id`` from the content hash when empty (the same spec always gets the same id)."""
        if self.run_id:
            return self
        return replace(
            self, run_id="run-" + hashlib.sha256(self.canonical_bytes()).hexdigest()[:16]
        )

    def node_rng(self, vertex: int, n: int) -> np.random.Generator:
        """The generator a node gives its machine: secret by default, the seeded one only on request.

        The privacy analyses assume observers do not know a node's noise or the walk's coin flips;
        a generator derived from the public seed would hand both to anyone holding the spec.
        """
        if self.noise == "public-seed":
            return node_generator(self.seed, n, vertex)
        return secret_generator()

    def noise_label(self) -> str:
        if self.noise == "public-seed":
            return "public-seed: noise and walk reproducible from the public run seed (testing only; NOT private)"
        return "secret: node-local OS entropy (ChaCha20 keyed with 256 bits from the OS pool)"

    def machine_params(self) -> dict[str, Any]:
        """Protocol parameters for :func:`hushnet.protocols.registry.make_machine` (the family maps them)."""
        from hushnet.families import family_of

        return family_of(self.protocol).machine_params(self)

    def task_kwargs(self) -> dict[str, Any]:
        """Public task parameters, with ``clip`` added for gradient protocols."""
        from hushnet.families import family_of

        kw = dict(self.task_params)
        if family_of(self.protocol).task_kind(self.protocol) == "gradient":
            kw.setdefault("clip", self.clip)
        return kw

    # ---- validation -------------------------------------------------------------------------------

    def validate(self, *, resolve_task: bool = True) -> "RunSpec":
        """Check the spec is complete and consistent; raise :class:`SpecError` with every problem found."""
        from hushnet.families import family_of, protocols
        from hushnet.privacy.graphs import GraphSpecError, parse_graph
        from hushnet.tasks.base import GradientTask, TaskError
        from hushnet.tasks.registry import resolve_task_class
        from hushnet.tasks.values import HistogramTask, SumTask

        errs: list[str] = []
        bad = _non_finite(self.to_dict())
        if bad:
            errs.append(f"{', '.join(bad)} must be a finite number (NaN and infinity are refused)")
        family = None
        if self.protocol not in protocols():
            errs.append(
                f"unknown protocol {self.protocol!r} (available: {', '.join(sorted(protocols()))})"
            )
        else:
            family = family_of(self.protocol)
        p = self.protocol
        kind = family.task_kind(p) if family else None
        graph_kind = family.graph_kind(p) if family else None
        per_node = bool(family and family.rounds_per_node(p))
        n = 0
        order = graph_order(self.graph) if isinstance(self.graph, str) else None
        if order is not None and order > MAX_RUN_NODES:  # refused from the string: never build it
            errs.append(
                f"graph {self.graph} has {order} vertices, more than the limit of {MAX_RUN_NODES} "
                "vertices per run"
            )
        else:
            try:
                n = parse_graph(self.graph).n
            except (GraphSpecError, ValueError, OSError) as exc:
                errs.append(f"graph {self.graph!r}: {exc}")
            if n > MAX_RUN_NODES:  # edge lists: known only once read
                errs.append(
                    f"graph {self.graph} has {n} vertices, more than the limit of {MAX_RUN_NODES} "
                    "vertices per run"
                )
                n = 0
        if self.weights not in ("hamilton", "paper"):
            errs.append(f"weights must be 'hamilton' or 'paper', got {self.weights!r}")
        if self.view_model not in VIEW_MODELS:
            errs.append(f"view_model must be one of {VIEW_MODELS}, got {self.view_model!r}")
        if self.on_peer_down not in ON_PEER_DOWN:
            errs.append(f"on_peer_down must be one of {ON_PEER_DOWN}, got {self.on_peer_down!r}")
        if self.noise not in NOISE_SOURCES:
            errs.append(f"noise must be one of {NOISE_SOURCES}, got {self.noise!r}")
        if self.constraint not in CONSTRAINTS:
            errs.append(f"constraint must be one of {CONSTRAINTS}, got {self.constraint!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            errs.append("seed must be a non-negative integer")
        b = self.budget
        if not (_finite(b.epsilon) and b.epsilon > 0):
            errs.append("budget.epsilon must be a positive number")
        if not (_finite(b.delta) and 0 < b.delta < 1):
            errs.append("budget.delta must lie in (0, 1)")
        if per_node:
            if not (isinstance(self.rounds, int) and self.rounds >= 1):
                errs.append(f"{self.protocol} needs rounds >= 1")
            elif n and self.rounds * n > MAX_RUN_STEPS:
                errs.append(
                    f"rounds = {self.rounds} on {n} nodes makes {self.rounds * n} steps, more than the limit "
                    f"of {MAX_RUN_STEPS} steps per run"
                )
        elif not (isinstance(self.steps, int) and self.steps >= 1):
            errs.append("steps must be an integer >= 1")
        elif self.steps > MAX_RUN_STEPS:
            errs.append(
                f"steps = {self.steps} is more than the limit of {MAX_RUN_STEPS} steps per run"
            )
        if isinstance(self.rounds, int) and self.rounds > MAX_RUN_STEPS and not per_node:
            errs.append(f"rounds = {self.rounds} is more than the limit of {MAX_RUN_STEPS} per run")
        pp = self.protocol_params if isinstance(self.protocol_params, dict) else {}
        for key in ("rounds", "steps", "K"):  # gossip protocols take their length from here
            v = pp.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v > MAX_RUN_STEPS:
                errs.append(
                    f"protocol_params.{key} = {v} is more than the limit of {MAX_RUN_STEPS} per run"
                )
        ks = pp.get("ks")
        if isinstance(ks, list) and (
            len(ks) > MAX_RUN_STEPS
            or sum(k for k in ks if isinstance(k, (int, float)) and not isinstance(k, bool))
            > MAX_RUN_STEPS
        ):
            errs.append(
                f"protocol_params.ks adds up to more than the limit of {MAX_RUN_STEPS} rounds per run"
            )
        if graph_kind == "ring" and not str(self.graph).startswith("ring:"):
            errs.append(f"{self.protocol} runs on the directed ring: graph must be 'ring:N'")
        if graph_kind == "complete" and not str(self.graph).startswith("complete:"):
            errs.append(f"{self.protocol} runs on the complete graph: graph must be 'complete:N'")
        if kind == "gradient":
            if not (_finite(self.step_size) and self.step_size > 0):
                errs.append("step_size must be > 0")
            if not (_finite(self.clip) and self.clip > 0):
                errs.append("clip must be > 0")
        if family and family.needs_sigma(p) and not (_finite(self.sigma) and self.sigma > 0):
            errs.append("sigma must be > 0 (a run without noise is not private)")
        if family and family.needs_gamma(p) and not (self.gamma is not None and 0 < self.gamma < 1):
            errs.append(f"{self.protocol} needs gamma in (0, 1)")
        if self.cap is not None and not (
            isinstance(self.cap, int) and 1 <= self.cap <= MAX_RUN_STEPS
        ):
            errs.append(f"cap must be an integer in 1..{MAX_RUN_STEPS} when given")
        if n and not 0 <= self.start < n:
            errs.append(f"start node {self.start} outside 0..{n - 1}")
        if resolve_task:
            try:
                cls = resolve_task_class(self.task)
            except TaskError as exc:
                errs.append(str(exc))
            else:
                if (
                    kind == "gradient"
                    and not issubclass(cls, GradientTask)
                    and cls.__module__.startswith("hushnet.")
                ):
                    errs.append(f"{self.protocol} needs a gradient task, {self.task!r} is not one")
                if kind == "sum" and not issubclass(cls, SumTask):
                    errs.append(f"{self.protocol} needs a 'sum' or 'mean' task, got {self.task!r}")
                if kind == "histogram" and not issubclass(cls, HistogramTask):
                    errs.append(f"{self.protocol} needs a 'histogram' task, got {self.task!r}")
        if errs:
            raise SpecError("invalid run spec: " + "; ".join(errs))
        return self


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _non_finite(d: Any, prefix: str = "") -> list[str]:
    """Dotted names of every NaN/±inf float in a (nested) spec dict: JSON cannot carry them, and no
    accountant can project a loss from them, so they are refused by name rather than crash a hash."""
    out: list[str] = []
    stack = [(prefix, d)]
    while stack:  # iterative: a hostile document must not recurse the interpreter
        name, x = stack.pop()
        if isinstance(x, dict):
            stack.extend((f"{name}.{k}" if name else str(k), v) for k, v in x.items())
        elif isinstance(x, (list, tuple)):
            stack.extend((f"{name}[{i}]", v) for i, v in enumerate(x))
        elif isinstance(x, float) and not math.isfinite(x):
            out.append(f"{name} = {x}")
    return sorted(out)


def _count(text: str, what: str, spec: str) -> int:
    if not re.fullmatch(r"\s*\d{1,12}\s*", text):
        raise ValueError(f"{spec!r}: {what} must be a non-negative integer")
    return int(text)


def graph_order(graph: str) -> int | None:
    """Number of vertices named by a graph spec string, computed from the string alone (no graph is
    built); ``None`` when the string does not say (edge lists, malformed specs: ``parse_graph`` reports)."""
    family, _, rest = graph.partition(":")
    family, args = family.strip().lower(), rest.split(":")
    try:
        if family in ("complete", "ring", "er", "regular", "geometric"):
            return _count(args[0], "N", graph)
        if family == "hypercube":
            d = _count(args[0], "D", graph)
            return 2**d if d <= 64 else 2**64
        if family == "grid":
            m = re.fullmatch(r"\s*(\d{1,12})x(\d{1,12})\s*", args[0].lower())
            return None if m is None else int(m.group(1)) * int(m.group(2))
        if family == "sbm":
            return sum(_count(x, "block size", graph) for x in args[0].split(","))
    except ValueError:
        return None
    return None


def loads_bounded(
    data: bytes | str, what: str = "JSON document", max_depth: int = MAX_JSON_DEPTH
) -> Any:
    """``json.loads`` that refuses documents nested deeper than ``max_depth`` *before* parsing them.

    ``json.loads`` recurses once per level, so a 100 000-deep array from the wire raises
    ``RecursionError`` (a crash, not a refusal).  Strings are blanked first (brackets inside them do
    not nest), then the depth is a running sum over the brackets, vectorised.
    """
    raw = data.encode() if isinstance(data, str) else bytes(data)
    if raw.count(b"[") + raw.count(b"{") <= max_depth:
        # no deeper than its opening brackets (those inside strings only add to the count): the
        # common small document (a control command's arguments, hundreds a second on a host's loop
        # during a watched run at n = 2048, where the vectorised scan below was ~0.4 ms each) skips it
        return _loads(raw, what, max_depth)
    blanked = re.sub(rb'"(?:[^"\\]|\\.)*"', b'""', raw)
    b = np.frombuffer(blanked, dtype=np.uint8)
    step = np.isin(b, (ord("["), ord("{"))).astype(np.int64) - np.isin(
        b, (ord("]"), ord("}"))
    ).astype(np.int64)
    depth = int(np.cumsum(step).max()) if step.size else 0
    if depth > max_depth:
        raise SpecError(f"{what} nested {depth} levels deep, more than the limit of {max_depth}")
    return _loads(raw, what, max_depth)


def _loads(raw: bytes, what: str, max_depth: int) -> Any:
    try:
        return json.loads(raw)
    except RecursionError:  # unbalanced tricks the scan missed: still a refusal, not a crash
        raise SpecError(f"{what} nested deeper than the limit of {max_depth}") from None


# ---- TOML ---------------------------------------------------------------------------------------

_RUN_KEYS = {f.name for f in fields(RunSpec)} - {"budget", "task", "task_params"}


def spec_from_dict(d: dict[str, Any]) -> RunSpec:
    """Build a spec from the TOML layout (``[run]``, ``[task]``, ``[budget]``) or from :meth:`RunSpec.to_dict`."""
    if "run" in d:
        run = dict(d["run"])
        task_tbl = d.get("task")
        if isinstance(task_tbl, dict):
            task_tbl = dict(task_tbl)
            task = task_tbl.pop("name", None)
            task_params = task_tbl
        else:
            task, task_params = task_tbl, {}
        budget = d.get("budget")
        extra = set(d) - {"run", "task", "budget"}
    else:
        run = {k: v for k, v in d.items() if k not in ("budget", "task", "task_params")}
        task, task_params, budget = d.get("task"), dict(d.get("task_params") or {}), d.get("budget")
        extra = set()
    if extra:
        raise SpecError(
            f"unknown top-level table(s) {sorted(extra)} (expected [run], [task], [budget])"
        )
    bad = _non_finite({**run, "budget": budget, "task": task_params})
    if bad:
        raise SpecError(
            f"invalid run spec: {', '.join(bad)} must be a finite number (NaN and infinity are refused)"
        )
    unknown = set(run) - _RUN_KEYS
    if unknown:
        raise SpecError(f"unknown key(s) in [run]: {sorted(unknown)}")
    missing = [k for k in ("protocol", "graph", "seed") if k not in run]
    if task is None:
        missing.append("task")
    if not isinstance(budget, dict) or "epsilon" not in budget or "delta" not in budget:
        missing.append("budget.epsilon/budget.delta")
    if "steps" not in run and "rounds" not in run:
        missing.append("steps (or rounds for ring protocols)")
    if missing:
        raise SpecError(f"run spec is missing {', '.join(missing)}")
    run.setdefault("steps", 0)
    try:
        return RunSpec(
            task=str(task),
            task_params=task_params,
            budget=Budget(float(budget["epsilon"]), float(budget["delta"])),
            **run,
        )
    except (TypeError, ValueError) as exc:
        raise SpecError(f"bad run spec: {exc}") from exc


def parse_spec_toml(text: str, *, validate: bool = True) -> RunSpec:
    """Parse a TOML run spec (``hushnet run start SPEC.toml``), fill its run id, and validate it."""
    try:
        d = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"run spec is not valid TOML: {exc}") from exc
    spec = spec_from_dict(d).with_run_id()
    return spec.validate() if validate else spec


# ---- signatures ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SignedRunSpec:
    """A spec with the operator's ECDSA P-256 / SHA-256 signature over :meth:`RunSpec.canonical_bytes`."""

    spec: RunSpec
    signature: bytes
    certificate_pem: bytes = b""

    def to_bytes(self) -> bytes:
        """Wire form delivered to the nodes (JSON: the spec, base64 signature, optional PEM certificate)."""
        return json.dumps(
            {
                "spec": self.spec.to_dict(),
                "signature": base64.b64encode(self.signature).decode(),
                "certificate": self.certificate_pem.decode(),
            },
            sort_keys=True,
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "SignedRunSpec":
        try:
            d = loads_bounded(data, "signed run spec")
            spec = spec_from_dict(d["spec"])
            sig = base64.b64decode(d["signature"], validate=True)
        except SpecError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise SpecError(f"not a signed run spec: {exc}") from exc
        return cls(spec, sig, str(d.get("certificate", "")).encode())


def sign_spec(
    spec: RunSpec, key: ec.EllipticCurvePrivateKey, certificate_pem: bytes = b""
) -> SignedRunSpec:
    """Sign with the operator's P-256 key (the key issued by the network's CA)."""
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise SpecError("run specs are signed with an ECDSA P-256 private key")
    spec = spec.with_run_id()
    return SignedRunSpec(
        spec, key.sign(spec.canonical_bytes(), ec.ECDSA(hashes.SHA256())), certificate_pem
    )


def close_record_bytes(run_id: str, deviated: bool) -> bytes:
    """What the operator signs when it closes a run: the run id and whether it deviated."""
    return json.dumps(
        {"close": str(run_id), "deviated": bool(deviated)}, sort_keys=True, separators=(",", ":")
    ).encode()


def sign_close(
    run_id: str, deviated: bool, key: ec.EllipticCurvePrivateKey, certificate_pem: bytes = b""
) -> str:
    """The operator's signed close record (JSON text).  Nodes keep it and hand it to a node that was down
    when the run was closed, which verifies it like a spec and applies its close (and top-up) once."""
    sig = key.sign(close_record_bytes(run_id, deviated), ec.ECDSA(hashes.SHA256()))
    return json.dumps(
        {
            "run_id": str(run_id),
            "deviated": bool(deviated),
            "signature": base64.b64encode(sig).decode(),
            "certificate": certificate_pem.decode(),
        },
        sort_keys=True,
        separators=(",", ":"),
    )


def parse_close(record: str | bytes) -> tuple[str, bool, bytes, bytes]:
    """``(run_id, deviated, signature, certificate_pem)`` of a close record; :class:`SpecError` if malformed."""
    try:
        doc = json.loads(record)
        return (
            str(doc["run_id"]),
            bool(doc["deviated"]),
            base64.b64decode(doc["signature"], validate=True),
            str(doc.get("certificate", "")).encode(),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise SpecError(f"malformed close record ({type(exc).__name__})") from None


def verify_close(
    record: str | bytes, operator_key: ec.EllipticCurvePublicKey | Certificate | bytes
) -> tuple[str, bool]:
    """Check a close record's signature; ``(run_id, deviated)``."""
    run_id, deviated, sig, _ = parse_close(record)
    try:
        _public_key(operator_key).verify(
            sig, close_record_bytes(run_id, deviated), ec.ECDSA(hashes.SHA256())
        )
    except InvalidSignature:
        raise SpecSignatureError(
            "close record signature does not verify under the operator's key"
        ) from None
    return run_id, deviated


def verify_spec(
    signed: SignedRunSpec | None, operator_key: ec.EllipticCurvePublicKey | Certificate | bytes
) -> RunSpec:
    """Verify the signature (key, certificate object, or PEM certificate/public key) and the run id; return the spec.

    Checking that the certificate was issued by the network's CA, and names an operator, is the
    network layer's job (it holds the CA); this function checks the signature itself.
    """
    if signed is None or not signed.signature:
        raise SpecSignatureError("run spec is unsigned")
    pub = _public_key(operator_key)
    try:
        pub.verify(signed.signature, signed.spec.canonical_bytes(), ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise SpecSignatureError(
            "run spec signature does not verify under the operator's key (tampered or wrong signer)"
        ) from None
    if (
        signed.spec.run_id
        and signed.spec.run_id != replace(signed.spec, run_id="").with_run_id().run_id
    ):
        raise SpecSignatureError("run id does not match the signed contents")
    return signed.spec


def _public_key(k: Any) -> ec.EllipticCurvePublicKey:
    if isinstance(k, Certificate):
        k = k.public_key()
    elif isinstance(k, (bytes, bytearray)):
        if b"CERTIFICATE" in k:
            k = load_pem_x509_certificate(bytes(k)).public_key()
        else:
            k = serialization.load_pem_public_key(bytes(k))
    if not isinstance(k, ec.EllipticCurvePublicKey) or not isinstance(k.curve, ec.SECP256R1):
        raise SpecSignatureError("operator key must be an ECDSA P-256 public key")
    return k


# ---- local policy -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyDecision:
    """A node's answer to a run: accept or refuse with a reason the operator sees, and its projected row.

    ``epsilon_row[v]`` is the projected (ε, δ) loss of this node's data toward node v (0 for itself),
    with ``bound`` saying which accountant produced it ("certified" here).
    """

    accept: bool
    reason: str
    epsilon_row: np.ndarray | None
    delta: float
    bound: str
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def delta_refusal(cls, spec_delta: float, node_delta: float) -> "PolicyDecision | None":
        """The refusal when the spec's δ is larger than the node's own δ (None: δ is acceptable).
        Every family checks this before projecting: a row at a larger δ than the node allows is
        not within its budget whatever its ε."""
        if node_delta < spec_delta:
            return cls(
                False,
                f"spec δ={spec_delta:g} exceeds this node's δ={node_delta:g}",
                None,
                spec_delta,
                "certified",
            )
        return None

    @classmethod
    def certified(
        cls,
        row: np.ndarray,
        delta: float,
        budget_epsilon: float,
        details: dict[str, Any],
        note: str = "",
    ) -> "PolicyDecision":
        """Accept when the worst pair of a certified projected row is within the node's ε budget; the
        reason names that pair and ``note`` (which view or bound produced the row)."""
        worst = int(np.argmax(row))
        tail = f" ({note})" if note else ""
        if row[worst] > budget_epsilon:
            return cls(
                False,
                f"over budget: projected certified loss toward node {worst} is ε={row[worst]:.4g} "
                f"at δ={delta:g}{tail}, this node's budget is ε={budget_epsilon:g}",
                row,
                delta,
                "certified",
                details,
            )
        return cls(
            True,
            f"within budget (worst certified ε={row[worst]:.4g} toward node {worst}{'; ' + note if note else ''})",
            row,
            delta,
            "certified",
            details,
        )

    @property
    def worst_epsilon(self) -> float:
        return (
            float(np.max(self.epsilon_row))
            if self.epsilon_row is not None and self.epsilon_row.size
            else 0.0
        )


def _best_order_dp(slope: np.ndarray, amax: float, log_inv_delta: float) -> np.ndarray:
    """Best (ε, δ) of the linear RDP curves ``α·slope`` over ``1 < α ≤ α_max``, per entry, by hushnet's one
    RDP → (ε, δ) rule (dp-accounting's improved conversion, :func:`hushnet.privacy.conversions.linear_rdp_to_dp`;
    never above Mironov's ``α·slope + ln(1/δ)/(α−1)`` at its continuous optimum)."""
    from hushnet.privacy.conversions import linear_rdp_to_dp

    return linear_rdp_to_dp(slope, math.exp(-log_inv_delta), amax)[0]
