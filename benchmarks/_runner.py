"""Discover and run benchmark or figure modules: each defines ``main(out_dir) -> dict``."""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
import time
import traceback
from pathlib import Path


def run(
    package: str,
    prefix: str,
    default_out: Path,
    argv: list[str] | None = None,
    write_json: bool = True,
) -> int:
    """Run the modules of ``package`` whose names start with ``prefix`` (all of them by default)."""
    pkg = importlib.import_module(package)
    names = sorted(
        m.name
        for m in pkgutil.iter_modules(pkg.__path__)
        if m.name.startswith(prefix) and not m.name.startswith("_")
    )
    parser = argparse.ArgumentParser(
        prog=f"python -m {package}", description=f"Run {package} modules."
    )
    parser.add_argument(
        "names", nargs="*", help=f"modules to run (default: all of {', '.join(names)})"
    )
    parser.add_argument("--out", type=Path, default=default_out, help="output directory")
    args = parser.parse_args(argv)
    selected = args.names or names
    unknown = [n for n in selected if n not in names]
    if unknown:
        parser.error(f"unknown module(s) {unknown}; available: {names}")
    args.out.mkdir(parents=True, exist_ok=True)
    failed = []
    for name in selected:
        print(f"== {package}.{name}", flush=True)
        t0 = time.perf_counter()
        try:
            result = importlib.import_module(f"{package}.{name}").main(args.out)
        except Exception:  # keep going: one broken benchmark must not hide the others
            traceback.print_exc()
            failed.append(name)
            continue
        elapsed = time.perf_counter() - t0
        if write_json and isinstance(
            result, dict
        ):  # figure scripts write their own JSON beside the PNG
            result.setdefault("wall_seconds", round(elapsed, 3))
            (args.out / f"{name}.json").write_text(json.dumps(result, indent=2, default=float))
        print(f"   done in {elapsed:.1f} s", flush=True)
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
