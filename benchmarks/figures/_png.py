"""Writing figure PNGs small enough to commit."""

from __future__ import annotations

import io
import pathlib


def save_palette_png(fig, path: pathlib.Path, dpi: int) -> None:
    """Save as a 256-colour palette PNG so the committed figure stays small (< ~300 KB)."""
    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    buf.seek(0)
    Image.open(buf).convert("RGB").quantize(colors=256).save(path, optimize=True)
