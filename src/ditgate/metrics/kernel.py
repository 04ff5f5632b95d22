"""The SSIM and squared-error kernel: whole batches of frames in a few torch calls, on CPU or GPU.

SSIM is Wang et al.'s definition with a Gaussian window, exactly as scikit-image computes it with
`structural_similarity(gaussian_weights=True, sigma=1.5, use_sample_covariance=False, data_range=1)`:
- window: Gaussian, sigma 1.5, truncated at 3.5 sigma (radius 5, 11 taps), weights normalised to sum 1;
- constants C1 = (0.01 * L)^2, C2 = (0.03 * L)^2 with data range L = 1 (inputs are float32 in [0, 1]);
- the local statistics are filtered only where the whole window fits ("valid" filtering), which is the same set
  of pixels scikit-image keeps after it crops a border of (11 - 1) / 2 = 5 pixels, so the mean is over the same
  (H - 10) x (W - 10) pixels per channel; channels are averaged with equal weight.

torchmetrics' `structural_similarity_index_measure` computes the same per-pixel map but pads by reflection and
averages the border too, which moves the result by about 1e-4 from scikit-image; with `return_full_image=True` and
the 5-pixel crop it agrees with this kernel to 1e-6 (tests/test_metrics.py checks both). It is not used here:
its 11x11 non-separable grouped convolution is slower on a CPU than scikit-image itself (benchmarks/README.md).
This kernel filters separably (11 + 11 taps) with matrix products (`GaussianFilter`), the four maps it needs
(x, y, x^2 + y^2, xy for every channel of every frame) side by side in one planar buffer, so a whole chunk of
frames is filtered by a few dozen GEMMs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ditgate.core.errors import MetricInputError

SIGMA = 1.5
TRUNCATE = 3.5
RADIUS = int(TRUNCATE * SIGMA + 0.5)  # 5, as scipy.ndimage.gaussian_filter and scikit-image compute it
WINDOW = 2 * RADIUS + 1  # 11
DATA_RANGE = 1.0
K1, K2 = 0.01, 0.03
C1 = (K1 * DATA_RANGE) ** 2
C2 = (K2 * DATA_RANGE) ** 2

# Work sizes. On a CPU one strip of output rows of one frame at a time keeps the working set in cache (the
# element-wise steps are memory bound there); on a GPU many whole frames go into each call.
BAND = 32                     # outputs per block of the banded filter matrices
CPU_STRIP_ROWS = 64           # SSIM-map rows per strip on a CPU
GPU_CHUNK_ELEMENTS = 1 << 25  # input elements (frames x H x W x C) per chunk on a GPU
# A frame of up to this many elements (H x W x C; 512 x 512 x 3 is 786k) is filtered on one CPU thread: its GEMMs
# ((32, 42) by (42, 4 C W)) are too small to split, and threads only wait on each other (measured on the 2-core
# machine under load: 128 x 128 x 3 in 0.006-0.013 s on one thread, 0.08-0.43 s on two; the sums bit for bit equal)
ONE_THREAD_FRAME = 1 << 20


def gaussian_window(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The 11 normalised taps of the Gaussian window (sigma 1.5)."""
    offsets = torch.arange(-RADIUS, RADIUS + 1, dtype=torch.float64)
    taps = torch.exp(-0.5 * (offsets / SIGMA) ** 2)
    return (taps / taps.sum()).to(device=device, dtype=dtype)


class GaussianFilter:
    """Valid-mode separable Gaussian filtering as dense matrix products.

    Filtering n outputs along an axis is a banded (n, n + 10) matrix times the data. The band is cut into blocks of
    BAND outputs, so each block is a small dense (BAND, BAND + 10) matrix applied with one GEMM: (BAND + 10) / 11
    times the multiply-adds of a direct 11-tap filter, but run at matrix-multiply speed, with no transposes and no
    copies (outputs are written in place through `out=`). The data is laid out (H, ..., W): rows are filtered by
    multiplying from the left, columns by multiplying from the right.
    """

    def __init__(self, device: torch.device | str, dtype: torch.dtype = torch.float32):
        taps = gaussian_window(device, dtype)
        band = torch.zeros(BAND, BAND + 2 * RADIUS, dtype=dtype, device=device)
        for i in range(BAND):
            band[i, i:i + WINDOW] = taps
        self.left = band
        self.right = band.t().contiguous()

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        """(h, ..., w) contiguous -> (h - 10, ..., w - 10)."""
        h, w = z.shape[0], z.shape[-1]
        middle = z.shape[1:-1]
        oh, ow = h - 2 * RADIUS, w - 2 * RADIUS
        rows = z.reshape(h, -1)
        across = torch.empty(oh, rows.shape[1], dtype=z.dtype, device=z.device)
        for r in range(0, oh, BAND):
            s = min(BAND, oh - r)
            torch.mm(self.left[:s, :s + 2 * RADIUS], rows[r:r + s + 2 * RADIUS], out=across[r:r + s])
        cols = across.view(-1, w)
        out = torch.empty(cols.shape[0], ow, dtype=z.dtype, device=z.device)
        for c in range(0, ow, BAND):
            s = min(BAND, ow - c)
            torch.mm(cols[:, c:c + s + 2 * RADIUS], self.right[:s + 2 * RADIUS, :s], out=out[:, c:c + s])
        return out.view(oh, *middle, ow)


def ssim_map(x: torch.Tensor, y: torch.Tensor, shift: torch.Tensor | None = None,
             blur: GaussianFilter | None = None) -> torch.Tensor:
    """Per-pixel SSIM of float32 (n, h, w, c) frames in [0, 1] -> map of shape (h - 10, n, c, w - 10).

    `shift` (broadcastable to (n, 1, 1, c)) is subtracted before the second moments are filtered and added back to
    the means: variances and covariances do not change under a constant shift, and float32 sums of centred values
    lose far less to cancellation (without it the mean SSIM of a smooth image is off by about 1e-5). By default it
    is the mean of both inputs per frame and channel (frame_sums calls this per strip of rows, so the shift
    follows the image's brightness down the frame). Inputs may be float32 or float64; the map has their dtype.
    """
    n, h, w, c = x.shape
    if blur is None:
        blur = GaussianFilter(x.device, x.dtype)
    if shift is None:
        shift = (x.mean(dim=(1, 2), keepdim=True) + y.mean(dim=(1, 2), keepdim=True)) / 2
    shift = shift.expand(n, 1, 1, c).permute(1, 0, 3, 2)           # (1, n, c, 1)
    z = torch.empty(h, n, 4, c, w, dtype=x.dtype, device=x.device)  # x, y, x^2 + y^2, xy, centred; planar
    xc, yc, sq, xy = z.unbind(2)
    torch.sub(x.permute(1, 0, 3, 2), shift, out=xc)
    torch.sub(y.permute(1, 0, 3, 2), shift, out=yc)
    torch.mul(xc, xc, out=sq).addcmul_(yc, yc)
    torch.mul(xc, yc, out=xy)
    mu_x, mu_y, sq, xy = blur(z).unbind(2)                          # each (h - 10, n, c, w - 10)
    cs_num = xy.mul_(2).add_(C2).addcmul_(mu_x, mu_y, value=-2)                          # 2 cov + C2
    cs_den = sq.add_(C2).addcmul_(mu_x, mu_x, value=-1).addcmul_(mu_y, mu_y, value=-1)   # var_x + var_y + C2
    mu_x, mu_y = mu_x.add_(shift), mu_y.add_(shift)
    c1 = torch.tensor(C1, dtype=x.dtype, device=x.device)
    l_num = torch.addcmul(c1, mu_x, mu_y, value=2)                                       # 2 mu_x mu_y + C1
    l_den = torch.addcmul(c1, mu_x, mu_x).addcmul_(mu_y, mu_y)                           # mu_x^2 + mu_y^2 + C1
    return l_num.mul_(cs_num).div_(l_den.mul_(cs_den))


def check_size(height: int, width: int, grid: int = 1) -> None:
    """Refuse frames the SSIM window (11 x 11) does not fit, or too small for a `grid` x `grid` split of the map."""
    if min(height, width) < WINDOW:
        raise MetricInputError(
            f"image {height}x{width} is smaller than the {WINDOW}x{WINDOW} SSIM window; SSIM is undefined there")
    if min(height, width) - 2 * RADIUS < grid:
        raise MetricInputError(
            f"image {height}x{width} is too small for a {grid}x{grid} tile grid (needs at least "
            f"{grid + 2 * RADIUS} pixels per side)")


@dataclass(frozen=True)
class KernelOutput:
    """Raw per-frame sums (float64 NumPy): squared error over all pixels, SSIM-map sum per tile."""

    sse: np.ndarray          # (N,)
    tile_sums: np.ndarray    # (N, grid, grid)
    tile_counts: np.ndarray  # (grid, grid): map pixels x channels per tile


def _segments(length: int, grid: int, device: torch.device) -> tuple[torch.Tensor, np.ndarray]:
    """One-hot (length, grid) float64 matrix of near-equal segments, and each segment's size."""
    edges = [(i * length) // grid for i in range(grid + 1)]
    index = torch.zeros(length, dtype=torch.long)
    for i in range(grid):
        index[edges[i]:edges[i + 1]] = i
    onehot = F.one_hot(index, grid).to(device=device, dtype=torch.float64)
    return onehot, np.diff(edges)


def frame_sums(x: torch.Tensor, y: torch.Tensor, grid: int = 1,
               precision: torch.dtype = torch.float32) -> KernelOutput:
    """See `_frame_sums`; small frames on a CPU are filtered on one thread (ONE_THREAD_FRAME)."""
    threads = torch.get_num_threads()
    if x.device.type != "cpu" or threads == 1 or x.numel() > ONE_THREAD_FRAME * max(1, x.shape[0]):
        return _frame_sums(x, y, grid, precision)
    torch.set_num_threads(1)
    try:
        return _frame_sums(x, y, grid, precision)
    finally:
        torch.set_num_threads(threads)


def _frame_sums(x: torch.Tensor, y: torch.Tensor, grid: int = 1,
                precision: torch.dtype = torch.float32) -> KernelOutput:
    """Squared error and SSIM tile sums of two float32 (N, H, W, C) batches in [0, 1] on the same device.

    `precision` is the dtype the SSIM statistics are computed in. float32 (the default) agrees with scikit-image
    (float64) to about 1e-8 on natural and noisy images; where a large flat region differs by a constant offset
    between the inputs, float32 rounding of the local variance (relative to C2 = 9e-4) can move SSIM by up to about
    1e-4. float64 agrees to 1e-9 everywhere and takes about 2.3 times as long on a CPU.
    """
    n, h, w, c = x.shape
    check_size(h, w, grid)
    if precision not in (torch.float32, torch.float64):
        raise MetricInputError(f"precision must be torch.float32 or torch.float64, got {precision}")
    mh, mw = h - 2 * RADIUS, w - 2 * RADIUS
    blur = GaussianFilter(x.device, precision)
    col_onehot, col_sizes = _segments(mw, grid, x.device)
    row_onehot, row_sizes = _segments(mh, grid, x.device)
    if x.device.type == "cpu":
        frames_per_chunk, strip = 1, CPU_STRIP_ROWS
    else:
        frames_per_chunk, strip = max(1, GPU_CHUNK_ELEMENTS // (h * w * c)), mh
    sse = torch.empty(n, dtype=torch.float64, device=x.device)
    identical = torch.empty(n, dtype=torch.bool, device=x.device)
    row_tiles = torch.empty(mh, n, grid, dtype=torch.float64, device=x.device)  # per map row: sum per tile column
    for f0 in range(0, n, frames_per_chunk):
        f1 = min(n, f0 + frames_per_chunk)
        xs, ys = x[f0:f1], y[f0:f1]
        diff = xs - ys
        identical[f0:f1] = (diff == 0).flatten(1).all(dim=1)
        sse[f0:f1] = torch.sum(diff.mul_(diff), dim=(1, 2, 3), dtype=torch.float64)
        xp, yp = xs.to(precision), ys.to(precision)
        for r0 in range(0, mh, strip):
            r1 = min(mh, r0 + strip)
            m = ssim_map(xp[:, r0:r1 + 2 * RADIUS], yp[:, r0:r1 + 2 * RADIUS], blur=blur)
            row_tiles[r0:r1, f0:f1] = m.sum(dim=2).to(torch.float64) @ col_onehot
    tile_sums = torch.einsum("rg,rnk->ngk", row_onehot, row_tiles)
    counts = np.outer(row_sizes, col_sizes) * c
    tile_sums = tile_sums.cpu().numpy()
    # Identical frames have SSIM exactly 1; the float32 filter would leave it within 1e-7 of that.
    tile_sums[identical.cpu().numpy()] = counts
    return KernelOutput(sse=sse.cpu().numpy(), tile_sums=tile_sums, tile_counts=counts)
