"""The calibrated floor in reduced precision: how the calibration row's distance from the baseline sets the gates of
a run in a dtype outside `rules.tensor.dtypes` (gates.json `rules.reduced_precision`).

In bfloat16 an exact phase is not exact (other tiling, other rounding, amplified step after step), so fixed
thresholds either fail a correct integration of a chaotic model or pass a wrong one of a calm model. The calibration
row (ditgate.gates.calibration: the baseline with one rounding error of the run dtype in every transformer and block
output) measures what this configuration's rounding costs; every output check is then derived from that floor:

    decibel metrics (PSNR, SI-SDR, mel PSNR):   floor - margin_db
    similarity metrics (SSIM, tile SSIM):       1 - (1 - floor) * ssim_factor

An exact phase must reach the derived value (the floor works both ways: a model whose floor is high is not judged
by loose defaults); a lossy phase keeps the looser of its default and the derived value. A metric whose floor is
not finite (the calibration equalled the baseline) keeps the default, and says so. The final latents of an exact
row may move at most `latents.factor` times as far from the baseline's as the calibration row's did.
"""

from __future__ import annotations

import math
from typing import Any

from ditgate.gates.calibration import finite_floor
from ditgate.gates.verdicts import OPS, CheckResult, format_value, load_gates

RULE = "reduced_precision"
_SIMILARITY = {"ssim", "ssim_frame_min", "worst_tile_ssim", "mel_ssim", "cosine"}


def rule(gates: dict | None = None) -> dict:
    return (load_gates() if gates is None else gates)["rules"][RULE]


def derive(metric: str, floor: float, spec: dict) -> float:
    """The threshold a measured `floor` of `metric` gives (`spec`: `final` or `first_step` of the rule)."""
    if metric in _SIMILARITY:
        return 1.0 - (1.0 - floor) * float(spec["ssim_factor"])
    return floor - float(spec["margin_db"])


def thresholds(checks: list[dict], measured: dict[str, Any], spec: dict, exact: bool) -> dict[str, Any]:
    """{"used": {metric: threshold} (the `floor=` argument of gates.evaluate), "at_default": [metrics whose floor is
    not finite, kept at their default], "derived": {metric: derived value}} for `checks` of one phase."""
    finite = finite_floor(measured)
    used, derived, at_default = {}, {}, []
    for check in checks:
        metric = check["metric"]
        if metric not in measured:
            continue
        if metric not in finite or (metric in _SIMILARITY and finite[metric] >= 1.0):  # equal to the baseline
            at_default.append(metric)
            continue
        value = derive(metric, finite[metric], spec)
        derived[metric] = value
        looser = not OPS[check["op"]](value, check["value"])  # the default would reject the derived value
        if exact or looser:
            used[metric] = value
    return {"used": used, "derived": derived, "at_default": at_default}


def latent_metric(measured: dict[str, Any]) -> str | None:
    """The latent error the floor is compared in: the displacement-relative error where the noise is known."""
    for metric in ("disp_rel_error", "rel_error"):
        if isinstance(measured.get(metric), (int, float)):
            return metric
    return None


def latent_check(row_latents: dict[str, Any], floor_latents: dict[str, Any], gates: dict | None = None
                 ) -> tuple[CheckResult | None, str | None]:
    """(the check, the reason it failed or None) of an exact row's final latents against the calibration row's:
    at most `latents.factor` times its error. None, None when either is unknown or the floor is zero."""
    spec = rule(gates)["latents"]
    metric = latent_metric(floor_latents)
    if metric is None or not isinstance(row_latents.get(metric), (int, float)):
        return None, None
    floor = float(floor_latents[metric])
    if not math.isfinite(floor) or floor <= 0:
        return None, None
    factor = float(spec["factor"])
    value = float(row_latents[metric])
    result = CheckResult(metric, "<=", factor * floor, value, bool(value <= factor * floor),
                         f"{factor:g} x the calibration row's: {spec['source']}")
    if result.passed:
        return result, None
    return result, (f"the latents moved {value / floor:.1f}x as far as the calibration row's ({metric} "
                    f"{format_value(metric, value)} against a floor of {format_value(metric, floor)}; at most "
                    f"{factor:g}x passes): more than this configuration's rounding, a fault that a tolerant "
                    "picture gate hides")


def at_floor(value: Any, floor: Any, metric: str, spec: dict) -> bool:
    """Whether a row's `value` sits at the floor: no further from the baseline than the margin allows beyond it."""
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (value, floor)):
        return False
    if metric in _SIMILARITY:
        return (1.0 - value) <= (1.0 - floor) * float(spec["ssim_factor"])
    return value >= floor - float(spec["margin_db"])
