"""A watch's sweeps stay within a budget of node calls a second (issue 12: at n = 1024 a 2 s sweep was
512 Control RPCs a second on the hosts' event loops during the run it watched), and calls to every node
are spread over the host processes (in vertex order the first 64 went to one host while the others
idled)."""

from __future__ import annotations

import pytest

from hushnet.client.core import (
    WATCH_ANSWERS_PER_S,
    WATCH_CALLS_PER_S,
    spread_order,
    watch_pacing,
)


def test_small_networks_keep_the_asked_poll_and_pause() -> None:
    assert watch_pacing(16, 2.0, 15.0) == (2.0, 15.0)
    assert watch_pacing(int(2 * WATCH_CALLS_PER_S), 2.0, 15.0) == (2.0, 15.0)


@pytest.mark.parametrize("n", [512, 1024, 2048, 4096])
def test_large_networks_are_swept_within_the_call_budget(n: int) -> None:
    period, pause = watch_pacing(n, 2.0, 15.0)
    assert n / period <= WATCH_CALLS_PER_S + 1e-9  # node calls a second
    assert period >= 2.0
    assert pause >= 2 * period and pause >= 15.0  # a slower sweep alone never looks like a pause


@pytest.mark.parametrize("n, hosts", [(1024, 3), (2048, 5), (4096, 10)])
def test_batched_sweeps_stay_within_the_answer_budget(n: int, hosts: int) -> None:
    # one call per host, but every node still answers on its host's loop
    period, pause = watch_pacing(hosts, 2.0, 15.0, answers=n)
    assert n / period <= WATCH_ANSWERS_PER_S + 1e-9
    assert period >= 2.0 and pause >= 2 * period and pause >= 15.0
    assert watch_pacing(1, 2.0, 15.0, answers=16) == (2.0, 15.0)  # a small network is not slowed


@pytest.mark.parametrize("n, per_process", [(1024, 342), (2048, 410), (256, 128), (16, 8)])
def test_calls_to_every_node_are_spread_over_the_hosts(n: int, per_process: int) -> None:
    ids = [f"n{v}" for v in range(n)]
    order = spread_order(ids + ["stranger"], {f"n{v}": v for v in range(n)})
    assert sorted(order[:-1], key=lambda i: int(i[1:])) == ids and order[-1] == "stranger"
    hosts = -(-n // per_process)
    window = min(64, n)  # the operator's default concurrency
    for start in range(0, n - window + 1, window // 2):
        per_host = [0] * hosts
        for i in order[start : start + window]:
            per_host[int(i[1:]) // per_process] += 1
        share = [per_host[h] / min(per_process, n - h * per_process) for h in range(hosts)]
        # every host gets about its share of any window of in-flight calls
        assert max(share) <= 2.0 * window / n + 2.0 / per_process, (start, per_host)
        assert min(share) >= 0.5 * window / n - 2.0 / per_process, (start, per_host)
