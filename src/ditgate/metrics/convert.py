"""Turn what users pass (PIL images, NumPy arrays, torch tensors, lists of frames) into the one form metrics use.

Images and video frames become a float32 torch tensor of shape (N, H, W, C), values in [0, 1], C = 1 or 3,
contiguous. That layout is also channels-last, which the SSIM kernel filters without a copy.

Nothing is guessed:
- uint8 is divided by 255 and uint16 by 65535 (never subtracted raw: uint8 differences wrap modulo 256);
- floats must already lie in [0, 1]; anything else (a [0, 255] float image, a [-1, 1] VAE output, int64) needs an
  explicit `value_range=(low, high)`;
- the layout is read from the shape only when exactly one axis can be the channel axis (size 1 or 3); otherwise
  pass `layout=` ("HWC", "CHW", "HW", "NHWC", "NCHW", "NHW"; "F" may stand for "N" in a video).
NaN and Inf raise `NonFiniteError`, so a broken output is never scored as if it were an image.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ditgate.core.errors import MetricInputError, NonFiniteError

CHANNELS = (1, 3)
# Float inputs may overshoot [0, 1] by this much (rounding in a decoder's post-processing); they are clipped.
RANGE_TOLERANCE = 1e-5

_LAYOUTS = ("HW", "HWC", "CHW", "NHW", "NHWC", "NCHW")


def _normalize_layout(layout: str) -> str:
    canon = layout.upper().replace("F", "N")
    if canon not in _LAYOUTS:
        raise MetricInputError(f"unknown layout {layout!r}; use one of {', '.join(_LAYOUTS)} (F may replace N)")
    return canon


def _pil_to_numpy(image: Any) -> np.ndarray:
    mode = image.mode
    if mode in ("RGB", "L", "I;16"):
        return np.asarray(image)
    if mode in ("RGBA", "LA"):
        array = np.asarray(image)
        if not (array[..., -1] == 255).all():
            raise MetricInputError(f"image has a non-opaque alpha channel (mode {mode}); flatten it first")
        return array[..., :-1] if mode == "RGBA" else array[..., 0]
    if mode in ("P", "CMYK", "YCbCr", "1"):
        return np.asarray(image.convert("RGB" if mode != "1" else "L"))
    raise MetricInputError(f"unsupported PIL image mode {mode!r}")


def raw_tensor(x: Any, name: str) -> torch.Tensor:
    """A torch view of a NumPy array, tensor or PIL image, without changing dtype or values."""
    if isinstance(x, torch.Tensor):
        return x.detach()
    if hasattr(x, "mode") and hasattr(x, "size") and hasattr(x, "getbands"):  # PIL.Image without importing PIL
        x = _pil_to_numpy(x)
    if isinstance(x, (list, tuple)):
        raise MetricInputError(f"{name}: a nested list is not an image or an array")
    array = np.asarray(x)
    if array.dtype == object or array.dtype.kind not in "biuf":
        raise MetricInputError(f"{name}: expected numbers, got dtype {array.dtype}")
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    with warnings.catch_warnings():  # read-only arrays: we never write into an input
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


def _stack(items: Sequence[Any], name: str) -> torch.Tensor:
    if not items:
        raise MetricInputError(f"{name}: empty list of frames")
    tensors = [raw_tensor(item, f"{name}[{i}]") for i, item in enumerate(items)]
    shapes = {tuple(t.shape) for t in tensors}
    if len(shapes) != 1:
        raise MetricInputError(f"{name}: frames differ in shape: {sorted(shapes)}")
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1:
        raise MetricInputError(f"{name}: frames differ in dtype: {sorted(map(str, dtypes))}")
    return torch.stack(tensors)


def _infer_layout(shape: tuple[int, ...], name: str) -> str:
    if len(shape) == 2:
        return "HW"
    if len(shape) not in (3, 4):
        raise MetricInputError(f"{name}: shape {shape} is not an image (2-D or 3-D) or a batch/video (4-D)")
    first, last = shape[-3], shape[-1]
    first_ok, last_ok = first in CHANNELS, last in CHANNELS
    prefix = "N" if len(shape) == 4 else ""
    if last_ok and not first_ok:
        return prefix + "HWC"
    if first_ok and not last_ok:
        return prefix + "CHW"
    why = "both" if first_ok else "neither"
    raise MetricInputError(
        f"{name}: layout of shape {shape} is ambiguous ({why} of the axes that could hold channels has size 1 or 3); "
        "pass layout='HWC', 'CHW', 'NHWC', 'NCHW' or 'NHW'")


def _to_nhwc(t: torch.Tensor, layout: str, name: str) -> torch.Tensor:
    if t.ndim != len(layout):
        raise MetricInputError(f"{name}: layout {layout} needs {len(layout)} axes, shape is {tuple(t.shape)}")
    if "C" not in layout:
        t = t.unsqueeze(-1)
        layout += "C"
    if "N" not in layout:
        t = t.unsqueeze(0)
        layout = "N" + layout
    t = t.permute(*(layout.index(axis) for axis in "NHWC"))
    if t.shape[-1] not in CHANNELS:
        raise MetricInputError(
            f"{name}: {t.shape[-1]} channels; ditgate compares grayscale (1) or RGB (3) images")
    return t


def _non_finite(t: torch.Tensor, name: str) -> NonFiniteError:
    return NonFiniteError(name, "NaN" if bool(torch.isnan(t).any()) else "Inf")


def check_finite(t: torch.Tensor, name: str) -> None:
    """Raise `NonFiniteError` when a float tensor holds NaN (reported first) or Inf.

    One pass: NaN and Inf propagate into the sum; only a sum that is not finite (or overflowed) is looked at
    element by element.
    """
    if not t.is_floating_point() or t.numel() == 0 or math.isfinite(float(t.sum())):
        return
    if not bool(torch.isfinite(t).all()):
        raise _non_finite(t, name)


def _to_unit_range(t: torch.Tensor, value_range: tuple[float, float] | None, name: str) -> torch.Tensor:
    if t.dtype == torch.bool:
        raise MetricInputError(f"{name}: boolean arrays are not images")
    if value_range is None:
        if t.dtype == torch.uint8:
            return t.div(255.0)
        if t.dtype == torch.uint16:
            return t.to(torch.float32).div_(65535.0)
        if not t.is_floating_point():
            raise MetricInputError(
                f"{name}: integer dtype {t.dtype} has no known range; pass value_range=(low, high)")
        low, high = 0.0, 1.0
    else:
        low, high = (float(v) for v in value_range)
        if not high > low:
            raise MetricInputError(f"value_range {value_range!r} must be (low, high) with high > low")
    if t.numel() == 0:
        raise MetricInputError(f"{name}: empty image")
    lo, hi = (float(v) for v in torch.aminmax(t))  # one pass; NaN and Inf show up here too
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise _non_finite(t, name)
    lo, hi = (lo - low) / (high - low), (hi - low) / (high - low)
    if lo < -RANGE_TOLERANCE or hi > 1 + RANGE_TOLERANCE:
        given = f"value_range {tuple(value_range)}" if value_range else "[0, 1]"
        raise MetricInputError(
            f"{name}: values span [{lo:.4g}, {hi:.4g}] after scaling, outside {given}; pass the range the "
            "data really has, e.g. value_range=(0, 255) for a float image in [0, 255] or (-1, 1) for a raw "
            "decoder output")
    t = t.to(torch.float32)
    if (low, high) != (0.0, 1.0):
        t = t.sub(low).div_(high - low)
    return t.clamp(0.0, 1.0) if lo < 0 or hi > 1 else t


def as_frames(x: Any, *, layout: str | None = None, value_range: tuple[float, float] | None = None,
              name: str = "image", device: str | torch.device | None = None) -> torch.Tensor:
    """One image, a batch of images or a video as float32 (N, H, W, C) in [0, 1], contiguous.

    `x` is a PIL image, a NumPy array, a torch tensor, or a list/tuple of those (frames; `layout` then describes one
    frame). `name` is used in error messages ("baseline", "candidate").
    """
    if isinstance(x, (list, tuple)):
        t = _stack(x, name)
        frame_layout = _normalize_layout(layout) if layout else _infer_layout(tuple(t.shape[1:]), name)
        if "N" in frame_layout:
            raise MetricInputError(f"{name}: for a list of frames, layout describes one frame (HWC, CHW or HW)")
        canon = "N" + frame_layout
    else:
        t = raw_tensor(x, name)
        canon = _normalize_layout(layout) if layout else _infer_layout(tuple(t.shape), name)
    t = _to_nhwc(t, canon, name)
    if device is not None:
        t = t.to(device)
    t = _to_unit_range(t, value_range, name)
    return t.contiguous()


def as_float_tensor(x: Any, name: str, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """A tensor or array as a float tensor (float64 by default) on its own device; NaN/Inf raise."""
    if isinstance(x, (list, tuple)):
        t = _stack(x, name) if x and not isinstance(x[0], (int, float)) else torch.tensor(x)
    else:
        t = raw_tensor(x, name)
    if t.dtype == torch.bool:
        raise MetricInputError(f"{name}: boolean arrays cannot be compared numerically")
    check_finite(t, name)
    return t.to(dtype)


def require_same_shape(a: torch.Tensor, b: torch.Tensor, what: str = "baseline and candidate") -> None:
    """Refuse to compare tensors of different shapes (no broadcasting, no resizing)."""
    if tuple(a.shape) != tuple(b.shape):
        raise MetricInputError(f"{what} differ in shape: {tuple(a.shape)} vs {tuple(b.shape)}")
