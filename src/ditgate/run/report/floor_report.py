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


def frame_gates(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """The per-frame thresholds the video rows were judged by, from their verdicts: {"psnr": {label: value},
    "ssim": {...}}; a label names the phases that share the value ("cache gate > 30 dB")."""
    found: dict[tuple[str, str, float], list[str]] = {}
    for r in rows:
        for c in (r.get("verdict") or {}).get("checks") or []:
            metric = {"psnr_frame_min": "psnr", "ssim_frame_min": "ssim"}.get(c["metric"])
            if metric and r.get("phase"):
                phases = found.setdefault((metric, c["op"], float(c["threshold"])), [])
                if r["phase"] not in phases:
                    phases.append(r["phase"])
    lines: dict[str, dict[str, float]] = {"psnr": {}, "ssim": {}}
    for (metric, op, value), phases in found.items():
        unit = " dB" if metric == "psnr" else ""
        lines[metric][f"{', '.join(phases)} gate {op} {value:g}{unit}"] = value
    return lines


def _gate(axes, label: str, value: float, low: float, high: float, colour: str) -> None:
    """A gate's threshold: a line where it falls inside the drawn range (widened by half of it), else an entry in the
    legend saying on which side of the axis it lies, so that a far threshold never squeezes the data into a line."""
    span = max(high - low, 1e-9)
    if low - span / 2 <= value <= high + span / 2:
        axes.axhline(value, color=colour, linestyle="--", linewidth=0.8, label=label)
    else:  # named in the legend only
        axes.plot([], [], color=colour, linestyle="--", linewidth=0.8,
                  label=f"{label} ({'below' if value < low else 'above'} the axis)")


def plot_frames(series: dict[str, dict[str, list[float]]], path: Path, rows: list[dict[str, Any]] = ()) -> Path | None:
    """frames.png: per-frame PSNR (top) and SSIM (bottom) of each video row, the calibration row dashed (the floor),
    the gates the rows were judged by (`rows`' verdicts) as lines, identical frames (infinite PSNR) as triangles on
    an "inf" line at the top, the legend beside the plots, plain SSIM ticks."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import ScalarFormatter

    if not series:
        return None
    finite = [v for s in series.values() for v in s["psnr"] if math.isfinite(v)]
    top_finite = max(finite) if finite else 60.0
    low = min(finite) if finite else top_finite
    cap = top_finite + max(3.0, (top_finite - low) * 0.15)  # where identical frames are drawn
    figure = Figure(figsize=(9.5, 5.5), dpi=110)
    FigureCanvasAgg(figure)
    top, bottom = figure.add_subplot(2, 1, 1), figure.add_subplot(2, 1, 2, sharex=None)
    any_inf = False
    for name, s in series.items():
        style = {"color": "black", "linestyle": "--", "label": "calibration (floor)"} if name == _CALIBRATION \
            else {"label": name, "marker": ".", "linewidth": 0.9}
        frames = range(len(s["psnr"]))
        line, = top.plot(frames, [v if math.isfinite(v) else math.nan for v in s["psnr"]], **style)
        inf = [i for i, v in enumerate(s["psnr"]) if not math.isfinite(v)]
        if inf:
            any_inf = True
            top.plot(inf, [cap] * len(inf), linestyle="none", marker="^", color=line.get_color())
        bottom.plot(frames, s["ssim"], **{k: v for k, v in style.items() if k != "label"})
    gates = frame_gates(rows)
    colours = iter(["tab:red", "tab:purple", "tab:brown", "tab:olive"])
    ssim_values = [v for s in series.values() for v in s["ssim"] if math.isfinite(v)] or [1.0]
    for metric, axes, lo, hi in (("psnr", top, low, cap if any_inf else top_finite),
                                 ("ssim", bottom, min(ssim_values), max(ssim_values))):
        for label, value in gates[metric].items():
            _gate(axes, label, value, lo, hi, next(colours, "tab:gray"))
    if any_inf:
        ticks = [t for t in top.get_yticks() if low - 1 <= t < cap - 1]
        top.set_yticks(ticks + [cap], [f"{t:g}" for t in ticks] + ["inf"])
        top.axhline(cap, color="gray", linewidth=0.5)
    formatter = ScalarFormatter(useOffset=False)
    formatter.set_scientific(False)
    bottom.yaxis.set_major_formatter(formatter)
    top.set_ylabel("PSNR (dB)")
    bottom.set_ylabel("SSIM")
    bottom.set_xlabel("frame")
    top.set_xlabel("frame")
    top.set_title("per frame, against each row's baseline" + ("; identical frames: triangles at inf" if any_inf
                                                               else ""), fontsize=10)
    top.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    if bottom.get_legend_handles_labels()[0]:
        bottom.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    figure.tight_layout()
    tmp = path.with_name("." + path.name + ".tmp")
    figure.savefig(tmp, format="png")
    tmp.replace(path)
    return path
