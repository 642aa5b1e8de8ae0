"""The membership directory as this node sees it: reading it (coalesced per process, see
:mod:`hushnet.net.shared`), applying it (neighbours, links opened and closed), following changes.
A mixin of :class:`hushnet.net.node.Node`."""

from __future__ import annotations

import asyncio
import logging
import time

import grpc

from hushnet.net import shared as _shared
from hushnet.net.errors import NodeError
from hushnet.v1 import bootstrap_pb2 as bpb


class DirectoryMixin:
    """Membership and neighbours (state on :class:`~hushnet.net.node.Node`).

    The node follows its process's copy of the directory (:class:`hushnet.net.shared.SharedBootstrap`):
    ``directory_epoch`` is the version it last applied, :attr:`directory` the process's message.
    """

    _dir_epoch: int | None = None
    _dir_source: _shared.SharedBootstrap | None = (
        None  # kept after stop, for reading what was known
    )

    @property
    def directory(self) -> bpb.Directory | None:
        """The directory as one message (members, topology, edges, weights, CA), or None before joining."""
        if self._dir_epoch is None or self._dir_source is None:
            return None
        return self._dir_source.current

    @property
    def directory_settings(self) -> bpb.Directory | None:
        """The directory's network-wide fields (topology, edges, weights, CA, onion periods), which never
        change within one bootstrap state; its members may be stale (read :attr:`members` for those).
        Cheap: no message is built (nodes read the onion period every few seconds)."""
        if self._dir_epoch is None or self._dir_source is None:
            return None
        return self._dir_source.settings

    @property
    def directory_epoch(self) -> int:
        """Version of the directory this node is at (0 before the first): the process's version when no
        change since the one it applied last concerns its neighbourhood (it would redo nothing for them, and
        is not woken for them, see :meth:`_directory_loop`), else the one it applied last."""
        applied, source = self._dir_epoch, self._dir_source
        if applied is None:
            return 0
        ident = getattr(self, "identity", None)
        if (
            source is not None
            and source.epoch is not None
            and source.epoch > applied
            and ident is not None
            and not source.view.changed_since(applied, ident.vertex)
        ):
            return source.epoch
        return applied

    async def _refresh_directory(
        self,
        force: bool = False,
        min_interval: float = 0.0,
        wait: bool = False,
        max_age: float = 0.0,
    ) -> None:
        """Read the directory from the bootstrap, at most once per ``min_interval``.

        With ``wait`` a call inside the interval sleeps until it ends and then reads (unless another read started
        meanwhile), so that a caller who joined a moment ago is not refused because of the rate limit.
        """
        now = time.monotonic()
        if not force and now - self._last_dir_fetch < min_interval:
            if not wait:
                return
            asked = now
            await asyncio.sleep(self._last_dir_fetch + min_interval - now)
            if self._last_dir_fetch >= asked:
                return
            now = time.monotonic()
        self._last_dir_fetch = now
        try:
            self._bootstrap_channel()
            # a read begun after we asked (or at most max_age before), shared with this process's other nodes
            epoch = await self._boot.directory(since=now - max_age, timeout=5.0)
        except grpc.aio.AioRpcError as exc:
            if self._bootstrap_ok:
                self.log.warning(
                    "bootstrap %s unreachable (%s); keeping the last directory",
                    self.config.bootstrap,
                    exc.code().name,
                    extra={"event": "bootstrap_unreachable"},
                )
            self._bootstrap_ok = False
            if self._dir_epoch is None and force:
                raise NodeError(
                    f"cannot read the directory from {self.config.bootstrap}: {exc.code().name}"
                ) from None
            return
        if not self._bootstrap_ok:
            self.log.info(
                "bootstrap %s reachable again",
                self.config.bootstrap,
                extra={"event": "bootstrap_back"},
            )
        self._bootstrap_ok = True
        if epoch is None or (epoch == self._dir_epoch and not force):
            return
        self._apply_directory(self._boot, epoch)

    def _apply_directory(self, source: _shared.SharedBootstrap, epoch: int) -> None:
        """Take the process's directory at ``epoch``: neighbours, and links opened, moved or closed."""
        self._dir_source, self._dir_epoch = source, epoch
        view = source.view  # kept up to date for all nodes of this process
        self.members = view.members  # shared by this process's nodes: read-only
        by_vertex = view.by_vertex
        nbr_vertices = view.adjacency.get(self.identity.vertex, [])
        neighbors = [by_vertex[v].node_id for v in nbr_vertices if v in by_vertex]
        if neighbors != self.neighbors:
            # one line a node once its neighbourhood is complete: during a 2048-node join storm each node's
            # set grew up to 11 times, and these lines with the one per link were ~7 % of a host's event loop
            self.log.log(
                logging.INFO if len(neighbors) == len(nbr_vertices) else logging.DEBUG,
                "neighbours: %s",
                ", ".join(neighbors) or "(none)",
                extra={"event": "neighbors", "neighbors": neighbors, "epoch": epoch},
            )
        self.neighbors = neighbors
        for peer_id in list(self.links):
            link = self.links[peer_id]
            member = self.members.get(peer_id)
            if peer_id not in neighbors or member is None or member.address != link.address:
                del self.links[peer_id]
                if link.probing is not None:
                    link.probing.cancel()
                task = asyncio.get_running_loop().create_task(link.channel.close())
                self._pending.add(task)
                task.add_done_callback(self._pending.discard)
        opened = False
        for peer_id in neighbors:
            if peer_id not in self.links:
                self.links[peer_id] = self._open_link(self.members[peer_id])
                opened = True
        if opened:
            self._kick_probes()  # new links are due at once

    async def _directory_loop(self) -> None:
        """Follow the process's copy of the directory, which moves when the bootstrap's does (a long poll
        shared by the process's nodes, see :mod:`hushnet.net.shared`), instead of polling.  The node wakes
        only when its own or a neighbour's entry changed (:meth:`SharedBootstrap.next_change`): a join storm
        is mostly other nodes' neighbourhoods."""
        while True:
            self._bootstrap_channel()
            if (
                self._dir_epoch is None
                or self._dir_source is not self._boot
                or self.identity is None
            ):
                epoch = await self._boot.next_directory(self._dir_epoch)
            else:
                epoch = await self._boot.next_change(self._dir_epoch, self.identity.vertex)
            if epoch == self._dir_epoch:
                continue
            self._apply_directory(self._boot, epoch)
