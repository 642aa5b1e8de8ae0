"""Suite-wide settings: the papers' data sets are read from ../shared/data (never copied)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"

if SHARED_DATA.is_dir():
    os.environ.setdefault("HUSHNET_DATA_DIR", str(SHARED_DATA))
os.environ.setdefault("MPLBACKEND", "Agg")
