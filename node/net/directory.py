"""The membership directory as this node sees it: reading it (coalesced per process, see
:mod:`hushnet.net.shared`), applying it (neighbours, links opened and closed), following changes.
A mixin of :class:`hushnet.net.node.Node`."""

from __future__ import annotations

import asyncio
import time

import grpc

from hushnet.net import shared as _shared
from hushnet.net.errors import NodeError
from hushnet.v1 import bootstrap_pb2 as bpb


class DirectoryMixin:
    """Membership and neighbours (state on :class:`~hushnet.net.node.Node`)."""

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
            directory = await self._boot.directory(since=now - max_age, timeout=5.0)
        except grpc.aio.AioRpcError as exc:
            if self._bootstrap_ok:
                self.log.warning(
                    "bootstrap %s unreachable (%s); keeping the last directory",
                    self.config.bootstrap,
                    exc.code().name,
                    extra={"event": "bootstrap_unreachable"},
                )
            self._bootstrap_ok = False
            if self.directory is None and force:
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
        if self.directory is not None and directory.epoch == self.directory.epoch and not force:
            return
        self._apply_directory(directory)

    def _apply_directory(self, directory: bpb.Directory) -> None:
        self.directory = directory
        view = _shared.view_of(directory)  # built once per directory for all nodes of this process
        self.members = view.members  # shared by this process's nodes: read-only
        by_vertex = view.by_vertex
        nbr_vertices = view.adjacency.get(self.identity.vertex, [])
        neighbors = [by_vertex[v].node_id for v in nbr_vertices if v in by_vertex]
        if neighbors != self.neighbors:
            self.log.info(
                "neighbours: %s",
                ", ".join(neighbors) or "(none)",
                extra={"event": "neighbors", "neighbors": neighbors, "epoch": directory.epoch},
            )
        self.neighbors = neighbors
        for peer_id in list(self.links):
            link = self.links[peer_id]
            member = self.members.get(peer_id)
            if peer_id not in neighbors or member is None or member.address != link.address:
                del self.links[peer_id]
                task = asyncio.get_running_loop().create_task(link.channel.close())
                self._pending.add(task)
                task.add_done_callback(self._pending.discard)
        for peer_id in neighbors:
            if peer_id not in self.links:
                self.links[peer_id] = self._open_link(self.members[peer_id])

    async def _directory_loop(self) -> None:
        """Follow the process's copy of the directory, which moves when the bootstrap's does (a long poll
        shared by the process's nodes, see :mod:`hushnet.net.shared`), instead of polling."""
        while True:
            self._bootstrap_channel()
            directory = await self._boot.next_directory(
                self.directory.epoch if self.directory is not None else None
            )
            if self.directory is None or directory.epoch != self.directory.epoch:
                self._apply_directory(directory)
