"""The first-step check (gates.json `rules.reduced_precision.first_step`): an exact phase's transformer output at
the first denoising step against the baseline's.

At the first step both runs see the same inputs, so the difference is what the integration itself changes, before
any trajectory amplifies it: in reduced precision the one place where an exact phase can be judged nearly exactly.
For video it is measured per latent frame (ditgate.metrics.frames): the worst frame is gated, and the frames on each
side of the edges between the ranks' chunks of a context-parallel row are reported on their own (a split that goes
wrong shows there first). Each threshold is the calibration row's first step less the margin (ditgate.gates.floor),
both ways: a model whose rounding floor is high is held to it. Where the floor is not finite or was not measured,
the default applies (the original skill's acceptance: > 30 dB, SSIM > 0.98, the minimum over frames). The
calibration rounds every block's output once, so its floor falls with depth as a correct integration's error does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ditgate.gates.floor import rule, thresholds
from ditgate.gates.verdicts import OPS, CheckResult, format_value
from ditgate.metrics.frames import chunk_boundaries, frame_scores

_PER_FRAME = {"psnr_frame_min": "psnr", "ssim_frame_min": "ssim"}


def summary(baseline: Any, candidate: Any, cp_size: int = 1) -> dict[str, Any]:
    """Per-frame PSNR and SSIM of the first-step outputs, their minimum, and the chunk-boundary frames' minimum."""
    scores = frame_scores(baseline, candidate)
    out: dict[str, Any] = {"psnr": scores["psnr"], "ssim": scores["ssim"]}
    frames = len(scores["psnr"])
    boundary = chunk_boundaries(frames, cp_size)
    out["boundary_frames"] = boundary
    for metric, key in _PER_FRAME.items():
        values = [v for v in scores[key] if v is not None]
        out[metric] = min(values) if values else None
        edge = [scores[key][f] for f in boundary if scores[key][f] is not None]
        rest = [scores[key][f] for f in range(frames) if f not in boundary and scores[key][f] is not None]
        out[f"{key}_boundary_min"] = min(edge) if edge else None
        out[f"{key}_rest_min"] = min(rest) if rest else None
    return out


def check(baseline: Any, candidate: Any, *, floor: dict[str, Any] | None = None, cp_size: int = 1,
          gates: dict | None = None) -> dict[str, Any]:
    """{"passed", "checks": [CheckResult as dicts], "reasons", "summary"} of a row's first-step output; `floor`:
    the calibration row's first-step summary (None: the defaults alone)."""
    spec = rule(gates)["first_step"]
    found = summary(baseline, candidate, cp_size)
    measured = {m: (floor or {}).get(m) for m in _PER_FRAME}
    derived = thresholds(spec["checks"], {m: v for m, v in measured.items() if v is not None}, spec, exact=True)
    results, reasons = [], []
    for c in spec["checks"]:
        value = found.get(c["metric"])
        if value is None:  # SSIM of frames under the 11 x 11 window, or of flat token layouts: not defined
            continue
        limit = derived["used"].get(c["metric"], c["value"])
        source = c["source"] if c["metric"] not in derived["used"] else \
            f"the calibration row's first step less the margin: {spec['source']}"
        result = CheckResult(c["metric"], c["op"], float(limit), float(value), bool(OPS[c["op"]](value, limit)),
                             source)
        results.append(result)
        if not result.passed:
            reasons.append(_reason(result, found))
    return {"passed": all(r.passed for r in results), "checks": [vars(r) for r in results], "reasons": reasons,
            "summary": found}


def _reason(result: CheckResult, found: dict[str, Any]) -> str:
    key = _PER_FRAME[result.metric]
    values = np.array([np.nan if v is None else v for v in found[key]], dtype=float)
    bad = [int(i) for i in np.flatnonzero(~(values > result.threshold))]
    listed = ", ".join(map(str, bad[:8])) + (", ..." if len(bad) > 8 else "")
    where = f"latent frame {listed}" if len(values) > 1 else "the output"
    boundary = [f for f in bad if f in found["boundary_frames"]]
    edge = f"; {len(boundary)} of them at a chunk boundary ({', '.join(map(str, boundary))})" if boundary else ""
    label = "PSNR" if key == "psnr" else "SSIM"
    return (f"first-step transformer output: {label} {format_value(result.metric, result.value)} at {where} is not "
            f"{result.op} {format_value(result.metric, result.threshold, threshold=True)}{edge} — the integration "
            "changes the transformer's output before any step amplifies rounding (compare the layout, positions "
            "and masks each rank sees; rerun with fp32 attention when in doubt)")
