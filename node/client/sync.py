"""Synchronous facade over :class:`~hushnet.client.core.AsyncClient` that works inside Jupyter.

Jupyter already runs an asyncio loop in the kernel's thread, so ``asyncio.run`` is not allowed
there.  The facade owns a private event loop in a daemon thread and submits every coroutine to
it (``run_coroutine_threadsafe``), so ``Client(...).watch(run_id)`` blocks the cell — with the
progress bar updating — in a notebook, a script or a REPL alike.  Async code should use
:class:`~hushnet.client.core.AsyncClient` directly (``await``).
"""

from __future__ import annotations

import asyncio
import pathlib
import threading
from typing import Any

from hushnet.client.core import AsyncClient


class Client:
    """``Client(state_dir)`` or ``Client(bootstrap=..., ca=..., cert=..., key=...)``; same methods as
    :class:`AsyncClient`, blocking."""

    def __init__(self, state_dir: str | pathlib.Path | None = None, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="hushnet-client", daemon=True
        )
        self._thread.start()
        try:
            self._async: AsyncClient = self._call(AsyncClient.connect(state_dir, **kwargs))
        except BaseException:
            self._stop_loop()
            raise

    def _call(self, coro, timeout: float | None = None):
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout)
        except KeyboardInterrupt:
            fut.cancel()
            raise

    def _stop_loop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)

    def close(self) -> None:
        if self._loop.is_running():
            try:
                self._call(self._async.close(), timeout=10)
            finally:
                self._stop_loop()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def aio(self) -> AsyncClient:
        return self._async

    def nodes(self):
        return self._call(self._async.nodes())

    def graph(self):
        return self._call(self._async.graph())

    def submit(self, spec):
        return self._call(self._async.submit(spec))

    def start_run(self, spec) -> str:
        return self._call(self._async.start_run(spec))

    def watch(self, run_id: str, **kwargs: Any):
        return self._call(self._async.watch(run_id, **kwargs))

    def cancel(self, run_id: str, reason: str = "cancelled by the operator"):
        return self._call(self._async.cancel(run_id, reason))

    def list_runs(self):
        return self._call(self._async.list_runs())

    def resume(self, run_id: str, *, from_node: str | None = None):
        return self._call(self._async.resume(run_id, from_node=from_node))

    def close_run(self, run_id: str, *, deviated: bool = False):
        return self._call(self._async.close_run(run_id, deviated=deviated))

    def report(self, run_id: str):
        return self._call(self._async.report(run_id))

    def model(self, run_id: str, *, node: str | None = None):
        return self._call(self._async.model(run_id, node=node))

    def models(self, run_id: str):
        return self._call(self._async.models(run_id))

    def result(self, run_id: str, *, node: str | None = None):
        return self._call(self._async.result(run_id, node=node))

    def ledgers(self, *, delta: float | None = None):
        return self._call(self._async.ledgers(delta=delta))

    def run_central(self, spec, **kwargs: Any):
        """Baseline: central DP-SGD with a trusted aggregator (NOT decentralized); see AsyncClient.run_central."""
        return self._call(self._async.run_central(spec, **kwargs))

    def statuses(self, run_id: str):
        return self._call(self._async.statuses(run_id))
