"""One ``Control`` call answers for every node of a host process (``host.batch``).

Why: the operator's watch, report, model and ledger commands asked each node on its own — at n = 1024
in 3 host processes that was 1024 mutual-TLS Control RPCs per sweep, served on the hosts' event
loops (a watch was rate-limited to 128 calls/s, a 1024-node sweep took 8 s; collecting 1024 reports
stalled the loops 2–10 s).  A host process already holds every node it hosts, so any of them can
answer for all: the operator's client sends one call per host (in pages) and gets each node's
answer back.

Trust is what it was per node.  The contact node's server authenticated the operator (``Control`` is
served to operator certificates only).  Each hosted node's answer is the exact bytes its own command
returns (the same handler a per-node call runs), signed with that node's own certificate key over the
client's nonce, the command, the node id, whether it is an answer or an error, and the bytes' SHA-256
(:func:`answer_message`).  The client checks the key against the node's ``key_sha256`` in the
directory, so a process can speak only for nodes whose keys it holds — its own nodes — as it could
per node; the nonce stops a replay of an old answer.

The loop: the nodes are asked one after the other, yielding to the event loop every
:data:`YIELD_S` of work, so a page of reports never holds the loop for the whole page; the client
pages (:data:`PAGE`) so no reply is built from thousands of answers at once, and a host stops a reply
at half its message limit (the rest go in the next page: ``more``).  ``run.events`` with a
``wait`` is a long poll for the whole host: it returns as soon as one of the asked nodes has an event
(or its run ended), else after ``wait`` seconds — one call in flight per host during a watch.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import time
import uuid
from typing import Any, Callable

from cryptography.hazmat.primitives import serialization

from hushnet.net import pki
from hushnet.net.errors import NodeStopping
from hushnet.net.handlers import UnknownCommand

#: the Control command name
BATCH_COMMAND = "host.batch"
#: commands a batch may carry: JSON in, JSON out, what the operator asks every node (``run.submit``,
#: with its signed bytes and its durable set-up in a worker thread, stays per node)
BATCHABLE = frozenset(
    {
        "run.status",
        "run.events",
        "run.report",
        "run.model",
        "run.ledger",
        "run.list",
        "run.close",
        "run.cancel",
        "run.start",
        "status",
        "node.status",
    }
)
#: the longest long poll a host holds (s), as ``run.events`` per node
MAX_WAIT_S = 30.0
#: work (s) between two yields to the event loop while a page is answered: a walk's token arriving at a
#: host in the middle of a page waits up to this long (issue 12: at 20 ms, the operator's watch of a
#: 2048-node walk added about a millisecond to the average hop; a yield costs ~20 µs)
YIELD_S = 0.002
#: nodes per page the client asks in one call, by command (models are large: ~0.1 MB per 10⁴ floats;
#: a host also ends a reply at half its message limit, see ``more``)
PAGE = {"run.model": 32, "run.events": 1 << 20}  # a watch's long poll: one page per host
PAGE_DEFAULT = 256


def answer_message(nonce: str, command: str, node_id: str, ok: bool, body: bytes) -> bytes:
    """What a hosted node signs for one answer (or error) of a batch."""
    return json.dumps(
        [
            "hushnet.v1",
            BATCH_COMMAND,
            nonce,
            command,
            node_id,
            bool(ok),
            hashlib.sha256(body).hexdigest(),
        ]
    ).encode()


def spki_der(key) -> bytes:
    """The DER SubjectPublicKeyInfo of a private key's public half (its SHA-256 is the directory's ``key_sha256``)."""
    return key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def command_error(exc: BaseException) -> str:
    """The error text of a failed command, exactly as the node's ``Control`` handler words it."""
    if isinstance(exc, KeyError) and exc.args:
        return f"{type(exc).__name__}: {exc.args[0]}"
    return f"{type(exc).__name__}: {exc}"


class HostBatch:
    """The ``host.batch`` command of one node.

    The node's ``host_peers`` (set by :class:`hushnet.net.host.NodeHost`: every running node of the
    process by id) are the nodes it answers for, its ``host_id`` names that set (the client groups
    nodes by it); a node without a host answers for itself, under the id ``node:<its id>``."""

    def __init__(self, node) -> None:
        self.node = node
        #: bytes of answers in one reply (None: half the node's message limit)
        self.budget: int | None = None
        self._spki: dict[int, tuple[Any, str]] = {}  # id(key) -> (key, its SPKI DER in hex)

    def nodes(self) -> dict[str, Any]:
        peers: Callable[[], dict[str, Any]] | None = getattr(self.node, "host_peers", None)
        return peers() if peers is not None else {self.node.node_id: self.node}

    @property
    def host_id(self) -> str:
        return getattr(self.node, "host_id", None) or f"node:{self.node.node_id}"

    async def __call__(self, payload: bytes) -> bytes:
        args = json.loads(payload or b"{}")
        if not isinstance(args, dict):
            raise ValueError("host.batch arguments must be a JSON object")
        command = str(args.get("command", ""))
        if command not in BATCHABLE:
            raise ValueError(
                f"host.batch cannot carry {command!r} (batchable: {', '.join(sorted(BATCHABLE))})"
            )
        nonce = str(args.get("nonce", ""))
        if not 16 <= len(nonce) <= 128:
            raise ValueError("host.batch needs a nonce of 16 to 128 characters")
        common = args.get("args")
        per_node = args.get("per_node") or {}
        asked = args.get("nodes")
        if not isinstance(asked, list) or not all(isinstance(i, str) for i in asked):
            raise ValueError("host.batch needs 'nodes': a list of node ids")
        if not isinstance(per_node, dict):
            raise ValueError("host.batch 'per_node' must map node ids to arguments")
        wait = min(max(float(args.get("wait", 0.0)), 0.0), MAX_WAIT_S)
        hosted = self.nodes()
        here = [i for i in asked if i in hosted and not hosted[i].stopping]
        absent = [i for i in asked if i not in here]

        def payload_of(i: str, extra: dict | None = None) -> bytes:
            a = per_node.get(i, common)
            if extra:
                a = {**(a or {}), **extra}
            return json.dumps(a or {}).encode()

        if command == "run.events" and wait > 0:
            await self._long_poll(hosted, here, payload_of, wait)
        answers: list[dict[str, Any]] = []
        bodies: list[bytes] = []
        more: list[str] = []
        same: list[str] = []
        size, budget = 0, self.budget or self.node.config.max_message_bytes // 2
        t0 = time.monotonic()
        # seconds on this loop, reported to the client: wall time, and the loop thread's CPU time in the
        # commands (on a loaded machine wall time counts the time other processes had the core)
        work = {"commands": 0.0, "sign": 0.0, "commands_cpu": 0.0}
        for k, i in enumerate(here):
            node = hosted[i]
            if node.stopping:
                absent.append(i)
                continue
            t, c = time.perf_counter(), time.thread_time()
            ok, body = await self._one(
                node, command, payload_of(i, {"wait": 0} if command == "run.events" else None)
            )
            work["commands"] += time.perf_counter() - t
            work["commands_cpu"] += time.thread_time() - c
            if (
                ok is None
            ):  # stopping meanwhile: the client asks it on its own (and learns it is down)
                absent.append(i)
                continue
            if ok and not body and command == "run.events":
                # nothing new since the status the watcher holds (``seen``): named, not signed — a
                # host can withhold its nodes' answers anyway, and the watcher keeps what they signed
                same.append(i)
                continue
            if answers and size + len(body) > budget:  # the rest in the client's next page
                more = here[k:]
                break
            size += len(body)
            t = time.perf_counter()
            key = node.identity.key
            sig = pki.sign(key, answer_message(nonce, command, i, ok, body))
            answers.append(
                {
                    "node": i,
                    "ok": ok,
                    "len": len(body),
                    "sig": sig.hex(),
                    "spki": self._spki_hex(key),
                }
            )
            work["sign"] += time.perf_counter() - t
            bodies.append(body)
            if time.monotonic() - t0 > YIELD_S:  # let the loop serve its links between nodes
                await asyncio.sleep(0)
                t0 = time.monotonic()
        self.node._load.count(f"control_batch:{command}")
        self.node._load.count("control_batched", len(answers))
        head = {
            "host": self.host_id,
            "hosted": sorted(hosted),
            "answers": answers,
            "absent": absent,
            "more": more,
            "same": same,
            "work_s": {k: round(v, 6) for k, v in work.items()},
        }
        return json.dumps(head).encode() + b"\n" + b"".join(bodies)

    def _spki_hex(self, key) -> str:
        """The key's SPKI DER in hex, kept per key (a node's key changes only when it re-joins)."""
        hit = self._spki.get(id(key))
        if hit is None or hit[0] is not key:
            if len(self._spki) > 65536:
                self._spki.clear()
            hit = self._spki[id(key)] = (key, spki_der(key).hex())
        return hit[1]

    async def _one(self, node, command: str, payload: bytes) -> tuple[bool | None, bytes]:
        """``(ok, answer or error text)`` of ``command`` at ``node``; ``(None, b"")`` if it is stopping."""
        try:
            return True, await node.controls.run(command, payload)
        except NodeStopping:
            return None, b""
        except UnknownCommand:
            return False, f"unknown control command {command!r}".encode()
        except (KeyError, ValueError, PermissionError) as exc:
            return False, command_error(exc).encode()
        except Exception as exc:  # a bug in one node's command: its error, the others still answer
            if node.stopping:
                return None, b""
            node.log.exception(
                "control command %s failed (host batch)", command, extra={"event": "control_error"}
            )
            return False, command_error(exc).encode()

    async def _long_poll(self, hosted, here: list[str], payload_of, wait: float) -> None:
        """Return when one of ``here`` has an event after its cursor (or its run is over, or it fails),
        or after ``wait`` seconds: each node's own ``run.events`` long poll, the first one back wins."""
        loop = asyncio.get_running_loop()
        pending = {
            loop.create_task(hosted[i].controls.run("run.events", payload_of(i, {"wait": wait})))
            for i in here
        }
        tasks = list(pending)
        deadline = time.monotonic() + wait
        try:
            while pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                done, pending = await asyncio.wait(
                    pending, timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
                # a node that answers at once with an error (no such run here) is no news: keep waiting
                if any(not t.cancelled() and t.exception() is None for t in done):
                    return
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def spread_order(ids: list[str], vertex: dict[str, int]) -> list[str]:
    """``ids`` reordered so that consecutive calls go to distant vertices (golden-ratio sequence of the
    vertex): any run of k consecutive calls hits every block of consecutive vertices — what one host
    process serves — about in proportion to its size.  Deterministic; ids without a vertex keep their
    place at the end."""
    phi = (5**0.5 - 1) / 2
    known = [i for i in ids if i in vertex]
    return sorted(known, key=lambda i: ((vertex[i] * phi) % 1.0, vertex[i])) + [
        i for i in ids if i not in vertex
    ]


#: nodes of no known host asked at once (each for itself) to learn which process hosts which node
DISCOVERY_WAVE = 8


class HostBatchClient:
    """The operator's side of ``host.batch``: one call per host process, each answer checked against its
    node's key (shared by :class:`hushnet.client.core.AsyncClient` and the status sweep of
    :meth:`hushnet.net.operator.Operator.network_status`).

    Which process hosts which node is learnt from the hosts' own replies (``hosted``) and kept: nodes of
    no known host are asked first, a few at a time and each for itself, and their replies name the rest
    of their hosts.  Nodes a reply leaves out, whose answer does not verify, or whose host did not
    answer are left to the caller's per-node calls (which say why a node is unreachable)."""

    def __init__(self, op, error: Callable[[str], Exception] = RuntimeError) -> None:
        self.op = op  # hushnet.net.operator.Operator: control_raw
        self.error = error  # what a node's error answer becomes
        self.host_of: dict[str, str] = {}  # node id → the host id its process answered under
        self.contact: dict[str, str] = {}  # host id → the node that answered its last batch
        self.no_batch: set[str] = set()  # nodes that do not serve host.batch (older versions)
        self._keys: dict[bytes, Any] = {}  # DER public key → loaded key (answers' signatures)
        #: calls made since :meth:`reset` (batches), and the hosts' loop seconds they reported
        self.calls = self.batches = 0
        self.same = 0  # run.events answers that said "nothing new" (see HostBatch)
        self.host_work_s: dict[str, float] = {}

    def reset(self) -> None:
        self.calls = self.batches = self.same = 0
        self.host_work_s = {}

    async def ask(
        self,
        members: dict[str, Any],
        command: str,
        args: Any,
        ids: list[str],
        timeout: float,
        per_node: dict[str, Any] | None = None,
        wait: float = 0.0,
        decode: bool = True,
    ) -> dict[str, Any]:
        """The verified answers of ``ids`` (``members``: the directory's entries by id, for addresses,
        vertices and key hashes): node id → its answer (JSON-decoded if ``decode`` and it parses, else
        its bytes) or ``error(...)`` for a node whose command failed.  Nodes not in the result are
        for the caller to ask on its own."""
        per_node = per_node or {}
        want = [i for i in ids if i in members and i not in self.no_batch]
        vertex = {i: members[i].vertex for i in want}
        out: dict[str, Any] = {}
        failed: set[str] = set()  # nodes already asked for themselves this time
        while True:
            unknown = [
                i
                for i in spread_order(want, vertex)
                if i not in self.host_of and i not in out and i not in failed
            ]
            if not unknown:
                break
            wave = unknown[:DISCOVERY_WAVE]
            res = await asyncio.gather(
                *(
                    self._call(members, c, command, args, [c], timeout, per_node, 0.0, decode)
                    for c in wave
                )
            )
            failed.update(wave)  # asked once this time, whatever became of it
            for r in res:
                if r is not None:
                    out.update(r[0])
            if not any(i in self.host_of for i in unknown[len(wave) :]):
                # nobody named another node (lone nodes, or hosts that are gone): the rest per node
                # now, not wave after wave (a stopped host would cost a timeout a wave)
                break
        groups: dict[str, list[str]] = {}
        for i in want:
            if i not in out and i in self.host_of:
                groups.setdefault(self.host_of[i], []).append(i)

        async def host(h: str, part_of_host: list[str]) -> None:
            page = PAGE.get(command, PAGE_DEFAULT)
            queue, hold = list(part_of_host), wait
            while queue:
                part, queue = queue[:page], queue[page:]
                contact = self.contact.get(h)
                if contact is None or contact not in members:
                    contact = part[0]
                r = await self._call(
                    members, contact, command, args, part, timeout + hold, per_node, hold, decode
                )
                hold = 0.0  # one long poll a sweep: a later page answers at once
                if r is None:
                    # the host is gone (or the contact): forget it, ask its nodes one by one
                    for i in part_of_host:
                        self.host_of.pop(i, None)
                    self.contact.pop(h, None)
                    return
                got, more = r
                out.update(got)
                queue = more + queue  # past the reply's byte budget: the next page

        await asyncio.gather(*(host(h, m) for h, m in groups.items()))
        return out

    async def _call(
        self,
        members: dict[str, Any],
        contact: str,
        command: str,
        args: Any,
        part: list[str],
        timeout: float,
        per_node: dict[str, Any],
        wait: float,
        decode: bool,
    ) -> tuple[dict[str, Any], list[str]] | None:
        """One ``host.batch`` call at ``contact`` for ``part``: the verified answers by node id and the
        nodes the host left for another page (its reply was full), or None when the contact did not
        answer the batch."""
        import grpc

        m = members[contact]
        nonce = secrets.token_hex(16)
        req = {
            "command": command,
            "args": args,
            "nodes": part,
            "nonce": nonce,
            "wait": wait,
            "per_node": {i: per_node[i] for i in part if i in per_node},
        }
        self.calls += 1
        self.batches += 1
        try:
            reply = await self.op.control_raw(
                contact, m.address, BATCH_COMMAND, req, timeout=timeout
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                # a node of an older version: asked on its own from now on
                self.no_batch.add(contact)
            return None
        if not reply.ok:
            return None
        raw = bytes(reply.payload)
        try:
            cut = raw.index(b"\n")
            head = json.loads(raw[:cut])
            host_id = str(head["host"])
            answers = [(str(a["node"]), int(a["len"]), a) for a in head["answers"]]
        except (ValueError, KeyError, TypeError):
            return None  # not a batch reply we can read: its nodes are asked one by one
        for i in head.get("hosted", []):
            if i in members:
                self.host_of[i] = host_id
        self.contact[host_id] = contact
        for k, v in (head.get("work_s") or {}).items():
            self.host_work_s[k] = self.host_work_s.get(k, 0.0) + float(v)
        got: dict[str, Any] = {}
        at = cut + 1
        for i, size, a in answers:
            body = raw[at : at + size]
            at += size
            if i not in part or not self._verify(members, nonce, command, i, a, body):
                self.host_of.pop(i, None)
                continue
            if not a["ok"]:
                got[i] = self.error(f"{i}: {command} failed: {body.decode(errors='replace')}")
            elif not decode:
                got[i] = bytes(body)
            else:
                try:
                    got[i] = json.loads(body) if body else None
                except ValueError:
                    got[i] = bytes(body)
        if command == "run.events":  # nothing new since the digest the caller sent (``seen``)
            seen = [
                i
                for i in head.get("same", [])
                if i in part and isinstance(per_node.get(i), dict) and per_node[i].get("seen")
            ]
            got.update(dict.fromkeys(seen))
            self.same += len(seen)
        for i in head.get("absent", []):
            self.host_of.pop(i, None)
        return got, [i for i in head.get("more", []) if i in part]

    def _verify(
        self,
        members: dict[str, Any],
        nonce: str,
        command: str,
        node_id: str,
        a: dict[str, Any],
        body: bytes,
    ) -> bool:
        """Whether ``body`` is ``node_id``'s own answer: signed by the key the directory lists for it."""
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec

        m = members.get(node_id)
        try:
            spki = bytes.fromhex(a["spki"])
            if m is None or hashlib.sha256(spki).hexdigest() != m.key_sha256:
                return False
            key = self._keys.get(spki)
            if key is None:
                key = self._keys[spki] = serialization.load_der_public_key(spki)
            key.verify(
                bytes.fromhex(a["sig"]),
                answer_message(nonce, command, node_id, bool(a["ok"]), body),
                ec.ECDSA(hashes.SHA256()),
            )
        except (InvalidSignature, ValueError, TypeError, KeyError):
            return False
        return True


def new_host_id() -> str:
    """A fresh id for the set of nodes one process serves."""
    return uuid.uuid4().hex[:16]
