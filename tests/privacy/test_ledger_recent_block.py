"""A ledger file points a new entry at a recent cost block only for curves nobody can change.

The store remembers its last blocks so that a walk's visits, which charge the very same sealed rows
again, write one block per run.  ``flags.writeable = False`` alone is not "nobody can change it": the
owner of the memory can switch writing back on, change the values and switch it off again.  Such an
array charged twice used to make the second entry point at the first block — the in-memory sums added
the new values, the file kept the old ones, and after a reopen the ledger under-counted (an adversarial
review found it; nothing in the tree passes such arrays, but ``Ledger.charge`` is public).
"""

from __future__ import annotations

import pathlib

import numpy as np

from hushnet.privacy.conversions import DEFAULT_ORDERS
from hushnet.privacy.ledger import Ledger, PrivacyEntry
from hushnet.privacy.ledger_math import sealed


def _entry(rows: np.ndarray) -> PrivacyEntry:
    return PrivacyEntry.from_row("r", "p", "v", "certified", ["x", "y"], rows)


def test_an_unsealed_read_only_array_changed_between_charges_is_stored_as_charged(
    tmp_path: pathlib.Path,
) -> None:
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path, node_id="me")
    a = np.full((2, len(DEFAULT_ORDERS)), 0.01)
    a.flags.writeable = False
    ledger.charge(_entry(a))
    a.flags.writeable = True
    a[:] = 0.5
    a.flags.writeable = False
    ledger.charge(_entry(a))
    live = ledger.rdp("x").copy()
    ledger.close()
    reopened = Ledger(path)
    try:
        assert np.array_equal(reopened.rdp("x"), live), (reopened.rdp("x")[0], live[0])
        assert live[0] == 0.01 + 0.5
    finally:
        reopened.close()


def test_sealed_rows_charged_again_share_one_block(tmp_path: pathlib.Path) -> None:
    """What the shortcut is for still holds: the same sealed rows charged again add no block."""
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path, node_id="me")
    rows = sealed(np.full((2, len(DEFAULT_ORDERS)), 0.01))
    for _ in range(3):
        ledger.charge(_entry(rows))
    blocks = ledger._store._db.execute("SELECT COUNT(*) FROM blocks").fetchone()[0]
    live = ledger.rdp("x").copy()
    ledger.close()
    reopened = Ledger(path)
    try:
        assert blocks == 1
        assert np.array_equal(reopened.rdp("x"), live)
    finally:
        reopened.close()
