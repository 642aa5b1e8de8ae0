"""A packed report is the plain report, bit for bit (issue 12: at n = 2048 a node's report was ~280 KB of
JSON, a quarter of a host's CPU per report; packed, its per-target rows travel as float64 bytes).

A real node's report — a walk on a 64-node hypercube, charged on its own ledger over two runs so the
lifetime totals differ from the run's row — packed, sent as JSON and unpacked equals the plain report
sent as JSON: every key, every float's bits, the infinite and zero values too.  The client's
``report`` asks for the packed form over the network in ``tests/runs/test_runs_operator_batch.py``.
"""

from __future__ import annotations

import json
import math
import pathlib

from hushnet.engine.actions import LedgerEntry
from hushnet.privacy.ledger import Ledger
from hushnet.protocols.registry import transition_matrix
from hushnet.runs.accounting import contribution_cost
from hushnet.runs.driver import RunDriver
from hushnet.runs.report_wire import PACKED, pack_report, unpack_ledger, unpack_report
from hushnet.runs.service import _json, ledger_doc
from hushnet.runs.spec import Budget, RunSpec


def _spec(seed: int) -> RunSpec:
    return RunSpec(
        protocol="rw-dpsgd",
        task="logreg",
        graph="hypercube:6",
        steps=64,
        seed=seed,
        budget=Budget(1e6, 1e-5),
        sigma=1.0,
        clip=1.0,
        step_size=0.1,
        cap=None,
    ).with_run_id()


def _bits(x):
    """A JSON value with every float replaced by its exact bits (so == compares bit for bit)."""
    if isinstance(x, float):
        return ("f", x.hex() if math.isfinite(x) else repr(x))
    if isinstance(x, dict):
        return {k: _bits(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_bits(v) for v in x]
    return x


def test_packed_report_unpacks_to_the_plain_one(tmp_path: pathlib.Path) -> None:
    ids = [f"n{i}" for i in range(64)]
    ledger = Ledger(tmp_path / "ledger.sqlite", node_id="n5")
    try:
        for seed, steps in ((1, 2), (2, 3)):  # two runs: lifetime totals are not the run's row
            spec = _spec(seed)
            W = transition_matrix(spec.graph, spec.weights)
            cost = contribution_cost(spec, 5, ids, W)
            drv = RunDriver(spec, 5, ids, None, None, ledger=ledger, cost=cost, W=W)
            for step in range(steps):
                entry = LedgerEntry(
                    5, step, "gradient", spec.view_model, 2.0, 2.0, spec.sigma,
                    spec.protocol, spec.run_id,
                )  # fmt: skip
                assert drv._charge(entry), drv.reason  # noqa: SLF001 - the node's charge path itself
        doc = drv.report()
        assert len(doc["certified"]) == 63 and doc["paper"] and len(doc["lifetime"]) == 63
        doc["certified"]["n9"] = math.inf  # values JSON spells specially travel exactly too
        doc["certified"]["n10"] = 0.0
        plain = json.loads(_json(doc))
        uniform = json.loads(_json(pack_report(doc)))
        assert uniform["lifetime"]["method"] == {"all": "rdp"}
        assert uniform["paper"]["ids"] is None  # the certified row's targets: not listed twice
        doc["lifetime"]["n11"] = {**doc["lifetime"]["n11"], "method": "gdp"}  # labels that differ
        plain = json.loads(_json(doc))
        wire = _json(pack_report(doc))
        packed = json.loads(wire)
        assert packed[PACKED] and "f64" in packed["certified"] and "epsilon" in packed["lifetime"]
        assert len(wire) < len(_json(doc))
        got = unpack_report(packed)
        assert list(got) == list(plain)
        assert _bits(got) == _bits(plain)
        assert unpack_report(plain) is plain  # an older node's plain answer passes through
    finally:
        ledger.close()


def test_report_written_packed_from_columns_is_the_packed_plain_report(
    tmp_path: pathlib.Path,
) -> None:
    """``report(packed=…)`` (rows packed from the arrays, the lifetime totals as the ledger's columns) is
    the document ``pack_report`` makes of the plain report — version 1, and 2 with the projected row — and the plain report's lifetime totals are
    the old path's (``Ledger.spent`` target by target), bit for bit, as are the ledger command's — with labels that differ: GDP totals
    (entries with μ only) and paper-bound ones beside the run's certified row."""
    import numpy as np

    from hushnet.privacy.ledger import PrivacyEntry

    ids = [f"n{i}" for i in range(64)]
    ledger = Ledger(tmp_path / "ledger.sqlite", node_id="n5")
    try:
        ledger.charge(
            PrivacyEntry.gaussian("g", "muffliato-gd", "local", "certified", {"x7": 0.3, "x8": 0.5})
        )
        ledger.charge(
            PrivacyEntry.from_row(
                "p", "rw-dpsgd", "local", "paper", ["n9", "n10"], np.full((2, 159), 1e-3)
            )
        )
        spec = _spec(3)
        W = transition_matrix(spec.graph, spec.weights)
        row = {t: 0.01 * i for i, t in enumerate(ids) if t != "n5"}
        row["n9"] = math.inf
        cost = contribution_cost(spec, 5, ids, W)
        drv = RunDriver(
            spec, 5, ids, None, None, ledger=ledger, cost=cost, W=W, decision={"row": row}
        )
        for step in range(2):
            entry = LedgerEntry(
                5,
                step,
                "gradient",
                spec.view_model,
                2.0,
                2.0,
                spec.sigma,
                spec.protocol,
                spec.run_id,
            )
            assert drv._charge(entry), drv.reason  # noqa: SLF001 - the node's charge path itself
        plain = drv.report()
        st = ledger._state  # noqa: SLF001 - the old path over the same state
        keys = st.targets()
        old = st.spent_many(keys, np.full(len(keys), spec.budget.delta))
        assert _bits(plain["lifetime"]) == _bits(
            {
                t: {"epsilon": s.epsilon, "bound": s.bound, "method": s.method}
                for t, s in old.items()
            }
        )
        labels = {(v["method"], v["bound"]) for v in plain["lifetime"].values()}
        assert {("gdp", "certified"), ("rdp", "paper"), ("rdp", "certified")} <= labels
        led = ledger_doc(ledger, "n5", None)  # the ledger command's answer: each target at its δ
        old = st.spent_many(keys, np.asarray([st.default_delta(t) for t in keys]))
        assert _bits(led["spent"]) == _bits(
            {
                t: {"epsilon": s.epsilon, "delta": s.delta, "bound": s.bound, "entries": s.entries}
                for t, s in old.items()
            }
        )
        # packed, the ledger answer reads back to the plain one, bit for bit (bound labels that differ)
        wire = _json(ledger_doc(ledger, "n5", None, packed=True))
        assert len(wire) < len(_json(led))
        assert json.loads(wire)["spent"]["bound"] != {"all": "certified"}
        assert _bits(unpack_ledger(json.loads(wire))) == _bits(json.loads(_json(led)))
        assert unpack_ledger(led) is led  # an older node's plain answer passes through
        assert plain["projected"] == row
        for version in (1, 2):
            want = json.loads(_json(pack_report(plain, version)))
            got = json.loads(_json(drv.report(packed=version)))
            assert _bits(got) == _bits(want)
            assert _bits(unpack_report(got)) == _bits(json.loads(_json(plain)))
            # version 2 packs the projected row as well (its targets: the certified row's)
            assert ("f64" in got["projected"]) == (version == 2)
        assert got["projected"]["ids"] is None and got[PACKED] == 2
        # a projected row the driver keeps as the acceptance gave it (not in vertex order): packed too
        shuffled = dict(reversed(list(row.items())))
        other = RunDriver(
            spec, 5, ids, None, None, ledger=ledger, cost=cost, W=W, decision={"row": shuffled}
        )
        got = json.loads(_json(other.report(packed=2)))
        assert "f64" in got["projected"]
        assert _bits(unpack_report(got)) == _bits(json.loads(_json(other.report())))
        # a projected row that is not all floats stays as it is
        odd = {**plain, "projected": {"n1": 1, "n2": 0.5}}
        assert pack_report(odd, 2)["projected"] == {"n1": 1, "n2": 0.5}
    finally:
        ledger.close()


def test_lifetime_totals_after_a_first_run_reuse_its_row_conversion(tmp_path, monkeypatch) -> None:
    """After a node's first run its lifetime totals are the run's row: the report converts those curves
    once (the certified row's conversion is handed to the ledger) and still reports the old path's
    lifetime totals, bit for bit."""
    import numpy as np

    import hushnet.privacy.ledger_math as lm

    ids = [f"n{i}" for i in range(64)]
    ledger = Ledger(tmp_path / "ledger.sqlite", node_id="n5")
    try:
        spec = _spec(4)
        W = transition_matrix(spec.graph, spec.weights)
        cost = contribution_cost(spec, 5, ids, W)
        drv = RunDriver(spec, 5, ids, None, None, ledger=ledger, cost=cost, W=W)
        entry = LedgerEntry(
            5, 0, "gradient", spec.view_model, 2.0, 2.0, spec.sigma, spec.protocol, spec.run_id
        )
        assert drv._charge(entry), drv.reason  # noqa: SLF001 - the node's charge path itself
        st = ledger._state  # noqa: SLF001 - the old path over the same state
        keys = st.targets()
        old = st.spent_many(keys, np.full(len(keys), spec.budget.delta))
        with monkeypatch.context() as mp:  # the ledger converts nothing itself
            mp.setattr(lm.LedgerState, "convert_rows", None)
            plain = drv.report()
            packed = json.loads(_json(drv.report(packed=2)))
        assert _bits(plain["lifetime"]) == _bits(
            {
                t: {"epsilon": s.epsilon, "bound": s.bound, "method": s.method}
                for t, s in old.items()
            }
        )
        assert _bits(unpack_report(packed)) == _bits(json.loads(_json(plain)))
        # the ledger answer packed with uniform columns (one run: every total certified, one entry)
        wire = json.loads(_json(ledger_doc(ledger, "n5", None, packed=True)))
        assert wire["spent"]["bound"] == {"all": "certified"} and wire["spent"]["entries"] == {
            "all": 1
        }
        plain_led = json.loads(_json(ledger_doc(ledger, "n5", None)))
        assert _bits(unpack_ledger(wire)) == _bits(plain_led)
    finally:
        ledger.close()
