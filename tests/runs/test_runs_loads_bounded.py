"""``loads_bounded`` gives every document the answer of its full depth scan, also on its shortcut for
documents with few brackets (issue 12: the scan was ~0.4 ms of a host's loop per control command, a few
hundred a second while an operator watched a run at n = 2048)."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest

from hushnet.runs.spec import MAX_JSON_DEPTH, SpecError, loads_bounded


def scanned(raw: bytes, max_depth: int = MAX_JSON_DEPTH):
    """The full scan alone (the behaviour before the shortcut), as a reference."""
    blanked = re.sub(rb'"(?:[^"\\]|\\.)*"', b'""', raw)
    b = np.frombuffer(blanked, dtype=np.uint8)
    step = np.isin(b, (ord("["), ord("{"))).astype(np.int64) - np.isin(
        b, (ord("]"), ord("}"))
    ).astype(np.int64)
    depth = int(np.cumsum(step).max()) if step.size else 0
    if depth > max_depth:
        raise SpecError("nested")
    return json.loads(raw)


def outcome(fn, raw: bytes):
    try:
        return ("ok", fn(raw))
    except SpecError:
        return ("refused", None)
    except ValueError as e:  # json.JSONDecodeError
        return (type(e).__name__, None)


def documents(rng: random.Random, n: int):
    atoms = [
        b"1",
        b'"a"',
        b'"[{"',
        b'"]}\\""',
        b"null",
        b"[",
        b"]",
        b"{",
        b"}",
        b",",
        b'"k":',
        b"x",
    ]
    for _ in range(n):
        yield b"".join(rng.choice(atoms) for _ in range(rng.randint(0, 40)))
    for depth in (0, 1, 5, MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 100):
        yield b"[" * depth + b"]" * depth
        yield b'{"a":' * depth + b"1" + b"}" * depth
        yield b'["' + b"[" * depth + b'"]'  # brackets inside a string do not nest


@pytest.mark.parametrize("seed", range(3))
def test_every_document_gets_its_full_scans_answer(seed: int) -> None:
    for raw in documents(random.Random(seed), 3000):
        assert outcome(loads_bounded, raw) == outcome(scanned, raw), raw


def test_a_small_command_is_read_and_a_deep_one_still_refused() -> None:
    assert loads_bounded(b'{"run_id": "r1", "after": 3, "wait": 0}') == {
        "run_id": "r1",
        "after": 3,
        "wait": 0,
    }
    with pytest.raises(SpecError, match="nested 33 levels deep"):
        loads_bounded(b"[" * 33 + b"]" * 33)
