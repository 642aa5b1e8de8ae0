"""``make bench``: run every ``benchmarks/bench_*.py`` and write ``benchmarks/out/<name>.json``."""

import sys
from pathlib import Path

from benchmarks._runner import run

sys.exit(run("benchmarks", "bench_", Path(__file__).resolve().parent / "out"))
