"""The pictures people read: grid.png labels whole (two lines where long) with each video frame numbered,
frames.png with the rows' gates and infinite PSNR drawn as such, speedup_vs_psnr.png with error bars over repeats,
diff.png with the block boundaries."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw


def test_grid_labels_are_whole_or_broken_between_words():
    from ditgate.run.report.grid import _fit

    draw = ImageDraw.Draw(Image.new("RGB", (10, 10)))
    assert _fit(draw, "cache", 120) == ["cache"]
    long = "cache-balanced+cp-ulysses-2"
    lines = _fit(draw, long, 120)
    assert len(lines) == 2 and "".join(lines) == long and all(draw.textlength(l) <= 120 for l in lines)
    assert _fit(draw, "x" * 80, 60)[0].endswith("…")


def test_video_grid_numbers_its_frames(wan_default_run):
    import json

    from ditgate.run.report.grid import FONT_PX, grid

    _, run_dir = wan_default_run
    report = json.loads((run_dir / "report.json").read_text())
    frames = report["grid_frames"]
    assert len(frames) >= 3
    picture = np.asarray(Image.open(grid(run_dir, report, frames)).convert("RGB")).astype(int)
    first = next(r for r in report["rows"] if r["status"] != "error")
    video = np.load(run_dir / "rows" / first["name"] / "output.npy")
    scale = max(1, 160 // max(video.shape[1], video.shape[2]))
    label = 3 * FONT_PX + 6
    for k in range(len(frames)):  # a black box with white text at the top-left corner of each frame
        x = k * video.shape[2] * scale
        box = picture[label + 1:label + FONT_PX, x + 1:x + 12]
        assert (box.sum(axis=-1) == 0).mean() > 0.3 and (box.min(axis=-1) >= 200).any(), k  # white text on black


def test_frames_plot_takes_the_gates_of_the_rows(tmp_path):
    from ditgate.run.report.floor_report import frame_gates, plot_frames

    rows = [{"name": "cache", "phase": "cache", "verdict": {"checks": [
        {"metric": "psnr_frame_min", "op": ">", "threshold": 30.0}, {"metric": "ssim_frame_min", "op": ">",
                                                                    "threshold": 0.9}]}},
            {"name": "cp-ulysses-2", "phase": "cp", "verdict": {"checks": [
                {"metric": "psnr_frame_min", "op": ">", "threshold": 35.0}]}}]
    gates = frame_gates(rows)
    assert gates["psnr"] == {"cache gate > 30 dB": 30.0, "cp gate > 35 dB": 35.0}
    assert gates["ssim"] == {"cache gate > 0.9": 0.9}
    series = {"cache": {"psnr": [40.0, 33.0, 36.0], "ssim": [0.99, 0.95, 0.97]},
              "cp-ulysses-2": {"psnr": [math.inf] * 3, "ssim": [1.0] * 3}}
    path = plot_frames(series, tmp_path / "frames.png", rows)
    assert path.is_file() and Image.open(path).size[0] > 900


def test_speedup_error_bars_span_the_repeats(tmp_path):
    from ditgate.perf.matrix import _speedup_range, plot

    assert _speedup_range({"times": [1.0, 2.0, 1.5]}, 3.0) == (1.5, 3.0)
    assert _speedup_range({"times": [1.0]}, 3.0) is None
    data = {"model": "zoo:flux", "tier": "A", "device": "cpu", "rows": [
        {"name": "baseline", "latency_s": 2.0, "speedup": None, "psnr": None, "status": "reference", "times": [2.0]},
        {"name": "cache-fast", "latency_s": 1.0, "speedup": 2.0, "psnr": 40.0, "status": "passed",
         "times": [0.9, 1.0, 1.2], "predicted": 2.2},
        {"name": "cp-ulysses-2", "latency_s": 1.5, "speedup": 1.33, "psnr": math.inf, "status": "passed",
         "times": [1.5, 1.6], "predicted": None}]}
    assert plot(data, tmp_path / "p.png", {"cache gate 30 dB": 30.0}).is_file()


def test_diff_plot_finds_the_blocks():
    from ditgate.run.diff.report import _block_of

    assert _block_of("transformer.single_transformer_blocks.3.attn.to_q") == ("transformer",
                                                                              "single_transformer_blocks.3")
    assert _block_of("text_encoder[last_hidden_state]") == ("text_encoder", None)
    assert _block_of("transformer.proj_out") == ("transformer", None)
