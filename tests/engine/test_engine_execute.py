"""The one executor: every action kind reaches its effect, in order; ``False`` stops; strangers are refused."""

from __future__ import annotations

import typing

import numpy as np
import pytest

from hushnet.engine.actions import (
    Action,
    CancelTimer,
    Deviation,
    Fault,
    Finish,
    LedgerEntry,
    Metric,
    Paused,
    Send,
    SetTimer,
)
from hushnet.engine.errors import MalformedMessage
from hushnet.engine.execute import EFFECT_OF, Effects, execute


def one_of_each() -> list:
    return [
        Send(3, b"payload"),
        SetTimer("ack", 0.5),
        CancelTimer("ack"),
        LedgerEntry(1, 7, "gradient", "sender-known", 0.4, 0.4, 1.0, "rw-dpsgd", "r1"),
        Metric("step", 7, 7, 1),
        Deviation(1, 7, "dead neighbour skipped", {"dead": 2}),
        Paused(1, 7, "neighbour down"),
        Fault(1, MalformedMessage("bad bytes")),
        Finish(1, 7, np.zeros(2), {"k": 1}),
    ]


class Recorder:
    """Effects that record which method received which action (and can stop at one kind)."""

    def __init__(self, stop_at: str | None = None) -> None:
        self.calls: list[tuple[str, object]] = []
        self.stop_at = stop_at

    def _rec(self, name: str, act: object) -> bool | None:
        self.calls.append((name, act))
        return False if name == self.stop_at else None

    def send(self, act):
        return self._rec("send", act)

    def set_timer(self, act):
        return self._rec("set_timer", act)

    def cancel_timer(self, act):
        return self._rec("cancel_timer", act)

    def charge(self, act):
        return self._rec("charge", act)

    def metric(self, act):
        return self._rec("metric", act)

    def deviation(self, act):
        return self._rec("deviation", act)

    def pause(self, act):
        return self._rec("pause", act)

    def fault(self, act):
        return self._rec("fault", act)

    def finish(self, act):
        return self._rec("finish", act)


EXPECTED = [
    "send",
    "set_timer",
    "cancel_timer",
    "charge",
    "metric",
    "deviation",
    "pause",
    "fault",
    "finish",
]


def test_every_action_kind_reaches_its_effect_in_order():
    acts = one_of_each()
    fx = Recorder()
    assert execute(acts, fx) is True
    assert [name for name, _ in fx.calls] == EXPECTED
    assert all(
        got is sent for (_, got), sent in zip(fx.calls, acts)
    )  # the very action objects, untouched


def test_the_table_covers_exactly_the_action_union_and_the_effects_protocol():
    """A new action kind in ``Action`` without an effect (or an effect nobody declares) fails here."""
    assert set(EFFECT_OF) == set(typing.get_args(Action))
    assert {type(a) for a in one_of_each()} == set(EFFECT_OF)
    declared = {n for n, v in vars(Effects).items() if callable(v) and not n.startswith("_")}
    assert declared == set(EFFECT_OF.values())


@pytest.mark.parametrize("stop_at", EXPECTED)
def test_an_effect_returning_false_drops_the_rest_of_the_batch(stop_at):
    """What a refused ledger charge relies on: the Send after it never runs."""
    fx = Recorder(stop_at=stop_at)
    assert execute(one_of_each(), fx) is False
    names = [name for name, _ in fx.calls]
    assert names == EXPECTED[: EXPECTED.index(stop_at) + 1]


def test_truthy_or_none_returns_continue():
    class Truthy(Recorder):
        def send(self, act):
            self._rec("send", act)
            return 0  # falsy but not False: continue

    fx = Truthy()
    assert execute(one_of_each(), fx) is True and len(fx.calls) == 9


def test_an_unknown_action_is_refused_with_its_name_and_nothing_after_it_runs():
    class Teleport:
        pass

    fx = Recorder()
    with pytest.raises(
        TypeError, match=r"cannot execute .*Teleport: not an engine action \(known: Send, SetTimer"
    ):
        execute([Send(1, b"x"), Teleport(), Metric("m", 1, 1, 1)], fx)
    assert [n for n, _ in fx.calls] == ["send"]
    with pytest.raises(TypeError, match="not an engine action"):
        execute([b"raw bytes"], Recorder())
    with pytest.raises(TypeError, match="not an engine action"):
        execute([None], Recorder())


def test_a_subclass_of_an_action_takes_its_base_effect():
    class Probe(Metric):
        __slots__ = ()

    fx = Recorder()
    execute([Probe("p", 1, 1, 0)], fx)
    assert fx.calls[0][0] == "metric"


def test_an_effects_subclass_missing_a_method_fails_loudly():
    class Partial(Effects):
        def send(self, act):
            return None

    execute([Send(0, b"")], Partial())
    with pytest.raises(NotImplementedError):
        execute([Finish(0, 1, None)], Partial())


def test_dispatch_follows_the_effects_class():
    """Two effects classes in one process each get their own methods (the dispatch cache is per class)."""

    class Other(Recorder):
        def send(self, act):
            return self._rec("other-send", act)

    a, b = Recorder(), Other()
    execute([Send(0, b"")], a)
    execute([Send(0, b"")], b)
    execute([Send(0, b"")], a)
    assert [n for n, _ in a.calls] == ["send", "send"] and [n for n, _ in b.calls] == ["other-send"]


def test_every_driver_provides_every_effect():
    """The five drivers each implement all effects, so no action kind can be silently dropped by one."""
    from hushnet.families.central.node import _GradientEffects
    from hushnet.families.central.operator import _AggregatorEffects
    from hushnet.runs.driver import NodeEffects
    from hushnet.sim.loopback import _NodeEffects
    from hushnet.sim.simulator import _SimEffects

    for cls in (_SimEffects, _NodeEffects, NodeEffects, _GradientEffects, _AggregatorEffects):
        for name in EFFECT_OF.values():
            impl = getattr(cls, name, None)
            assert callable(impl) and impl is not getattr(Effects, name), (
                f"{cls.__qualname__} lacks {name}"
            )


def test_operator_aggregator_effects_stop_on_a_fault_or_an_action_it_never_emits():
    """run_central's effects: requests queue for the awaited control call, a fault or a timer/charge/pause
    stops the run with a reason (never ignored), a finish keeps the model."""
    from hushnet.families.central.operator import _AggregatorEffects

    fx = _AggregatorEffects()
    assert execute([Metric("model", np.ones(2), 1, 4), Send(2, b"req")], fx) is True
    assert fx.requests == [(2, b"req")] and fx.state == "running"
    assert execute([Finish(4, 3, np.arange(2.0))], fx) and fx.state == "finished" and fx.step == 3
    np.testing.assert_array_equal(fx.model, [0.0, 1.0])
    for act in (
        SetTimer("t", 1.0),
        CancelTimer("t"),
        Paused(4, 1, "x"),
        LedgerEntry(4, 1, "gradient", "sender-known", 1.0, 1.0, 1.0, "central-dpsgd", "r"),
    ):
        fx = _AggregatorEffects()
        assert execute([act, Send(0, b"after")], fx) is False
        assert fx.state == "stopped" and type(act).__name__ in fx.reason and not fx.requests
    fx = _AggregatorEffects()
    assert execute([Fault(4, MalformedMessage("bad reply")), Send(0, b"after")], fx) is False
    assert (
        fx.state == "stopped"
        and "bad reply" in fx.reason
        and fx.faults[0]["message"] == "bad reply"
    )
