"""Secret noise drives the same walk as seeded noise (issue 4: the demo's spread on the network).

A network run draws each node's noise and next hops from its own ``secret_generator()``; the
simulator from the seeded ones.  Noise of the wrong scale or count (a draw skipped, doubled, or
taken from another generator's state) would show in the spread; a reused stream in identical runs.
On a pure-noise task
the final model is ``−γ·Σ η_t`` exactly, so its per-coordinate variance must be ``T·γ²·std²``
with either source, and every run must differ (fresh entropy per node and per run).
"""

from __future__ import annotations

import numpy as np
from helpers.engine import ZeroGradTask

from hushnet.engine.rng import secret_generator
from hushnet.families.walk.walker import WalkOptions
from hushnet.protocols.registry import build_machines, transition_matrix
from hushnet.sim import Simulator

N, T, DIM, RUNS, STEP, SIGMA = 4, 60, 40, 30, 0.1, 1.5


def _final_models(secret: bool) -> np.ndarray:
    W = transition_matrix(f"ring:{N}")
    out = []
    for r in range(RUNS):
        tasks = [ZeroGradTask(dim=DIM) for _ in range(N)]
        ms = build_machines(
            "rw-dpsgd",
            tasks,
            run_seed=r,
            params=dict(steps=T, step_size=STEP, sigma=SIGMA),
            W=W,
            options=WalkOptions(),
        )
        if secret:
            for m in ms:
                m.ctx.rng = (
                    secret_generator()
                )  # what RunSpec.node_rng gives every node of a network run
        res = Simulator(ms).run()
        assert res.status == "finished" and len(res.visits()) == T
        out.append(res.model)
    return np.stack(out)


def test_secret_and_seeded_noise_give_the_same_walk_distribution():
    std = 2.0 * 1.0 * SIGMA  # sensitivity 2·clip, times σ
    expected_var = T * (STEP * std) ** 2
    for secret in (False, True):
        models = _final_models(secret)
        var = float(np.mean(models**2))  # mean-zero noise: pooled over RUNS·DIM coordinates
        assert abs(var / expected_var - 1.0) < 0.2, (
            secret,
            var,
            expected_var,
        )  # 1200 samples: 6 standard errors
        assert len({m.tobytes() for m in models}) == RUNS
