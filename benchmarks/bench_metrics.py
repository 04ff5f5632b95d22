"""PSNR + SSIM: scikit-image frame by frame against ditgate's batched path.

Cases: one 1024x1024 RGB image, and an 81-frame 480x832 RGB clip (a Wan-sized video). Inputs are float32 in
[0, 1]: a smooth textured base and a candidate with small noise added (what a parallel run looks like).
scikit-image runs as it should be called (`structural_similarity(gaussian_weights=True, sigma=1.5,
use_sample_covariance=False, data_range=1, channel_axis=-1)`, `peak_signal_noise_ratio(data_range=1)`), one frame
at a time; ditgate runs `metrics.score_frames` on the whole clip. Printed: seconds, speedup, and the largest
|difference| of the per-frame values from scikit-image's.

    python benchmarks/bench_metrics.py [--device cuda] [--precision float64] [--threads N] [--torchmetrics]
                                       [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np
import torch
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

from ditgate.metrics import score_frames

SK_SSIM = dict(gaussian_weights=True, sigma=1.5, use_sample_covariance=False, data_range=1.0, channel_axis=-1)


def make_clip(frames: int, height: int, width: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32) / max(height, width)
    base = np.empty((frames, height, width, 3), np.float32)
    for f in range(frames):
        for c in range(3):
            base[f, ..., c] = 0.5 + 0.3 * np.sin(9 * xx + 0.1 * f + c) * np.cos(7 * yy - c)
    base += 0.05 * rng.standard_normal(base.shape, dtype=np.float32)
    np.clip(base, 0, 1, out=base)
    cand = np.clip(base + 0.01 * rng.standard_normal(base.shape, dtype=np.float32), 0, 1)
    return base, cand


def time_skimage(base: np.ndarray, cand: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    start = time.perf_counter()
    psnr = np.array([peak_signal_noise_ratio(b, c, data_range=1.0) for b, c in zip(base, cand)])
    ssim = np.array([structural_similarity(b, c, **SK_SSIM) for b, c in zip(base, cand)])
    return time.perf_counter() - start, psnr, ssim


def time_ditgate(base: np.ndarray, cand: np.ndarray, device: str, precision: str, repeat: int):
    x, y = torch.from_numpy(base), torch.from_numpy(cand)
    if device != "cpu":  # time the metric, not the host-to-device copy
        x, y = x.to(device), y.to(device)
    score_frames(x[:1], y[:1], precision=precision)  # warm-up
    best, scores = float("inf"), None
    for _ in range(repeat):
        if device != "cpu":
            torch.cuda.synchronize()
        start = time.perf_counter()
        scores = score_frames(x, y, precision=precision)
        best = min(best, time.perf_counter() - start)
    return best, scores.psnr, scores.ssim


def time_torchmetrics(base: np.ndarray, cand: np.ndarray, device: str) -> tuple[float, np.ndarray]:
    from torchmetrics.functional.image import structural_similarity_index_measure as tm_ssim

    x = torch.from_numpy(base).permute(0, 3, 1, 2).to(device)
    y = torch.from_numpy(cand).permute(0, 3, 1, 2).to(device)
    values = []
    start = time.perf_counter()
    for i in range(0, len(x), 8):  # 8 frames per call keeps the memory of its 11x11 grouped convolution bounded
        _, full = tm_ssim(y[i:i + 8], x[i:i + 8], gaussian_kernel=True, sigma=1.5, kernel_size=11, data_range=1.0,
                          return_full_image=True)
        values.append(full[..., 5:-5, 5:-5].mean(dim=(1, 2, 3)))
    ssim = torch.cat(values).double().cpu().numpy()
    return time.perf_counter() - start, ssim


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="float32", choices=("float32", "float64"))
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--repeat", type=int, default=3, help="ditgate runs per case (best is kept)")
    parser.add_argument("--torchmetrics", action="store_true", help="also time torchmetrics' SSIM (slow on a CPU)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's own choice)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    cases = [("image 1024x1024", 1, 1024, 1024), (f"clip {args.frames}x480x832", args.frames, 480, 832)]
    rows = []
    for name, frames, height, width in cases:
        base, cand = make_clip(frames, height, width)
        t_sk, psnr_sk, ssim_sk = time_skimage(base, cand)
        t_dg, psnr_dg, ssim_dg = time_ditgate(base, cand, args.device, args.precision, args.repeat)
        row = {"case": name, "skimage_s": t_sk, "ditgate_s": t_dg, "speedup": t_sk / t_dg,
               "max_abs_diff_psnr_db": float(np.abs(psnr_dg - psnr_sk).max()),
               "max_abs_diff_ssim": float(np.abs(ssim_dg - ssim_sk).max()),
               "ssim_mean": float(ssim_sk.mean()), "psnr_mean_db": float(psnr_sk.mean())}
        if args.torchmetrics:
            t_tm, ssim_tm = time_torchmetrics(base, cand, args.device)
            row.update(torchmetrics_s=t_tm, torchmetrics_max_abs_diff_ssim=float(np.abs(ssim_tm - ssim_sk).max()))
        rows.append(row)

    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or "CPU"
    print(f"ditgate {args.precision} on {args.device} ({where}); torch threads {torch.get_num_threads()}, "
          f"CPUs {os.cpu_count()}; scikit-image on the CPU, one frame at a time")
    header = f"{'case':<20} {'skimage s':>10} {'ditgate s':>10} {'speedup':>8} {'max|dPSNR| dB':>14} {'max|dSSIM|':>11}"
    if args.torchmetrics:
        header += f" {'torchmetrics s':>15} {'tm max|dSSIM|':>14}"
    print(header)
    for r in rows:
        line = (f"{r['case']:<20} {r['skimage_s']:>10.3f} {r['ditgate_s']:>10.3f} {r['speedup']:>7.1f}x "
                f"{r['max_abs_diff_psnr_db']:>14.1e} {r['max_abs_diff_ssim']:>11.1e}")
        if args.torchmetrics:
            line += f" {r['torchmetrics_s']:>15.3f} {r['torchmetrics_max_abs_diff_ssim']:>14.1e}"
        print(line)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"device": args.device, "precision": args.precision, "threads": torch.get_num_threads(),
                       "cpus": os.cpu_count(), "rows": rows}, out, indent=2)


if __name__ == "__main__":
    main()
