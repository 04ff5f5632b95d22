"""Metrics that compare a candidate output with its baseline, correctly.

- `image`  : PSNR, Gaussian-window SSIM (equal to scikit-image's) and worst-tile SSIM of images and videos,
             on float32 in [0, 1] with data range 1, a whole clip per call (CPU or GPU);
- `tensor` : max-abs, relative error, cosine similarity and displacement-relative error of latents;
- `audio`  : SI-SDR of waveforms, PSNR and SSIM of log-mel spectrograms;
- `convert`: how inputs are read (layouts, value ranges) and what is refused.

May import: `ditgate.core.errors` only; metrics are functions of arrays and know nothing of gates or runs.
"""

from ditgate.metrics.audio import audio_metrics, mel_psnr, mel_ssim, si_sdr
from ditgate.metrics.image import FrameScores, WorstTile, image_metrics, psnr, score_frames, ssim, video_metrics, worst_tile_ssim
from ditgate.metrics.tensor import cosine, disp_rel_error, max_abs, rel_error, tensor_metrics

__all__ = [
    "FrameScores", "WorstTile", "audio_metrics", "cosine", "disp_rel_error", "image_metrics", "max_abs",
    "mel_psnr", "mel_ssim", "psnr", "rel_error", "score_frames", "si_sdr", "ssim", "tensor_metrics",
    "video_metrics", "worst_tile_ssim",
]
