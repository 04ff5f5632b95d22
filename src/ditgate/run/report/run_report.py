"""The report of a run: report.json (schema-checked), report.md (the results table) and grid.png.

The grid shows the baseline and every row side by side (a video: several frames of it, see
ditgate.run.report.floor_report.grid_frames), and under each row the difference from the row it is compared with,
amplified so that an error of 1/AMPLIFY of the range is full white. A video run adds frames.png, per-frame PSNR and
SSIM; a reduced-precision run the floor table (ditgate.run.report.floor_report).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np

from ditgate import __version__
from ditgate.run.report import floor_report, twin_report
from ditgate.run.report.time_report import fmt, time_lines, time_summary
from ditgate.run.report.grid import grid
from ditgate.run.exec import files as store
from ditgate.run.judge.discrimination import power_lines
from ditgate.gates.verdicts import format_value, json_ready
from ditgate.run.judge import outputs as further_outputs
from ditgate.run.judge.proofs import acted_word
from ditgate.run.report import spread
from ditgate.core import request as request_mod
from ditgate.core.paths import checklists_dir

SCHEMA = "report.schema.json"
VERDICT_WORD = {"passed": "PASS", "failed": "FAIL", "inconclusive": "INCONCLUSIVE"}


def _status(state) -> str:
    if not state.result or state.result.get("status") != "ok":
        return "error"
    if state.row.phase is None:
        return "reference"
    if (state.verdict or {}).get("inconclusive"):
        return "inconclusive"
    return "passed" if state.passed else "failed"


def acted(state) -> dict[str, Any] | None:
    """What the probes saw the row's features do, kept apart from its verdict: {feature: {"acted", "detail"}, and
    with several transformers "transformers": {name: "acted" | "did not act" | "not covered"}}; a feature that
    acted is evidence that it ran, not that it is right (the verdict and `status` say that)."""
    if not state.proofs:
        return None
    return {p["feature"]: {"acted": bool(p["passed"]), "detail": p["detail"],
                           **({"transformers": p["coverage"]} if p.get("coverage") else {})} for p in state.proofs}


def outcome(rows: list[dict[str, Any]]) -> str:
    """The run's outcome: "passed" (every row passed), "failed" (a row failed or did not run), else "inconclusive"
    (a row could not be judged; exit status ditgate.core.errors.EXIT_INCONCLUSIVE)."""
    statuses = {r["status"] for r in rows}
    if statuses & {"failed", "error"}:
        return "failed"
    return "inconclusive" if "inconclusive" in statuses else "passed"


def _row_record(state, base, profile, cfg=None) -> dict[str, Any]:
    from ditgate.run.define import predict

    result = state.result or {}
    baseline_latency = (base.result or {}).get("latency_s") if base else None
    latency = result.get("latency_s")
    metrics = (state.verdict or {}).get("metrics") or json_ready(state.measured or {})
    return {
        "name": state.row.name,
        "phase": state.row.phase,
        "baseline": state.row.baseline,
        "description": state.row.description,
        "world_size": state.row.world_size,
        "config": {"cache": state.row.cache, "parallel": state.row.parallel, "vae_tiling": state.row.vae_tiling,
                   "compile": state.row.compile, "quantize": state.row.quantize},
        "status": _status(state),
        "modality": result.get("modality"),
        "sample_rate": result.get("sample_rate"),
        "latency_s": latency,
        "times": result.get("times"),
        "speedup": (baseline_latency / latency) if latency and baseline_latency else None,
        "speedup_caveats": predict.caveats(state.row, result, (baseline_latency / latency) if latency and
                                           baseline_latency else None, getattr(cfg, "warmup", 0),
                                           cfg.model.device if cfg is not None else "cpu")
        + ([f"the baseline's latency was measured by the run it was reused from ({base.result['reused_from']})"]
           if latency and baseline_latency and state is not base and (base.result or {}).get("reused_from") else []),
        "prediction": predict.predict(state.row, result, base.result if base else None, profile),
        "peak_memory_bytes": (result.get("peak_memory") or {}).get("bytes"),
        "peak_memory_kind": (result.get("peak_memory") or {}).get("kind"),
        "metrics": metrics,
        "verdict": state.verdict,
        "proofs": state.proofs,
        "acted": acted(state),
        "reasons": state.reasons,
        "twin": getattr(state, "twin", None),
        "facts": result.get("facts"),
        "error": result.get("error"),
        "media": [f"rows/{state.row.name}/{name}" for name in result.get("media") or []],
        "resumed": bool(result.get("resumed")),
        "reused_from": result.get("reused_from"),
        "warmup_calls": result.get("warmup_calls"),  # untimed calls before its timed ones (warm-up once per process)  # the run whose stored result this is (ditgate.run.reuse)
        "diff": state.diff,
        "generate_s": result.get("generate_s"),  # every pipeline call of the row, warm-up included
        "overhead": result.get("overhead"),  # launch_s, load_s, restore_s, setup_s (ditgate.run.exec.execute.run_row)
    }


def build(run_dir: Path, cfg, states: list, wall_s: float | None = None, profile=None,
          profile_note: str | None = None, checks: list[dict[str, Any]] = (),
          twin: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report of `states`; `profile` (ditgate.inspect.flops.profile.Profile) adds speedup predictions."""
    from ditgate.run.define import predict

    base = next((s for s in states if s.row.name == "baseline"), None)
    rows = [_row_record(s, base, profile, cfg) for s in states]
    run_info = json.loads((run_dir / "run.json").read_text())
    return {
        "ditgate": __version__,
        "run_dir": str(run_dir),
        "model": run_info["model"],
        "request": run_info["request"],
        "added_to_call": request_mod.added(request_mod.Request.from_dict(run_info["request"])),
        "dtype": run_info["dtype"],
        "device": run_info["device"],
        "integration": run_info.get("integration"),
        "versions": run_info["versions"],
        "passed": all(r["status"] in ("passed", "reference") for r in rows),
        "outcome": outcome(rows),
        "wall_s": wall_s,
        "flops": predict.flops_summary(profile),
        "prediction_note": profile_note,
        "time": time_summary(rows, wall_s, getattr(cfg, "launch", None), checks, twin_report.wall_share(twin)),
        "rows": rows,
        "reused": {r["name"]: r["reused_from"] for r in [*rows, *checks] if r.get("reused_from")},
        "produced_size": produced_size(run_dir, rows),
        "twin": _public(twin),
    }


def _public(twin: dict[str, Any] | None) -> dict[str, Any] | None:
    """The twin record as the report keeps it (the traceback of a twin that could not run stays out)."""
    return None if twin is None else {k: v for k, v in twin.items() if k not in ("traceback", "verdicts")}


def produced_size(run_dir: Path, rows: list[dict[str, Any]]) -> str | None:
    """The size the first finished row's output really has (the pipeline may round a requested size): frames x
    height x width, or the audio's length; None when no row produced an output."""
    for r in rows:
        path = store.row_dir(run_dir, r["name"]) / "output.npy"
        if r["status"] == "error" or not path.is_file():
            continue
        try:
            shape = np.load(path, mmap_mode="r").shape
        except (OSError, ValueError):
            continue
        if r.get("modality") == "audio" and r.get("sample_rate") and len(shape) == 2:
            return f"{shape[1] / r['sample_rate']:.2f} s of audio"
        if r.get("modality") in ("image", "video") and len(shape) in (3, 4):
            return "x".join(str(n) for n in shape[:-1])
    return None


def validate(report: dict[str, Any]) -> None:
    """Raise jsonschema's ValidationError (its best match, as jsonschema.validate) when `report` breaks the schema."""
    import jsonschema

    error = jsonschema.exceptions.best_match(schema_validator().iter_errors(json.loads(json.dumps(report, default=str))))
    if error is not None:
        raise error


def schema_validator():
    """The report schema's validator, the schema itself checked once per process and schema text."""
    return _validator((checklists_dir() / SCHEMA).read_text())


@functools.lru_cache(maxsize=2)
def _validator(text: str):
    import jsonschema

    schema = json.loads(text)
    kind = jsonschema.validators.validator_for(schema)
    kind.check_schema(schema)
    return kind(schema)


def _size_line(requested: str, produced: str | None) -> str:
    if not produced or produced == requested:
        return requested or "the pipeline's default size"
    return f"{produced} produced ({'requested ' + requested if requested else 'the pipeline default'})"


DURATION_KEYS = ("audio_end_in_s", "audio_length_in_s", "audio_duration_s", "duration", "duration_s", "seconds")


def size_text(call: dict[str, Any]) -> str:
    """The output size a pipeline call asks for, in the words of its modality: frames x height x width, or the span
    of audio ("" when unset)."""
    from ditgate.core.request import FRAME_NAMES

    frames = next((call[k] for k in FRAME_NAMES if k in call), None)
    size = "x".join(str(call[k]) for k in ("height", "width") if k in call)
    if frames is not None:
        size = f"{frames} frames" + (f" of {size}" if size else "")
    if not size:
        key = next((k for k in DURATION_KEYS if k in call), None)
        if key == "audio_end_in_s":
            size = f"{call.get('audio_start_in_s', 0)}-{call[key]} s of audio"
        elif key is not None:
            size = f"{call[key]} s of audio"
    return size


def steps_text(request: dict[str, Any]) -> str:
    """"8 steps", with where the count came from when the user did not give it."""
    steps = request["call"].get("num_inference_steps")
    if steps is None:
        return "the pipeline's own step count (its __call__ names no default)"
    return f"{steps} steps" + (" (the pipeline's default)" if request.get("steps_from") == "signature" else "")


def markdown(report: dict[str, Any]) -> str:
    call = report["request"]["call"]
    size = size_text(call)
    lines = [
        f"# ditgate run: {report['model']}",
        "",
        f"- verdict: **{VERDICT_WORD[report.get('outcome') or ('passed' if report['passed'] else 'failed')]}**",
        *twin_report.headline(report),
        f"- size {_size_line(size, report.get('produced_size'))}, {steps_text(report['request'])}, seed "
        f"{report['request']['seed']}, {report['dtype']} on {report['device']}"
        + (f", input image {report['request']['image']}" if report["request"].get("image") else ""),
        "- added to the call by ditgate: " + ("; ".join(f"`{k}`: {v}" for k, v in report["added_to_call"].items())
                                              if report.get("added_to_call") else "nothing (the call as given)"),
        *further_outputs.batch_line(report),
        "- versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()),
        f"- wall time {fmt(report.get('wall_s'), '.1f')} s",
        "",
        "| row | phase | ranks | latency (s) | speedup | predicted | PSNR (dB) | SSIM | worst tile SSIM | "
        "max-abs (latents) | peak memory (MiB) | twin | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        m = r["metrics"] or {}
        psnr = m.get("psnr", m.get("psnr_frame_min"))
        ssim = m.get("ssim", m.get("ssim_frame_min"))
        mem = r["peak_memory_bytes"] / 2**20 if r["peak_memory_bytes"] else None
        prediction = r.get("prediction") or {}
        far = " (far below)" if prediction.get("far_below") else ""
        far += " (not meaningful)" if any(c.startswith("not meaningful") for c in r.get("speedup_caveats") or []) \
            else ""
        lines.append(
            f"| {r['name']} | {r['phase'] or 'reference'} | {r['world_size']} | {fmt(r['latency_s'], '.3f')} | "
            f"{fmt(r['speedup'], '.2f')}{far} | {fmt(prediction.get('predicted'), '.2f')} | {fmt(psnr, '.2f')} | "
            f"{fmt(ssim, '.4f')} | "
            f"{fmt(m.get('worst_tile_ssim'), '.4f')} | {fmt(m.get('max_abs'), '.2e')} | {fmt(mem, '.0f')} | "
            f"{twin_report.cell(r)} | {r['status'].upper()} |")
    lines += twin_report.section(report)
    lines += _audio_lines(report)
    lines += floor_report.floor_lines(report)
    if report.get("frames_plot"):
        lines += ["", "## Video frames (per-frame PSNR and SSIM; the calibration row, when it ran, is the floor)", "",
                  f"![per-frame PSNR and SSIM]({report['frames_plot']})"]
    if report.get("reused"):
        lines += ["", "## Reused rows (nothing they depend on changed; `--fresh` computes them again)", ""]
        lines += [f"- {name}: reused from {source}" for name, source in report["reused"].items()]
    warmed = [r["name"] for r in report["rows"] if r.get("warmup_calls")]
    if warmed:
        lines += ["", f"Warm-up: once per process, by {', '.join(warmed)} (its untimed calls); the other rows of "
                      "that process ran on it warm."]
    lines += time_lines(report)
    lines += spread.lines(report["rows"])
    media = [r for r in report["rows"] if r.get("media")]
    if media:
        lines += ["", "## Outputs to open", ""]
        lines += [f"- {r['name']}: " + ", ".join(f"[{Path(m).name}]({m})" for m in r["media"]) for r in media]
    unjudged = [r for r in report["rows"] if r["status"] == "inconclusive"]
    if unjudged:
        lines += ["", "## Rows that could not be judged (inconclusive: neither passed nor failed)", ""]
        lines += [f"- **{r['name']}**: " + "; ".join(r["reasons"]) for r in unjudged]
    failures = [r for r in report["rows"] if r["reasons"] and r["status"] != "inconclusive"]
    if failures:
        lines += ["", "## Why rows failed", ""]
        for r in failures:
            lines += [f"- **{r['name']}**: " + "; ".join(r["reasons"])]
    lines += power_lines(report["rows"])
    proofs = [(r["name"], p) for r in report["rows"] for p in r["proofs"]]
    if proofs:
        status = {r["name"]: r["status"] for r in report["rows"]}
        lines += ["", "## What each feature did (what the probes saw, not a verdict: a feature that acted can still be "
                      "wrong; the verdict column says whether the row is right)", ""]
        lines += [f"- {name} / {p['feature']}: {acted_word(p)} — {p['detail']} (verdict: {status[name]})"
                  for name, p in proofs]
    lines += further_outputs.lines(report)
    careful = [r for r in report["rows"] if r.get("speedup_caveats")]
    if careful:
        lines += ["", "## Speedups to read with care", ""]
        lines += [f"- {r['name']}: " + "; ".join(r["speedup_caveats"]) for r in careful]
    slow = [r for r in report["rows"] if (r.get("prediction") or {}).get("far_below")]
    if slow:
        from ditgate.run.define.predict import FAR_BELOW

        lines += ["", f"## Speedups far below the prediction (under {FAR_BELOW:g} of it)", ""]
        lines += [f"- {r['name']}: {r['speedup']:.2f}x measured, {r['prediction']['predicted']:.2f}x predicted"
                  for r in slow]
    if any(r.get("prediction") for r in report["rows"]):
        lines += ["", "Predicted: the best speedup the FLOPs allow, given the transformer's share of the baseline's "
                      "time (`ditgate flops` explains the count); communication is free in it."]
    elif report.get("prediction_note"):
        lines += ["", f"No speedup predictions: {report['prediction_note']}."]
    mem_kinds = {r["peak_memory_kind"] for r in report["rows"] if r["peak_memory_kind"]}
    if "cpu-process-peak-rss" in mem_kinds:
        lines += ["", "Peak memory on CPU is the peak resident set of the process that ran the row."]
    if report.get("grid") and report.get("grid_frames"):
        lines += ["", f"The grid shows frames {', '.join(map(str, report['grid_frames']))} of each video (the first, "
                      "where two ranks' chunks meet, the worst of any row, the last)."]
    lines += ["", "![baseline, rows and amplified differences](grid.png)" if report.get("grid") else ""]
    return "\n".join(lines).rstrip() + "\n"


AUDIO_METRICS = ("cosine", "si_sdr", "mel_psnr", "mel_ssim")  # latents first, then the waveform


def _audio_lines(report: dict[str, Any]) -> list[str]:
    """The audio table: latent cosine, SI-SDR, mel PSNR and SSIM per row, the calibration row's being the floor."""
    rows = [r for r in report["rows"] if r["modality"] == "audio" and r["metrics"]]
    if not rows:
        return []
    lines = ["", "## Audio (latents, then waveform; the calibration row is the measured noise floor)", "",
             "| row | latent cosine | SI-SDR | mel PSNR | mel SSIM | thresholds |", "|---|---|---|---|---|---|"]
    for r in rows:
        values = [_metric_text(m, r["metrics"].get(m)) for m in AUDIO_METRICS]
        checks = (r["verdict"] or {}).get("checks", [])
        limits = ", ".join(f"{c['metric']} {c['op']} {format_value(c['metric'], c['threshold'], threshold=True)}"
                           for c in checks if c["metric"] in AUDIO_METRICS)
        lines.append(f"| {r['name']} | " + " | ".join(values) + f" | {limits or '–'} |")
    return lines


def _metric_text(metric: str, value: Any) -> str:
    if value is None:
        return "–"
    return value if isinstance(value, str) else format_value(metric, value)


def write(run_dir: Path, cfg, states: list, wall_s: float | None = None, profile=None,
          profile_note: str | None = None, checks: list[dict[str, Any]] = (),
          twin: dict[str, Any] | None = None) -> dict[str, Any]:
    report = build(run_dir, cfg, states, wall_s, profile, profile_note, checks, twin)
    series = floor_report.frame_series(run_dir, report)
    frames = None
    if series:
        length = len(next(iter(series.values()))["psnr"])
        frames = floor_report.grid_frames(series, length)
        report["grid_frames"] = frames
    plot = floor_report.plot_frames(series, run_dir / floor_report.FRAMES_PLOT, report["rows"])
    report["frames_plot"] = plot.name if plot else None
    picture = grid(run_dir, report, frames)
    report["grid"] = str(picture.name) if picture else None
    validate(report)
    store.write_json(run_dir / "report.json", report)
    store.write_text(run_dir / "report.md", markdown(report))
    return report
