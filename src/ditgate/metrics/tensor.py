"""Comparisons of raw tensors (latents, hidden states): all in float64, over every element.

- max_abs    = max |cand - base|
- rel_error  = ||cand - base|| / ||base||                     (Frobenius norms)
- cosine     = <base, cand> / (||base|| ||cand||)
- disp_rel_error = ||cand - base|| / ||base - noise||
  the error relative to how far the baseline moved from its initial noise. A denoised latent keeps much of its
  noise, so ||base|| is a poor yardstick; the displacement is what the model actually computed.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ditgate.core.errors import MetricInputError
from ditgate.metrics.convert import as_float_tensor, require_same_shape


def _pair(baseline: Any, candidate: Any) -> tuple[torch.Tensor, torch.Tensor]:
    base = as_float_tensor(baseline, "baseline")
    cand = as_float_tensor(candidate, "candidate").to(base.device)
    require_same_shape(base, cand)
    if base.numel() == 0:
        raise MetricInputError("baseline and candidate are empty")
    return base, cand


def _ratio(num: float, den: float) -> float:
    if den > 0:
        return num / den
    return 0.0 if num == 0 else math.inf


def _max_abs(base: torch.Tensor, cand: torch.Tensor) -> float:
    return float((cand - base).abs().max())


def _rel_error(base: torch.Tensor, cand: torch.Tensor) -> float:
    return _ratio(float(torch.linalg.vector_norm(cand - base)), float(torch.linalg.vector_norm(base)))


def _cosine(base: torch.Tensor, cand: torch.Tensor) -> float:
    nb, nc = float(torch.linalg.vector_norm(base)), float(torch.linalg.vector_norm(cand))
    if nb == 0 or nc == 0:
        return 1.0 if nb == nc else 0.0
    return float(torch.sum(base * cand)) / (nb * nc)


def _disp_rel_error(base: torch.Tensor, cand: torch.Tensor, noise: Any) -> float:
    start = as_float_tensor(noise, "noise").to(base.device)
    require_same_shape(base, start, "baseline and noise")
    return _ratio(float(torch.linalg.vector_norm(cand - base)), float(torch.linalg.vector_norm(base - start)))


def max_abs(baseline: Any, candidate: Any) -> float:
    return _max_abs(*_pair(baseline, candidate))


def rel_error(baseline: Any, candidate: Any) -> float:
    return _rel_error(*_pair(baseline, candidate))


def cosine(baseline: Any, candidate: Any) -> float:
    """Cosine similarity of the flattened tensors; 1.0 when both are zero, 0.0 when only one is."""
    return _cosine(*_pair(baseline, candidate))


def disp_rel_error(baseline: Any, candidate: Any, noise: Any) -> float:
    return _disp_rel_error(*_pair(baseline, candidate), noise)


def tensor_metrics(baseline: Any, candidate: Any, noise: Any = None) -> dict[str, float]:
    """max_abs, rel_error, cosine, and disp_rel_error when `noise` is given."""
    base, cand = _pair(baseline, candidate)
    out = {"max_abs": _max_abs(base, cand), "rel_error": _rel_error(base, cand), "cosine": _cosine(base, cand)}
    if noise is not None:
        out["disp_rel_error"] = _disp_rel_error(base, cand, noise)
    return out
