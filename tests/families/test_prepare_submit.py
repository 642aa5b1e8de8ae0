"""What the operator fixes in a spec before signing it (``Family.prepare_submit``).

An onion run on a network that rotates onion keys gets one key epoch for every node: without it, each
node would take the epoch current at its own acceptance, and acceptances straddling a boundary would
build layers under two epochs that travel in the clear (docs/anonymity.md, "One epoch per run").
"""

from __future__ import annotations

import time
from dataclasses import replace
from types import SimpleNamespace

from hushnet.families import family_of
from hushnet.runs.spec import Budget, RunSpec


def _spec(protocol: str, **pp) -> RunSpec:
    return RunSpec(
        protocol=protocol,
        task="logreg",
        graph="regular:10:4:1",
        steps=12,
        seed=1,
        budget=Budget(1e6, 1e-5),
        sigma=2.0,
        step_size=0.05,
        cap=10,
        view_model="anonymous" if protocol == "rw-dpsgd-onion" else "sender-known",
        protocol_params=pp,
    ).with_run_id()


def test_onion_run_gets_the_current_epoch_of_a_rotating_network() -> None:
    spec = _spec("rw-dpsgd-onion", hops=2)
    before = int(time.time() // 60.0)
    out = family_of(spec.protocol).prepare_submit(spec, SimpleNamespace(onion_epoch_seconds=60.0))
    after = int(time.time() // 60.0)
    assert before <= out.protocol_params["epoch"] <= after
    assert out.protocol_params["hops"] == 2
    # the id is the hash of what is signed (nodes check it): a new parameter, a new id
    assert out.run_id == replace(out, run_id="").with_run_id().run_id != spec.run_id
    assert "epoch" not in spec.protocol_params  # the caller's spec is not changed


def test_nothing_is_filled_without_rotation_or_when_given_or_for_other_protocols() -> None:
    onion = _spec("rw-dpsgd-onion", hops=2)
    fam = family_of(onion.protocol)
    assert fam.prepare_submit(onion, SimpleNamespace(onion_epoch_seconds=0.0)) is onion
    given = _spec("rw-dpsgd-onion", hops=2, epoch=7)
    assert fam.prepare_submit(given, SimpleNamespace(onion_epoch_seconds=60.0)) is given
    walk = _spec("rw-dpsgd")
    assert (
        family_of(walk.protocol).prepare_submit(walk, SimpleNamespace(onion_epoch_seconds=60.0))
        is walk
    )
