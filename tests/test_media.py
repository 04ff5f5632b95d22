"""Row outputs a person opens: output.png per image row (equal to the stored array, rounded to 8 bits), a video file
per video row (MP4 through diffusers' export_to_video where an encoder is installed, else GIF) whose frame count
reads back as the stored video's, each linked from report.md."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image


def _frame_count(path: Path) -> int:
    if path.suffix == ".gif":
        return Image.open(path).n_frames
    import imageio

    return sum(1 for _ in imageio.get_reader(path))


def _linked(out: Path) -> set[str]:
    links = set(re.findall(r"\]\((rows/[^)]+)\)", (out / "report.md").read_text()))
    assert all((out / link).is_file() for link in links), links
    return links


def test_image_row_writes_a_png_equal_to_its_array(flux_default_run):
    from ditgate.run.exec.files import to_uint8

    report, out = flux_default_run
    for name in ("baseline", "cache", "cp-ulysses-2"):
        folder = out / "rows" / name
        stored = np.load(folder / "output.npy")
        png = np.asarray(Image.open(folder / "output.png"))
        assert png.dtype == np.uint8 and png.shape == stored.shape
        assert np.array_equal(png, to_uint8(stored))
        assert f"rows/{name}/output.png" in _linked(out)
    # the PNG is the row's own output: the cached row differs from the baseline somewhere
    base = np.asarray(Image.open(out / "rows" / "baseline" / "output.png"))
    assert not np.array_equal(base, np.asarray(Image.open(out / "rows" / "cache" / "output.png")))


def test_video_row_writes_a_playable_file_with_every_frame(wan_default_run):
    report, out = wan_default_run
    for name in ("baseline", "cache", "cp-ulysses-2"):
        folder = out / "rows" / name
        stored = np.load(folder / "output.npy")
        files = sorted(folder.glob("output.mp4")) + sorted(folder.glob("output.gif"))
        assert len(files) == 1, files
        assert _frame_count(files[0]) == stored.shape[0] > 1
        assert Image.open(files[0]).size == (stored.shape[2], stored.shape[1]) if files[0].suffix == ".gif" else True
        assert f"rows/{name}/{files[0].name}" in _linked(out)


def test_no_viewable_file_for_a_non_finite_output():
    from ditgate.run.exec.files import viewable

    image = np.full((8, 8, 3), 0.5, dtype=np.float32)
    assert set(viewable(image, "image")) == {"output.png"}
    image[0, 0, 0] = np.nan
    assert viewable(image, "image") == {}


@pytest.mark.parametrize("frames", [3])
def test_gif_fallback_keeps_the_frames(frames):
    import io

    from ditgate.run.exec.files import video_bytes

    video = np.stack([np.full((16, 24, 3), i / frames, dtype=np.float32) for i in range(frames)])
    name, data = video_bytes(video)
    assert name in ("output.mp4", "output.gif")
    if name == "output.gif":
        assert Image.open(io.BytesIO(data)).n_frames == frames


def test_mp4_where_an_encoder_is_installed(tmp_path):
    """With imageio-ffmpeg installed a video row is an MP4 (odd sides padded by one repeated line, H.264 needs even
    ones); every frame reads back."""
    pytest.importorskip("imageio_ffmpeg")
    import imageio

    from ditgate.run.exec.files import video_bytes

    video = np.random.default_rng(0).random((5, 33, 35, 3)).astype(np.float32)
    name, data = video_bytes(video)
    assert name == "output.mp4" and data
    (tmp_path / name).write_bytes(data)
    reader = imageio.get_reader(tmp_path / name)
    frames = [frame for frame in reader]
    assert len(frames) == 5 and frames[0].shape == (34, 36, 3)
    assert np.abs(frames[2][:33, :35] / 255.0 - video[2]).mean() < 0.2  # lossy, but the same picture
