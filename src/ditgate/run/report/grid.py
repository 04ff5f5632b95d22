"""grid.png: the baseline and every row side by side (a video: several of its frames), and under each row its
difference from the row it is compared with, amplified so that an error of 1/AMPLIFY of the range is full white."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ditgate.run.exec import files as store

AMPLIFY = 10.0


def _picture(array: np.ndarray | None, modality: str, frames: list[int] | None = None) -> np.ndarray | None:
    """An image to draw: an image as it is, a video's `frames` side by side (default: its middle frame)."""
    if array is None or modality == "audio":
        return None
    if modality == "video":
        picks = [f for f in (frames or [len(array) // 2]) if 0 <= f < len(array)] or [len(array) // 2]
        array = np.concatenate([array[f] for f in picks], axis=1)
    array = np.nan_to_num(np.asarray(array, dtype=np.float32))
    if array.ndim == 2:
        array = np.repeat(array[..., None], 3, axis=-1)
    return np.clip(array, 0, 1)


def grid(run_dir: Path, report: dict[str, Any], frames: list[int] | None = None) -> Path | None:
    """grid.png: top line the outputs, bottom line |row - its baseline| x AMPLIFY; None when nothing is drawable.
    A video shows `frames` side by side (floor_report.grid_frames: first, chunk boundary, worst, last)."""
    from PIL import Image, ImageDraw

    cells = []
    for r in report["rows"]:
        if r["status"] == "error":
            continue
        modality = r["modality"] or "image"
        out = _picture(store.load_array(run_dir, r["name"], "output"), modality, frames)
        if out is None:
            continue
        ref = _picture(store.load_array(run_dir, r["baseline"], "output"), modality, frames) if r["baseline"] \
            else None
        diff = np.clip(np.abs(out - ref) * AMPLIFY, 0, 1) if ref is not None and ref.shape == out.shape else None
        cells.append((r["name"], r["status"], out, diff))
    if not cells:
        return None
    h, w = cells[0][2].shape[:2]
    scale = max(1, 160 // max(h, w))
    ch, cw, label = h * scale, w * scale, 16
    canvas = Image.new("RGB", (cw * len(cells), 2 * (ch + label)), "white")
    draw = ImageDraw.Draw(canvas)
    for i, (name, status, out, diff) in enumerate(cells):
        x = i * cw
        colour = {"passed": (0, 120, 0), "failed": (200, 0, 0)}.get(status, (0, 0, 0))
        draw.text((x + 2, 2), name[: cw // 6], fill=colour)
        for j, image in enumerate((out, diff)):
            if image is None or image.shape[:2] != (h, w):
                continue
            tile = Image.fromarray((image * 255).round().astype(np.uint8)).resize((cw, ch), Image.NEAREST)
            canvas.paste(tile, (x, label + j * (ch + label)))
        if diff is not None:
            draw.text((x + 2, ch + label + 2), f"|diff| x{AMPLIFY:g}", fill=(0, 0, 0))
    path = run_dir / "grid.png"
    tmp = run_dir / ".grid.png.tmp"
    canvas.save(tmp, format="PNG")
    tmp.replace(path)
    return path
