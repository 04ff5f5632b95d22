"""Gates: the thresholds of `checklists/gates.json` applied to a candidate output, with reasons in plain words.

`evaluate(phase, modality, baseline, candidate, ...)` measures every metric of the modality (`compare`), then
applies, in this order:
1. the phase's checks for the modality (`phases.<phase>.modalities.<modality>.checks`);
2. image and video: the region rule (worst-tile SSIM on a `rules.region.grid` split) and the garbled rule
   (PSNR >= `psnr_at_least` while SSIM < `ssim_below`, per image or frame);
3. audio: `rules.audio.checks`; for every modality, a threshold that `floor` names is replaced by its value (the
   calibrated noise floor: `ditgate.gates.calibration.gate_floor` turns a measured audio floor into this argument
   as `rules.audio.calibration` says, `ditgate.gates.floor.thresholds` a reduced-precision one);
4. latents (the modality "latent", or `latents=` given with another modality): the phase's latent checks, plus
   `rules.tensor.checks` when the phase is exact and `dtype` is one of `rules.tensor.dtypes` (a check with
   `scale: baseline_max_abs` is relative: its threshold is value x the largest magnitude of the baseline latents). Audio latents get
   the tensor rule in that case and `rules.audio.latent_checks` in every other, never the phase's latent checks;
   an audio verdict lists its latent checks first.
A candidate holding NaN or Inf fails with that reason; a baseline that does, mismatched shapes, an unknown phase or
a check that needs a missing input (`noise` for disp_rel_error) raise a `DitgateError`.

`Verdict.to_dict()` is JSON-ready: infinities become the strings "inf" and "-inf" (JSON has no infinity, and a
large number would read as a measurement), a metric that could not be computed is null.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ditgate.core.errors import GateConfigError, GateInputError, NonFiniteError
from ditgate.core.paths import checklists_dir

MODALITIES = ("image", "video", "audio", "latent")
METRICS = {  # what `compare` returns per modality
    "image": ("psnr", "ssim", "worst_tile_ssim"),
    "video": ("psnr", "psnr_frame_mean", "psnr_frame_min", "ssim", "ssim_frame_min", "worst_tile_ssim"),
    "audio": ("si_sdr", "mel_psnr", "mel_ssim"),
    "latent": ("max_abs", "rel_error", "cosine"),
}
OPS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}
DEFAULT_GATES = checklists_dir() / "gates.json"
SCHEMA = checklists_dir() / "gates.schema.json"

_DTYPE_ALIASES = {
    "float32": "float32", "fp32": "float32", "float": "float32", "torch.float32": "float32",
    "float16": "float16", "fp16": "float16", "half": "float16", "torch.float16": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16", "torch.bfloat16": "bfloat16",
    "float64": "float64", "fp64": "float64", "double": "float64", "torch.float64": "float64",
}
_LABELS = {
    "psnr": "PSNR", "psnr_frame_mean": "mean per-frame PSNR", "psnr_frame_min": "worst-frame PSNR",
    "ssim": "SSIM", "ssim_frame_min": "worst-frame SSIM", "worst_tile_ssim": "worst-tile SSIM",
    "max_abs": "latent max-abs error", "rel_error": "latent relative error", "cosine": "latent cosine similarity",
    "disp_rel_error": "latent error relative to the baseline's move from its noise",
    "si_sdr": "SI-SDR", "mel_psnr": "mel PSNR", "mel_ssim": "mel SSIM",
}
_DECIBELS = {"psnr", "psnr_frame_mean", "psnr_frame_min", "si_sdr", "mel_psnr"}
FLOOR_SOURCE = "calibration run: noise floor of the same configuration run twice"


# ---------------------------------------------------------------------------------------------------- loading


def _schema_errors(gates: Any) -> list[str]:
    import jsonschema

    try:
        schema = json.loads(SCHEMA.read_text())
    except FileNotFoundError as exc:
        raise GateConfigError(f"gate schema not found at {SCHEMA}") from exc
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(gates), key=lambda e: list(map(str, e.absolute_path)))
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top level)'}: {e.message}" for e in errors]


def validate_gates(gates: Any, origin: str = "gates") -> dict:
    """Return `gates` if it follows checklists/gates.schema.json, else raise `GateConfigError` naming each field."""
    problems = _schema_errors(gates)
    if problems:
        shown = "\n  ".join(problems[:10]) + (f"\n  ... and {len(problems) - 10} more" if len(problems) > 10 else "")
        raise GateConfigError(f"{origin} does not follow {SCHEMA.name}:\n  {shown}")
    return gates


_LOADED: dict[tuple, dict] = {}  # (path, mtime, size) -> validated table: a run judges with it dozens of times


def load_gates(path: str | Path | None = None) -> dict:
    """The validated gate table: `path`, or the repository's checklists/gates.json (a copy: callers may change it;
    a file is read and validated again when it changed)."""
    import copy

    path = Path(path) if path is not None else DEFAULT_GATES
    try:
        stat = path.stat()
        key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
        if key not in _LOADED:
            _LOADED[key] = validate_gates(json.loads(path.read_text()), str(path))
    except FileNotFoundError as exc:
        raise GateConfigError(f"gate table not found: {path}") from exc
    except json.JSONDecodeError as exc:
        raise GateConfigError(f"{path} is not valid JSON: {exc}") from exc
    return copy.deepcopy(_LOADED[key])


# ---------------------------------------------------------------------------------------------------- metrics


def _region_grid(grid: int | None) -> int:
    return int(grid) if grid is not None else int(load_gates()["rules"]["region"]["grid"])


def _measure(modality: str, baseline: Any, candidate: Any, sample_rate: int | None, grid: int):
    """(metrics, per-frame scores or None) of one modality."""
    from ditgate import metrics

    if modality in ("image", "video"):
        scores = metrics.score_frames(baseline, candidate, grid=grid)
        summary = metrics.image_metrics if modality == "image" else metrics.video_metrics
        return summary(scores), scores
    if modality == "audio":
        if sample_rate is None:
            raise GateInputError("audio metrics need the sample rate (sample_rate=...)")
        return metrics.audio_metrics(baseline, candidate, sample_rate), None
    if modality == "latent":
        return metrics.tensor_metrics(baseline, candidate), None
    raise GateInputError(f"unknown modality {modality!r}; use one of {', '.join(MODALITIES)}")


def compare(modality: str, baseline: Any, candidate: Any, *, sample_rate: int | None = None,
            grid: int | None = None) -> dict[str, float]:
    """Every metric of `modality` for `candidate` against `baseline`.

    image: psnr, ssim, worst_tile_ssim (for a batch, the worst image's values);
    video: psnr (whole clip), psnr_frame_mean, psnr_frame_min, ssim (frame mean), ssim_frame_min, worst_tile_ssim;
    audio: si_sdr, mel_psnr, mel_ssim (needs sample_rate); latent: max_abs, rel_error, cosine.
    `grid` (tiles per side for worst_tile_ssim) defaults to gates.json `rules.region.grid`.
    """
    grid = _region_grid(grid) if modality in ("image", "video") else 1
    return _measure(modality, baseline, candidate, sample_rate, grid)[0]


# ---------------------------------------------------------------------------------------------------- verdict


@dataclass
class CheckResult:
    metric: str
    op: str
    threshold: float
    value: float | None
    passed: bool
    source: str


@dataclass
class Verdict:
    phase: str
    modality: str
    passed: bool
    metrics: dict[str, float | None]
    checks: list[CheckResult] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON-ready: inf -> "inf", -inf -> "-inf", NaN -> null (see the module docstring)."""
        return json_ready(asdict(self))


def json_ready(value: Any) -> Any:
    """`value` with inf -> "inf", -inf -> "-inf" and NaN -> None, in nested dicts and lists."""
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
    return value


def format_value(metric: str, value: float | None, threshold: bool = False) -> str:
    """A metric value for people: dB where it is one, 4 significant digits, "n/a" for a value not computed."""
    if value is None or math.isnan(value):
        return "n/a"
    if math.isinf(value):
        text = "inf" if value > 0 else "-inf"
    elif threshold:
        text = f"{value:g}"
    elif metric in _DECIBELS:
        text = f"{value:.2f}"
    elif abs(value) < 1e-2 and value != 0:
        text = f"{value:.2e}"
    else:
        text = f"{value:.4g}"
    return f"{text} dB" if metric in _DECIBELS else text


def normalize_dtype(dtype: Any) -> str:
    key = str(dtype).lower()
    if key not in _DTYPE_ALIASES:
        raise GateInputError(f"unknown dtype {dtype!r}; use one of float32, float16, bfloat16, float64")
    return _DTYPE_ALIASES[key]


def _latent_checks(gates: dict, spec: dict, dtype: str, modality: str) -> list[dict]:
    tensor = gates["rules"]["tensor"]
    exact = spec["exact"] and dtype in tensor["dtypes"]
    if modality == "audio":  # the phase's latent checks were measured on images; audio has its own
        return list(tensor["checks"] if exact else gates["rules"]["audio"]["latent_checks"])
    checks = list(spec["modalities"].get("latent", {}).get("checks", []))
    if exact:
        checks += tensor["checks"]
    return checks


def latent_checks_for(phase: str, modality: str, dtype: Any, gates: dict) -> list[dict]:
    """The latent checks `evaluate` applies to `phase` when it is given latents (the tensor rule included)."""
    return _latent_checks(gates, gates["phases"][phase], _normalize_dtype(dtype), modality)


def _floored(checks: list[dict], floor: dict | None, modality: str) -> list[dict]:
    """`checks` with each threshold that `floor` names replaced by the floor's value (source FLOOR_SOURCE)."""
    floor = dict(floor or {})
    unknown = set(floor) - {c["metric"] for c in checks}
    if unknown:
        raise GateInputError(f"floor names {sorted(unknown)}; {modality} floors exist for "
                             f"{sorted(c['metric'] for c in checks)}")
    for metric, value in floor.items():
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise GateInputError(
                f"floor {metric} = {value!r} is not a finite number: a calibration rerun identical to the baseline "
                "measures no noise floor; leave it out to keep the default")
    return [dict(c, value=float(floor[c["metric"]]), source=FLOOR_SOURCE) if c["metric"] in floor else c
            for c in checks]


def _audio_checks(gates: dict, spec: dict, floor: dict | None) -> list[dict]:
    return list(spec["modalities"].get("audio", {}).get("checks", [])) + _floored(
        gates["rules"]["audio"]["checks"], floor, "audio")


def _scaled(check: dict, baseline_latents: Any) -> dict:
    """A tensor-rule check whose value is relative (`scale`: baseline_max_abs) as the absolute threshold it sets."""
    if check.get("scale") != "baseline_max_abs":
        return check
    import numpy as np

    scale = float(np.abs(np.asarray(baseline_latents, dtype=np.float64)).max(initial=0.0))
    return dict(check, value=float(check["value"]) * scale,
                source=f"{check['value']:g} x max |baseline latents| ({scale:.4g}): {check['source']}")


def _check(check: dict, value: float | None) -> CheckResult:
    passed = value is not None and not math.isnan(value) and OPS[check["op"]](value, check["value"])
    return CheckResult(check["metric"], check["op"], float(check["value"]), value, bool(passed), check["source"])


def _plain_reason(result: CheckResult, scores: Any, modality: str) -> str:
    where = ""
    if scores is not None and modality == "video" and result.metric in ("psnr_frame_min", "ssim_frame_min"):
        per_frame = scores.psnr if result.metric == "psnr_frame_min" else scores.ssim
        where = f" (frame {int(per_frame.argmin())})"
    label = _LABELS.get(result.metric, result.metric)
    return (f"{label} {format_value(result.metric, result.value)}{where} is not {result.op} "
            f"{format_value(result.metric, result.threshold, threshold=True)}")


def _region_reason(scores: Any, modality: str) -> str:
    worst = scores.worst_tile()
    frame = f"frame {worst.frame}, " if modality == "video" or scores.frames > 1 else ""
    return (f"a region is corrupted: worst tile ({frame}row {worst.row}, col {worst.col}) SSIM {worst.value:.3f} "
            f"while global SSIM {scores.ssim[worst.frame]:.3f}")


def _garbled(gates: dict, scores: Any, modality: str) -> tuple[CheckResult, str | None]:
    rule = gates["rules"]["garbled"]
    psnr, ssim = scores.psnr, scores.ssim
    bad = [i for i in range(scores.frames) if psnr[i] >= rule["psnr_at_least"] and ssim[i] < rule["ssim_below"]]
    result = CheckResult("garbled", "==", 0.0, float(len(bad)), not bad, rule["source"])
    if not bad:
        return result, None
    first = bad[0]
    detail = f"PSNR {psnr[first]:.1f} dB but SSIM {ssim[first]:.2f} — structure destroyed"
    if scores.frames == 1:
        return result, f"garbled: {detail}"
    kind = "frames" if modality == "video" else "images"
    listed = ", ".join(map(str, bad[:8])) + (", ..." if len(bad) > 8 else "")
    return result, f"garbled {kind} {listed}: {kind[:-1]} {first} has {detail}"


def _select_checks(gates: dict, phase: str, modality: str, has_latents: bool, dtype: str,
                   floor: dict | None, noise: Any) -> tuple[list[dict], list[dict]]:
    """(checks on the output, checks on the latents) that apply; raise when none can or one lacks its input."""
    spec = gates["phases"][phase]
    latent_names = set(METRICS["latent"]) | {"disp_rel_error"}
    on_output = {k: v for k, v in (floor or {}).items() if k not in latent_names}
    if modality in ("image", "video"):
        if modality not in spec["modalities"]:
            raise GateInputError(f"phase {phase} has no gate for modality {modality}")
        output_checks = _floored(spec["modalities"][modality]["checks"] + gates["rules"]["region"]["checks"],
                                 on_output, modality)
    elif modality == "audio":
        output_checks = _audio_checks(gates, spec, on_output)
    else:
        output_checks = []
    latent_checks = _latent_checks(gates, spec, dtype, modality) if has_latents else []
    latent_checks = _floored(latent_checks, {k: v for k, v in (floor or {}).items() if k in latent_names}, "latent")
    if modality == "latent" and not latent_checks:
        raise GateInputError(f"phase {phase} has no latent gate (no latent checks, and the tensor rule applies to "
                             f"exact phases in {', '.join(gates['rules']['tensor']['dtypes'])} only)")
    if any(c["metric"] == "disp_rel_error" for c in latent_checks) and noise is None:
        raise GateInputError(f"phase {phase}'s latent gate checks disp_rel_error, which needs the initial noise "
                             "latents (noise=...)")
    return output_checks, latent_checks


def evaluate(phase: str, modality: str, baseline: Any, candidate: Any, *, latents: tuple | None = None,
             noise: Any = None, dtype: str = "float32", sample_rate: int | None = None, floor: dict | None = None,
             gates: dict | None = None) -> Verdict:
    """Apply `phase`'s gate for `modality` to `candidate` against `baseline` (see the module docstring)."""
    from ditgate.metrics import tensor_metrics

    gates = load_gates() if gates is None else validate_gates(gates)
    if phase not in gates["phases"]:
        raise GateInputError(f"unknown phase {phase!r}; gates.json has {', '.join(gates['phases'])}")
    if modality not in MODALITIES:
        raise GateInputError(f"unknown modality {modality!r}; use one of {', '.join(MODALITIES)}")
    if floor and modality == "latent":
        raise GateInputError("floor= sets thresholds of the output checks; the latent modality has none")
    if modality == "latent" and latents is not None:
        raise GateInputError("for modality latent pass the latents as baseline and candidate, not latents=")
    if latents is not None and len(latents) != 2:
        raise GateInputError("latents must be a pair (baseline_latents, candidate_latents)")
    latent_pair = (baseline, candidate) if modality == "latent" else latents
    output_checks, latent_checks = _select_checks(gates, phase, modality, latent_pair is not None,
                                                  normalize_dtype(dtype), floor, noise)

    values: dict[str, float | None] = {}
    reasons: list[str] = []
    scores = None
    if modality != "latent":
        grid = int(gates["rules"]["region"]["grid"]) if modality in ("image", "video") else 1
        try:
            measured, scores = _measure(modality, baseline, candidate, sample_rate, grid)
            values.update(measured)
        except NonFiniteError as exc:
            if exc.which != "candidate":
                raise
            values.update(dict.fromkeys(METRICS[modality]))
            reasons.append(f"output contains {exc.kind}")
    if latent_pair is not None:
        try:
            values.update(tensor_metrics(latent_pair[0], latent_pair[1], noise))
        except NonFiniteError as exc:
            if exc.which != "candidate":
                raise NonFiniteError(f"{exc.which} latents", exc.kind) from exc
            values.update(dict.fromkeys(METRICS["latent"] + (("disp_rel_error",) if noise is not None else ())))
            reasons.append(f"output contains {exc.kind}" if modality == "latent"
                           else f"candidate latents contain {exc.kind}")
    broken = bool(reasons)  # only non-finite outputs have added a reason so far
    if latent_pair is not None:
        latent_checks = [_scaled(c, latent_pair[0]) for c in latent_checks]

    results: list[CheckResult] = []
    ordered = latent_checks + output_checks if modality == "audio" else output_checks + latent_checks
    for check in ordered:
        result = _check(check, values.get(check["metric"]))
        results.append(result)
        if result.passed or result.value is None:
            continue
        if result.metric == "worst_tile_ssim" and scores is not None:
            reasons.append(_region_reason(scores, modality))
        else:
            reasons.append(_plain_reason(result, scores, modality))
    if scores is not None:
        result, reason = _garbled(gates, scores, modality)
        results.append(result)
        if reason:
            reasons.append(reason)
    return Verdict(phase, modality, all(r.passed for r in results) and not broken, values, results, reasons)


_normalize_dtype = normalize_dtype  # the name ditgate.run.diff.compare imports
