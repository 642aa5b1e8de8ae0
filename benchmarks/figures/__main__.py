"""``make figures``: run every figure reproduction; each writes ``<name>.png`` and ``<name>.json``."""

import sys
from pathlib import Path

from benchmarks._runner import run

sys.exit(run("benchmarks.figures", "", Path(__file__).resolve().parent / "out", write_json=False))
