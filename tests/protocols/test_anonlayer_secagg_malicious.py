"""Issue 11 finding 3: a leader that equivocates on the survivor set.

With 9 members and threshold 4, the leader tells one half "everyone survived" and the other half "the
victim dropped": the first half reveals shares of the victim's self-mask seed, the second shares of
the victim's pairwise seeds, and together they open its masked input (measured on the old protocol:
error 2.8e-8).  The fix is SecAgg's consistency round (Bonawitz et al. 2017, malicious variant): every
survivor signs the survivor set it was told with its node signing key, and a member unmasks only when
the leader shows it ``q = max(t, ⌊n/2⌋ + 1)`` valid signatures over *its* set.  Two quorums share
``2q − n`` members who each sign one set per round, so an equivocating leader needs ``2q − n`` colluders;
the tests check both sides of that bound, and the threshold rule without the check."""

import numpy as np
import pytest

from hushnet.crypto.masks import add_masks
from hushnet.crypto.shamir import SHARE_LEN, Share, combine
from hushnet.engine.actions import Fault, Send
from hushnet.engine.events import MessageArrived, RunStarted
from hushnet.families.secagg import wire as sa
from hushnet.families.secagg.machines import build_round
from hushnet.families.secagg.params import SecAggParams

N_MEM, LEADER, DIM = 9, 9, 16
VICTIM = 0
EVERYONE = list(range(N_MEM))
WITHOUT_VICTIM = [u for u in EVERYONE if u != VICTIM]


def _sends(acts):
    return [a for a in acts if isinstance(a, Send)]


def _faults(acts):
    return [a.error.code for a in acts if isinstance(a, Fault)]


class SplitLeader:
    """The leader's side, played by the test on top of the real leader machine's collection phase:
    group A is told U3 = everyone, group B U3 = everyone but the victim.  ``colluders`` are members
    running modified code that answer both requests.  ``swap`` hands each group the *other* group's
    signatures (or A's to both when B has too few)."""

    def __init__(self, ms):
        self.ms, self.L = ms, ms[LEADER]
        self.faults: list[str] = []
        for a in _sends(self.L.handle(RunStarted())):  # the fresh nonce (or nothing without it)
            self._deliver_from_leader(a.dst, a.payload)
        if not self.L.p.fresh_nonce:
            for u in EVERYONE:
                for a in _sends(ms[u].handle(RunStarted())):
                    self.L.handle(MessageArrived(u, a.payload))
        assert sorted(self.L.masked) == EVERYONE

    def _deliver_from_leader(self, v, payload):
        out = self.ms[v].handle(MessageArrived(LEADER, payload))
        self.faults += _faults(out)
        for a in _sends(out):
            if a.payload[0] == sa.MASKED:
                self.L.handle(MessageArrived(v, a.payload))
        return _sends(out)

    def _sign(self, v, U3):
        D = sorted(set(EVERYONE) - set(U3))
        out = self._deliver_from_leader(v, bytes([sa.CHECK_REQ]) + sa.pack_ids(U3) + sa.pack_ids(D))
        if not out:
            return None
        r = sa.Reader(out[0].payload)
        spki = r.take(r.u16())
        return v, spki, r.take(r.u16())

    def _reveal(self, v, U3, sigs):
        D = sorted(set(EVERYONE) - set(U3))
        cts = self.L.cts
        parts = [sa.U32.pack(u) + sa.U32.pack(len(cts[u][v])) + cts[u][v] for u in U3 if u != v]
        head = sa.pack_ids(U3) + sa.pack_ids(D)
        if self.L.p.consistency_check:
            head += sa.U16.pack(len(sigs)) + b"".join(
                sa.U32.pack(w) + sa.U16.pack(len(k)) + k + sa.U16.pack(len(g)) + g
                for w, k, g in sigs
            )
        out = self._deliver_from_leader(
            v, bytes([sa.UNMASK_REQ]) + head + sa.U16.pack(len(parts)) + b"".join(parts)
        )
        if not out:
            return {}
        r = sa.Reader(out[0].payload)
        got = {}
        for _ in range(r.u16()):
            owner, which = r.u32(), r.take(1)[0]
            peer = r.u32() if which == sa.SECRET_S else -1
            got[(owner, which, peer)] = Share.decode(r.take(SHARE_LEN))
        return got

    def attack(self, A, B, colluders=(), swap=False):
        """The victim's decoded input, or None if the members' shares do not suffice."""
        groups = {
            "A": (EVERYONE, [VICTIM, *A, *colluders]),
            "B": (WITHOUT_VICTIM, [*B, *colluders]),
        }
        sigs, reveals = {}, []
        for g, (U3, who) in groups.items():
            sigs[g] = []
            for v in who:
                if self.L.p.consistency_check:
                    s = self._sign(v, U3)
                    if s is not None:
                        sigs[g].append(s)
                if v in colluders:  # modified code: forgets that it already confirmed a set
                    self.ms[v].phase, self.ms[v].signed_U3 = "masked", None
        for g, (U3, who) in groups.items():
            shown = sigs["B" if g == "A" else "A"] if swap else sigs[g]
            for v in who:
                if v in colluders:
                    self.ms[v].phase, self.ms[v].signed_U3 = (
                        ("signed", U3) if self.L.p.consistency_check else ("masked", None)
                    )
                reveals.append(self._reveal(v, U3, shown))
        return self._open(reveals)

    def _open(self, reveals):
        t = self.L.p.threshold
        b_sh = [r[(VICTIM, sa.SECRET_B, -1)] for r in reveals if (VICTIM, sa.SECRET_B, -1) in r]
        if len(b_sh) < t:
            return None
        pair = []
        for u in WITHOUT_VICTIM:
            sh = [r[(u, sa.SECRET_S, VICTIM)] for r in reveals if (u, sa.SECRET_S, VICTIM) in r]
            if len(sh) < t:
                return None
            pair.append((combine(sh[:t], t), -1 if VICTIM < u else 1))
        y = np.array(self.L.masked[VICTIM], copy=True)
        add_masks(y, [(combine(b_sh[:t], t), -1)], self.L.context + b"|self")
        add_masks(y, pair, self.L.context + b"|pair")
        fp = self.L.fp
        return fp.decode(fp.reduce(y))


def _round(threshold, **kw):
    rng = np.random.default_rng(11)
    vecs = {v: rng.normal(size=DIM) for v in range(N_MEM)}
    p = SecAggParams(members=tuple(EVERYONE), leader=LEADER, threshold=threshold, dim=DIM, **kw)
    ms, _ = build_round(vecs, p, N_MEM + 1, run_seed=5)
    return SplitLeader(ms), vecs


def _recovered(got, vecs):
    return got is not None and np.abs(got - vecs[VICTIM]).max() < 1e-6


@pytest.mark.parametrize("swap", [False, True], ids=["own-signatures", "other-group-signatures"])
def test_equivocating_leader_cannot_unmask_a_member_nine_members_threshold_four(swap):
    """The issue's attack (t = 4, n = 9, halves {1..4} ∪ victim and {5..8}) with the consistency check:
    the quorum is 5, half B has only 4 signers on its set, and A's signatures are over another set, so B
    refuses to unmask (counted faults) and the victim's input stays hidden."""
    atk, vecs = _round(4)
    assert atk.L.p.consistency_quorum == 5 and atk.L.p.malicious_collusion_tolerance() == 0
    got = atk.attack(A=(1, 2, 3, 4), B=(5, 6, 7, 8), swap=swap)
    assert not _recovered(got, vecs), "the leader recovered the victim's input"
    assert got is None
    assert len(atk.faults) == (9 if swap else 4) and set(atk.faults) <= {
        "malformed",
        "integrity",
    }  # swapped: A refuses too


def test_the_quorum_bound_is_tight_one_colluder_suffices_when_tolerance_is_zero():
    """The stated tolerance is not an overclaim in the safe direction only: with q = 5 of 9 a single
    colluding member that signs both sets gives both halves a quorum, and the leader opens the victim —
    so ``malicious_collusion_tolerance() = 2q − n − 1 = 0`` is exact.  (This is the test that the attack
    machinery really works.)"""
    atk, vecs = _round(4)
    assert _recovered(atk.attack(A=(1, 2, 3), B=(5, 6, 7, 8), colluders=(4,)), vecs)


def test_larger_quorum_tolerates_its_colluders():
    """t = 7 of 9: q = 7, 2q − n − 1 = 4 … capped by the masking bound; with 2 colluders the equivocating
    leader still cannot give both halves a quorum."""
    atk, vecs = _round(7)
    assert atk.L.p.malicious_collusion_tolerance() >= 2
    got = atk.attack(A=(1, 2, 3), B=(4, 5, 6), colluders=(7, 8))
    assert got is None and not _recovered(got, vecs)


def test_threshold_at_most_half_refused_without_the_consistency_check():
    with pytest.raises(ValueError, match="n/2 = 4.5.*consistency_check"):
        SecAggParams(
            members=tuple(EVERYONE), leader=LEADER, threshold=4, dim=DIM, consistency_check=False
        )
    # t = 5 > n/2 without the check: the halves cannot both reach t unmask answers (each member answers once)
    atk, vecs = _round(5, consistency_check=False)
    assert atk.L.p.malicious_collusion_tolerance() == 0
    got = atk.attack(A=(1, 2, 3, 4), B=(5, 6, 7, 8))
    assert got is None


def test_member_refuses_a_second_confirmation_and_forged_signatures():
    atk, _ = _round(4)
    own = atk._sign(1, EVERYONE)
    assert own is not None
    assert atk._sign(1, WITHOUT_VICTIM) is None and atk.faults == [
        "replay"
    ]  # one survivor set per round
    sigs = [own] + [atk._sign(v, EVERYONE) for v in (0, 2, 3, 4)]  # 5 = the quorum
    w, k, g = sigs[1]
    forged = sigs[:1] + sigs[2:] + [(w, k, g[:-1] + bytes([g[-1] ^ 1]))]
    assert atk._reveal(1, EVERYONE, forged) == {} and atk.faults[-1] in ("integrity", "malformed")
    stranger = (
        sigs[:1]
        + sigs[2:]
        + [(w, atk.ms[5].signer.spki, atk.ms[5].signer.sign(atk.ms[1]._check_message(EVERYONE)))]
    )
    assert (
        atk._reveal(1, EVERYONE, stranger) == {} and atk.faults[-1] == "integrity"
    )  # member 5's key named as 0's
    assert (
        atk._reveal(1, EVERYONE, sigs[:4]) == {} and atk.faults[-1] == "malformed"
    )  # below the quorum
    assert len(atk._reveal(1, EVERYONE, sigs)) == N_MEM  # the honest request: b-shares of all 9
