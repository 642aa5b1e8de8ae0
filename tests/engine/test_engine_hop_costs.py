"""The cheaper hop (issue 4): the same numbers as before, and replays still caught.

* the noisy step reuses one noise buffer — it must stay bit-identical to ``x − γ(∇ + η)`` with the
  same draws (simulator/network parity and every seeded result depend on it), and must not touch
  the incoming model (the holder keeps it for a retransmission);
* the replay digest is taken after the token has moved on — a retransmission of the newest token
  (compared byte for byte) and of an older one (compared by digest) are both acknowledged and
  ignored, and a different token for either step is still a replay.
"""

from __future__ import annotations

import numpy as np
from helpers.engine import rw_run, synthetic_tasks

from hushnet.engine import MessageArrived, ReplayedMessage
from hushnet.engine.actions import Fault, LedgerEntry, Send
from hushnet.engine.rng import node_generator
from hushnet.families.walk.wire import KIND_ACK, encode_ack, encode_token


def test_noisy_step_is_bit_identical_and_leaves_the_input_alone():
    tasks = synthetic_tasks(4, d=3)
    _, ms, _ = rw_run(
        "ring:4", tasks, seed=5, steps=50, sigma=1.3, step_size=0.07, cap=1, until=-1.0
    )
    m = ms[1]
    rng = node_generator(5, 4, 1)  # the generator the machine was built with, replayed
    x = np.linspace(-0.3, 0.4, 4)
    x_before = x.copy()
    grad = tasks[1].gradient(x)
    y, _, led = m.visit(3, x, 0)  # a contribution
    expected = x - 0.07 * (grad + rng.standard_normal(4) * m.noise_std)
    assert np.array_equal(y, expected) and np.array_equal(x, x_before) and y is not x
    assert [e.kind for e in led if isinstance(e, LedgerEntry)] == ["gradient"]
    y2, _, led2 = m.visit(4, y, 0)  # over the cap of 1: noise only
    assert np.array_equal(y2, y - 0.07 * (rng.standard_normal(4) * m.noise_std))
    assert [e.kind for e in led2] == ["noise"] and np.array_equal(y, expected)


def test_retransmissions_before_and_after_the_digest_and_replays():
    tasks = synthetic_tasks(4, d=3)
    _, ms, _ = rw_run("ring:4", tasks, steps=50, until=-1.0)
    m = ms[1]  # ring:4: node 1 receives from 0 and 2
    first = encode_token(1, 50, 0, 1, np.full(4, 0.25))
    acts = m.handle(MessageArrived(0, first))
    assert not any(isinstance(a, Fault) for a in acts)
    visits = m.visits
    forwarded = [a for a in acts if isinstance(a, Send) and a.payload[0] != KIND_ACK]
    assert len(forwarded) == 1  # the token moved on (or the run looped here and then moved on)
    # newest token, not yet digested: the same bytes are a retransmission, other bytes a replay
    assert [type(a) for a in m.handle(MessageArrived(0, bytes(first)))] == [Send]
    acts = m.handle(MessageArrived(0, encode_token(1, 50, 0, 1, np.full(4, 0.5))))
    assert isinstance(acts[0], Fault) and isinstance(acts[0].error, ReplayedMessage)
    # the next holder acknowledges: the digest is taken now, and the checks still hold
    fwd = forwarded[0]
    step_sent = int.from_bytes(fwd.payload[1:9], "little")
    m.handle(MessageArrived(fwd.dst, encode_ack(step_sent)))
    assert m._recent is None and 1 in m._seen
    assert [type(a) for a in m.handle(MessageArrived(0, first))] == [Send]
    acts = m.handle(MessageArrived(0, encode_token(1, 50, 0, 1, np.full(4, 0.5))))
    assert isinstance(acts[0], Fault) and isinstance(acts[0].error, ReplayedMessage)
    assert m.visits == visits


def test_ledger_charge_without_report_records_the_same_and_still_enforces(tmp_path):
    """The driver's per-hop charge (``report=False``) is the same durable charge, minus the returned totals."""
    import pytest

    from hushnet.privacy.ledger import BudgetExceeded, Ledger, LedgerBudget, PrivacyEntry

    orders = np.array([2.0, 4.0, 8.0, 16.0])
    entry = PrivacyEntry.from_row(
        "run-x",
        "rw-dpsgd",
        "sender-known",
        "certified",
        ["a", "b"],
        np.array([[0.1, 0.2, 0.4, 0.8], [0.05, 0.1, 0.2, 0.4]]),
    )
    quiet = Ledger(tmp_path / "quiet.sqlite", orders=orders, budget=LedgerBudget(3.0, 1e-5))
    loud = Ledger(tmp_path / "loud.sqlite", orders=orders, budget=LedgerBudget(3.0, 1e-5))
    charged = 0
    while True:
        try:
            assert quiet.charge(entry, report=False) == {}
        except BudgetExceeded:
            with pytest.raises(BudgetExceeded):
                loud.charge(entry)
            break
        assert set(loud.charge(entry)) == {"a", "b"}
        charged += 1
    assert charged >= 1
    reopened = Ledger(
        tmp_path / "quiet.sqlite", orders=orders
    )  # durable: what is on disk, not in memory
    for t in ("a", "b"):
        assert reopened.spent(t, delta=1e-5).epsilon == pytest.approx(
            loud.spent(t, delta=1e-5).epsilon, rel=1e-12
        )
        assert reopened.spent(t, delta=1e-5).entries == charged
    for led in (quiet, loud, reopened):
        led.close()


def test_prefetched_noise_gives_the_same_models_and_ledgers():
    """Networked runs draw the next visit's noise while the token is away: the same draws, so the same run."""
    tasks = synthetic_tasks(8, d=3, seed=4)
    for protocol, cap in (("rw-dpsgd", 6), ("local-dp-sgd", 6), ("rw-dpsgd", None)):
        runs = [
            rw_run(
                "hypercube:3",
                tasks,
                seed=9,
                steps=120,
                cap=cap,
                protocol=protocol,
                prefetch_noise=pf,
            )[0]
            for pf in (False, True)
        ]
        assert all(r.status == "finished" for r in runs)
        assert np.array_equal(runs[0].model, runs[1].model), protocol
        assert np.array_equal(runs[0].visits(), runs[1].visits())
        assert {v: [(e.step, e.kind) for e in led] for v, led in runs[0].ledgers.items()} == {
            v: [(e.step, e.kind) for e in led] for v, led in runs[1].ledgers.items()
        }
        assert runs[1].events > runs[0].events  # the prefetch timers did run
