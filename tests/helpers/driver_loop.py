"""An event loop for tests that drive a :class:`~hushnet.runs.driver.RunDriver` by hand.

A driver lives on an event loop (its events notify watchers there, e.g. when the budget stops the run);
a test that calls it outside one gets the loop state an earlier test left behind.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def driver_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A fresh loop set as current for the test; the notifications the driver queued run before it closes."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield loop
    loop.run_until_complete(asyncio.sleep(0))
    asyncio.set_event_loop(None)
    loop.close()
