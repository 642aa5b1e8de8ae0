"""Adversarial review of the secure-sum privacy claims (distributed DP credit, consistency check).

The attack machinery is the equivocating leader of ``test_anonlayer_secagg_malicious`` (real member
machines, real signatures and Shamir shares; the test plays only the leader's lies)."""

from __future__ import annotations

import numpy as np
import pytest
from test_anonlayer_secagg_malicious import DIM, EVERYONE, LEADER, N_MEM, VICTIM, _round

from hushnet.crypto.signing import simulation_signers
from hushnet.engine.actions import Fault, Send
from hushnet.engine.events import MessageArrived, RunStarted
from hushnet.families.secagg import wire as sa
from hushnet.families.secagg.machines import build_round
from hushnet.families.secagg.params import SecAggParams
from hushnet.privacy.secure_sum import SecureSumError, share_std
from hushnet.runs.spec import Budget, RunSpec

SIGMA = 2.0


def _secagg_sum_spec(**pp) -> RunSpec:
    return RunSpec(
        protocol="secagg-sum",
        task="sum",
        graph=f"complete:{N_MEM + 1}",
        steps=1,
        seed=1,
        budget=Budget(10.0, 1e-5),
        sigma=SIGMA,
        protocol_params={"members": list(EVERYONE), "leader": LEADER, **pp},
    ).with_run_id()


def test_secagg_sum_credit_without_the_consistency_check_is_not_granted_against_an_equivocating_leader():
    """HOLE (found in review): ``secagg_sum_calibration`` bounded c by the *honest-but-curious* tolerance
    (t − 1) when ``consistency_check = False``, although secagg.py's threat model lets the leader equivocate
    on the survivor set.  n = 9 members, t = 5, check off: c = 2 was certified (2 < t − 1 = 4), each member
    adding only s = σΔ/√(t − c) = σΔ/√3.  A leader colluding with 2 members tells {victim, 1, 2} + colluders
    "everyone survived" (they reveal the victim's self-mask shares) and {3, 4, 5} + colluders "the victim
    dropped" (they reveal its pairwise-seed shares): every honest member answers once, yet the leader opens
    the victim's noisy input, whose view has multiplier s/Δ = σ/√3 — 3× the certified RDP α/(2σ²).
    Without the check the malicious tolerance is 2t − n − 1 = 0 (``malicious_collusion_tolerance``)."""
    t, c = 5, 2
    s = share_std(SIGMA, 1.0, t, c, dim=DIM, frac_bits=24)
    atk, vecs = _round(t, consistency_check=False, noise_std=s)
    got = atk.attack(A=(1, 2), B=(3, 4, 5), colluders=(7, 8))
    # the attack is real: the victim's noisy input comes out exactly, its noise only the victim's own share s
    assert got is not None and np.abs(got - atk.ms[VICTIM].x).max() < 1e-6
    assert 0.1 * s < np.abs(got - vecs[VICTIM]).max() < 10 * s
    assert atk.L.p.malicious_collusion_tolerance() == 0
    # so the credit must not be certified for this spec
    from hushnet.families.secagg.accounting import project_secagg, secagg_sum_calibration

    spec = _secagg_sum_spec(threshold=t, collusion=c, consistency_check=False)
    with pytest.raises(SecureSumError, match="collusion tolerance"):
        secagg_sum_calibration(spec, 1.0)
    dec = project_secagg(spec, 0)
    assert not dec.accept and "collusion tolerance" in dec.reason


def test_with_the_check_the_same_collusion_gets_no_credit_either_and_a_high_threshold_does():
    """Companion: t = 5 of 9 *with* the check has q = 5, 2q − n − 1 = 0 → c = 2 refused; t = 8 has q = 8,
    tolerance min(7, 6) = 6 → c = 2 certified (and the equivocation attack with 2 colluders fails there)."""
    from hushnet.families.secagg.accounting import secagg_sum_calibration

    with pytest.raises(SecureSumError):
        secagg_sum_calibration(_secagg_sum_spec(threshold=5, collusion=2), 1.0)
    view = secagg_sum_calibration(_secagg_sum_spec(threshold=8, collusion=2), 1.0, DIM)
    assert view.tolerance == 6
    atk, _ = _round(8, noise_std=view.share_std)
    assert atk.attack(A=(1, 2, 3, 4, 5), B=(6,), colluders=(7, 8)) is None


@pytest.mark.parametrize(
    "colluders,opens",
    [((5, 6, 7, 8), False), ((4, 5, 6, 7, 8), True)],
    ids=["at-tolerance-4", "one-above"],
)
def test_malicious_tolerance_is_exact_for_t7_n9(colluders, opens):
    """``malicious_collusion_tolerance`` = 2q − n − 1 = 4 for t = 7 of 9 is exact: 4 colluders (e.g. a
    leader that is a member and signs twice, and 3 more) cannot give two survivor sets a quorum of 7,
    5 can.  secure_sum requires c < tolerance, so c ≤ 3 is certified: one below what the masks need."""
    atk, vecs = _round(7)
    assert atk.L.p.malicious_collusion_tolerance() == 4
    honest = [u for u in EVERYONE if u != VICTIM and u not in colluders]
    need_a = 7 - 1 - len(colluders)  # group A: victim + honest + colluders reach q = 7
    A, B = tuple(honest[: max(need_a, 0)]), tuple(honest[max(need_a, 0) :])
    got = atk.attack(A=A, B=B, colluders=colluders)
    recovered = got is not None and np.abs(got - vecs[VICTIM]).max() < 1e-6
    assert recovered == opens


def _quorum_sigs(ms, U3):
    """Drive a real round to the point where every member of ``U3`` signed it; return (leader, sigs)."""
    L = ms[LEADER]
    for a in [a for a in L.handle(RunStarted()) if isinstance(a, Send)]:
        for b in ms[a.dst].handle(MessageArrived(LEADER, a.payload)):
            if isinstance(b, Send):
                L.handle(MessageArrived(a.dst, b.payload))
    D = sorted(set(EVERYONE) - set(U3))
    sigs = []
    for v in U3:
        out = [
            b
            for b in ms[v].handle(
                MessageArrived(LEADER, bytes([sa.CHECK_REQ]) + sa.pack_ids(U3) + sa.pack_ids(D))
            )
            if isinstance(b, Send)
        ]
        r = sa.Reader(out[0].payload)
        spki = r.take(r.u16())
        sigs.append((v, spki, r.take(r.u16())))
    return L, sigs


def _unmask_req(L, v, U3, sigs):
    D = sorted(set(EVERYONE) - set(U3))
    parts = [sa.U32.pack(u) + sa.U32.pack(len(L.cts[u][v])) + L.cts[u][v] for u in U3 if u != v]
    head = (
        sa.pack_ids(U3)
        + sa.pack_ids(D)
        + sa.U16.pack(len(sigs))
        + b"".join(
            sa.U32.pack(w) + sa.U16.pack(len(k)) + k + sa.U16.pack(len(g)) + g for w, k, g in sigs
        )
    )
    return bytes([sa.UNMASK_REQ]) + head + sa.U16.pack(len(parts)) + b"".join(parts)


def _round_ms(round_id=0, run_id="sim", signers=None):
    rng = np.random.default_rng(3)
    vecs = {v: rng.normal(size=4) for v in range(N_MEM)}
    p = SecAggParams(members=tuple(EVERYONE), leader=LEADER, threshold=5, dim=4, round_id=round_id)
    ms, _ = build_round(vecs, p, N_MEM + 1, run_seed=5, run_id=run_id, signers=signers)
    return ms


@pytest.mark.parametrize("other", ["next-round", "other-run"])
def test_a_quorum_of_signatures_does_not_replay_into_another_round_or_run(other):
    """Signatures over a survivor set are bound to (run, round, leader, nonce): a full, valid quorum
    from round 0 of run "sim" — over the very same U3 — is refused in round 1 or in another run (same keys)."""
    signers = simulation_signers(5, N_MEM + 1)
    U3 = [u for u in EVERYONE if u != VICTIM]
    _, old = _quorum_sigs(_round_ms(0, "sim", signers), U3)
    ms = _round_ms(1, "sim", signers) if other == "next-round" else _round_ms(0, "sim-2", signers)
    L, own = _quorum_sigs(ms, U3)
    honest = ms[1].handle(MessageArrived(LEADER, _unmask_req(L, 1, U3, own)))
    assert [a for a in honest if isinstance(a, Send)], "control: the round's own quorum unmasks"
    ms2 = _round_ms(1, "sim", signers) if other == "next-round" else _round_ms(0, "sim-2", signers)
    L2, _ = _quorum_sigs(ms2, U3)
    out = ms2[1].handle(MessageArrived(LEADER, _unmask_req(L2, 1, U3, old)))
    assert not [a for a in out if isinstance(a, Send)], "replayed signatures made a member unmask"
    assert [a.error.code for a in out if isinstance(a, Fault)] == ["integrity"]
