"""Per-epoch onion keys over real nodes (mutual TLS on 127.0.0.x; issue 11, finding 4).

The bootstrap publishes a short rotation period, every node makes its onion keys in its state
directory and publishes them; an ``rw-dpsgd-onion`` run uses the epoch current at acceptance.  Checked:
packets carry that epoch and open only under the directory's key of it; a layer that a relay really
processed is refused as a replay in its run, refused in another run, still refused by the same node
after a restart (same state directory: same key, replay tag still there), and after rotation plus
grace — the key deleted from disk — refused with the reason that the key is gone.
"""

from __future__ import annotations

import pathlib
import struct
import time

import pytest
import uvloop
from helpers.anonnet import Spy, network

from hushnet.crypto.onion import _derive, peel
from hushnet.engine.errors import ReplayedMessage
from hushnet.net.node import DeliveryError, Node
from hushnet.runs.service import RUN_PROTOCOL, RunService
from hushnet.runs.spec import Budget, RunSpec
from hushnet.runs.synthetic import planted_logistic_shards

GRAPH, N = "regular:10:4:1", 10
PERIOD, GRACE = 15.0, 15.0  # seconds; a run accepted in epoch e can use its key until (e+2)·PERIOD
_CELL_HEAD = 1 + 9  # kind + cell header, then the packet: version(1) ‖ epoch(4) ‖ epk(32) ‖ …


def _spec(seed: int) -> RunSpec:
    return RunSpec(
        protocol="rw-dpsgd-onion",
        task="logreg",
        graph=GRAPH,
        steps=12,
        seed=seed,
        budget=Budget(1e6, 1e-5),
        sigma=2.0,
        step_size=0.05,
        cap=10,
        view_model="anonymous",
        protocol_params={"hops": 2},
    ).with_run_id()


async def _clear_of_epoch_boundary(margin: float = 7.0) -> None:
    """Start a run well inside an epoch, so that runs A and B use the same key epoch (the checks of a
    layer replayed across runs assume it).  Within one run every node uses the epoch the operator fixed
    in the signed spec (``AnonymityFamily.prepare_submit``), whenever the nodes accept."""
    import asyncio

    into = time.time() % PERIOD
    if into > PERIOD - margin:
        await asyncio.sleep(PERIOD - into + 0.5)


def _epoch_of(payload: bytes) -> int:
    return struct.unpack_from(">I", payload, _CELL_HEAD + 1)[0]


@pytest.mark.timeout(240)
def test_onion_epochs_replay_across_runs_restart_and_rotation(tmp_path: pathlib.Path) -> None:
    async def go():
        async with network(
            tmp_path,
            GRAPH,
            N,
            shards=planted_logistic_shards(N, m=12, d=4, seed=0),
            base_ip=70,
            bootstrap_options={"onion_epoch_seconds": PERIOD, "onion_grace_seconds": GRACE},
        ) as net:
            spec = _spec(21)
            await _clear_of_epoch_boundary()
            run_a = await net.client.start_run(spec)
            drivers = {v: net.driver(v, run_a) for v in range(N)}
            await net.wait(
                lambda: any(d.state == "finished" for d in drivers.values()),
                60,
                what="run A to finish",
            )
            ids = drivers[0].ids
            # the run uses the epoch current at acceptance: the directory's per-epoch keys, not x25519_public
            epoch = drivers[0].machine.p.epoch
            # one epoch for the run, fixed by the operator in the signed spec
            assert all(d.spec.protocol_params["epoch"] == epoch for d in drivers.values())
            for nd in net.nodes:
                store = nd.onion_keys
                assert store is not None and store.period == PERIOD
                assert drivers[nd.identity.vertex].machine.keyring is store.keyring
                assert store.pair(epoch).public != nd.identity.x25519_public
                me = nd.members[nd.node_id]
                assert (epoch, store.pair(epoch).public) in [
                    (int(k.epoch), bytes(k.public_key)) for k in me.onion_keys
                ]
            assert int(epoch) in (int(time.time() // PERIOD), int(time.time() // PERIOD) - 1)
            layers = {
                v: [
                    r
                    for r in net.spies[v].seen
                    if r["run_id"] == run_a and r["payload"][:1] == b"O"
                ]
                for v in range(N)
            }
            assert all(_epoch_of(r["payload"]) == epoch for rs in layers.values() for r in rs)
            relays = [
                v
                for v in range(N)
                if layers[v] and drivers[v].state == "running" and drivers[v].machine.relayed
            ]
            assert len(relays) >= 2, relays
            r1, r2 = relays[:2]
            rec1, rec2 = layers[r1][0], layers[r2][0]

            # 1. replay in run A: refused as a replay
            prev = net.by_id[rec1["sender"]]
            f0 = len(drivers[r1].faults)
            with pytest.raises(DeliveryError) as e1:
                await prev.send(
                    ids[r1], rec1["payload"], protocol=RUN_PROTOCOL, run_id=run_a, timeout=10
                )
            assert "replay" in e1.value.details.lower() or "duplicate" in e1.value.details.lower()
            assert [f["code"] for f in drivers[r1].faults[f0:]] == ["replay"]

            # 2. the same layer in run B (same node, same key epoch): refused (bound to run A)
            await _clear_of_epoch_boundary()
            run_b = await net.client.start_run(_spec(22))
            drv_b = net.driver(r1, run_b)
            await net.wait(
                lambda: drv_b.state in ("running", "finished"), 30, what="run B at the relay"
            )
            f0 = len(drv_b.faults)
            with pytest.raises(DeliveryError):
                await prev.send(
                    ids[r1], rec1["payload"], protocol=RUN_PROTOCOL, run_id=run_b, timeout=10
                )
            assert [f["code"] for f in drv_b.faults[f0:]] == ["integrity"]
            assert (
                drv_b.machine.keyring is drivers[r1].machine.keyring
            )  # one keyring and replay cache per node

            # 3. restart r1 (same state directory): same onion key, the layer's replay tag still held
            node1 = net.by_id[ids[r1]]
            pair = node1.onion_keys.pair(epoch)
            raw = rec1["payload"]
            from hushnet.crypto.cells import from_cells

            packet = from_cells(
                raw[1:], drivers[r1].machine.p.cell_body, expected_cells=drivers[r1].machine.p.cells
            )
            epk = packet[5:37]
            tau = _derive(pair.exchange(epk), epk, pair.public).tau
            cfg = node1.config
            net.svc_by_vertex[r1].close()
            await node1.stop(grace=0.2, leave=False)
            again = Node(cfg)
            svc = RunService(again).install()
            Spy(again, svc)
            await again.start()
            try:
                assert (
                    again.onion_keys.pair(epoch).public == pair.public
                )  # loaded from onion-keys/, not regenerated
                assert (
                    again.onion_keys.keyring.replay.seen(epoch, tau) is not None
                )  # persisted in SQLite
                mp = drivers[r1].machine.p
                with pytest.raises(
                    ReplayedMessage
                ):  # the restarted node's real keyring refuses the run-A layer
                    peel(
                        again.onion_keys.keyring,
                        packet,
                        slots=mp.slots,
                        payload_len=mp.payload_len,
                        ad=drivers[r1].machine._ad,
                    )

                # 4. rotation + grace: r2 deletes epoch's key from disk, and a layer of it is refused, saying why
                node2 = net.by_id[ids[r2]]
                keyfile = node2.state_dir / "onion-keys" / f"epoch-{epoch}.key"
                assert keyfile.exists()
                deadline = (epoch + 1) * PERIOD + GRACE
                await net.wait(
                    lambda: epoch not in node2.onion_keys.keys.pairs,
                    deadline - time.time() + 15,
                    every=0.2,
                    what="the old onion key to be deleted",
                )
                assert time.time() >= deadline and not keyfile.exists()
                assert (
                    epoch not in node2.onion_keys.keyring.replay.epochs
                )  # its replay tags pruned with it
                f0 = len(drivers[r2].faults)
                # the layer's sender may be r1 itself: then the node running now sends it (the stopped
                # one closed its links when it stopped)
                sender = again if rec2["sender"] == ids[r1] else net.by_id[rec2["sender"]]
                with pytest.raises(DeliveryError) as e4:
                    await sender.send(
                        ids[r2], rec2["payload"], protocol=RUN_PROTOCOL, run_id=run_a, timeout=10
                    )
                assert "deleted after its grace period" in e4.value.details, e4.value.details
                assert [f["code"] for f in drivers[r2].faults[f0:]] == ["unknown-epoch"]
                # the directory now lists only epochs ≥ current − 1 for every member
                await net.wait(
                    lambda: all(
                        int(k.epoch) >= int(time.time() // PERIOD) - 1
                        for m in node2.directory.members
                        for k in m.onion_keys
                    ),
                    10,
                    what="the directory to drop the old epoch",
                )
            finally:
                svc.close()
                await again.stop(grace=0.2)

    uvloop.run(go())
