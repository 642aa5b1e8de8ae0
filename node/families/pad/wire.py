"""P-AD's messages: the walk's token and acknowledgement (:mod:`hushnet.families.walk.wire`),
with the token's protocol-specific ``aux`` field used only by the ring sum.

* ``pad-ring-sum``: ``aux`` = hops left before the next noise injection (Alg. 1 adds noise once every
  n−1 hops; :func:`ring_noise_aux` is the value after an injection).  With ``distributed_noise``
  every hop adds noise and ``aux`` stays 0.
* the other three algorithms leave ``aux`` at 0.

Everything a receiver observes of a P-AD run is in this header and the vector (the running sum or
histogram); the accounting (:mod:`hushnet.families.pad.accounting`) is written against exactly that.
"""

from __future__ import annotations


def ring_noise_aux(n: int) -> int:
    """The ring sum's ``aux`` after a noise injection: n−2 more hops without noise (n−1 per window)."""
    return n - 2
