"""A node's privacy report in a packed form: its per-target rows as float64 bytes instead of JSON objects.

Why (issue 12): at n = 2048 a report carries three rows of 2 047 targets (certified ε, the paper's values,
the lifetime totals with their bound and method), ~280 KB of JSON per node; writing it was a quarter of a
host's CPU per report and reading 2 048 of them ~570 MB of JSON at the operator.  Packed, a row is its ids
once and its values as little-endian float64 (base64): the same numbers, bit for bit (``repr`` of a float
in JSON round-trips too, but costs ~0.5 µs a number each way).  The client asks for it with
``{"packed": true}`` and unpacks (:func:`unpack_report`); a node of an older version ignores the flag and
answers the plain form, which :func:`unpack_report` passes through.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

#: the report fields that map each target to a float
FLOAT_ROWS = ("certified", "paper")
#: marks a packed report
PACKED = "packed_rows"


def _f64(values) -> str:
    return base64.b64encode(np.asarray(values, dtype="<f8").tobytes()).decode()


def _floats(b64: str) -> list[float]:
    return np.frombuffer(base64.b64decode(b64), dtype="<f8").tolist()


def _labels(values: list) -> list | dict:
    """A column of labels, or ``{"all": label}`` when every target has the same one (the usual case)."""
    first = values[0]
    return {"all": first} if all(v == first for v in values) else values


def _column(col: list | dict, n: int) -> list:
    return [col["all"]] * n if isinstance(col, dict) else col


def pack_report(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` (a :meth:`RunDriver.report`) with its per-target rows packed; other fields unchanged.  A
    row whose targets are those of the row before it says so (``"ids": null``) instead of listing them."""
    out = dict(doc)
    last: list[str] | None = None

    def ids_of(row: dict) -> list[str] | None:
        nonlocal last
        ids = list(row)
        same = ids == last
        last = ids
        return None if same else ids

    for k in FLOAT_ROWS:
        row = doc.get(k)
        if isinstance(row, dict) and row:
            vals = np.fromiter(row.values(), float, len(row))
            out[k] = {"ids": ids_of(row), "f64": _f64(vals)}
    life = doc.get("lifetime")
    if isinstance(life, dict) and life:
        vals = list(life.values())
        if all(isinstance(v, dict) and set(v) == {"epsilon", "bound", "method"} for v in vals):
            out["lifetime"] = {
                "ids": ids_of(life),
                "epsilon": _f64([v["epsilon"] for v in vals]),
                "bound": _labels([v["bound"] for v in vals]),
                "method": _labels([v["method"] for v in vals]),
            }
    out[PACKED] = True
    return out


def unpack_report(doc: Any) -> Any:
    """The plain report of a packed one (a plain report, or anything else, is returned as it is)."""
    if not isinstance(doc, dict) or not doc.get(PACKED):
        return doc
    out = {k: v for k, v in doc.items() if k != PACKED}
    last: list[str] = []
    for k in FLOAT_ROWS:
        row = doc.get(k)
        if isinstance(row, dict) and "f64" in row:
            last = row["ids"] if row["ids"] is not None else last
            out[k] = dict(zip(last, _floats(row["f64"])))
    life = doc.get("lifetime")
    if isinstance(life, dict) and "epsilon" in life:
        last = life["ids"] if life["ids"] is not None else last
        n = len(last)
        out["lifetime"] = {
            i: {"epsilon": e, "bound": b, "method": m}
            for i, e, b, m in zip(
                last,
                _floats(life["epsilon"]),
                _column(life["bound"], n),
                _column(life["method"], n),
            )
        }
    return out
