"""Source-anonymous destination walk (``anon-walk-sgd``, Egger et al.) over 12 real nodes.

Every sealed token seen by any node's handler is opened by exactly one node's own long-term key —
the destination its source drew (never the source or one of its neighbours) — and relays see only
the same opaque bytes; the hitting times recorded from the nodes' event streams match the walk;
each update is charged once, as attributable (no anonymity credit), on the updater's ledger.
"""

from __future__ import annotations

import pathlib

import pytest
import uvloop
from helpers.anonnet import network

from hushnet.crypto.cells import from_cells
from hushnet.crypto.sealed import try_open_token
from hushnet.families.anonymity.anonymous_walk import sealing_info
from hushnet.families.anonymity.operator import walk_iterations
from hushnet.families.anonymity.wire import HOP_ID, KIND_SEALED
from hushnet.runs.node_keys import node_keypair
from hushnet.runs.spec import Budget, RunSpec
from hushnet.runs.synthetic import planted_logistic_shards

GRAPH, N, CELL = "regular:12:3:1", 12, 4096


@pytest.mark.timeout(150)
def test_sealed_token_walks_to_its_destination_only_it_opens(tmp_path: pathlib.Path) -> None:
    async def go():
        async with network(
            tmp_path, GRAPH, N, shards=planted_logistic_shards(N, m=10, d=4, seed=1), base_ip=90
        ) as net:
            spec = RunSpec(
                protocol="anon-walk-sgd",
                task="logreg",
                graph=GRAPH,
                steps=1,
                seed=4,
                budget=Budget(1e6, 1e-5),
                sigma=2.0,
                step_size=0.05,
                start=0,
                protocol_params={"updates_per_node": 1, "ell1": 2, "ell2": 5, "cell_body": CELL},
            ).with_run_id()
            run_id = await net.client.start_run(spec)
            drivers = {v: net.driver(v, run_id) for v in range(N)}
            await net.wait(
                lambda: any(d.state == "finished" for d in drivers.values()),
                90,
                what="the walk to end",
            )
            keys = {nd.identity.vertex: node_keypair(nd) for nd in net.nodes}
            info = sealing_info(run_id, 0)
            graph = drivers[0].machine.setup
            dist = graph.dist

            # every token any handler saw: opened by exactly one node, the destination its source chose
            tokens: dict[bytes, set[int]] = {}
            for v, spy in net.spies.items():
                for r in spy.seen:
                    if r["run_id"] != run_id or r["payload"][:1] == b"A":
                        continue
                    data = from_cells(r["payload"], CELL)
                    assert data[0] == KIND_SEALED
                    tokens.setdefault(bytes(data[1 + HOP_ID :]), set()).add(v)
            assert tokens
            chosen = {v: list(d.machine.chosen) for v, d in drivers.items()}
            opened_by: list[int] = []
            for tok, seen_at in tokens.items():
                openers = [v for v in range(N) if try_open_token(keys[v], tok, info) is not None]
                assert len(openers) == 1, openers
                opened_by.append(openers[0])
                assert any(openers[0] in c for c in chosen.values())
                assert openers[0] in seen_at  # it walked there

            # hitting times from the event streams: source → destination, hops ≥ graph distance ≥ 2
            it = walk_iterations([d.events for d in drivers.values()], spec.start)
            updates = sum(d.machine.updates for d in drivers.values())
            # each update sealed one fresh token; the run ends when a destination is asked to update
            # beyond its cap, i.e. every token was opened: iterations = tokens = updates
            assert it["source"].size == len(tokens) == updates >= 1
            assert sorted(it["destination"].tolist()) == sorted(opened_by)
            for s, j, h in zip(it["source"], it["destination"], it["hops"]):
                assert j in chosen[int(s)]
                assert dist[s, j] >= 2 and h >= dist[s, j]
            total_hops = sum(d.machine.relayed for d in drivers.values()) + sum(
                d.machine.updates for d in drivers.values()
            )
            assert int(it["hops"].sum()) <= total_hops

            # one attributable charge per update, on the updater's own ledger
            for v, d in drivers.items():
                assert (
                    len(net.svc_by_vertex[v].ledger.entries(run_id))
                    == d.machine.updates
                    == d.contributions
                )
                assert "local-DP" in d.cost.bound_name
                view = d.report()["accounting_view"]
                assert view["mechanism"] == "source-anonymous-walk" and view["dp_credit"] is False
            outcome = await net.client.watch(run_id, progress=False, timeout=30)
            assert outcome.state == "finished"

    uvloop.run(go())
