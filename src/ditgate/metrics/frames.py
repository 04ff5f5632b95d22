"""Per-frame PSNR and SSIM of two model tensors (a transformer's output, latents), the first-step check's numbers.

A tensor is read as frames the way diffusers lays latents out: (B, C, F, H, W) is F frames of C channels (video
latents, `frames_of`), (B, C, H, W) one frame, anything else (packed tokens (B, L, C), audio (B, C, T)) one frame of
flat values. Both tensors are mapped to [0, 1] by the same affine map, the baseline's range over the whole tensor
(so every frame is measured on one scale and a frame of small values is not flattered), then

    PSNR_f = 10 log10(1 / mean over frame f of (candidate - baseline)^2)     (data range 1)
    SSIM_f = the image SSIM of frame f as an H x W image of C channels (`metrics.kernel.frame_sums`)

SSIM needs frames of at least 11 x 11 values (the Gaussian window); below that, and for flat layouts, it is None.
A baseline with one value everywhere has no range: PSNR is inf when the tensors are equal, else 0 dB against a
range of 1.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ditgate.metrics.convert import as_float_tensor, check_finite, require_same_shape
from ditgate.metrics.kernel import WINDOW, frame_sums


def frames_of(x: torch.Tensor) -> torch.Tensor:
    """(F, H, W, C) frames of a (B, C, F, H, W) tensor (the first batch item), (1, H, W, C) of a (B, C, H, W) one,
    (1, 1, N, 1) of any other layout (flat values)."""
    if x.dim() == 5:
        return x[0].permute(1, 2, 3, 0)
    if x.dim() == 4:
        return x[0].permute(1, 2, 0)[None]
    return x.reshape(1, 1, -1, 1)


def frame_scores(baseline: Any, candidate: Any) -> dict[str, list[float | None]]:
    """{"psnr": [per frame, dB], "ssim": [per frame, or None where undefined]} (see the module docstring)."""
    base = as_float_tensor(baseline, "baseline", torch.float32)
    cand = as_float_tensor(candidate, "candidate", torch.float32)
    require_same_shape(base, cand)
    check_finite(base, "baseline")
    check_finite(cand, "candidate")
    low, high = float(base.min()), float(base.max())
    span = (high - low) or 1.0
    x, y = frames_of((base - low) / span), frames_of((cand - low) / span)
    mse = ((x.double() - y.double()) ** 2).mean(dim=(1, 2, 3)).numpy()
    with np.errstate(divide="ignore"):
        psnr = np.where(mse > 0, -10.0 * np.log10(np.where(mse > 0, mse, 1.0)), np.inf)
    ssim: list[float | None] = [None] * x.shape[0]
    if min(x.shape[1], x.shape[2]) >= WINDOW:
        raw = frame_sums(x.contiguous(), y.contiguous())
        ssim = [float(v) for v in np.clip(raw.tile_sums.sum(axis=(1, 2)) / raw.tile_counts.sum(), -1.0, 1.0)]
    return {"psnr": [float(v) for v in psnr], "ssim": ssim}


def chunk_boundaries(frames: int, parts: int) -> list[int]:
    """The frames on each side of the edges between `parts` near-equal chunks of `frames` frames (where the ranks of
    a context-parallel row split a video's sequence frame-major); [] for one part or one frame."""
    if parts < 2 or frames < 2:
        return []
    edges = sorted({(k * frames) // parts for k in range(1, parts)} - {0})
    return sorted({f for e in edges for f in (e - 1, e) if 0 <= f < frames})
