"""Simulator experiments on the papers' houses task (figure reproductions and benchmarks).

Runs the real protocol machines (the same code a node runs) in the simulator, collects model
snapshots every ``eval_every`` steps, and evaluates them *outside* the protocol: the objective on
1000 fixed training rows and the accuracy on the held-out test set (docs/design/spec/randomwalk.md §A.6.3 / B.7.2).
Snapshots are a simulation trace, not something a deployed run releases.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hushnet.families.central.params import PROTOCOL as CENTRAL_DPSGD
from hushnet.families.walk.walker import WalkOptions
from hushnet.protocols.registry import build_machines
from hushnet.sim.simulator import Simulator
from hushnet.tasks import LogisticRegressionTask, Partition, houses_partition, logistic_metrics

REPO = Path(__file__).resolve().parents[2]


def ensure_data_dir() -> None:
    """Point ``HUSHNET_DATA_DIR`` at the shared data folder (``../shared/data`` from the repo root) if unset."""
    shared = REPO.parent / "shared" / "data"
    if "HUSHNET_DATA_DIR" not in os.environ and shared.is_dir():
        os.environ["HUSHNET_DATA_DIR"] = str(shared)


@dataclass
class HousesSetup:
    part: Partition
    tasks: list[LogisticRegressionTask]
    X_obj: np.ndarray  # 1000 fixed training rows, intercept-augmented
    y_obj: np.ndarray
    X_test: np.ndarray  # augmented
    y_test: np.ndarray


def houses_setup(n: int, per_node: int = 8, clip: float = 0.4, seed: int = 42) -> HousesSetup:
    """Houses split 80/20 (stratified, seed 42), ``per_node`` rows per node, clipped logistic tasks."""
    ensure_data_dir()
    part = houses_partition(n, per_node, seed=seed)
    tasks = [LogisticRegressionTask(X, y, clip=clip) for X, y in part.shards]
    rng = np.random.default_rng(seed)
    idx = rng.choice(part.X_train.shape[0], size=min(1000, part.X_train.shape[0]), replace=False)
    aug = tasks[0].augment
    return HousesSetup(
        part, tasks, aug(part.X_train[idx]), part.y_train[idx], aug(part.X_test), part.y_test
    )


def sgd_curve(
    protocol: str,
    setup: HousesSetup,
    *,
    seed: int,
    steps: int,
    step_size: float,
    noise_std: float,
    W: Any = None,
    cap: int | None = None,
    clip_after_noise: bool = True,
    eval_every: int = 100,
) -> dict[str, Any]:
    """One training run; ``noise_std`` is the absolute Gaussian std per step (the reference code's σ).

    Walk protocols take a noise multiplier, so it is converted with the task's sensitivity 2C.
    Returns steps, objective and test accuracy at every ``eval_every`` steps (step 0 included).
    """
    tasks = setup.tasks
    if protocol == CENTRAL_DPSGD:
        params: dict[str, Any] = {
            "steps": steps,
            "step_size": step_size,
            "noise_std": noise_std,
            "clip_after_noise": clip_after_noise,
            "clip": tasks[0].clip,
            "snapshot_every": eval_every,
        }
        opts = None
    else:
        params = {
            "steps": steps,
            "step_size": step_size,
            "sigma": noise_std / tasks[0].sensitivity(),
            "cap": cap,
            "clip_after_noise": clip_after_noise,
        }
        opts = WalkOptions(reliable=False, snapshot_every=eval_every)
    ms = build_machines(protocol, tasks, run_seed=seed, params=params, W=W, options=opts)
    res = Simulator(ms).run()
    if res.status != "finished":
        raise RuntimeError(f"{protocol} run ended with status {res.status}")
    snaps = [(0, np.zeros(tasks[0].dim))] + [
        (m.step, m.value) for m in res.metrics if m.name == "model"
    ]
    if snaps[-1][0] != steps:
        snaps.append((steps, res.model))
    t = np.array([s for s, _ in snaps])
    obj = np.array([logistic_metrics(w, setup.X_obj, setup.y_obj)["loss"] for _, w in snaps])
    acc = np.array([logistic_metrics(w, setup.X_test, setup.y_test)["accuracy"] for _, w in snaps])
    return {
        "steps": t,
        "objective": obj,
        "accuracy": acc,
        "model": res.model,
        "wall_seconds": res.wall_seconds,
        "gradients": int(sum(res.ledger_counts("gradient"))),
    }


def nonprivate_accuracy(setup: HousesSetup, iters: int = 3000, lr: float = 2.0) -> float:
    """Full-batch gradient descent on all training rows (no privacy, no clipping): the utility ceiling."""
    Xa = setup.tasks[0].augment(setup.part.X_train)
    yX = setup.part.y_train[:, None] * Xa
    w = np.zeros(Xa.shape[1])
    from scipy.special import expit

    for _ in range(iters):
        w += lr * (expit(-(yX @ w)) @ yX) / Xa.shape[0]
    return logistic_metrics(w, setup.X_test, setup.y_test)["accuracy"]
