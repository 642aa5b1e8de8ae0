"""The ``hushnet`` command line.

Each area of the system registers its own sub-commands here, so this file stays a thin
dispatcher: the network commands live in :mod:`hushnet.netcli`, the privacy tools in
:mod:`hushnet.privacy.cli`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# (module, function) pairs; each function takes the top-level sub-parser collection.
_REGISTRARS = [
    ("hushnet.netcli", "register"),
    ("hushnet.privacy.cli", "register"),
    ("hushnet.runs.cli", "register"),
]


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every area, or, given ``command``, of the areas up to the one that registers it.

    Why: the privacy tools import numpy and scipy (about 1 s, and several seconds on a loaded machine);
    a ``node serve`` or ``bootstrap serve`` process (``hushnet up`` starts several at once) needs only
    the network commands.  An unknown command still gets the full parser (and its error and help).
    """
    parser = argparse.ArgumentParser(
        prog="hushnet",
        description="hushnet: peer-to-peer learning with pairwise network differential privacy.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name, func in _REGISTRARS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:  # an area not built yet must not break the others
            if exc.name != module_name:
                raise
            continue
        getattr(module, func)(sub)
        if command is not None and command in sub.choices:
            break
    return parser


def main(argv: list[str] | None = None) -> int:
    from hushnet.net.cluster import die_with_parent

    die_with_parent()  # a node or bootstrap started by `hushnet up` ends with its supervisor
    given = sys.argv[1:] if argv is None else argv
    parser = build_parser(given[0] if given and not given[0].startswith("-") else None)
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return int(handler(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
