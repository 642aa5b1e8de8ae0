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


def build_parser() -> argparse.ArgumentParser:
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
    return parser


def main(argv: list[str] | None = None) -> int:
    from hushnet.net.cluster import die_with_parent

    die_with_parent()  # a node or bootstrap started by `hushnet up` ends with its supervisor
    parser = build_parser()
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
