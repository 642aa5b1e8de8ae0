"""A node's own run policy: its privacy budget and where its local data lives.

The operator decides what runs; each node decides whether *its* data takes part.  The policy is
the node owner's file ``runs.toml`` in the node's state directory (or the path in
``$HUSHNET_RUNS_CONFIG``), never something the operator sends::

    [budget]            # this node's lifetime budget toward every other node
    epsilon = 8.0
    delta = 1e-5

    [data]              # local data: CSV (last column = label) or NPZ (arrays X, y)
    path = "data.npz"   # relative paths are relative to the state directory

Without a file the node has no data (it refuses data-using runs with that reason) and the spec's
budget is its budget.
"""

from __future__ import annotations

import os
import pathlib
import tomllib
from dataclasses import dataclass
from typing import Any

import numpy as np

from hushnet.runs.spec import Budget, RunSpec
from hushnet.tasks.base import GradientTask, Task, TaskError
from hushnet.tasks.data import DataFileMissing, DataShapeError, load_local_data
from hushnet.tasks.registry import make_task, resolve_task_class
from hushnet.tasks.values import HistogramTask, SumTask

POLICY_FILE = "runs.toml"


class PolicyError(ValueError):
    """The node's policy file is unreadable or inconsistent."""


@dataclass(frozen=True)
class NodePolicy:
    budget: Budget | None
    data_path: pathlib.Path | None

    @classmethod
    def load(cls, state_dir: pathlib.Path) -> "NodePolicy":
        path = pathlib.Path(
            os.environ.get("HUSHNET_RUNS_CONFIG") or pathlib.Path(state_dir) / POLICY_FILE
        )
        if not path.exists():
            return cls(None, None)
        try:
            doc = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise PolicyError(f"node policy {path}: {exc}") from exc
        budget = None
        if "budget" in doc:
            b = doc["budget"]
            try:
                budget = Budget(float(b["epsilon"]), float(b["delta"]))
            except (KeyError, TypeError, ValueError) as exc:
                raise PolicyError(
                    f"node policy {path}: [budget] needs numbers epsilon and delta ({exc})"
                ) from exc
        data = None
        if "data" in doc and "path" in doc["data"]:
            data = pathlib.Path(str(doc["data"]["path"]))
            if not data.is_absolute():
                data = path.parent / data
        return cls(budget, data)

    @staticmethod
    def write(
        state_dir: pathlib.Path,
        *,
        epsilon: float | None = None,
        delta: float | None = None,
        data_path: str | None = None,
    ) -> pathlib.Path:
        """Write a policy file (what an operator's provisioning script or the demo does per node)."""
        lines = []
        if epsilon is not None:
            lines += [
                "[budget]",
                f"epsilon = {float(epsilon)!r}",
                f"delta = {float(delta if delta is not None else 1e-5)!r}",
                "",
            ]
        if data_path is not None:
            lines += ["[data]", f"path = {str(data_path)!r}".replace("'", '"'), ""]
        p = pathlib.Path(state_dir) / POLICY_FILE
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("\n".join(lines))
        return p


def load_task(spec: RunSpec, policy: NodePolicy) -> Task:
    """Build this node's task for ``spec`` from its own data file (clear errors for every problem)."""
    cls = resolve_task_class(spec.task)  # UnknownTask for a bad name
    params = {k: v for k, v in spec.task_kwargs().items() if k not in ("dim", "features")}
    features = spec.task_params.get("features")
    if policy.data_path is None:
        raise DataFileMissing(
            "this node has no local data configured ([data] path in its runs.toml)"
        )
    if issubclass(cls, (SumTask, HistogramTask)):
        X, _ = load_local_data(policy.data_path, labels=False)
        if X.shape[1] != 1:
            raise DataShapeError(
                f"{policy.data_path}: a {spec.task} task needs one value column, got {X.shape[1]}"
            )
        return make_task(spec.task, {"values": X[:, 0]}, params)
    X, y = load_local_data(policy.data_path, features=features, labels=True)
    return make_task(spec.task, {"X": X, "y": y}, params)


def check_task(task: Task, spec: RunSpec) -> None:
    """A gradient task's model dimension must match the spec's declared one (``task.dim`` in [task])."""
    want = spec.task_params.get("dim")
    if want is not None and int(want) != task.dim:
        raise DataShapeError(
            f"local data gives a model of dimension {task.dim}, the spec declares {want}"
        )
    if not isinstance(task, (GradientTask, SumTask, HistogramTask)) and not hasattr(
        task, "gradient"
    ):
        raise TaskError(f"{type(task).__name__} is not a task this node can run")


def as_array(x: Any) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)
