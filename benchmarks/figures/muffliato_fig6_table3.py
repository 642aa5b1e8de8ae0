"""Muffliato Fig. 6 and Table 3 (App. H.6): averaging with user dropouts, run by the protocol machines.

Setup ([M] ``versatile.py``, docs/design/spec/gossip.md §1.2.5 / E7): n = 1000, a fresh public G(n, 0.002) every
round, each node unavailable for a round with probability q, MH weights on what is left, plain
gossip, σ = Δ = 1, α = 2, source u = 0, inputs x ~ U[0, 1].  Here every node is a
:class:`~hushnet.families.gossip.machines.MuffliatoAveraging` machine in the engine's simulator: dropouts are
announced in the availability phase, the effective W_t is rebuilt on both ends, and the realised
schedule is read back **from the nodes' ledgers** — the accountant never sees the simulator's
random draws.  The stopping round is the reference code's ground-truth rule
(first t with ``(1/n)‖x^t − x̄_noisy‖² < 3 (x̄_noisy − x̄)²``), applied post hoc to the recorded
states (stopping does not change earlier rounds); runs are T_max rounds long.

Reported privacy loss = ``(1/n) Σ_v ε_{0→v}``:
* ``paper``: [M] Theorem 1 with the correct indexing (t = 0..T−1, ``W_{0:0} = I``), the term v = 0
  included, unclipped — the quantity of Table 3 (a labelled reproduction, not a guarantee);
* ``certified``: the exact Rényi divergence of each observer's whole view of the run (observer knows
  its own noise; v = 0 counts 0), on the same recorded schedule.

Deviations from the reference: q = 0.9 is left out (the issue asks for 10–50 %; at 0.9 the runs need
~750 rounds each); noisy inputs are not clipped to [0, 1] (clipping is post-processing and changes
only the error curves).  Runs per level: ``RUNS`` = 8 (the paper says 10; its ``fig6.py`` lists 8 prefixes).
"""

from __future__ import annotations

import json
import pathlib
import time

import numpy as np

from hushnet.families.gossip.build import build_gossip_machines, run_gossip
from hushnet.families.gossip.realised import (
    averaging_sensitivities,
    averaging_thm1,
    schedule_from_ledgers,
)
from hushnet.tasks import SumTask

N = 1000
P_EDGE = 0.002
LEVELS = {0.0: 25, 0.1: 30, 0.5: 90}  # dropout -> T_max (spec re-simulation maxima: 20, 22, 73)
RUNS = 8
PAPER_TABLE3 = {
    0.0: (1.7e-2, 0.6e-2),
    0.1: (1.8e-2, 0.6e-2),
    0.5: (1.5e-2, 0.7e-2),
    0.9: (1.4e-2, 0.6e-2),
}
SPEC_RESIM = {
    0.0: (2.2e-2, 0.8e-2, 11),
    0.1: (2.0e-2, 0.8e-2, 13),
    0.5: (1.8e-2, 0.8e-2, 36),
    0.9: (1.6e-2, 0.7e-2, 753),
}


def one_run(q: float, t_max: int, seed: int) -> dict:
    rng = np.random.default_rng(10_000 + seed)
    x = rng.random(N)
    tasks = [SumTask(np.array([x[i]]), lo=0.0, hi=1.0) for i in range(N)]
    params = dict(
        rounds=t_max,
        sigma=1.0,
        graph="er-per-round",
        q=P_EDGE,
        graph_seed=seed,
        dropout=q,
        record_states=True,
    )
    ms = build_gossip_machines("muffliato", tasks, run_seed=seed, params=params)
    res = run_gossip(ms)
    assert res.status == "finished", res.status
    states = np.zeros((t_max + 1, N))
    for m in res.sim.metrics:
        if m.name == "state":
            states[m.step, m.node] = m.value[0]
    assert all(
        sum(e.kind == "value" for e in res.sim.ledgers[v]) == 1 for v in range(N)
    )  # noise once
    sched = schedule_from_ledgers(res.sim.ledgers, N, t_max)
    xbar_noisy = states[1].mean()  # mean preserved exactly by every W_t
    precision = (xbar_noisy - x.mean()) ** 2
    err = ((states[1:] - xbar_noisy) ** 2).mean(axis=1)  # error after t = 1..t_max rounds
    hit = np.flatnonzero(err < 3 * precision)
    t_stop = int(hit[0]) + 1 if hit.size else t_max
    rounds = list(range(t_stop))
    F = averaging_thm1(sched, rounds=rounds, keep_diagonal=True)
    S = averaging_sensitivities(sched, rounds=rounds, source=0)
    return {
        "seed": seed,
        "dropout": q,
        "t_stop": t_stop,
        "converged": bool(hit.size),
        "paper_mean_loss_from_0": float(F[0].mean()),
        "certified_mean_loss_from_0": float(S[0].mean()),
        "certified_max_loss_from_0": float(S[0].max()),
        "available_fraction": float(sched.up[:t_stop].mean()),
        "error_over_precision": (err[: t_stop + 5] / precision).tolist(),
        "faults": len(res.sim.faults),
        "wall_seconds": res.sim.wall_seconds,
    }


def main(out_dir: pathlib.Path) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    runs = {q: [one_run(q, tm, s) for s in range(RUNS)] for q, tm in LEVELS.items()}
    table = {}
    for q, rs in runs.items():
        pp = np.array([r["paper_mean_loss_from_0"] for r in rs])
        cc = np.array([r["certified_mean_loss_from_0"] for r in rs])
        ts = np.array([r["t_stop"] for r in rs])
        table[str(q)] = {
            "paper_mean": float(pp.mean()),
            "paper_std": float(pp.std()),
            "certified_mean": float(cc.mean()),
            "certified_std": float(cc.std()),
            "steps_mean": float(ts.mean()),
            "steps_min": int(ts.min()),
            "steps_max": int(ts.max()),
            "converged_runs": int(sum(r["converged"] for r in rs)),
            "runs": len(rs),
            "faults": int(sum(r["faults"] for r in rs)),
            "paper_table3": PAPER_TABLE3[q],
            "spec_resimulation": SPEC_RESIM[q],
        }
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    qs = list(LEVELS)
    xs = np.arange(len(qs))
    ax1.errorbar(
        xs - 0.15,
        [PAPER_TABLE3[q][0] for q in qs],
        yerr=[PAPER_TABLE3[q][1] for q in qs],
        fmt="s",
        color="gray",
        capsize=4,
        label="paper Table 3 (published)",
    )
    ax1.errorbar(
        xs,
        [table[str(q)]["paper_mean"] for q in qs],
        yerr=[table[str(q)]["paper_std"] for q in qs],
        fmt="o",
        color="C0",
        capsize=4,
        label="paper bound (Thm 1) on our runs",
    )
    ax1.errorbar(
        xs + 0.15,
        [table[str(q)]["certified_mean"] for q in qs],
        yerr=[table[str(q)]["certified_std"] for q in qs],
        fmt="^",
        color="C3",
        capsize=4,
        label="certified (exact view) on our runs",
    )
    ax1.set_xticks(xs, [f"{int(q * 100)}%" for q in qs])
    ax1.set_xlabel("dropout probability")
    ax1.set_ylabel(
        r"mean privacy loss from node 0, $\frac{1}{n}\sum_v \varepsilon_{0\to v}$ ($\alpha$=2)"
    )
    ax1.set_yscale("log")
    ax1.set_title(f"Table 3: n={N}, G(n,{P_EDGE}) per round, {RUNS} runs/level")
    ax1.legend(fontsize=7)
    for i, q in enumerate(qs):
        curve = runs[q][0]["error_over_precision"]
        ax2.plot(
            np.arange(1, len(curve) + 1), curve, color=f"C{i}", label=f"dropout {int(q * 100)}%"
        )
    ax2.axhline(3.0, color="k", ls="--", lw=0.8, label="stop: error < 3 x precision")
    ax2.set_yscale("log")
    ax2.set_xlabel("gossip rounds")
    ax2.set_ylabel("error / precision (first run)")
    ax2.set_title("Fig. 6 (right): convergence with dropouts")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "muffliato_fig6_table3.png", dpi=110)
    plt.close(fig)
    result = {
        "figure": "Muffliato Fig. 6 / Table 3 (dropout), protocol machines in the simulator",
        "bounds": {
            "paper": "[M] Theorem 1, t = 0..T-1, v = 0 term included, unclipped (not a guarantee)",
            "certified": "exact view divergence on the schedule recorded in the nodes' ledgers",
        },
        "n": N,
        "p_edge": P_EDGE,
        "sigma": 1.0,
        "alpha": 2.0,
        "runs_per_level": RUNS,
        "left_out": "dropout 0.9 (issue asks 10-50 %; ~750 rounds per run)",
        "table": table,
        "runs": {
            str(q): [{k: v for k, v in r.items() if k != "error_over_precision"} for r in rs]
            for q, rs in runs.items()
        },
        "wall_seconds": round(time.time() - t0, 1),
    }
    (out_dir / "muffliato_fig6_table3.json").write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main(pathlib.Path(__file__).resolve().parent / "out")
