"""A watch's sweeps stay within a budget of node calls a second (issue 12: at n = 1024 a 2 s sweep was
512 Control RPCs a second on the hosts' event loops during the run it watched)."""

from __future__ import annotations

import pytest

from hushnet.client.core import WATCH_CALLS_PER_S, watch_pacing


def test_small_networks_keep_the_asked_poll_and_pause() -> None:
    assert watch_pacing(16, 2.0, 15.0) == (2.0, 15.0)
    assert watch_pacing(int(2 * WATCH_CALLS_PER_S), 2.0, 15.0) == (2.0, 15.0)


@pytest.mark.parametrize("n", [512, 1024, 2048, 4096])
def test_large_networks_are_swept_within_the_call_budget(n: int) -> None:
    period, pause = watch_pacing(n, 2.0, 15.0)
    assert n / period <= WATCH_CALLS_PER_S + 1e-9  # node calls a second
    assert period >= 2.0
    assert pause >= 2 * period and pause >= 15.0  # a slower sweep alone never looks like a pause
