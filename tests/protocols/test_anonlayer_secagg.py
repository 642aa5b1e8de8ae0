"""Secure summation: 16 members with 3 dropouts, threshold abort, bad input, and the aggregate view."""

import numpy as np
import pytest

from hushnet.crypto.errors import InconsistentShares
from hushnet.crypto.shamir import PRIME, SHARE_LEN, Share
from hushnet.engine.actions import Fault, Send
from hushnet.engine.events import MessageArrived
from hushnet.families.secagg import wire as sa
from hushnet.families.secagg.machines import build_round, mask_graph
from hushnet.families.secagg.params import SecAggParams
from hushnet.privacy.audit import AuditOptions, audit_muffliato
from hushnet.privacy.graphs import metropolis_hastings, parse_graph
from hushnet.privacy.muffliato import muffliato_observer_losses
from hushnet.sim.simulator import Simulator

M, D = 16, 2000
LAT = 1e-3  # one message = 1 ms of virtual time: the leader's nonce arrives at 1 ms, masked inputs + shares at 2 ms,
# survivor-set confirmation requests at 3 ms, signatures at 4 ms, unmask requests at 5 ms, answers at 6 ms


def _vectors(seed=0):
    rng = np.random.default_rng(seed)
    return {v: rng.normal(scale=10.0, size=D) for v in range(M)}


def _run(params, kill=(), vecs=None, n=M + 1):
    vecs = vecs or _vectors()
    ms, keys = build_round(vecs, params, n, run_seed=2)
    sim = Simulator(ms, latency=LAT)
    for v, at in kill:
        sim.kill(v, at)
    return sim.run(), ms, vecs


def _params(**kw):
    return SecAggParams(**{"members": tuple(range(M)), "leader": M, "threshold": 9, "dim": D, **kw})


@pytest.mark.parametrize(
    "when",
    [(0.0, 0.0, 0.0), (0.0015, 0.0015, 0.0015), (0.0, 0.0, 0.0015)],
    ids=["before-input", "after-input", "mixed"],
)
def test_sixteen_members_three_dropouts_equal_plain_sum(when):
    """Dropouts before their masked input left (their pairwise masks in the survivors' inputs are removed
    with shares of those seeds), after it left (their self-mask seeds are rebuilt from shares), or both
    (member 11 masked with the dropped 3 and 7 and then went silent: its seeds with them are known to no
    one alive and are rebuilt from its own shares): the sum equals the plain sum of the included inputs
    to the documented fixed-point bound n·2^-(f+1)."""
    dead = (3, 7, 11)
    res, ms, vecs = _run(_params(), kill=list(zip(dead, when)))
    assert res.status == "finished" and not res.faults
    info = res.finish.result
    survivors = info["survivors"]
    early = [v for v, at in zip(dead, when) if at == 0.0]
    assert info["dropped"] == early and survivors == sorted(set(range(M)) - set(early))
    plain = sum(vecs[v] for v in survivors)
    err = np.abs(res.model - plain).max()
    assert err <= info["error_bound"] + 1e-12 * np.abs(plain).max()
    assert info["error_bound"] == pytest.approx(len(survivors) * 2.0**-25)
    # one 'aggregate' ledger entry per contributor, written at release
    entries = [e for led in res.ledgers.values() for e in led]
    assert sorted(e.node for e in entries) == survivors
    assert {e.view_model for e in entries} == {"aggregate"}


def test_leader_sees_only_masked_inputs():
    """A masked input alone reveals nothing: it is uniform mod 2^64 and unrelated to the input."""
    res, ms, vecs = _run(_params())
    leader = ms[M]
    y = leader.masked[0]
    enc = ms[0].fp.encode(vecs[0], M)
    assert not np.array_equal(y, enc)
    assert abs(np.corrcoef(y.astype(np.float64), enc.view(np.int64).astype(np.float64))[0, 1]) < 0.1
    assert abs(y.astype(np.float64).mean() / 2.0**63 - 1.0) < 0.05  # uniform words have mean 2^63


@pytest.mark.parametrize(
    "when,phase", [(0.0, "masked inputs arrived"), (0.0025, "confirmed the survivor set")]
)
def test_below_threshold_aborts_cleanly_without_release(when, phase):
    """Three members gone before their masked input left (abort at the inputs) or after it, before
    unmasking (too few confirmations of the survivor set): no sum, no release."""
    res, ms, _ = _run(_params(threshold=14), kill=[(v, when) for v in (1, 2, 3)])
    assert res.status == "finished"
    assert res.finish.model is None and res.finish.result["status"] == "aborted"
    assert phase in res.finish.result["reason"]
    assert not any(res.ledgers.values())  # the ledger records no release
    # a member refuses an unmask request below the threshold even if a leader sends one
    res2, ms2, _ = _run(_params(threshold=14))
    m = ms2[0]
    m.phase, m.signed_U3 = "signed", list(range(10))
    req = bytes([sa.UNMASK_REQ]) + sa.pack_ids(range(10)) + sa.pack_ids(range(10, 16))
    out = m.handle(MessageArrived(M, req))
    assert [a.error.code for a in out if isinstance(a, Fault)] == ["malformed"]


def test_leader_as_member_over_closed_neighbourhood():
    """Gossip use: node 0 aggregates its closed neighbourhood, itself included."""
    g = parse_graph("regular:20:4:1")
    group = tuple(sorted([0] + [int(v) for v in g.neighbors(0)]))
    rng = np.random.default_rng(3)
    vecs = {v: rng.uniform(size=50) for v in group}
    p = SecAggParams(members=group, leader=0, threshold=3, dim=50)
    ms, _ = build_round(vecs, p, 20, run_seed=1)
    res = Simulator(ms).run()
    assert res.finish.node == 0 and res.finish.result["status"] == "released"
    assert np.abs(res.model - sum(vecs.values())).max() <= p.fixed_point.error_bound(len(group))


def test_bad_inputs_rejected_and_counted():
    p = _params()
    ms, keys = build_round(_vectors(), p, M + 1, run_seed=2)
    L = ms[M]
    ann = next(a.payload for a in L.on_start() if isinstance(a, Send))  # the leader's fresh nonce
    assert (
        ann[0] == sa.ANNOUNCE and not ms[4].on_start()
    )  # a member masks only once the nonce is announced
    good = next(
        a.payload for a in ms[4].handle(MessageArrived(M, ann)) if isinstance(a, Send)
    )  # member 4's first message
    assert good[0] == sa.MASKED
    out = L.handle(MessageArrived(99, good))  # from a non-member
    assert [a.error.code for a in out if isinstance(a, Fault)] == ["unexpected-sender"]
    assert [a.error.code for a in L.handle(MessageArrived(4, good[:7]))] == [
        "malformed"
    ]  # truncated header
    wrong = (
        good[:1] + sa.U32.pack(D - 1) + good[5:-8]
    )  # claims one entry less, and is one word short
    assert [a.error.code for a in L.handle(MessageArrived(4, wrong))] == ["wrong-dimension"]
    assert [a.error.code for a in L.handle(MessageArrived(4, good[:-3]))] == ["wrong-dimension"]
    off = sa.U32.unpack_from(good, 5)[0]
    tampered = bytearray(good)
    assert good[off - 1] == 0  # (16 members, complete graph: the header needs padding to 8 bytes)
    tampered[off - 1] ^= 1  # the header padding altered
    assert [a.error.code for a in L.handle(MessageArrived(4, bytes(tampered)))] == ["malformed"]
    assert not L.handle(MessageArrived(4, good))
    assert [a.error.code for a in L.handle(MessageArrived(4, good))] == ["replay"]  # twice
    # a member only listens to its leader
    req = bytes([sa.UNMASK_REQ]) + sa.pack_ids(range(M)) + sa.pack_ids([]) + sa.U16.pack(0)
    assert [a.error.code for a in ms[2].handle(MessageArrived(5, req))] == ["unexpected-sender"]


@pytest.mark.parametrize("which", ["self-mask seed", "pairwise seed"])
def test_inconsistent_shares_detected_and_round_still_exact(monkeypatch, which):
    """A member that reveals a wrong share — of a survivor's self-mask seed, or of a survivor's pairwise
    seed with a dropped member — is identified (counted Fault) and the sum stays exact, because the
    remaining shares open the committed secrets."""
    p = _params()
    ms, _ = build_round(_vectors(), p, M + 1, run_seed=2)
    cheater = ms[5]
    orig = cheater._send

    def lying_send(dst, data):
        if data[0] == sa.UNMASK:
            b = bytearray(data)
            # the first revealed share (kind, count, owner, which) is of a self-mask seed; the last one,
            # with member 3 dropped, of a pairwise seed (owner, which, peer, share)
            off = 3 + 4 + 1 if which == "self-mask seed" else len(b) - SHARE_LEN
            y = int.from_bytes(b[off + 4 : off + SHARE_LEN], "big")
            b[off + 4 : off + SHARE_LEN] = ((y + 12345) % PRIME).to_bytes(SHARE_LEN - 4, "big")
            data = bytes(b)
        return orig(dst, data)

    monkeypatch.setattr(cheater, "_send", lying_send)
    sim = Simulator(ms, latency=LAT)
    sim.kill(
        3, 0.0
    )  # member 3's input never leaves: the survivors reveal shares of their seeds with it
    res = sim.run()
    assert res.finish.result["status"] == "released" and res.finish.result["dropped"] == [3]
    assert res.finish.result["offenders"] == [5]
    assert [f.error.code for f in res.faults] == ["inconsistent-shares"]
    assert which in res.faults[0].error.args[0]
    vecs = _vectors()
    plain = sum(vecs[v] for v in range(M) if v != 3)
    assert np.abs(res.model - plain).max() <= res.finish.result["error_bound"] + 1e-9


def test_aggregate_view_leaks_less_than_neighbourhood_view():
    """What secure summation buys the accountant: with the aggregate view (S = e_i^T) the privacy
    core's certified loss and the empirical audit are both below the neighbourhood view's."""
    W = metropolis_hastings(parse_graph("ring:8"))
    cert_nb = muffliato_observer_losses(W, 0, 3, 2.0, 1.0, view="neighbourhood")
    cert_ag = muffliato_observer_losses(W, 0, 3, 2.0, 1.0, view="aggregate")
    assert np.all(cert_ag <= cert_nb + 1e-12) and cert_ag[1] < cert_nb[1]
    opts = AuditOptions(n_train=1000, n_test=4000, seed=0)
    nb = audit_muffliato(
        W, source=1, observer=0, T=3, sigma=1.0, options=opts, view="neighbourhood"
    )
    ag = audit_muffliato(W, source=1, observer=0, T=3, sigma=1.0, options=opts, view="aggregate")
    assert ag["certified_epsilon"] < nb["certified_epsilon"]
    assert ag["empirical_epsilon"] < nb["empirical_epsilon"]
    assert (
        ag["empirical_epsilon"] <= ag["certified_epsilon"]
        and nb["empirical_epsilon"] <= nb["certified_epsilon"]
    )


def _connected(adj: dict[int, frozenset[int]], keep: set[int]) -> bool:
    start = next(iter(keep))
    seen, todo = {start}, [start]
    while todo:
        for w in adj[todo.pop()] & keep:
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen == keep


@pytest.mark.parametrize("m,k", [(7, 3), (8, 3), (9, 4), (10, 5), (10, 6)])
def test_mask_graph_is_k_regular_and_k_connected(m, k):
    """The sparse masking graph's privacy claim rests on its connectivity: removing any k−1 members
    (dropped or colluding) leaves the rest connected, so the leader sees only their total."""
    from itertools import combinations

    ids = [3 * i + 1 for i in range(m)]  # arbitrary ids: positions follow the sorted order
    adj = mask_graph(ids, k)
    assert all(
        u not in adj[u] and all(u in adj[v] for v in adj[u]) for u in ids
    )  # simple, undirected
    assert (
        sorted(len(a) for a in adj.values())[0] == k and max(len(a) for a in adj.values()) <= k + 1
    )
    for cut in combinations(ids, k - 1):
        assert _connected(adj, set(ids) - set(cut)), cut
    assert any(
        not _connected(adj, set(ids) - set(cut)) for cut in combinations(ids, k)
    )  # k is tight
    assert mask_graph(ids, None) == mask_graph(ids, m - 1) == {u: frozenset(ids) - {u} for u in ids}


def test_mask_degree_must_survive_the_dropouts_the_threshold_allows():
    with pytest.raises(ValueError, match="n − t \\+ 1"):
        _params(threshold=9, mask_degree=7)  # 16 − 9 + 1 = 8
    assert _params(threshold=9, mask_degree=8).collusion_tolerance() == 0
    assert _params(threshold=9, mask_degree=10).collusion_tolerance() == 2
    assert _params(threshold=9).collusion_tolerance() == 8  # complete graph: Shamir's t − 1


def test_sparse_uint32_round_three_dropouts_exact():
    """Harary masking graph of degree 8 (8 keystreams per member instead of 15) and 32-bit words
    (f = 16): three members drop before their input leaves; the sum of the 13 survivors is exact to the
    32-bit bound, masked inputs travel as uint32 and look uniform mod 2^32."""
    p = _params(threshold=9, mask_degree=8, bits=32, frac_bits=16)
    res, ms, vecs = _run(p, kill=[(v, 0.0) for v in (3, 7, 11)])
    info = res.finish.result
    assert info["status"] == "released" and info["dropped"] == [3, 7, 11] and not res.faults
    plain = sum(vecs[v] for v in info["survivors"])
    assert info["error_bound"] == pytest.approx(13 * 2.0**-17)
    assert np.abs(res.model - plain).max() <= info["error_bound"] + 1e-9 * np.abs(plain).max()
    y = ms[M].masked[0]
    assert y.dtype == np.dtype("<u4") and abs(y.astype(np.float64).mean() / 2.0**31 - 1.0) < 0.05
    # the masks of a member cancel only with its 8 graph neighbours: dropping them from the leader's
    # recovery would leave the sum wrong, so exactness above checks the leader used the same graph
    assert all(len(a) == 8 for a in mask_graph(range(M), 8).values())


def _sum_spec(pp: dict, sigma: float = 1.0):
    """A ``secagg-sum`` spec over complete:16 with these protocol parameters."""
    from hushnet.runs.spec import Budget, RunSpec

    return RunSpec(
        protocol="secagg-sum",
        task="sum",
        graph="complete:16",
        steps=1,
        seed=1,
        budget=Budget(10.0, 1e-5),
        sigma=sigma,
        protocol_params=pp,
    )


@pytest.mark.parametrize(
    "pp,why",
    [
        ({"threshold": 10, "mask_degree": 6}, "n − t + 1 = 7"),
        ({"bits": 32, "frac_bits": 31}, "frac_bits"),
        ({"threshold": 1}, "threshold"),
    ],
)
def test_run_with_bad_secagg_parameters_is_refused_with_the_reason(pp, why):
    from hushnet.families.secagg.accounting import project_secagg

    spec = _sum_spec(pp)
    d = project_secagg(spec, 0)
    assert not d.accept and "secure-summation parameters" in d.reason and why in d.reason
    ok = _sum_spec({"threshold": 10, "mask_degree": 8, "bits": 32, "frac_bits": 16})
    assert project_secagg(ok, 0).accept


def test_static_share_boxes_bind_sender_recipient_and_round():
    """Share envelopes travel under the static-static key of (dealer, holder) and the round's context:
    the holder opens its own; an envelope of another dealer relabelled, one forged by the leader (who
    knows every public key but neither private key), one of another round, the reverse direction, or
    a flipped bit all fail with IntegrityError; two boxes of the same content differ (random nonce)."""
    from hushnet.crypto.errors import IntegrityError
    from hushnet.crypto.sealed import STATIC_OVERHEAD, open_static, seal_static

    ms, keys = build_round(_vectors(), _params(), M + 1, run_seed=2)
    info = ms[2].context + b"|shares"
    nb = sorted(ms[0].graph[0])
    plain = (
        sa.U32.pack(0)
        + sa.U32.pack(2)
        + sa.U32.pack(3)
        + (1).to_bytes(SHARE_LEN - 4, "big")
        + sa.U16.pack(len(nb))
        + b"".join(
            sa.U32.pack(v) + sa.U32.pack(3) + (v + 1).to_bytes(SHARE_LEN - 4, "big") for v in nb
        )
    )
    box = seal_static(keys[0], keys[2].public, plain, info)
    assert len(box) == len(plain) + STATIC_OVERHEAD and box != seal_static(
        keys[0], keys[2].public, plain, info
    )
    b, seeds = ms[2]._open_shares(0, box)
    assert Share.decode(b) == Share(3, 1) and {v: Share.decode(s) for v, s in seeds.items()} == {
        v: Share(3, v + 1) for v in nb
    }
    other_point = plain.replace(sa.U32.pack(2) + sa.U32.pack(3), sa.U32.pack(2) + sa.U32.pack(4), 1)
    with pytest.raises(InconsistentShares):  # a share dealt at another holder's point
        ms[2]._open_shares(0, seal_static(keys[0], keys[2].public, other_point, info))
    bad = [
        seal_static(
            keys[1], keys[2].public, plain, info
        ),  # dealer 1's box passed off as dealer 0's
        seal_static(keys[M], keys[2].public, plain, info),  # forged by the leader
        seal_static(keys[0], keys[2].public, plain, info + b"x"),  # another round
        box[:-1] + bytes([box[-1] ^ 1]),
    ]
    for ct in bad:
        with pytest.raises(IntegrityError):
            ms[2]._open_shares(0, ct)
    with pytest.raises(IntegrityError):  # the reverse direction has its own key
        open_static(keys[0], keys[2].public, box, info)
    with pytest.raises(IntegrityError):
        open_static(keys[2], keys[0].public, box[: STATIC_OVERHEAD - 1], info)


def test_seal_many_boxes_open_only_for_their_recipient():
    """seal_many (kept for sealers with many recipients) seals with one ephemeral key: each box opens with the
    ordinary open_sealed for its recipient only, and a repeated recipient (nonce reuse) is refused."""
    from hushnet.crypto.errors import IntegrityError
    from hushnet.crypto.keys import KeyPair
    from hushnet.crypto.sealed import open_sealed, seal_many

    keys = [KeyPair.generate() for _ in range(4)]
    boxes = seal_many([k.public for k in keys], [bytes([i]) * 40 for i in range(4)], b"ctx")
    assert len({b[:32] for b in boxes}) == 1 and len({b[32:] for b in boxes}) == 4
    for i, k in enumerate(keys):
        assert open_sealed(k, boxes[i], b"ctx") == bytes([i]) * 40
        with pytest.raises(IntegrityError):
            open_sealed(k, boxes[(i + 1) % 4], b"ctx")
        with pytest.raises(IntegrityError):
            open_sealed(k, boxes[i], b"other")
    with pytest.raises(ValueError, match="distinct"):
        seal_many([keys[0].public, keys[0].public], [b"a", b"b"])


def test_a_member_with_out_of_range_data_is_clipped_not_dropped():
    """A member whose data exceeds the fixed-point range of the sum still takes part, with its data
    clipped into the range (a public 1-Lipschitz map, inside the charged Δ): refusing it made it drop out
    *because of its data*, and the dropout set reaches the leader and every survivor (ε = ∞ on the event
    "x above the range", nothing charged)."""
    p = _params(bits=32, frac_bits=16)
    lim = p.fixed_point.max_abs(M)
    vecs = _vectors()
    vecs = {v: np.clip(x, -lim / 2, lim / 2) for v, x in vecs.items()}
    vecs[5] = vecs[5].copy()
    vecs[5][:3] = [4 * lim, -4 * lim, 1e12]
    res, ms, _ = _run(p, vecs=vecs)
    assert res.status == "finished" and not res.faults
    info = res.finish.result
    assert info["dropped"] == [] and info["survivors"] == list(range(M))
    plain = sum(np.clip(vecs[v], -lim, lim) for v in range(M))
    assert np.abs(res.model - plain).max() <= info["error_bound"] + 1e-9 * np.abs(plain).max()
    assert sorted(e.node for led in res.ledgers.values() for e in led) == list(range(M))


def test_secagg_sum_refuses_a_task_whose_range_does_not_fit_the_fixed_point():
    """The node's own task declares values in [lo, hi]: a range beyond what a sum of the members' words
    can hold is refused when the node builds its member (one clear reason), not clipped silently."""
    from hushnet.families.secagg.accounting import check_task_range
    from hushnet.tasks.values import SumTask

    spec = _sum_spec({"threshold": 12, "bits": 32, "frac_bits": 24, "collusion": 1}, sigma=2.0)
    fits = SumTask(np.zeros(3), lo=-4.0, hi=4.0)
    check_task_range(spec, fits, 16)  # max_abs(16) = 8 at 32 bits with 24 fraction bits
    with pytest.raises(ValueError, match=r"exceed the fixed-point range ±8 of a sum of 16 members"):
        check_task_range(spec, SumTask(np.zeros(3), lo=0.0, hi=10.0), 16)
