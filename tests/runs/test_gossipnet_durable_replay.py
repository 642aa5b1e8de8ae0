"""The durable schedule store and the safe completion of a crashed node's rounds (no network: fast).

* the store keeps records across a reopen (what a restarted process sees), refuses a second record of
  a round, and gives back the registered spec;
* completion is conservative: on a simulated run, cut one node's records at round c (a crash after it
  sent its round-c value, before the record) — whatever it really sent in round c, the certified loss
  of every source toward every observer on the completed schedule is at least the loss on the truth;
* a record set with a gap is refused (not a crash prefix).
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
from helpers.gossipnet import sim_records, simulate, spec  # noqa: E402

from hushnet.families.gossip.accounting import realised_schedule, settled_schedule  # noqa: E402
from hushnet.families.gossip.realised import averaging_sensitivities  # noqa: E402
from hushnet.families.gossip.schedule import round_plan  # noqa: E402
from hushnet.families.gossip.store import ScheduleStore  # noqa: E402
from hushnet.protocols.registry import transition_matrix  # noqa: E402

GRAPH = "grid:3x4"
N = 12


def test_store_survives_reopen_and_refuses_duplicates(tmp_path: pathlib.Path) -> None:
    sp = spec("muffliato", GRAPH, 4, 5, timeout=1.0)
    path = tmp_path / "store.sqlite"
    st = ScheduleStore(path)
    st.open_run(sp, 3, [f"n{i}" for i in range(N)])
    rec = {
        "round": 0,
        "up": True,
        "self": 0.5,
        "row": {"2": 0.25, "4": 0.25},
        "sent_value": [2, 4],
        "missing": [],
        "step": 0,
    }
    st.append(sp.run_id, rec)
    with pytest.raises(ValueError, match="already recorded"):
        st.append(sp.run_id, {**rec, "self": 0.4})
    st.close()
    again = ScheduleStore(path)  # a restarted process
    assert again.records(sp.run_id) == [rec]
    got = again.run(sp.run_id)
    assert got is not None and got[0] == sp and got[1] == 3 and got[2][3] == "n3"
    assert again.run("run-unknown") is None and again.records("run-unknown") == []
    again.close()


def _sens(sp, W, sched) -> np.ndarray:
    phases, gammas = round_plan(sp, W)
    return sum(averaging_sensitivities(sched, g, rounds=ph) for ph, g in zip(phases, gammas))


@pytest.mark.parametrize("cut", [0, 1])
def test_completion_never_undercounts(cut: int) -> None:
    rng = np.random.default_rng(1)
    values = [rng.random(2) for _ in range(N)]
    rounds = (
        cut + 1
    )  # the crash round is the last: later mixing would reveal the value anyway (saturation)
    sp = spec("muffliato", GRAPH, rounds, 9, timeout=5.0)
    res, ms = simulate(sp, values)
    assert res.status == "finished"
    W = transition_matrix(sp.graph, sp.weights)
    full = sim_records(ms)
    crashed = next(
        v for v in range(5, N) if full[v][cut]["sent_value"]
    )  # it was up and sent in round `cut`
    # one receiver got the crash round's value too late to use it (it is still in its view: sender-side)
    late = full[crashed][cut]["sent_value"][0]
    rec = dict(full[late][cut])
    row = dict(rec["row"])
    rec["self"] += row.pop(str(crashed), 0.0)
    rec["row"] = row
    full[late] = [rec if r["round"] == cut else r for r in full[late]]
    # the truth: the crashed node sent its round-`cut` value to the neighbours it really sent to, then died
    # (its own row of that round reaches nobody: it never sends again)
    prefix = {**full, crashed: full[crashed][:cut]}
    truth = realised_schedule(prefix, N, rounds)
    truth.sent[cut].extend((crashed, j) for j in full[crashed][cut]["sent_value"])
    completed, info = settled_schedule(sp, prefix, N, W)
    assert info == {crashed: cut}
    bare = realised_schedule(prefix, N, rounds)
    S_true, S_comp, S_bare = _sens(sp, W, truth), _sens(sp, W, completed), _sens(sp, W, bare)
    assert np.all(S_comp >= S_true - 1e-9), np.max(S_true - S_comp)
    assert np.all(S_comp >= S_bare - 1e-9)
    if (
        cut == 0
    ):  # without the completion the replay would miss the noisy input the late receiver saw
        assert S_true[crashed, late] > S_bare[crashed, late] + 1e-6, (
            S_true[crashed, late],
            S_bare[crashed, late],
        )


def test_gap_in_records_is_refused() -> None:
    rng = np.random.default_rng(2)
    values = [rng.random(2) for _ in range(N)]
    sp = spec("muffliato", GRAPH, 5, 10, timeout=5.0)
    _res, ms = simulate(sp, values)
    full = sim_records(ms)
    holed = {**full, 4: [r for r in full[4] if r["round"] != 2]}
    with pytest.raises(ValueError, match="skip round 2"):
        settled_schedule(sp, holed, N, transition_matrix(sp.graph, sp.weights))


def test_store_commits_like_the_nodes_other_stores(tmp_path: pathlib.Path, monkeypatch) -> None:
    """WAL + ``synchronous=NORMAL`` (a committed record survives a process crash) unless
    ``HUSHNET_RUNS_SYNC=full`` asks for an fsync per record, as the run store does; it was FULL alone
    of the node's stores, and at n = 1024 each round's 1 024 fsyncs held the hosts' event loops."""
    monkeypatch.delenv("HUSHNET_RUNS_SYNC", raising=False)
    st = ScheduleStore(tmp_path / "a.sqlite")
    assert st._db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    assert st._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    st.close()
    monkeypatch.setenv("HUSHNET_RUNS_SYNC", "full")
    st = ScheduleStore(tmp_path / "b.sqlite")
    assert st._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    st.close()
    monkeypatch.setenv("HUSHNET_RUNS_SYNC", "sometimes")
    with pytest.raises(ValueError, match="HUSHNET_RUNS_SYNC must be 'full' or 'normal'"):
        ScheduleStore(tmp_path / "c.sqlite")
