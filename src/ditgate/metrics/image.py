"""PSNR, SSIM and worst-tile SSIM of images and videos against their baseline.

Every input goes through `convert.as_frames` (float32 in [0, 1], data range 1), then through the batched kernel in
`ssim.py`, which returns per-frame squared errors and per-tile SSIM sums in one pass over the clip. An image is a
clip of one frame. The numbers:

- PSNR = 10 log10(1 / MSE) in dB (inf when the frames are identical);
- SSIM = mean of the Gaussian-window SSIM map (scikit-image's `gaussian_weights=True, sigma=1.5,
  use_sample_covariance=False, data_range=1`), channels weighted equally;
- tile SSIM = mean of the same map over each cell of a `grid` x `grid` split of the map (near-equal cells); the
  worst tile catches a corrupted region that the global mean hides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ditgate.core.errors import MetricInputError
from ditgate.metrics.convert import as_frames, require_same_shape
from ditgate.metrics.kernel import KernelOutput, frame_sums


@dataclass(frozen=True)
class WorstTile:
    """The lowest tile SSIM and where it is (frame index, tile row, tile column; (0, 0) is top-left)."""

    value: float
    frame: int
    row: int
    col: int


@dataclass(frozen=True)
class FrameScores:
    """Scores of every frame (or image) of a candidate against its baseline."""

    mse: np.ndarray    # (N,) mean squared error, in units of the [0, 1] range
    ssim: np.ndarray   # (N,) mean SSIM per frame
    tiles: np.ndarray  # (N, grid, grid) SSIM per tile

    @property
    def frames(self) -> int:
        return len(self.mse)

    @property
    def grid(self) -> int:
        return self.tiles.shape[-1]

    @property
    def psnr(self) -> np.ndarray:
        """PSNR per frame in dB; inf where a frame is identical to its baseline."""
        return _psnr_of(self.mse)

    @property
    def clip_psnr(self) -> float:
        """PSNR of all frames' pixels together (from the mean MSE); finite unless every frame is identical."""
        return float(_psnr_of(np.array([self.mse.mean()]))[0])

    @classmethod
    def from_sums(cls, raw: KernelOutput, pixels_per_frame: int) -> FrameScores:
        """Per-frame scores from the kernel's sums (`pixels_per_frame` = H x W x C); SSIM is clipped to [-1, 1],
        its mathematical range, which float32 rounding can overshoot by about 1e-7."""
        ssim = np.clip(raw.tile_sums.sum(axis=(1, 2)) / raw.tile_counts.sum(), -1.0, 1.0)
        return cls(mse=raw.sse / pixels_per_frame, ssim=ssim, tiles=np.clip(raw.tile_sums / raw.tile_counts, -1.0, 1.0))

    def worst_tile(self) -> WorstTile:
        frame, row, col = np.unravel_index(int(np.argmin(self.tiles)), self.tiles.shape)
        return WorstTile(float(self.tiles[frame, row, col]), int(frame), int(row), int(col))


_PRECISIONS = {"float32": torch.float32, "float64": torch.float64}


def _psnr_of(mse: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(mse > 0, -10.0 * np.log10(np.maximum(mse, 1e-300)), np.inf)


def _device_for(device: str | torch.device | None, *inputs: Any) -> torch.device:
    if device is not None:
        return torch.device(device)
    for x in inputs:
        if isinstance(x, torch.Tensor):
            return x.device
    return torch.device("cpu")


def score_frames(baseline: Any, candidate: Any, *, grid: int = 1, layout: str | None = None,
                 value_range: tuple[float, float] | None = None,
                 device: str | torch.device | None = None, precision: str = "float32") -> FrameScores:
    """Per-frame MSE, SSIM and tile SSIM of `candidate` against `baseline`.

    Both are one image, a batch or a video in any accepted form (see `convert.as_frames`); `layout` and
    `value_range` apply to both. `device` defaults to the device of a torch input, else the CPU. `precision`
    ("float32" or "float64") is what the SSIM statistics are computed in; see `kernel.frame_sums` for the accuracy
    of each (float32: about 1e-8 on natural images, at worst about 1e-4 on flat regions offset by a constant).
    """
    if precision not in _PRECISIONS:
        raise MetricInputError(f"precision must be one of {sorted(_PRECISIONS)}, got {precision!r}")
    if not isinstance(grid, int) or grid < 1:
        raise MetricInputError(f"grid must be a positive integer, got {grid!r}")
    where = _device_for(device, baseline, candidate)
    base = as_frames(baseline, layout=layout, value_range=value_range, name="baseline", device=where)
    cand = as_frames(candidate, layout=layout, value_range=value_range, name="candidate", device=where)
    require_same_shape(base, cand)
    raw = frame_sums(base, cand, grid, _PRECISIONS[precision])
    return FrameScores.from_sums(raw, base.shape[1] * base.shape[2] * base.shape[3])


def psnr(baseline: Any, candidate: Any, **options: Any) -> float:
    """PSNR in dB (data range 1) of one image; of several frames, the PSNR of all their pixels together."""
    return score_frames(baseline, candidate, **options).clip_psnr


def ssim(baseline: Any, candidate: Any, **options: Any) -> float:
    """Gaussian-window SSIM of one image; of several frames, the mean over frames."""
    return float(score_frames(baseline, candidate, **options).ssim.mean())


def worst_tile_ssim(baseline: Any, candidate: Any, grid: int = 4, **options: Any) -> float:
    """The lowest SSIM of any tile of a `grid` x `grid` split, over all frames."""
    return score_frames(baseline, candidate, grid=grid, **options).worst_tile().value


def image_metrics(scores: FrameScores) -> dict[str, float]:
    """Metrics of the image modality. For a batch of images each is the worst image's value (a gate must hold for
    every image)."""
    return {
        "psnr": float(scores.psnr.min()),
        "ssim": float(scores.ssim.min()),
        "worst_tile_ssim": scores.worst_tile().value,
    }


def video_metrics(scores: FrameScores) -> dict[str, float]:
    """Metrics of the video modality: the clip's PSNR (pooled MSE), per-frame mean and minimum of PSNR and SSIM,
    and the worst tile over all frames. `psnr_frame_mean` is inf when any frame is identical to its baseline."""
    psnr_frames = scores.psnr
    return {
        "psnr": scores.clip_psnr,
        "psnr_frame_mean": float(psnr_frames.mean()),
        "psnr_frame_min": float(psnr_frames.min()),
        "ssim": float(scores.ssim.mean()),
        "ssim_frame_min": float(scores.ssim.min()),
        "worst_tile_ssim": scores.worst_tile().value,
    }
