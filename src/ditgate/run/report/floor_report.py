"""The report's parts about the calibrated floor and video frames: the floor table of a reduced-precision run (each
gated row's numbers next to the floor, and in words where a row sits at it), the per-frame PSNR/SSIM plot of video
rows (frames.png, the calibration row drawn as the floor), and which frames the grid shows.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ditgate.gates.verdicts import format_value
from ditgate.run.exec import files as store

FRAMES_PLOT = "frames.png"
_MAIN = {"image": "psnr", "video": "psnr_frame_min", "audio": "si_sdr"}
_CALIBRATION = "calibration"


def _text(metric: str, value: Any) -> str:
    if value is None:
        return "–"
    return value if isinstance(value, str) else format_value(metric, value)


def floor_lines(report: dict[str, Any]) -> list[str]:
    """The floor section of report.md; [] when no row was judged against a floor measured in reduced precision."""
    from ditgate.gates.calibration import reduced_precision
    from ditgate.gates.floor import at_floor, rule

    if not reduced_precision(report["dtype"]):
        return []
    rows = [r for r in report["rows"] if (r.get("verdict") or {}).get("floor")]
    if not rows:
        if any(r["name"] == _CALIBRATION for r in report["rows"]):
            return []
        return ["", f"## The calibrated floor ({report['dtype']})", "",
                "No calibration row ran: the gates kept their defaults."]
    spec = rule()["final"]
    header = ("| row | phase | first step, worst frame (chunk boundaries) | threshold | final | floor | threshold | "
              "latents | allowed |")
    lines = ["", f"## The calibrated floor ({report['dtype']}: the calibration row against the baseline)", "",
             header, "|---|---|---|---|---|---|---|---|---|"]
    words = []
    for r in rows:
        v = r["verdict"]
        floor = v["floor"]
        metric = _MAIN.get(r["modality"] or "image", "psnr")
        measured = floor.get("measured") or {}
        threshold = next((c["threshold"] for c in v.get("checks", []) if c["metric"] == metric), None)
        first = v.get("first_step") or {}
        first_check = next((c for c in first.get("checks", []) if c["metric"] == "psnr_frame_min"), None)
        boundary = (first.get("summary") or {}).get("psnr_boundary_min")
        first_text = "–" if first_check is None else _text("psnr", first_check["value"]) + (
            f" ({_text('psnr', boundary)})" if boundary is not None else "")
        latent = v.get("latent_floor") or next(  # a lossy row: its own latent check, calibrated for cache
            (c for c in v.get("checks", []) if c["metric"] in ("disp_rel_error", "rel_error")), {})
        lines.append(
            f"| {r['name']} | {r['phase']} | {first_text} | "
            f"{'–' if first_check is None else '> ' + format(first_check['threshold'], 'g') + ' dB'} | "
            f"{_text(metric, (r['metrics'] or {}).get(metric))} | {_text(metric, measured.get(metric))} | "
            f"{'–' if threshold is None else format_value(metric, threshold, threshold=True)} | "
            f"{_text('rel_error', latent.get('value'))} | {_text('rel_error', latent.get('threshold'))} |")
        value = (r["metrics"] or {}).get(metric)
        if at_floor(value, measured.get(metric), metric, spec) and r["status"] == "passed":
            words.append(f"- **{r['name']}** sits at the floor: {_text(metric, value)} against the calibration row's "
                         f"{_text(metric, measured.get(metric))} (within the {spec['margin_db']:g} dB margin): as close "
                         "to the baseline as one rounding error per transformer output leaves this configuration, "
                         "so the rounding of the run dtype, not the integration, limits it.")
        if floor.get("note"):
            words.append(f"- {r['name']}: {floor['note']}.")
    lines += ["", ("Exact phases must reach the floor less the margin of gates.json `rules.reduced_precision`, and "
                   "their latents may move at most its factor times as far as the calibration row's; lossy phases "
                   "keep the looser of their default and the floor's value.")]
    return lines + ([""] + sorted(set(words), key=words.index) if words else [])


def frame_series(run_dir: Path, report: dict[str, Any]) -> dict[str, dict[str, list[float]]]:
    """Per-frame PSNR and SSIM of each video row against the row it is compared with (the calibration row against
    the baseline: the floor)."""
    from ditgate.metrics import score_frames

    series = {}
    for r in report["rows"]:
        if r["modality"] != "video" or r["status"] == "error" or not (r["baseline"] or r["name"] == _CALIBRATION):
            continue
        base = store.load_array(run_dir, r["baseline"] or "baseline", "output")
        out = store.load_array(run_dir, r["name"], "output")
        if base is None or out is None or base.shape != out.shape or not np.isfinite(out).all():
            continue
        scores = score_frames(base, out)
        series[r["name"]] = {"psnr": [float(x) for x in scores.psnr], "ssim": [float(x) for x in scores.ssim]}
    return series


def grid_frames(series: dict[str, dict[str, list[float]]], frames: int) -> list[int]:
    """The frames a video grid shows: the first, the middle (where two ranks' chunks meet), the worst of any row,
    the last."""
    lows = [(min(s["psnr"]), int(np.argmin(s["psnr"]))) for name, s in series.items()
            if name != _CALIBRATION and s["psnr"] and math.isfinite(min(s["psnr"]))]
    worst_row = min(lows)[1] if lows else None
    picks = [0, frames // 2] + ([worst_row] if worst_row is not None else []) + [frames - 1]
    return sorted({f for f in picks if 0 <= f < frames})


def plot_frames(series: dict[str, dict[str, list[float]]], path: Path) -> Path | None:
    """frames.png: per-frame PSNR (top) and SSIM (bottom) of each video row; the calibration row dashed, the floor."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not series:
        return None
    finite = [v for s in series.values() for v in s["psnr"] if math.isfinite(v)]
    cap = (max(finite) if finite else 60.0) + 5.0  # identical frames (infinite PSNR) are drawn at the top
    figure = Figure(figsize=(8, 5.5), dpi=110)
    FigureCanvasAgg(figure)
    top, bottom = figure.add_subplot(2, 1, 1), figure.add_subplot(2, 1, 2)
    for name, s in series.items():
        style = {"color": "black", "linestyle": "--", "label": "calibration (floor)"} if name == _CALIBRATION \
            else {"label": name, "marker": ".", "linewidth": 0.9}
        top.plot([v if math.isfinite(v) else cap for v in s["psnr"]], **style)
        bottom.plot(s["ssim"], **style)
    top.set_ylabel("PSNR (dB)")
    bottom.set_ylabel("SSIM")
    bottom.set_xlabel("frame")
    top.set_title("per frame, against each row's baseline; identical frames at the top")
    top.legend(fontsize=7, loc="lower left")
    figure.tight_layout()
    tmp = path.with_name("." + path.name + ".tmp")
    figure.savefig(tmp, format="png")
    tmp.replace(path)
    return path
