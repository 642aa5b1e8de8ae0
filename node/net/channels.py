"""Channels to the neighbours: one mutual-TLS channel per neighbour, health probes, and sending envelopes
over them with retries.  A mixin of :class:`hushnet.net.node.Node`."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from hushnet.net import pki
from hushnet.net.config import ENVELOPE_SLACK, PEER_SERVICE
from hushnet.net.errors import DeliveryError, NotANeighbour, PayloadTooLarge
from hushnet.net.handlers import OutgoingEnvelope
from hushnet.net.wire import encode_envelope
from hushnet.v1 import bootstrap_pb2 as bpb
from hushnet.v1 import envelope_pb2 as epb
from hushnet.v1 import peer_pb2 as ppb
from hushnet.v1 import peer_pb2_grpc as ppb_grpc

#: answers :meth:`ChannelsMixin.send` retries until its deadline.  CANCELLED too: this node's own
#: cancellations surface as ``asyncio.CancelledError``, so a CANCELLED status is the peer's server
#: cancelling a stream that reached it after its shutdown began (gRPC core does so for streams it had
#: not dispatched yet: 165 of 4 708 RPCs racing 30 stops of a bare grpc.aio server, 8 concurrent callers,
#: or a handler still running at the end of its grace) — not acknowledged, so sent again as after
#: UNAVAILABLE; the receiver drops a duplicate by its sequence number.
_RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)

#: a probe timeout is not counted as a miss when this process's event loop ran later than this fraction
#: of the probe's deadline during the probe (see ``ChannelsMixin._probe``)
LATE_LOOP = 0.25


@dataclass
class PeerLink:
    """Our channel to one neighbour and what we know about its health."""

    peer_id: str
    address: str
    channel: grpc.aio.Channel
    healthy: bool = False
    last_ok: float = 0.0
    sent: int = 0
    failures: int = 0
    ever_healthy: bool = False
    next_probe: float = 0.0  # time.monotonic() when a healthy link is probed next
    missed: int = 0  # consecutive probes that timed out on a connected channel (see Node._probe)
    excused: int = 0  # consecutive timeouts not counted as misses because this loop ran late
    last_rpc: float = 0.0  # time.monotonic() of the last Health RPC on this link
    #: time.monotonic() of the last proof of life from this neighbour other than a probe: an envelope it
    #: acknowledged on this channel, or one it delivered to us (both over its own mutual-TLS identity)
    last_heard: float = 0.0
    probing: asyncio.Task | None = (
        None  # the probe in flight on this link (at most one, see Node._probe_loop)
    )
    # made on first use: a link confirmed by READY may carry no call for minutes, and building the stub's four
    # callables and Deliver's for each of the 22 528 links of a 2048-node start-up was ~5 % of the hosts' loops
    _stub: Any = None
    _deliver: Any = None

    @property
    def stub(self) -> ppb_grpc.PeerStub:
        if self._stub is None:
            self._stub = ppb_grpc.PeerStub(self.channel)
        return self._stub

    @stub.setter
    def stub(self, value: Any) -> None:
        self._stub = value

    @property
    def deliver(self) -> Any:
        """Deliver with pre-encoded request bytes (see :mod:`hushnet.net.wire`)."""
        if self._deliver is None:
            self._deliver = self.channel.unary_unary(
                f"/{PEER_SERVICE}/Deliver",
                request_serializer=None,
                response_deserializer=epb.DeliveryAck.FromString,
            )
        return self._deliver

    @deliver.setter
    def deliver(self, value: Any) -> None:
        self._deliver = value

    def state(self) -> str:
        try:
            return self.channel.get_state(try_to_connect=False).name
        except Exception:  # channel closed
            return "SHUTDOWN"


class ChannelsMixin:
    """Links to the neighbours and delivery over them (state on :class:`~hushnet.net.node.Node`)."""

    def next_seq(self, protocol: str, run_id: str, to: str = "") -> int:
        """Sequence numbers unique per (protocol, run, link) across restarts (incarnation in the high bits).

        One counter per *link*, not per node and run: a neighbour then sees only how many envelopes
        this node sent *to it*, which it counted itself, never how busy the node is with others (with
        onion relaying that would tell a receiver how much its last relay relayed — issue 11 finding 5).
        Receivers deduplicate by ``(sender, protocol, run_id, seq)``, so per-link numbers stay unique there.
        """
        key = (protocol, run_id, to)
        value = self._seq.get(key, 0)
        self._seq[key] = value + 1
        return (self.incarnation << 32) | value

    async def send(
        self,
        to: str,
        payload: bytes,
        *,
        protocol: str,
        run_id: str = "",
        seq: int | None = None,
        timeout: float = 60.0,
        started: Callable[[], None] | None = None,
    ) -> epb.DeliveryAck:
        """Send one envelope to neighbour ``to`` and wait for its delivery receipt.

        Raises :class:`NotANeighbour`, :class:`PayloadTooLarge` or :class:`DeliveryError`.
        Transient failures are retried until ``timeout``; the receiver drops duplicates by
        ``(sender, protocol, run_id, seq)``, so a retry never delivers twice.

        ``started`` is called once, as soon as the first attempt's call exists: gRPC starts it from a
        task of its own, and whatever ``started`` schedules on the loop runs after that task (a run
        driver's work that must not delay the envelope: :class:`hushnet.runs.driver._Soon`).
        """
        link = self.links.get(to)
        if link is None:
            raise NotANeighbour(
                f"{to} is not a neighbour of {self.node_id} (neighbours: {', '.join(self.neighbors)})"
            )
        if len(payload) > self.config.max_message_bytes:
            raise PayloadTooLarge(
                f"payload of {len(payload)} bytes exceeds the configured limit of {self.config.max_message_bytes} bytes"
            )
        if seq is None:
            seq = self.next_seq(protocol, run_id, to)
        wire = encode_envelope(protocol, run_id, seq, payload, self.node_id, to)
        deadline = time.monotonic() + timeout
        delay = 0.2
        while True:
            remaining = deadline - time.monotonic()
            if (
                to in self.cut
            ):  # fault injection: a cut link behaves like a dead one (retried until the deadline)
                if remaining <= 0:
                    raise DeliveryError(
                        to, grpc.StatusCode.UNAVAILABLE, "link cut (fault injection)"
                    )
                await asyncio.sleep(min(0.2, remaining))
                continue
            try:
                call = link.deliver(wire, timeout=max(remaining, 0.01), wait_for_ready=True)
                if started is not None:
                    started, notify = None, started
                    notify()
                ack = await call
                link.sent += 1
                link.last_heard = time.monotonic()
                link.missed = link.excused = 0
                return ack
            except grpc.aio.AioRpcError as exc:
                link.failures += 1
                code = exc.code()
                if code in _RETRIED and time.monotonic() + delay < deadline:
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 2.0)
                    link = self.links.get(to, link)
                    continue
                raise DeliveryError(to, code, exc.details() or "") from None

    async def send_many(
        self, items: list[OutgoingEnvelope], *, timeout: float = 60.0
    ) -> list[BaseException | epb.DeliveryAck]:
        """Send several envelopes concurrently; returns an ack or the exception for each."""
        coros = [
            self.send(
                o.to,
                o.payload,
                protocol=o.protocol or "",
                run_id=o.run_id,
                seq=o.seq,
                timeout=timeout,
            )
            for o in items
        ]
        return await asyncio.gather(*coros, return_exceptions=True)

    def _open_link(self, member: bpb.Member) -> PeerLink:
        ident = self.identity
        cfg = self.config
        key = (cfg.max_message_bytes, cfg.keepalive_s, cfg.max_backoff_s)
        cached_options = getattr(self, "_link_options", None)
        if cached_options is not None and cached_options[0] == key:
            common = cached_options[1]
        else:  # the same for every link of this node: built once
            limit = self.config.max_message_bytes + ENVELOPE_SLACK
            common = (
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
                ("grpc.keepalive_time_ms", int(self.config.keepalive_s * 1000)),
                ("grpc.keepalive_timeout_ms", 10_000),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.max_pings_without_data", 0),
                ("grpc.initial_reconnect_backoff_ms", 250),
                ("grpc.min_reconnect_backoff_ms", 250),
                ("grpc.max_reconnect_backoff_ms", int(self.config.max_backoff_s * 1000)),
                # a distinct channel per neighbour, never shared with another identity
                ("grpc.use_local_subchannel_pool", 1),
            )
            self._link_options = (key, common)
        options = (("grpc.ssl_target_name_override", pki.node_dns(member.node_id)), *common)
        # one credentials object per node identity, not per link: building it per channel cost ~25 µs more of
        # the event loop per link (48 vs 24 µs a channel, 1 500 channels in one process)
        key = (ident.ca_pem, ident.key_pem, ident.cert_pem)
        cached = getattr(self, "_link_creds", None)
        if cached is None or cached[0] != key:
            cached = self._link_creds = (key, pki.channel_credentials(*key))
        creds = cached[1]
        channel = grpc.aio.secure_channel(member.address, creds, options=options)
        channel.get_state(try_to_connect=True)
        self.log.debug("opened channel to %s at %s", member.node_id, member.address)
        return PeerLink(member.node_id, member.address, channel)

    async def _probe(self, link: PeerLink) -> None:
        now = time.monotonic()
        if (
            link.healthy
            and self.config.health_rpc_s > 0
            and link.state() == "READY"
            and now - max(link.last_rpc, link.last_heard) < self.config.health_rpc_s
        ):
            # still connected, and its identity was confirmed recently (a Health RPC, or an envelope it
            # acknowledged or sent over its own certificate): no RPC now
            return
        load = self._load
        link.last_rpc = started = now
        timeout = max(self.config.probe_s, 1.0)
        if not link.ever_healthy and not link.healthy:
            # A new link is confirmed by its channel reaching READY, not by a Health RPC: gRPC's client
            # reports READY only once the server's HTTP/2 SETTINGS frame arrived (its connector waits for
            # it), and the server's transport exists only after its TLS handshake accepted our client
            # certificate — so READY is the mutual-TLS connection the RPC proved (the server's name was
            # pinned by the handshake: ``grpc.ssl_target_name_override``).  The first RPC was ~0.9 ms of
            # CPU a link (both ends, 28 % of a link's cost, ``bench_links``): ~21 CPU-s of a 2048-node
            # start-up.  Later probes are as before (a Health RPC every ``health_rpc_s``, or every probe),
            # so a neighbour whose process hangs is still found; a link that went down is confirmed again
            # by an RPC.  ``tests/net/test_net_link_ready.py`` checks that a refused certificate never
            # makes a link healthy.
            load.count("probe_ready")
            try:
                await asyncio.wait_for(link.channel.channel_ready(), timeout)
                ok, detail = True, "ok"
            except asyncio.TimeoutError:
                ok, detail = False, "not connected"
            self._probed(link, ok, detail)
            return
        load.count("probe_rpc")
        try:
            reply = await link.stub.Health(
                ppb.HealthRequest(), timeout=timeout, wait_for_ready=True
            )
            ok = reply.ok and reply.node_id == link.peer_id
        except grpc.aio.AioRpcError as exc:
            ok = False
            detail = exc.code().name
            # A probe that timed out on a connection that is still up is a busy neighbour (a host process
            # starved of CPU), not a lost one; a lost peer shows as a failed connection (UNAVAILABLE, or a
            # channel no longer READY) at once.  So such a timeout is a *miss*, and only ``probe_misses``
            # misses in a row call the link down; a timeout is no miss at all when the neighbour was heard
            # from meanwhile, or when this process's own loop ran late during the probe (at n = 1024 loops
            # stalled 0.6-9 s under load and single timeouts dropped 2 046 live links of a walk in two
            # minutes, each then re-probed every 0.5 s: more load on the stalled loops).
            if (
                exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                and link.healthy
                and link.state() == "READY"
            ):
                if link.last_heard >= started:
                    load.count("probe_timeout_heard")
                    link.missed = link.excused = 0
                    return  # heard from meanwhile: alive
                if (
                    load.lag_since(started) > LATE_LOOP * timeout
                    and link.excused < self.config.probe_misses
                ):
                    # our own loop was late: no evidence either way (but never more than probe_misses
                    # times in a row, so a neighbour that is really gone is still called down on a busy host)
                    link.excused += 1
                    load.count("probe_timeout_excused")
                    return
                link.missed += 1
                if link.missed < self.config.probe_misses:
                    return
        else:
            detail = "ok"
        self._probed(link, ok, detail)

    def _probed(self, link: PeerLink, ok: bool, detail: str) -> None:
        """Record a probe's outcome on ``link`` (and say when the link or the node's wiring changed)."""
        link.missed = link.excused = 0
        if ok:
            link.last_ok = time.time()
            if not link.healthy:
                # a first connection is a debug line, a reconnection an info line; the node says once when
                # all its links are up (one line per link was 22 528 lines for a 2048-node start)
                self.log.log(
                    logging.INFO if link.ever_healthy else logging.DEBUG,
                    "%s neighbour %s at %s",
                    "reconnected to" if link.ever_healthy else "connected to",
                    link.peer_id,
                    link.address,
                    extra={"event": "link_up", "peer_id": link.peer_id},
                )
                if len(self.links) == len(self.neighbors) and all(
                    l.healthy for l in self.links.values() if l is not link
                ):
                    self.log.info(
                        "connected to all %d neighbours",
                        len(self.links),
                        extra={"event": "wired", "neighbors": len(self.links)},
                    )
            link.ever_healthy = True
        elif link.healthy:
            self.log.warning(
                "lost neighbour %s at %s (%s); reconnecting with backoff",
                link.peer_id,
                link.address,
                detail,
                extra={"event": "link_down", "peer_id": link.peer_id},
            )
        link.healthy = ok

    #: a failed probe's link is probed again after this many seconds (its probe_s once it is healthy)
    UNHEALTHY_REPROBE_S = 0.5
    #: times this node's probe loop woke (tests and profiles read it)
    probe_wakes = 0
    #: fraction of a probe period by which a healthy link's probe may come early to share a wake-up (hosted
    #: nodes only, where the probes between Health RPCs read the channel state)
    PROBE_SLACK = 0.5

    def _kick_probes(self) -> None:
        """Wake the probe loop now (a probe ended, or links were opened): it sleeps until then otherwise."""
        kick = getattr(self, "_probe_kick", None)
        if kick is not None:
            kick.set()

    async def _probe_loop(self) -> None:
        """Probe each healthy link every ~``probe_s`` and each unhealthy one every 0.5 s.

        Why per link: re-probing *all* links every 0.5 s while any one was down multiplied the probe load
        (up to probe_s / 0.5 times: 16× at a 342-node host's 8 s) exactly when the processes were too busy
        to answer in time — at n = 2048 on a loaded machine links kept flapping for minutes.

        Why each probe in its own task: a probe of a link that is still connecting waits (``wait_for_ready``)
        up to its deadline; when a round waited for all its probes, a link that came up meanwhile was
        confirmed only after the slowest probe of the round (at n = 2048 every node had neighbours not yet
        serving).  A link has at most one probe in flight, so the rate per link is what it was.

        Why the loop sleeps until a link is due or a probe ends (:meth:`_kick_probes`), not 0.5 s while a
        link is down: a link that is down has its probe in flight (waiting for the neighbour, up to its
        deadline) nearly all the time, so the 0.5 s wake-ups found nothing to do — at n = 2048 a host's
        410 nodes woke twice a second each for the minute or two until their last neighbour joined.
        """
        self._probe_kick = kick = asyncio.Event()
        loop = asyncio.get_running_loop()
        while True:
            kick.clear()
            self.probe_wakes += 1
            now = time.monotonic()
            probe_s = self.config.probe_s
            # Where Health RPCs are spaced (health_rpc_s > 0: hosted nodes) a healthy link due within the next
            # PROBE_SLACK of a period is taken in this wake, and the links taken together get one next due
            # time: each link's own jittered due time woke the loop once per link and period (degree 11: ~530
            # wake-ups a second in an idle 410-node host, each going over every link); now a node's healthy
            # links fall into one wake per period.  Health RPCs stay as often as health_rpc_s says.
            soon = now + (self.PROBE_SLACK * probe_s if self.config.health_rpc_s > 0 else 0.0)
            next_due = now + probe_s * (0.9 + 0.2 * random.random())
            for link in list(self.links.values()):
                if link.probing is None and link.next_probe <= (soon if link.healthy else now):
                    if (
                        link.healthy
                        and now - link.last_heard < self.config.probe_s
                        and link.state() == "READY"
                    ):
                        # traffic is proof of life: a link that carried an envelope within the last probe
                        # period and is still connected needs no probe (during gossip rounds at n = 1024
                        # every link carries traffic each round; probing them too was pure overhead)
                        link.next_probe = next_due
                        self._load.count("probe_skipped_traffic")
                        continue
                    if (
                        link.healthy
                        and 0 < self.config.health_rpc_s
                        and now - max(link.last_rpc, link.last_heard) < self.config.health_rpc_s
                        and link.state() == "READY"
                    ):
                        # what _probe would do (read the channel's state, no RPC), without a task: at
                        # n = 1024 an idle host's loop spent 0.26 CPU-s/s on ~500 such probe tasks a second
                        link.next_probe = next_due
                        self._load.count("probe_state_read")
                        continue
                    link.probing = loop.create_task(self._probe_once(link))
            due = [l.next_probe for l in self.links.values() if l.probing is None]
            delay = (min(due) if due else now + self.config.probe_s) - time.monotonic()
            timer = loop.call_later(min(max(delay, 0.05), self.config.probe_s), kick.set)
            await kick.wait()
            timer.cancel()

    async def _probe_once(self, link: PeerLink) -> None:
        try:
            await self._probe(link)
        except (
            Exception
        ) as exc:  # a closed channel (link replaced or node stopping): the link is gone
            self.log.debug("probe of %s failed: %r", link.peer_id, exc)
        finally:
            now = time.monotonic()
            if link.healthy:
                link.next_probe = now + self.config.probe_s * (0.9 + 0.2 * random.random())
            else:
                link.next_probe = now + self.UNHEALTHY_REPROBE_S
            link.probing = None
            self._kick_probes()
