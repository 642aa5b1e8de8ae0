"""A node's privacy report in a packed form: its per-target rows as float64 bytes instead of JSON objects.

Why (issue 12): at n = 2048 a report carries four rows of 2 047 targets (certified ε, the paper's values,
the projected row, the lifetime totals with their bound and method), ~340 KB of JSON per node; writing it
was a quarter of a host's CPU per report and reading 2 048 of them ~570 MB of JSON at the operator.  Packed,
a row is its ids once and its values as little-endian float64 (base64): the same numbers, bit for bit
(``repr`` of a float in JSON round-trips too, but costs ~0.5 µs a number each way).  The client asks for it
with ``{"packed": 2}`` and unpacks (:func:`unpack_report`).  Versions: ``true`` (1) packs the certified,
paper and lifetime rows; 2 packs the projected row too (its JSON was most of what was left of writing a
walk node's report).  A node of an older version answers 1 to a request for 2 (it reads the flag as true)
or the plain form if it knows no packing, and :func:`unpack_report` reads all three.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

#: the report fields that map each target to a float, packed in version 1
FLOAT_ROWS = ("certified", "paper")
#: the same in version 2 (in this order: a row lists its ids only when they differ from the row before)
FLOAT_ROWS_2 = ("certified", "paper", "projected")
#: marks a packed report (its value: the version, ``True`` for 1)
PACKED = "packed_rows"
#: the newest version this module writes and reads
VERSION = 2


def _rows_of(version: int) -> tuple[str, ...]:
    return FLOAT_ROWS_2 if version >= 2 else FLOAT_ROWS


def _f64(values) -> str:
    return base64.b64encode(np.asarray(values, dtype="<f8").tobytes()).decode()


def _floats(b64: str) -> list[float]:
    return np.frombuffer(base64.b64decode(b64), dtype="<f8").tolist()


def _labels(values: list) -> list | dict:
    """A column of labels, or ``{"all": label}`` when every target has the same one (the usual case)."""
    first = values[0]
    return {"all": first} if all(v == first for v in values) else values


def _flag_labels(mask: np.ndarray, yes: str, no: str) -> list | dict:
    """:func:`_labels` of the column ``yes`` where ``mask`` else ``no``, without building it when uniform."""
    if not mask.any():
        return {"all": no}
    if mask.all():
        return {"all": yes}
    return np.where(mask, yes, no).tolist()


def _column(col: list | dict, n: int) -> list:
    return [col["all"]] * n if isinstance(col, dict) else col


def _float_row(row: Any) -> bool:
    """Whether a report field is a non-empty ``target → float`` dict (what can be packed bit for bit)."""
    return isinstance(row, dict) and bool(row) and all(type(v) is float for v in row.values())


def pack_report(doc: dict[str, Any], version: int = 1) -> dict[str, Any]:
    """``doc`` (a :meth:`RunDriver.report`) with its per-target rows packed; other fields unchanged.  A
    row whose targets are those of the row before it says so (``"ids": null``) instead of listing them.
    ``version`` 2 packs the projected row too (a client that asked for 2 reads it)."""
    out = dict(doc)
    last: list[str] | None = None

    def ids_of(row: dict) -> list[str] | None:
        nonlocal last
        ids = list(row)
        same = ids == last
        last = ids
        return None if same else ids

    for k in _rows_of(version):
        row = doc.get(k)
        if k == "projected" and not _float_row(row):
            continue  # kept as it is (ints or None would not come back as they were)
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
    out[PACKED] = True if version < 2 else version
    return out


def pack_columns(
    doc: dict[str, Any], rows: dict[str, tuple[list[str], np.ndarray]], lifetime, version: int = 1
) -> dict[str, Any]:
    """:func:`pack_report` of ``doc`` with its rows given as columns: ``rows[k]`` is ``(ids, float64
    values)`` for the float rows present (``doc[k]`` is then a placeholder), ``lifetime`` the ledger's
    :class:`~hushnet.privacy.ledger_math.SpentColumns` (or ``None``).  The same document as packing the
    plain report (a test compares), without building a dict per target first and reading it back (issue
    12: at n = 2048 that was most of a packed report's writing).  A ``projected`` given in ``doc`` as a
    dict (not in ``rows``) is packed as :func:`pack_report` packs it."""
    out = dict(doc)
    last: list[str] | None = None

    def ids_of(ids: list[str]) -> list[str] | None:
        nonlocal last
        same = ids == last
        last = ids
        return None if same else list(ids)

    for k in _rows_of(version):
        if k in rows:
            ids, vals = rows[k]
            if len(ids):
                out[k] = {"ids": ids_of(ids), "f64": _f64(vals)}
        elif k == "projected" and _float_row(doc.get(k)):
            row = doc[k]
            out[k] = {
                "ids": ids_of(list(row)),
                "f64": _f64(np.fromiter(row.values(), float, len(row))),
            }
    if lifetime is not None and len(lifetime.keys):
        out["lifetime"] = {
            "ids": ids_of(lifetime.keys),
            "epsilon": _f64(lifetime.epsilon),
            "bound": _flag_labels(lifetime.paper, "paper", "certified"),
            "method": _flag_labels(lifetime.gdp, "gdp", "rdp"),
        }
    out[PACKED] = True if version < 2 else version
    return out


def unpack_report(doc: Any) -> Any:
    """The plain report of a packed one (a plain report, or anything else, is returned as it is)."""
    if not isinstance(doc, dict) or not doc.get(PACKED):
        return doc
    out = {k: v for k, v in doc.items() if k != PACKED}
    last: list[str] = []
    version = doc[PACKED] if type(doc[PACKED]) is int else 1
    for k in _rows_of(version):
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


#: marks a ``run.ledger`` answer whose totals are packed (:func:`pack_spent`)
PACKED_SPENT = "packed_spent"


def _ints(values: np.ndarray) -> list | dict:
    """A column of ints, or ``{"all": k}`` when every target has the same one."""
    if values.size and (values == values[0]).all():
        return {"all": int(values[0])}
    return values.tolist()


def pack_spent(cols) -> dict[str, Any]:
    """A ledger's totals (:class:`~hushnet.privacy.ledger_math.SpentColumns`) as the packed ``spent`` of
    a ``run.ledger`` answer: ids once, ε and δ as float64 bytes, bound labels and entry counts as columns
    (``{"all": …}`` when uniform).  Why (issue 12): at n = 2048 the plain answer is 2 047 objects of four
    fields, most of the answer's CPU once the totals are converted once per distinct curve."""
    return {
        "ids": list(cols.keys),
        "epsilon": _f64(cols.epsilon),
        "delta": _f64(cols.delta),
        "bound": _flag_labels(cols.paper, "paper", "certified"),
        "entries": _ints(cols.entries),
    }


def unpack_ledger(doc: Any) -> Any:
    """The plain ``run.ledger`` answer of a packed one (anything else is returned as it is)."""
    if not isinstance(doc, dict) or not doc.get(PACKED_SPENT):
        return doc
    out = {k: v for k, v in doc.items() if k != PACKED_SPENT}
    sp = doc["spent"]
    ids = sp["ids"]
    n = len(ids)
    out["spent"] = {
        t: {"epsilon": e, "delta": d, "bound": b, "entries": k}
        for t, e, d, b, k in zip(
            ids,
            _floats(sp["epsilon"]),
            _floats(sp["delta"]),
            _column(sp["bound"], n),
            _column(sp["entries"], n),
        )
    }
    return out
