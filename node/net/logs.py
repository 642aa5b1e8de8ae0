"""Structured logging for hushnet processes.

Every record carries the process's node id (or ``bootstrap``/``cli``) so that the logs of a
local cluster, interleaved in one terminal or collected from many files, stay attributable.
``--log-json`` switches to one JSON object per line (for log shippers and for tests that
grep for an event); the default is a compact human format.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time

_ROLE = {"id": "-"}
#: the node whose code is running: set by each node in its own task, so that the many nodes one
#: process may host (:mod:`hushnet.net.host`) each sign their records; the process role is the fallback
_NODE: contextvars.ContextVar[str | None] = contextvars.ContextVar("hushnet_node", default=None)

_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", (), None)).keys()) | {"message", "asctime"}


def set_identity(name: str) -> None:
    """Name attached to every later log record (e.g. the node id once it is known)."""
    _ROLE["id"] = name


def bind_node(name: str) -> None:
    """Attribute the records of the current task, and of every task it creates from now on, to ``name``."""
    _NODE.set(name)


def current_identity() -> str:
    return _NODE.get() or _ROLE["id"]


class _IdentityFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "node"):
            record.node = current_identity()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, node, logger, msg, plus any ``extra=`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "node": getattr(record, "node", None) or current_identity(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _RESERVED and key not in out and not key.startswith("_"):
                try:
                    json.dumps(value)
                    out[key] = value
                except TypeError:
                    out[key] = repr(value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, sort_keys=False)


class TextFormatter(logging.Formatter):
    """``time level [node] logger: message key=value ...``."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%H:%M:%S", time.localtime(record.created)) + f".{int(record.msecs):03d}"
        extras = " ".join(
            f"{k}={v}"
            for k, v in vars(record).items()
            if k not in _RESERVED and k != "node" and not k.startswith("_")
        )
        line = f"{ts} {record.levelname:<7} [{getattr(record, 'node', '-')}] {record.name}: {record.getMessage()}"
        if extras:
            line += "  " + extras
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup_logging(
    json_lines: bool = False, level: str = "INFO", identity: str | None = None
) -> None:
    """Configure the root logger once for a hushnet process (stderr)."""
    if identity:
        set_identity(identity)
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else TextFormatter())
    handler.addFilter(_IdentityFilter())
    root.addHandler(handler)
    root.setLevel(level.upper())


class ContextLog(logging.LoggerAdapter):
    """Logger adapter that merges fixed fields (e.g. ``node``) with per-call ``extra=``.

    Several nodes (and a bootstrap) may share one process in tests; the adapter keeps each
    record attributed to the right one.
    """

    def process(self, msg, kwargs):
        kwargs["extra"] = {**self.extra, **(kwargs.get("extra") or {})}
        return msg, kwargs


class RateLimitedLog:
    """At most one log line per *kind* per ``interval`` seconds, carrying how many events it stands for.

    A node under fuzzing or attack refuses thousands of messages a second; logging each (let alone
    with a traceback) floods the disk and hides everything else.  The first event of a kind in an
    interval is logged at once (``extra`` gains ``kind`` and ``count``); later ones only increment a
    counter, and :meth:`flush` (called periodically by the node) writes one summary line per kind
    with the count and the last message.  A traceback, when asked for, is attached only to the line
    that is actually written.
    """

    def __init__(
        self,
        log: logging.LoggerAdapter | logging.Logger,
        interval: float = 10.0,
        clock=time.monotonic,
    ) -> None:
        self.log = log
        self.interval = float(interval)
        self._clock = clock
        self._kinds: dict[
            str, list
        ] = {}  # kind -> [last_write, suppressed_count, last_message, level]
        self.totals: dict[str, int] = {}

    def log_event(
        self, level: int, kind: str, msg: str, *args, exc_info=None, extra: dict | None = None
    ) -> bool:
        """Record one event; returns whether a line was written now."""
        self.totals[kind] = self.totals.get(kind, 0) + 1
        now = self._clock()
        st = self._kinds.get(kind)
        if st is not None and now - st[0] < self.interval:
            st[1] += 1
            st[2] = msg % args if args else msg
            st[3] = max(st[3], level)
            return False
        if st is not None and st[1]:
            self._summary(kind, st, now)
        self._kinds[kind] = [now, 0, "", level]
        self.log.log(
            level, msg, *args, exc_info=exc_info, extra={**(extra or {}), "kind": kind, "count": 1}
        )
        return True

    def warning(self, kind: str, msg: str, *args, **kw) -> bool:
        return self.log_event(logging.WARNING, kind, msg, *args, **kw)

    def error(self, kind: str, msg: str, *args, **kw) -> bool:
        return self.log_event(logging.ERROR, kind, msg, *args, **kw)

    def _summary(self, kind: str, st: list, now: float) -> None:
        self.log.log(
            st[3],
            "%d more %s in the last %.0f s (last: %s)",
            st[1],
            kind,
            now - st[0],
            st[2],
            extra={"event": "suppressed", "kind": kind, "count": st[1]},
        )
        st[0], st[1] = now, 0

    def flush(self, force: bool = False) -> None:
        """Write the pending count of every kind whose interval is over (all of them with ``force``)."""
        now = self._clock()
        for kind, st in list(self._kinds.items()):
            if st[1] and (force or now - st[0] >= self.interval):
                self._summary(kind, st, now)
