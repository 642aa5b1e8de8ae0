"""Node plugins: how features above the transport (runs, later others) attach to every node process.

A plugin is a callable ``fn(node) -> object | None`` run on the :class:`~hushnet.net.node.Node`
before it starts; it registers handlers and control commands.  If it returns an object with a
``close()`` method, that is called when the node stops.  Installed packages announce plugins
under the entry-point group ``hushnet.node_plugins`` (see ``pyproject.toml``), so the network
layer never imports the features built on it.
"""

from __future__ import annotations

import logging
from importlib.metadata import entry_points
from typing import Any, Callable

GROUP = "hushnet.node_plugins"
Plugin = Callable[[Any], Any]

log = logging.getLogger("hushnet.net")


def load_plugins() -> tuple[Plugin, ...]:
    """Every plugin installed under :data:`GROUP`, in name order (a broken one is a clear error)."""
    out = []
    for ep in sorted(entry_points(group=GROUP), key=lambda e: e.name):
        try:
            out.append(ep.load())
        except Exception as exc:
            raise RuntimeError(
                f"node plugin {ep.name!r} ({ep.value}) failed to load: {exc}"
            ) from exc
    return tuple(out)
