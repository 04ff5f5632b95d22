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


GAP = 6  # pixels between two rows' columns
FONT_PX = 11  # PIL's default bitmap font is about 6 x 11 pixels a character


def _fit(draw, text: str, width: int) -> list[str]:
    """`text` on at most two lines that fit `width` pixels, broken at + - _ or a space where it can be, else cut
    with an ellipsis."""
    def fits(line: str) -> bool:
        return draw.textlength(line) <= width

    if fits(text):
        return [text]
    cuts = [i + 1 for i, ch in enumerate(text) if ch in "+-_ @"] or [len(text) // 2]
    for cut in sorted(cuts, key=lambda i: abs(i - len(text) / 2)):
        first, second = text[:cut], text[cut:]
        if fits(first) and fits(second):
            return [first, second]
    line = text
    while line and not fits(line + "…"):
        line = line[:-1]
    return [line + "…"]


def grid(run_dir: Path, report: dict[str, Any], frames: list[int] | None = None) -> Path | None:
    """grid.png: top line the outputs, bottom line |row - its baseline| x AMPLIFY; None when nothing is drawable.
    Each column is labelled with the whole row name (on two lines where it is long) and its verdict, each
    difference with what it is taken against. A video shows `frames` side by side (floor_report.grid_frames: first,
    chunk boundary, worst, last), each numbered."""
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
        cells.append((r, out, diff))
    if not cells:
        return None
    h, w = cells[0][1].shape[:2]
    video = any((r["modality"] or "") == "video" for r, _, _ in cells)
    shown = [f for f in (frames or []) if f >= 0] if video else []
    per_frame = w // len(shown) if shown else w
    scale = max(1, 160 // max(h, per_frame))
    ch, cw = h * scale, w * scale
    label = 3 * FONT_PX + 6  # the name on up to two lines, then the verdict
    canvas = Image.new("RGB", (cw * len(cells) + GAP * (len(cells) - 1), 2 * (ch + label)), "white")
    draw = ImageDraw.Draw(canvas)
    for i, (r, out, diff) in enumerate(cells):
        x = i * (cw + GAP)
        colour = {"passed": (0, 120, 0), "failed": (200, 0, 0)}.get(r["status"], (0, 0, 0))
        names = _fit(draw, r["name"], cw - 4)
        for k, line in enumerate(names):
            draw.text((x + 2, 2 + k * FONT_PX), line, fill=colour)
        draw.text((x + 2, 2 + 2 * FONT_PX), r["status"].upper(), fill=colour)
        for j, image in enumerate((out, diff)):
            if image is None or image.shape[:2] != (h, w):
                continue
            tile = Image.fromarray((image * 255).round().astype(np.uint8)).resize((cw, ch), Image.NEAREST)
            top = label + j * (ch + label)
            canvas.paste(tile, (x, top))
            for k, frame in enumerate(shown):  # each frame of a video numbered, a line between two frames
                fx = x + k * per_frame * scale
                if k:
                    draw.line([(fx, top), (fx, top + ch - 1)], fill=(255, 255, 255), width=1)
                draw.rectangle([fx + 1, top + 1, fx + 6 * len(f"f{frame}") + 3, top + FONT_PX + 1], fill=(0, 0, 0))
                draw.text((fx + 2, top + 1), f"f{frame}", fill=(255, 255, 255))
        if diff is not None:
            against = _fit(draw, f"|diff| x{AMPLIFY:g} vs {r['baseline']}", cw - 4)
            for k, line in enumerate(against):
                draw.text((x + 2, ch + label + 2 + k * FONT_PX), line, fill=(0, 0, 0))
    path = run_dir / "grid.png"
    tmp = run_dir / ".grid.png.tmp"
    canvas.save(tmp, format="PNG")
    tmp.replace(path)
    return path
