"""[Source anonymity] Destination-side entropy on a small *real* network vs the simulator and the accountant.

The paper's Figs. 1–2 setting (random 3-regular graph, N = 300, κ = 634, δ = 5) is reproduced on the
simulator by ``anon_protocol_entropy`` (the protocol machines) and ``anon_fig1``/``anon_fig2`` (the privacy
core).  This figure adds the network: ``N`` real nodes (:mod:`hushnet.runs.local_net`: one bootstrap, every
node its own 127.0.0.x address, mutual TLS, own long-term X25519 key and ledger) on a random 3-regular
graph run ``anon-walk-sgd`` (Mode A: the sealed token walks until its destination opens it) through the
real operator client.  Each completed model update is one (source, destination, hop count T) sample; the
samples come from the nodes' run records (``anon-hop``/``anon-open`` metrics of every node's event
stream, merged by :func:`hushnet.families.anonymity.operator.walk_iterations`) — nothing in the token counts hops.

Compared, on the *same* graph and the same public setup (p* and Ā from the run's own machines):

* (a) the law of T: network samples, the simulator's machines (many updates), and the exact first-passage
  law ``Σ_ij π_i M_ij P(T_FH(i,j) = t)`` of the privacy core (:mod:`hushnet.privacy.anonymity_graph`) — KS tests;
* (b) the destination-side, distance-level entropy of the source with the paper's per-node normalisation
  ``W(ℓ) ∝ P(ℓ, T ≤ κ')/Ā(ℓ)`` (``anon_protocol_entropy``'s metric) as a function of the side information
  κ' (a return-time bound on T): accountant (exact graph), simulator and network (bootstrap 90 % band),
  and the paper's RRG model at this N for context;
* (c) destination distances drawn over the network vs p*.

N = 20 here, not the paper's 300: a 300-node in-process network would need ~580 real hops per update and
several hundred updates (hours on this shared 2-core machine), and the entropy depends on the graph only
through p*, Ā and the first-passage law, which is exactly what is compared.  Anonymity is a diagnostic,
never credited to the DP accountant (docs/design/spec/anonymity.md §6.7).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import tempfile
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from scipy import stats  # noqa: E402

from benchmarks.figures.anon_protocol_entropy import _h_cum  # noqa: E402 - same entropy metric, one definition
from hushnet.families.anonymity.anonymous_walk import AnonWalkParams, build_walk, iterations  # noqa: E402
from hushnet.families.anonymity.operator import walk_iterations  # noqa: E402
from hushnet.privacy.anonymity import RRGModel  # noqa: E402
from hushnet.privacy.anonymity_graph import first_passage_stream, transition_matrix  # noqa: E402
from hushnet.runs import local_net  # noqa: E402
from hushnet.runs.spec import Budget, RunSpec  # noqa: E402
from hushnet.runs.synthetic import planted_logistic_shards
from hushnet.sim.simulator import Simulator  # noqa: E402
from hushnet.tasks.logistic import LogisticRegressionTask  # noqa: E402

NAME = "anon_entropy_network"
N, C, GRAPH_SEED = 20, 3, 3
GRAPH = f"regular:{N}:{C}:{GRAPH_SEED}"  # connected, diameter 5
ELL1, ELL2 = 2, 5
UPDATES_PER_NODE = (
    30  # the run ends when a destination would exceed its cap (a few hundred updates)
)
CELL = 2048
SIM_EVENTS = 400_000
KAPPAS = np.array([3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50, 75, 100, 150])
BASE_IP = 200
T_MAX = 3000  # exact-law horizon: the first-passage tail at N = 20 is far below 1e-12 by then


def run_spec(
    updates_per_node: int,
    *,
    graph: str = GRAPH,
    ell1: int = ELL1,
    ell2: int = ELL2,
    cell: int = CELL,
    seed: int = 4,
) -> RunSpec:
    return RunSpec(
        protocol="anon-walk-sgd",
        task="logreg",
        graph=graph,
        steps=1,
        seed=seed,
        budget=Budget(1e6, 1e-5),
        sigma=2.0,
        step_size=0.05,
        start=0,
        protocol_params={
            "updates_per_node": updates_per_node,
            "ell1": ell1,
            "ell2": ell2,
            "cell_body": cell,
        },
    ).with_run_id()


async def network_walk(
    tmp: pathlib.Path, spec: RunSpec, n: int, *, base_ip: int = BASE_IP, timeout: float = 1800.0
) -> dict:
    """Run ``spec`` on ``n`` real in-process nodes; returns the iterations and the run's public setup."""
    t0 = time.perf_counter()
    async with local_net.network(
        tmp, spec.graph, n, shards=planted_logistic_shards(n), base_ip=base_ip
    ) as net:
        t_up = time.perf_counter() - t0
        run_id = await net.client.start_run(spec)
        drivers = {v: net.driver(v, run_id) for v in range(n)}
        t1 = time.perf_counter()
        await net.wait(
            lambda: any(d is not None and d.state == "finished" for d in drivers.values()),
            timeout,
            every=0.2,
            what="the anonymous walk to end",
        )
        wall = time.perf_counter() - t1
        it = walk_iterations([d.events for d in drivers.values()], spec.start)
        setup = drivers[0].machine.setup
        relayed = sum(d.machine.relayed for d in drivers.values())
        updates = sum(d.machine.updates for d in drivers.values())
    return {
        "it": it,
        "setup": setup,
        "wall_seconds": wall,
        "startup_seconds": t_up,
        "relayed": relayed,
        "updates": updates,
    }


def simulator_walk(setup, events: int = SIM_EVENTS, seed: int = 1) -> dict:
    """The same machines in the simulator, on the network run's own public setup."""
    rng = np.random.default_rng(0)
    tasks = [
        LogisticRegressionTask(
            rng.standard_normal((4, 2)), np.where(rng.random(4) > 0.5, 1.0, -1.0)
        )
        for _ in range(setup.n)
    ]
    params = AnonWalkParams(
        updates_per_node=10**9, step_size=0.05, sigma=1.0, cell_body=256, reliable=False
    )
    ms, _ = build_walk(setup, tasks, params, run_seed=seed, secret_seed=2026)
    res = Simulator(ms, latency=1e-3).run(max_events=events)
    return iterations(res.metrics, start=0)


def ks_discrete(sample: np.ndarray, cdf: np.ndarray) -> tuple[float, float]:
    """KS distance ``max_t |F_n(t) − F(t)|`` over the integers, and its p-value from the continuous
    null law (conservative for a discrete F).  ``scipy.stats.kstest`` would compare F(x) with the
    ECDF just *before* x as well, which counts the atom P(T = x) as a discrepancy — not negligible
    when T is a few tens of hops."""
    t = np.arange(cdf.size)
    ecdf = np.searchsorted(np.sort(sample), t, side="right") / sample.size
    d = float(np.max(np.abs(ecdf - cdf)))
    return d, float(stats.kstwo.sf(d, sample.size))


def exact_law(setup, source_weights: list[np.ndarray]) -> list[dict]:
    """Exact law of (distance ℓ, hop count T) of one update for each source weighting: ``Σ_ij w_i M_ij
    P(T_FH(i,j) = t)`` from the privacy core's destination chain and first-passage recursion.

    ``w = π`` (the chain's stationary law) is the accountant's prediction; ``w`` = the network run's own
    source frequencies conditions on the sources that run happened to visit (given its source, an
    update's destination and walk are independent of the other updates)."""
    M = setup.destination_matrix()
    K = setup.n_distances
    masks = [(setup.dist == setup.ell1 + k) for k in range(K)]
    Ws = [np.asarray(w, dtype=float)[:, None] / np.sum(w) * M for w in source_weights]
    pmf_l = [np.zeros((K, T_MAX + 1)) for _ in Ws]
    for t, F in first_passage_stream(transition_matrix(setup.adjacency), T_MAX):
        for Wt, out in zip(Ws, pmf_l):
            X = Wt * F
            for k, m in enumerate(masks):
                out[k, t] = X[m].sum()
    res = []
    for Wt, pl in zip(Ws, pmf_l):
        pbar = np.array([Wt[m].sum() for m in masks])
        pmf = pl.sum(axis=0)
        res.append(
            {
                "pbar": pbar,
                "pmf": pmf,
                "cdf": np.cumsum(pmf),
                "cdf_l": np.cumsum(pl, axis=1),
                "mass": float(pmf.sum()),
            }
        )
    return res


def entropy_exact(law: dict, A: np.ndarray) -> np.ndarray:
    idx = np.clip(KAPPAS, 0, T_MAX)
    joint = law["cdf_l"][:, idx].T
    return np.concatenate([_h_cum(joint, A), _h_cum(law["pbar"][None, :], A)])


def entropy_curve(
    hops: np.ndarray, dist: np.ndarray, A: np.ndarray, ell1: int, K: int
) -> np.ndarray:
    """Empirical distance-level entropy given T ≤ κ' for every κ' of KAPPAS, then κ' = ∞."""
    k = dist - ell1
    joint = np.array(
        [[np.sum((k == q) & (hops <= kp)) for q in range(K)] for kp in KAPPAS], dtype=float
    )
    tot = np.bincount(k, minlength=K)[None, :].astype(float)
    return np.concatenate([_h_cum(joint, A), _h_cum(tot, A)])


def main(out_dir: pathlib.Path, updates_per_node: int = UPDATES_PER_NODE) -> dict:
    import uvloop

    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    spec = run_spec(updates_per_node)
    with tempfile.TemporaryDirectory(prefix="hushnet-anon-entropy-") as tmp:
        net = uvloop.run(network_walk(pathlib.Path(tmp), spec, N))
    setup = net["setup"]
    it = net["it"]
    hops_n, dist_n = it["hops"], setup.dist[it["source"], it["destination"]]
    n_net = int(hops_n.size)
    sim = simulator_walk(setup)
    hops_s, dist_s = sim["hops"], setup.dist[sim["source"], sim["destination"]]
    pi = setup.source_stationary()
    src_freq = np.bincount(it["source"], minlength=setup.n).astype(float)
    ex, ex_net = exact_law(setup, [pi, src_freq])
    cdf = ex["cdf"]
    ks_net_exact = ks_discrete(hops_n, cdf)
    ks_sim_exact = ks_discrete(hops_s, cdf)
    ks_net_sim = stats.ks_2samp(hops_n, hops_s)  # ties handled (ECDFs at the pooled values)
    tgrid = np.arange(T_MAX + 1)
    mean_exact = float((tgrid * ex["pmf"]).sum() / ex["pmf"].sum())

    K, A = setup.n_distances, setup.A
    idx = np.clip(KAPPAS, 0, T_MAX)
    h_exact = entropy_exact(ex, A)
    h_exact_net = entropy_exact(ex_net, A)
    h_net = entropy_curve(hops_n, dist_n, A, ELL1, K)
    h_sim = entropy_curve(hops_s, dist_s, A, ELL1, K)
    brng = np.random.default_rng(7)
    boots = np.array(
        [
            entropy_curve(hops_n[b], dist_n[b], A, ELL1, K)
            for b in (brng.integers(0, n_net, n_net) for _ in range(400))
        ]
    )
    lo, hi = np.percentile(boots, [5, 95], axis=0)
    try:  # the paper's random-regular-graph model at this N (its Figs. 1-2 use N = 300)
        model = RRGModel(N, C)
        pmf_model = np.array([model.pmf(tgrid, int(l)) for l in range(ELL1, ELL2 + 1)])
        jm = setup.p_star[None, :] * np.cumsum(pmf_model, axis=1)[:, idx].T
        h_model = np.concatenate([_h_cum(jm, A), _h_cum(setup.p_star[None, :], A)])
    except Exception as exc:  # noqa: BLE001 - context curve only; the JSON says why it is missing
        h_model, model_error = None, repr(exc)
    else:
        model_error = None
    inside = (lo - 1e-12 <= h_exact_net) & (h_exact_net <= hi + 1e-12)
    inside_pi = (lo - 1e-12 <= h_exact) & (h_exact <= hi + 1e-12)

    # ---- figure ----------------------------------------------------------------------------------
    fig, ax = plt.subplots(1, 3, figsize=(16, 4.8))
    top = int(np.quantile(hops_s, 0.995)) + 5
    bins = np.arange(0, top + 5, 5)
    ax[0].hist(
        hops_s,
        bins=bins,
        density=True,
        alpha=0.35,
        color="C2",
        label=f"simulator machines ({hops_s.size} updates)",
    )
    ax[0].hist(
        hops_n,
        bins=bins,
        density=True,
        histtype="step",
        lw=2,
        color="C0",
        label=f"real network, {N} nodes ({n_net} updates)",
    )
    binned = np.add.reduceat(ex["pmf"][: bins[-1]], bins[:-1]) / 5.0
    ax[0].step(bins[:-1], binned, where="post", color="C3", label="accountant: exact first passage")
    ax[0].set_xlabel("hops per model update T (hitting time)")
    ax[0].set_ylabel("density")
    ax[0].set_title(
        f"(a) mean T: network {hops_n.mean():.1f}, simulator {hops_s.mean():.1f}, exact {mean_exact:.1f}\n"
        f"KS p: network vs exact {ks_net_exact[1]:.2f}, network vs simulator {ks_net_sim.pvalue:.2f}",
        fontsize=9,
    )
    ax[0].legend(fontsize=8)

    xs = np.concatenate([KAPPAS, [400]]).astype(float)
    ax[1].axhline(math.log(K), color="grey", ls=":", lw=1, label=f"log {K} (max)")
    ax[1].plot(
        xs,
        h_exact,
        "C3-",
        label=r"accountant (exact graph, stationary sources): given $T\leq\kappa'$",
    )
    ax[1].plot(
        xs, h_exact_net, "C1-.", label="accountant, conditioned on the network run's sources"
    )
    if h_model is not None:
        ax[1].plot(xs, h_model, "k--", lw=1, label=f"paper's RRG model at N={N}")
    ax[1].plot(xs, h_sim, "C2s", ms=4, label="simulator machines")
    ax[1].fill_between(xs, lo, hi, color="C0", alpha=0.25, lw=0)
    ax[1].plot(xs, h_net, "C0o", ms=5, label="real network (90% bootstrap)")
    ax[1].set_xscale("log")
    ax[1].set_xlabel(r"side information $\kappa'$ (hops; rightmost point: $\infty$)")
    ax[1].set_ylabel("distance-level entropy of the source (nats)")
    ax[1].set_title(
        f"(b) destination-side entropy, random 3-regular N={N}, ℓ∈[{ELL1},{ELL2}]", fontsize=9
    )
    ax[1].legend(fontsize=7, loc="lower right")
    ax[1].set_ylim(0, math.log(K) * 1.15)

    ells = np.arange(ELL1, ELL2 + 1)
    emp = np.bincount(dist_n - ELL1, minlength=K) / n_net
    expected = (
        ex_net["pbar"] * n_net
    )  # Σ over the run's updates of the per-node renormalised p* of its source
    chi = stats.chisquare(np.bincount(dist_n - ELL1, minlength=K), expected)
    w = 0.27
    ax[2].bar(ells - w, setup.p_star, w, label="p* (privacy core)", color="C1")
    ax[2].bar(
        ells,
        ex_net["pbar"],
        w,
        label="expected given the run's sources\n(p* renormalised over non-empty shells)",
        color="C3",
    )
    ax[2].bar(ells + w, emp, w, label="destinations drawn over the network", color="C0")
    ax[2].set_xlabel("distance ℓ from source to destination")
    ax[2].set_ylabel("probability")
    ax[2].set_title(
        f"(c) destination distances, χ² p (given the run's sources) = {chi.pvalue:.2f}", fontsize=9
    )
    ax[2].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / f"{NAME}.png", dpi=100)
    plt.close(fig)

    labels = [float(k) for k in KAPPAS] + ["inf"]
    out = {
        "setting": {
            "graph": f"{GRAPH} (networkx random_regular_graph)",
            "n": N,
            "ell": [ELL1, ELL2],
            "kappa": setup.kappa,
            "delta": setup.delta,
            "p_star": setup.p_star.tolist(),
            "A": A.tolist(),
            "updates_per_node": updates_per_node,
            "cell_body": CELL,
            "network": "in-process real nodes (hushnet.runs.local_net): bootstrap, mutual TLS on 127.0.0.x, "
            "own X25519 keys; run started by the operator client",
            "paper_setting": "N=300, c=3, κ=634, δ=5: simulator reproduction in anon_protocol_entropy / anon_fig1-2",
        },
        "network": {
            "updates": n_net,
            "relayed_hops": net["relayed"],
            "machine_updates": net["updates"],
            "wall_seconds": round(net["wall_seconds"], 1),
            "startup_seconds": round(net["startup_seconds"], 1),
            "hops_per_second": round(float(hops_n.sum()) / max(net["wall_seconds"], 1e-9), 1),
            "mean_hops": float(hops_n.mean()),
            "sem_hops": float(hops_n.std() / math.sqrt(n_net)),
        },
        "simulator": {
            "updates": int(hops_s.size),
            "mean_hops": float(hops_s.mean()),
            "events": SIM_EVENTS,
        },
        "exact_mean_hops": mean_exact,
        "exact_law_mass_to_t_max": ex["mass"],
        "samples": {
            "source": it["source"].tolist(),
            "destination": it["destination"].tolist(),
            "hops": hops_n.tolist(),
        },
        "ks": {
            "network_vs_exact": {"statistic": ks_net_exact[0], "pvalue": ks_net_exact[1]},
            "simulator_vs_exact": {"statistic": ks_sim_exact[0], "pvalue": ks_sim_exact[1]},
            "network_vs_simulator": {
                "statistic": float(ks_net_sim.statistic),
                "pvalue": float(ks_net_sim.pvalue),
            },
        },
        "destination_distance": {
            "p_star": setup.p_star.tolist(),
            "expected_given_sources": ex_net["pbar"].tolist(),
            "network": emp.tolist(),
            "chi2_pvalue_given_sources": float(chi.pvalue),
            "nodes_with_empty_shells": int(setup.nodes_with_empty_shells),
        },
        "entropy_vs_kappa_prime": {
            "kappa_prime": labels,
            "accountant_exact_graph": {
                "values": h_exact.tolist(),
                "sources": "stationary law π of the destination chain",
            },
            "accountant_given_network_sources": {
                "values": h_exact_net.tolist(),
                "sources": "the network run's own source frequencies",
            },
            "simulator": h_sim.tolist(),
            "network": {
                "values": h_net.tolist(),
                "lo90": lo.tolist(),
                "hi90": hi.tolist(),
                "n_updates_with_T_le_kappa": [int(np.sum(hops_n <= k)) for k in KAPPAS] + [n_net],
            },
            "accountant_given_sources_inside_network_band": inside.tolist(),
            "accountant_stationary_inside_network_band": inside_pi.tolist(),
            "rrg_model": None if h_model is None else h_model.tolist(),
            "rrg_model_error": model_error,
            "metric": "W(ℓ) ∝ P(ℓ, T ≤ κ')/Ā(ℓ), entropy in nats (paper's per-node normalisation)",
        },
        "notes": [
            "diagnostics only: anonymity is never credited as differential privacy (docs/design/spec/anonymity.md §6.7)",
            "network entropies are plug-in estimates from the updates with T ≤ κ' (biased low when few qualify: small κ')",
            "hitting times come from the nodes' own event streams merged by time (exact on one host)",
            "consecutive updates share a source chain, so the network's distance mix follows the sources it visited; the "
            "'given the run's sources' curve and χ² condition on them (given its source, an update is independent of the rest)",
        ],
        "seconds": {"total": round(time.perf_counter() - t0, 1)},
    }
    (out_dir / f"{NAME}.json").write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    upn = int(os.environ.get("HUSHNET_ANON_UPDATES", UPDATES_PER_NODE))
    res = main(pathlib.Path(__file__).resolve().parent / "out", upn)
    print(
        json.dumps(
            {
                k: res[k]
                for k in ("network", "simulator", "exact_mean_hops", "ks", "destination_distance")
            },
            indent=1,
        )
    )
