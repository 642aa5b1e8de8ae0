"""The papers' formulas as printed: **uncertified**, kept for labelled reproductions only.

Everything here reproduces a published bound (or a published erratum) so that hushnet's figures
and run reports can show it next to the certified value — random-walk paper Theorem 3 as printed,
Theorems 4/5 closed forms, Muffliato Theorem 1/4/6 and Corollaries 1/2, Koskela et al. Theorem 15,
the classic (Mironov / Dwork–Roth) conversions the papers' code uses.  None of it is a guarantee:
the spec's errata (gossip.md §1.3.9, §2.5; randomwalk B.4) show cases where each under-states the
loss.  Every value computed from here must travel with the label ``"paper"``.

The certified accountant (:mod:`hushnet.privacy`) never imports this package to decide a charge;
it imports it lazily only where a caller explicitly asks for the labelled reproduction
(``bound="paper"``, ``method="classic"``).  A test checks that no certified module imports it at
module level.
"""

from __future__ import annotations

__all__ = ["conversions", "koskela", "muffliato", "randomwalk"]
