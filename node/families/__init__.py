"""Protocol families and the one list of them.

Each family is a package ``hushnet.families.<name>``: its ``__init__`` holds the :class:`Family`
subclass and its ``FAMILY`` instance; ``params`` (names, typed parameters), ``machines``, ``wire``,
``accounting`` and, where the family has them, ``node`` / ``operator`` hold its parts.  Adding a
family is one new package and one line in :data:`FAMILIES` (and its name in ``pyproject.toml``'s
package list; ``docs/design/layout.md``).  Nothing is registered by importing a module: the run
service, the registry and the accountant's entry points ask :func:`family_of`.
"""

from __future__ import annotations

from hushnet.families.anonymity import FAMILY as ANONYMITY
from hushnet.families.base import Family, RunCost
from hushnet.families.central import FAMILY as CENTRAL
from hushnet.families.gossip import FAMILY as GOSSIP
from hushnet.families.pad import FAMILY as PAD
from hushnet.families.secagg import FAMILY as SECAGG
from hushnet.families.walk import FAMILY as WALK

#: every protocol family hushnet runs, in the order CLIs list them
FAMILIES: tuple[Family, ...] = (WALK, PAD, GOSSIP, ANONYMITY, SECAGG, CENTRAL)

_BY_PROTOCOL: dict[str, Family] = {}
for _family in FAMILIES:
    for _protocol in _family.protocols:
        if _protocol in _BY_PROTOCOL:  # pragma: no cover - a programming error, caught at import
            raise RuntimeError(f"protocol {_protocol!r} is in two families")
        _BY_PROTOCOL[_protocol] = _family


class UnknownRunProtocol(ValueError):
    """The run names a protocol hushnet does not implement."""


def protocols() -> dict[str, str]:
    """Every protocol name → its description."""
    return {p: d for f in FAMILIES for p, d in f.protocols.items()}


def family_of(protocol: str) -> Family:
    """The family that runs ``protocol`` (:class:`UnknownRunProtocol` with the available names otherwise)."""
    try:
        return _BY_PROTOCOL[protocol]
    except KeyError:
        raise UnknownRunProtocol(
            f"unknown protocol {protocol!r}; available: {sorted(_BY_PROTOCOL)}"
        ) from None


__all__ = [
    "FAMILIES",
    "Family",
    "RunCost",
    "UnknownRunProtocol",
    "family_of",
    "protocols",
    "WALK",
    "PAD",
    "GOSSIP",
    "ANONYMITY",
    "SECAGG",
    "CENTRAL",
]
