"""Build a node's task from a run spec: a built-in name or a user class named by dotted path."""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from hushnet.tasks.base import GradientTask, Task, TaskError, UnknownTask, ValueTask
from hushnet.tasks.logistic import LogisticRegressionTask
from hushnet.tasks.values import HistogramTask, MeanTask, SumTask

BUILTIN_TASKS: dict[str, type[Task]] = {
    "sum": SumTask,
    "mean": MeanTask,
    "histogram": HistogramTask,
    "logreg": LogisticRegressionTask,
}

_REQUIRED = {GradientTask: ("gradient", "loss", "evaluate", "sensitivity", "dim")}


def resolve_task_class(name: str) -> type[Task]:
    """``"logreg"`` → the built-in class; ``"pkg.mod:Cls"`` or ``"pkg.mod.Cls"`` → the user's class.

    A user class must provide ``gradient``, ``loss``, ``evaluate``, ``sensitivity`` and ``dim``
    (subclassing :class:`~hushnet.tasks.base.GradientTask` is the easy way).  Anything else is
    :class:`~hushnet.tasks.base.UnknownTask`.
    """
    if name in BUILTIN_TASKS:
        return BUILTIN_TASKS[name]
    if ":" in name:
        mod_name, _, cls_name = name.partition(":")
    elif "." in name:
        mod_name, _, cls_name = name.rpartition(".")
    else:
        raise UnknownTask(
            f"unknown task {name!r}; built-ins are {sorted(BUILTIN_TASKS)}, or name a class as 'pkg.module:Class'"
        )
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as exc:
        raise UnknownTask(f"task {name!r}: cannot import module {mod_name!r} ({exc})") from exc
    cls = getattr(mod, cls_name, None)
    if not isinstance(cls, type):
        raise UnknownTask(f"task {name!r}: module {mod_name!r} has no class {cls_name!r}")
    if not issubclass(cls, (GradientTask, ValueTask)):
        missing = [a for a in _REQUIRED[GradientTask] if not hasattr(cls, a)]
        if missing:
            raise UnknownTask(
                f"task {name!r}: class lacks {missing} (subclass hushnet.tasks.GradientTask)"
            )
    return cls


def make_task(
    name: str, data: dict[str, Any] | None = None, params: dict[str, Any] | None = None
) -> Task:
    """Instantiate a task for one node.

    ``data`` holds the node's local arrays (``X``, ``y`` for gradient tasks; ``values`` for value
    tasks), ``params`` the public parameters from the spec (``clip``, ``lo``/``hi``, ``bins``, …).
    User classes are called as ``cls(**data, **params)``.
    """
    cls = resolve_task_class(name)
    data = dict(data or {})
    params = dict(params or {})
    try:
        if cls is LogisticRegressionTask:
            return cls(data["X"], data["y"], **params)
        if cls in (SumTask, MeanTask):
            return cls(np.asarray(data["values"]), **params)
        if cls is HistogramTask:
            return cls(np.asarray(data["values"]), **params)
        return cls(**data, **params)
    except KeyError as exc:
        raise TaskError(f"task {name!r} needs local data {exc.args[0]!r}") from exc
    except TypeError as exc:
        raise TaskError(f"task {name!r}: bad parameters ({exc})") from exc
