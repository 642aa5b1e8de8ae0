"""The peer server: the mutual-TLS gRPC server and its RPCs (Deliver, Health, Status, Control), each
admitted by :mod:`hushnet.net.admission` before a protocol or command sees it.  A mixin of
:class:`hushnet.net.node.Node`."""

from __future__ import annotations

import asyncio
import time

import grpc
from google.protobuf.message import DecodeError

from hushnet.net import pki
from hushnet.net.admission import _Rejected
from hushnet.net.config import ENVELOPE_SLACK, PEER_SERVICE, SERVER_KEEPALIVE_S
from hushnet.net.errors import NodeError, NodeStopping, handler_refusal
from hushnet.net.handlers import OutgoingEnvelope, UnknownCommand, UnknownProtocol
from hushnet.v1 import envelope_pb2 as epb
from hushnet.v1 import peer_pb2 as ppb


class ServerMixin:
    """Serve the peer API (state on :class:`~hushnet.net.node.Node`)."""

    async def _start_server(self, bind: str) -> None:
        limit = self.config.max_message_bytes + ENVELOPE_SLACK
        options = [
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            ("grpc.keepalive_time_ms", int(SERVER_KEEPALIVE_S * 1000)),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
            ("grpc.http2.max_ping_strikes", 0),
            ("grpc.so_reuseport", 0),
        ]
        server = grpc.aio.server(options=options)
        ident = lambda b: b  # noqa: E731  raw bytes in: we parse (and reject) ourselves
        handlers = {
            "Deliver": grpc.unary_unary_rpc_method_handler(
                self._rpc_deliver,
                request_deserializer=ident,
                response_serializer=epb.DeliveryAck.SerializeToString,
            ),
            "Health": grpc.unary_unary_rpc_method_handler(
                self._rpc_health,
                request_deserializer=ppb.HealthRequest.FromString,
                response_serializer=ppb.HealthReply.SerializeToString,
            ),
            "Status": grpc.unary_unary_rpc_method_handler(
                self._rpc_status,
                request_deserializer=ppb.StatusRequest.FromString,
                response_serializer=ppb.StatusReply.SerializeToString,
            ),
            "Control": grpc.unary_unary_rpc_method_handler(
                self._rpc_control,
                request_deserializer=ident,
                response_serializer=ppb.ControlReply.SerializeToString,
            ),
        }
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(PEER_SERVICE, handlers),)
        )
        ident_ = self.identity
        creds = pki.server_credentials(ident_.key_pem, ident_.cert_pem, ident_.ca_pem)
        try:
            port = server.add_secure_port(bind, creds)
        except RuntimeError as exc:
            raise NodeError(f"cannot listen on {bind}: {exc}") from exc
        if port == 0:
            raise NodeError(f"cannot listen on {bind} (address in use?)")
        await server.start()
        self._server = server

    def _stopping_refusal(self, what: str, exc: BaseException | None = None, **fields) -> _Rejected:
        """The answer to an RPC that reaches (or is still running in) a node that began to stop: its
        services and stores may be closed, so it is not served — UNAVAILABLE, as a node that is down.

        ``exc``: what a handler raised meanwhile; anything but :class:`NodeStopping` (a service that
        said it is closed) may be a bug, so its traceback stays in the node's log — never in the answer."""
        return _Rejected(
            grpc.StatusCode.UNAVAILABLE,
            f"node {self.node_id} stopping: {what} not served",
            kind="rejected:stopping",
            exc_info=None if exc is None or isinstance(exc, NodeStopping) else exc,
            **fields,
        )

    async def _served(self, what: str, handler, raw: bytes, context):
        """Run one Deliver/Control handler as in-flight work: refused while the node stops, and
        registered so ``Node.stop`` lets it finish before anything it uses closes."""
        if self._stopping:
            await self._reject(context, self._stopping_refusal(what))
        task = asyncio.current_task()
        self._inflight.add(task)
        try:
            return await handler(raw, context)
        finally:
            self._inflight.discard(task)

    async def _rpc_deliver(self, raw: bytes, context) -> epb.DeliveryAck:
        return await self._served("Deliver", self._deliver, raw, context)

    async def _deliver(self, raw: bytes, context) -> epb.DeliveryAck:
        try:
            who, key_sha = self._caller(context)
            if who is None or not who.is_node:
                raise _Rejected(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"Deliver requires a node certificate (caller: {who or 'none'})",
                    kind="rejected:not-a-node",
                )
            if len(raw) > self.config.max_message_bytes + ENVELOPE_SLACK:
                raise _Rejected(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"message of {len(raw)} bytes exceeds the limit of {self.config.max_message_bytes} bytes",
                    kind="rejected:too-large",
                    caller=who.name,
                )
            env = epb.Envelope()
            try:
                env.ParseFromString(raw)
            except DecodeError as exc:
                raise _Rejected(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"malformed Envelope from {who.name}: {exc}",
                    kind="rejected:malformed-envelope",
                    caller=who.name,
                ) from None
            if len(env.payload) > self.config.max_message_bytes:
                raise _Rejected(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"payload of {len(env.payload)} bytes exceeds the limit of "
                    f"{self.config.max_message_bytes} bytes",
                    kind="rejected:too-large",
                    caller=who.name,
                )
            if env.sender != who.name:
                raise _Rejected(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"envelope claims sender {env.sender!r} but the certificate names {who.name!r}",
                    kind="rejected:sender-mismatch",
                    caller=who.name,
                )
            await self._check_member(who, key_sha)
            if who.name in self.cut:
                raise _Rejected(
                    grpc.StatusCode.UNAVAILABLE,
                    f"link to {who.name} is cut (fault injection)",
                    kind="rejected:link-cut",
                    caller=who.name,
                )
            if env.recipient and env.recipient != self.node_id:
                raise _Rejected(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"envelope addressed to {env.recipient!r}, this is {self.node_id}",
                    kind="rejected:wrong-recipient",
                    caller=who.name,
                )
            if who.name not in self.neighbors:
                raise _Rejected(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"{who.name} is not a neighbour of {self.node_id}",
                    kind="rejected:not-a-neighbour",
                    caller=who.name,
                )
            self._load.count("deliver_served")
            link = self.links.get(who.name)
            if link is not None:  # traffic is proof of life (see ChannelsMixin._probe_loop)
                link.last_heard = time.monotonic()
                link.missed = link.excused = 0
            key = (env.sender, env.protocol, env.run_id, env.seq)
            if key in self._seen:
                return epb.DeliveryAck(accepted=True, duplicate=True)
            # claim the key before dispatching: a concurrent retry of the same envelope is a duplicate
            self._seen[key] = None
            if len(self._seen) > 65536:
                self._seen.popitem(last=False)
            try:
                outgoing = await self.handlers.dispatch(env)
            except UnknownProtocol:
                self._seen.pop(key, None)  # not delivered: a later retry may succeed
                raise _Rejected(
                    grpc.StatusCode.UNIMPLEMENTED,
                    f"unknown protocol {env.protocol!r} (this node serves: "
                    f"{', '.join(self.handlers.protocols()) or 'none'})",
                    kind="rejected:unknown-protocol",
                    caller=who.name,
                    protocol=env.protocol,
                ) from None
            except Exception as exc:  # a protocol bug must not take the node down
                self._seen.pop(key, None)
                if self._stopping or isinstance(exc, NodeStopping):
                    # not delivered, and the node or its service is going: the caller sees a node that
                    # is down (UNAVAILABLE), not a failure of the handler it should report (INTERNAL)
                    raise self._stopping_refusal(
                        f"{env.protocol!r} envelope", exc, caller=who.name, protocol=env.protocol
                    ) from None
                # a refusal the handler names (``exc.code``, e.g. a run's RunRefused) is an expected answer to
                # bad input: one rate-limited line per code; anything else is a bug: its traceback is logged
                # with the first line of its kind per interval, never once per message
                code = getattr(exc, "code", None)
                refusal = isinstance(code, str)
                raise _Rejected(
                    grpc.StatusCode.INTERNAL,
                    handler_refusal(env.protocol, exc),
                    kind=f"{'refused' if refusal else 'handler_error'}:{env.protocol}:"
                    f"{code if refusal else type(exc).__name__}",
                    exc_info=None if refusal else exc,
                    caller=who.name,
                    protocol=env.protocol,
                ) from None
            self.delivered += 1
            if outgoing:
                task = asyncio.get_running_loop().create_task(self._send_outgoing(outgoing))
                self._pending.add(task)
                task.add_done_callback(self._pending.discard)
            return epb.DeliveryAck(accepted=True, produced=len(outgoing))
        except _Rejected as exc:
            await self._reject(context, exc)

    async def _send_outgoing(self, items: list[OutgoingEnvelope]) -> None:
        for item, result in zip(items, await self.send_many(items)):
            if isinstance(result, BaseException):
                self.log.warning(
                    "could not send %s envelope to %s: %s",
                    item.protocol,
                    item.to,
                    result,
                    extra={"event": "send_failed", "to": item.to},
                )

    async def _rpc_health(self, request, context) -> ppb.HealthReply:
        if self._stopping:  # neighbours' probes see the link go before the connection does
            await self._reject(context, self._stopping_refusal("Health"))
        self._load.count("health_served")
        return ppb.HealthReply(ok=True, node_id=self.node_id)

    async def _rpc_status(self, request, context) -> ppb.StatusReply:
        if self._stopping:
            await self._reject(context, self._stopping_refusal("Status"))
        self._load.count("status_served")
        who, key_sha = self._caller(context)
        if who is None:
            await self._reject(
                context,
                _Rejected(
                    grpc.StatusCode.PERMISSION_DENIED,
                    "Status requires a certificate",
                    kind="rejected:no-certificate",
                ),
            )
        if (
            who.is_node
        ):  # a node certificate counts only with the key of that node's directory entry
            try:
                await self._check_member(who, key_sha)
            except _Rejected as exc:
                await self._reject(context, exc)
        return self.status()

    async def _rpc_control(self, raw: bytes, context) -> ppb.ControlReply:
        return await self._served("Control", self._control, raw, context)

    async def _control(self, raw: bytes, context) -> ppb.ControlReply:
        try:
            who, _ = self._caller(context)
            if who is None or not who.is_operator:
                raise _Rejected(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"Control requires an operator certificate (caller: {who or 'none'})",
                    kind="rejected:not-an-operator",
                )
            req = ppb.ControlRequest()
            try:
                req.ParseFromString(raw)
            except DecodeError as exc:
                raise _Rejected(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"malformed ControlRequest: {exc}",
                    kind="rejected:malformed-control",
                ) from None
            self._load.count(f"control_served:{req.command}")
            try:
                out = await self.controls.run(req.command, bytes(req.payload))
            except NodeStopping:
                raise self._stopping_refusal(f"command {req.command!r}") from None
            except UnknownCommand:
                raise _Rejected(
                    grpc.StatusCode.UNIMPLEMENTED,
                    f"unknown control command {req.command!r} (known: {', '.join(self.controls.commands())})",
                    kind="rejected:unknown-command",
                ) from None
            except (KeyError, ValueError, PermissionError) as exc:
                # an expected refusal (unknown run id, bad argument): one line, no traceback
                msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
                self.log.warning(
                    "control command %s refused: %s",
                    req.command,
                    msg,
                    extra={"event": "control_refused"},
                )
                return ppb.ControlReply(ok=False, error=f"{type(exc).__name__}: {msg}")
            except Exception as exc:
                # stopping: the traceback (a bug, or a store closed under it) in the log only
                if self._stopping:
                    raise self._stopping_refusal(f"command {req.command!r}", exc) from None
                self.log.exception(
                    "control command %s failed", req.command, extra={"event": "control_error"}
                )
                return ppb.ControlReply(ok=False, error=f"{type(exc).__name__}: {exc}")
            return ppb.ControlReply(ok=True, payload=out)
        except _Rejected as exc:
            await self._reject(context, exc)
