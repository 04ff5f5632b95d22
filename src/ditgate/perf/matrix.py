"""Acceptance benchmarking: the perf matrix of a model cache-dit supports, and speedup predictions.

The matrix is a set of rows run by the phase runner (`ditgate.run.runner`) against one baseline: cache presets with and
without TaylorSeer, torch.compile, quantization, context and tensor parallelism and their hybrids. Each row gets its
median latency, speedup, PSNR/SSIM against the baseline under its phase's gate, peak memory and a verdict.

Predictions come from a FLOP count of the transformer at the run's size (`ditgate.inspect.flops`) and from what the probes
measured (the transformer's share of the baseline's time, the calls a cached row skipped):

    transformer speedup  S = calls x F(1) / (computed x F(ranks) + cached x F_always(ranks))
    predicted speedup    1 / ((1 - p) + p / S)      (p: the baseline's time share spent in the transformer)

where F is the FLOPs of one transformer call per rank and F_always the part a cached call still runs (outside the
blocks, the first Fn and last Bn blocks). Communication is free in the prediction, so it is a ceiling. A measured
speedup under FAR_BELOW of its prediction is flagged.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ditgate.core.errors import DitgateError
from ditgate.run.rows import BASELINE, Row

# A speedup below this fraction of its prediction is "far below". Measured efficiencies of sound rows lie above it:
# a static cache schedule on one H200 reaches 0.97-0.98 of its ideal (research anchor), and published Ulysses-2
# numbers for FLUX.1-dev reach 0.77-0.84 of 2x (cache-dit: H100 9.30 s -> 6.04 s; L20 23.25 s -> 13.87 s).
FAR_BELOW = 0.7
ABOVE_CEILING = 1.1  # efficiencies above this are reported as a timing problem, not as a gain
TIERS = {"A": 2, "B": 4, "C": 8}  # most ranks a tier's rows use
TAYLORSEER_ORDER = 1  # cache-dit CLI --taylorseer-order default
QUANT_TYPE = "float8_per_row"  # cache_dit.QuantizeConfig default quant_type

# name: (Fn, Bn, cache-dit schedule (cache_dit.steps_mask mask_policy), where the values come from)
PRESETS: dict[str, tuple[int, int, str, str]] = {
    "conservative": (8, 0, "slow", "Fn=8 Bn=0 are DBCacheConfig()'s defaults; cache-dit's 'slow' step schedule"),
    "balanced": (4, 0, "medium", "F4B0 is cache-dit's benchmarked FLUX.1-dev row (2.66x at PSNR 31.5 with a "
                                 "dynamic threshold); cache-dit's 'medium' step schedule"),
    "fast": (1, 0, "fast", "F1B0 are the cache-dit CLI's --cache defaults; cache-dit's 'fast' step schedule"),
}
BALANCED = "cache-balanced"


def _cache(preset: str, max_fn: int | None, taylorseer: bool) -> tuple[dict[str, Any], str]:
    fn, bn, mask, _ = PRESETS[preset]
    cap = ""
    if max_fn is not None and fn + bn > max_fn:
        fn, cap = max(1, max_fn - bn), f" (Fn capped from {fn}: the model has {max_fn + 1} blocks)"
    cache = {"Fn_compute_blocks": fn, "Bn_compute_blocks": bn, "mask": mask}
    if taylorseer:
        cache["taylorseer"] = TAYLORSEER_ORDER
    return cache, (f"DBCache F{fn}B{bn}{cap}, cache-dit's {mask!r} step schedule (static)"
                   + (f", TaylorSeer order {TAYLORSEER_ORDER}" if taylorseer else ""))


def _parallel_name(u: int, t: int) -> str:
    if u > 1 and t > 1:
        return f"hybrid-u{u}xtp{t}"
    return f"cp-ulysses-{u}" if u > 1 else f"tp-{t}"


def _parallel_row(u: int, t: int, cache: dict | None = None) -> Row:
    parallel = {k: v for k, v in (("ulysses_size", u), ("tp_size", t)) if v > 1}
    name = _parallel_name(u, t)
    what = {"hybrid": f"Ulysses-{u} x TP-{t} on {u * t} ranks", "cp": f"Ulysses context parallelism, {u} ranks",
            "tp": f"tensor parallelism of the transformer, {t} ranks"}[name.split("-")[0]]
    if cache:
        return Row(f"{BALANCED}+{name}", "cache", cache=cache, parallel=parallel,
                   description=f"{what}, with the {BALANCED} preset; gated as cache against the single-device "
                               "baseline")
    phase = "hybrid" if u > 1 and t > 1 else ("cp" if u > 1 else "tp")
    return Row(name, phase, parallel=parallel, description=what)


def matrix_rows(tier: str = "A", max_fn: int | None = None) -> list[Row]:
    """The rows of a tier (A: 1-2 devices; B adds 4; C adds 8 with hybrid CP x TP). Tiers include the lower ones.

    `max_fn`: the most always-run blocks the model allows (its block count - 1); presets are capped to it."""
    tier = tier.upper()
    if tier not in TIERS:
        raise DitgateError(f"unknown tier {tier!r}; tiers: {', '.join(TIERS)}")
    rows: list[Row] = [BASELINE]
    for preset in PRESETS:
        for taylorseer in (False, True):
            cache, note = _cache(preset, max_fn, taylorseer)
            rows.append(Row(f"cache-{preset}" + ("+taylorseer" if taylorseer else ""), "cache", cache=cache,
                            description=note))
    balanced, note = _cache("balanced", max_fn, False)
    rows += [
        Row("compile", "compile", compile=True,
            description="torch.compile of the transformer's repeated blocks (cache-dit's --compile), "
                        "cache-dit's compiler settings; gated as exact"),
        Row(f"{BALANCED}+compile", "cache", cache=balanced, compile=True,
            description=f"{note}, plus torch.compile of the repeated blocks; gated as cache"),
        Row("quant-fp8", "quantization", quantize={"quant_type": QUANT_TYPE},
            description=f"cache-dit QuantizeConfig(quant_type={QUANT_TYPE!r}) of the transformer (torchao)"),
        Row("quant-fp8+compile", "quantization", quantize={"quant_type": QUANT_TYPE}, compile=True,
            description=f"QuantizeConfig(quant_type={QUANT_TYPE!r}) plus torch.compile of the repeated blocks: "
                        "eager fp8 quantizes activations op by op, compiled it fuses them"),
        _parallel_row(2, 1), _parallel_row(1, 2), _parallel_row(2, 1, balanced),
    ]
    if TIERS[tier] >= 4:
        rows += [_parallel_row(4, 1), _parallel_row(1, 4), _parallel_row(2, 2), _parallel_row(4, 1, balanced)]
    if TIERS[tier] >= 8:
        rows += [_parallel_row(8, 1), _parallel_row(1, 8), _parallel_row(4, 2), _parallel_row(2, 4),
                 _parallel_row(4, 2, balanced)]
    return rows


def max_fn(profile) -> int | None:
    """Blocks a cache preset may always run: the shortest cache unit minus one (one block left to cache)."""
    if profile is None or not profile.cache_units:
        return None
    return min(len(unit) for unit in profile.cache_units) - 1


# ------------------------------------------------------------------------------------------------ predictions


def profile_for(model_path: Path, request, dtype: str):
    """The FLOP profile at the request's size, or (None, why not)."""
    from ditgate.inspect import flops

    call = request.call
    if not (isinstance(call.get("height"), int) and isinstance(call.get("width"), int)):
        return None, "no --height/--width in the request: the FLOP model needs the size"
    try:
        profile = flops.analyze(model_path, height=call["height"], width=call["width"],
                                frames=call.get("num_frames"), text_len=call.get("max_sequence_length"), dtype=dtype)
    except DitgateError as exc:
        return None, str(exc)
    return profile, None


def _cached_calls(facts: dict[str, Any]) -> int:
    stats = (facts.get("cache") or [{}])[0]
    return len(stats.get("cached_steps", [])) + len(stats.get("cfg_cached_steps", []))


def predict(row: Row, result: dict[str, Any] | None, base: dict[str, Any] | None, profile) -> dict[str, Any] | None:
    """Predicted speedup of `row` over the baseline, and how the measurement compares (None: nothing to predict).

    Rows that compile or quantize get none, cache or not: their kernels differ from the baseline's, so time is no
    longer proportional to the FLOPs counted (on an H200 a compiled cached row ran 1.27x past the ceiling of its
    schedule). Reference rows get none either."""
    if profile is None or row.compile or row.quantize or not (row.cache or row.world_size > 1):
        return None
    if not (result and base and result.get("status") == "ok" and base.get("status") == "ok"):
        return None
    facts, base_facts = result.get("facts") or {}, base.get("facts") or {}
    calls = facts.get("transformer_calls") or 0
    if calls < 1:
        return None
    cached = _cached_calls(facts) if row.cache else 0
    cache = row.cache or {}
    fn, bn = int(cache.get("Fn_compute_blocks", 8)), int(cache.get("Bn_compute_blocks", 0))
    cp, tp = row.cp_size, row.tp_size
    full, always = profile.cost(cp=cp, tp=tp), profile.cost(profile.always_run(fn, bn), cp=cp, tp=tp)
    transformer = calls * profile.cost() / ((calls - cached) * full + cached * always)
    base_time, base_latency = base_facts.get("transformer_time_s"), base.get("latency_s")
    share = min(1.0, base_time / base_latency) if base_time and base_latency else None
    predicted = 1.0 / ((1 - share) + share / transformer) if share is not None else None
    measured = base_latency / result["latency_s"] if base_latency and result.get("latency_s") else None
    row_time = facts.get("transformer_time_s")
    out = {
        "calls": calls, "cached_calls": cached, "cp": cp, "tp": tp,
        "ideal_steps": calls / (calls - cached),  # total calls / computed calls
        "transformer": transformer,  # best transformer speedup (always-run blocks and ranks accounted)
        "transformer_share": share,  # of the baseline's latency
        "predicted": predicted,  # best end-to-end speedup
        "measured": measured,
        "efficiency": measured / predicted if measured and predicted else None,
        "transformer_measured": base_time / row_time if base_time and row_time else None,
    }
    out["transformer_efficiency"] = (out["transformer_measured"] / transformer if out["transformer_measured"]
                                     else None)
    out["far_below"] = out["efficiency"] is not None and out["efficiency"] < FAR_BELOW
    return out


def flops_summary(profile) -> dict[str, Any] | None:
    if profile is None:
        return None
    total = profile.flops()
    return {"transformer_class": profile.transformer_class, "tokens": profile.geometry.tokens,
            "image_tokens": profile.geometry.image_tokens, "text_tokens": profile.geometry.text_tokens,
            "forward_flops": total, "attention_share": profile.flops("attention") / total if total else 0.0,
            "gemm_share": profile.flops("gemm") / total if total else 0.0,
            "cp_share": profile.shares()["cp"], "tp_share": profile.shares()["tp"]}


# ------------------------------------------------------------------------------------------------ the matrix


def _status(record: dict[str, Any]) -> str:
    if record["status"] == "error" and (record.get("error") or {}).get("preflight"):
        return "refused"
    return record["status"]


def matrix(report: dict[str, Any], tier: str, warmup: int, repeats: int,
           prediction_note: str | None = None) -> dict[str, Any]:
    """matrix.json: the report's rows reduced to what an acceptance table shows."""
    import torch

    rows = []
    for r in report["rows"]:
        m = r.get("metrics") or {}
        prediction = r.get("prediction")
        rows.append({
            "name": r["name"], "phase": r["phase"], "world_size": r["world_size"], "description": r["description"],
            "config": r["config"], "status": _status(r), "latency_s": r["latency_s"],
            "modality": r.get("modality"), "times": r.get("times"), "speedup": r["speedup"],
            "predicted": (prediction or {}).get("predicted"), "efficiency": (prediction or {}).get("efficiency"),
            "far_below": bool((prediction or {}).get("far_below")), "prediction": prediction,
            "psnr": m.get("psnr"), "ssim": m.get("ssim"), "max_abs": m.get("max_abs"),
            "peak_memory_bytes": r["peak_memory_bytes"], "peak_memory_kind": r["peak_memory_kind"],
            "reasons": r["reasons"],
        })
    ran = [r for r in rows if r["status"] not in ("refused", "reference")]
    return {
        "model": report["model"], "tier": tier, "device": report["device"], "dtype": report["dtype"],
        "request": report["request"], "versions": report["versions"], "warmup": warmup, "repeats": repeats,
        "cpu_threads": None if str(report["device"]).startswith("cuda") else torch.get_num_threads(),
        "run_dir": report["run_dir"], "flops": report.get("flops"),
        "prediction_note": prediction_note or report.get("prediction_note"),
        "passed": all(r["status"] == "passed" for r in ran),
        "far_below": FAR_BELOW, "rows": rows,
    }


def markdown(data: dict[str, Any]) -> str:
    from ditgate.run.report import fmt, size_text

    call = data["request"]["call"]
    size = size_text(call)
    bad = [r["name"] for r in data["rows"] if r["status"] in ("failed", "error")]
    verdict = f"failed: {', '.join(bad)}" if bad else "every row that ran passed its gate"
    lines = [
        f"# ditgate matrix: {data['model']} (tier {data['tier']})", "",
        f"- verdict: **{'PASS' if data['passed'] else 'FAIL'}** ({verdict})",
        f"- size {size or 'pipeline default'}, {call.get('num_inference_steps', '?')} steps, {data['dtype']} on "
        f"{data['device']}; warm-up {data['warmup']}, {data['repeats']} timed repeats, median latency",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in data["versions"].items()),
    ]
    if data.get("flops"):
        f = data["flops"]
        lines.append(f"- transformer forward: {f['forward_flops'] / 1e9:.3g} GFLOP over {f['tokens']} tokens, "
                     f"attention {f['attention_share']:.1%}, GEMM {f['gemm_share']:.1%}; CP divides "
                     f"{f['cp_share']:.1%} of it, TP {f['tp_share']:.1%}")
    elif data.get("prediction_note"):
        lines.append(f"- no speedup predictions: {data['prediction_note']}")
    lines += ["", "| row | phase | ranks | latency (s) | speedup | predicted | efficiency | PSNR (dB) | SSIM | "
                  "peak memory (MiB) | verdict |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        mem = r["peak_memory_bytes"] / 2**20 if r["peak_memory_bytes"] else None
        speed = fmt(r["speedup"], ".2f") + (" (far below)" if r["far_below"] else "")
        lines.append(f"| {r['name']} | {r['phase'] or 'reference'} | {r['world_size']} | "
                     f"{fmt(r['latency_s'], '.3f')} | {speed} | {fmt(r['predicted'], '.2f')} | "
                     f"{fmt(r['efficiency'], '.2f')} | {fmt(r['psnr'], '.2f')} | {fmt(r['ssim'], '.4f')} | "
                     f"{fmt(mem, '.0f')} | {r['status'].upper()} |")
    refused = [r for r in data["rows"] if r["status"] == "refused"]
    if refused:
        lines += ["", "## Not run here", ""] + [f"- **{r['name']}**: {r['reasons'][0].removeprefix('not run: ')}"
                                                for r in refused]
    failed = [r for r in data["rows"] if r["status"] in ("failed", "error")]
    if failed:
        lines += ["", "## Why rows failed", ""] + [f"- **{r['name']}**: " + "; ".join(r["reasons"]) for r in failed]
    slow = [r for r in data["rows"] if r["far_below"]]
    if slow:
        lines += ["", f"## Speedups far below the prediction (under {FAR_BELOW:g} of it)", ""]
        for r in slow:
            p = r["prediction"]
            lines.append(f"- **{r['name']}**: {r['speedup']:.2f}x measured, {p['predicted']:.2f}x predicted; the "
                         f"transformer alone {fmt(p['transformer_measured'], '.2f')}x of "
                         f"{p['transformer']:.2f}x possible")
    above = [r["name"] for r in data["rows"] if (r["efficiency"] or 0) > ABOVE_CEILING]
    if above:
        lines += ["", f"Above the ceiling (efficiency over {ABOVE_CEILING:g}): {', '.join(above)}. A prediction is a "
                      "ceiling for time proportional to FLOPs; beating it means the rows were timed under different "
                      "load, or (tiny models on CPU) per-op overhead outweighs FLOPs. Compare the repeats in "
                      "matrix.json (`times`) before trusting either number."]
    lines += ["", "Columns: speedup = baseline latency / row latency; predicted = the ceiling from FLOPs and the "
                  "baseline's transformer time share (communication free); efficiency = speedup / predicted.",
              "Rows are described in matrix.json (`description`, `config`). Cache presets: "
              + "; ".join(f"{name}: {source}" for name, (*_, source) in PRESETS.items()) + "."]
    if str(data["device"]).startswith("cpu"):
        lines.append(f"On CPU the ranks of a parallel row share the machine's cores: those rows check correctness, "
                     f"their speedups say nothing about GPUs. Every process (a single-process row, each rank) ran "
                     f"{data['cpu_threads']} thread(s). Peak memory is the process's peak resident set.")
    lines += ["", "![speedup against PSNR](speedup_vs_psnr.png)"]
    return "\n".join(lines) + "\n"


def plot(data: dict[str, Any], path: Path, gates: dict[str, float] | None = None) -> Path | None:
    """speedup_vs_psnr.png: each row that ran at (PSNR against the baseline, speedup); predictions as crosses."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    points = [r for r in data["rows"] if r["speedup"] is not None and r["psnr"] is not None]
    if not points:
        return None
    finite = [float(r["psnr"]) for r in points if isinstance(r["psnr"], (int, float)) and math.isfinite(r["psnr"])]
    cap = (max(finite) if finite else 60.0) + 10.0  # identical outputs (infinite PSNR) are drawn at the right edge
    figure = Figure(figsize=(8, 5.5), dpi=110)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    colours = {"passed": "tab:green", "failed": "tab:red", "error": "tab:red"}
    for r in points:
        x = float(r["psnr"]) if isinstance(r["psnr"], (int, float)) and math.isfinite(r["psnr"]) else cap
        axes.scatter([x], [r["speedup"]], color=colours.get(r["status"], "tab:gray"), zorder=3)
        axes.annotate(r["name"], (x, r["speedup"]), textcoords="offset points", xytext=(4, 4), fontsize=7)
        if r["predicted"]:
            axes.plot([x, x], [r["speedup"], r["predicted"]], color="tab:gray", linestyle=":", linewidth=0.8)
            axes.scatter([x], [r["predicted"]], marker="x", color="tab:gray", zorder=2)
    axes.axhline(1.0, color="black", linewidth=0.6)
    for label, value in (gates or {}).items():
        axes.axvline(value, color="tab:blue", linestyle="--", linewidth=0.7)
        axes.annotate(label, (value, axes.get_ylim()[1]), fontsize=7, rotation=90, va="top", ha="right")
    axes.set_xlabel("PSNR against the baseline (dB); identical outputs at the right edge")
    axes.set_ylabel("speedup over the baseline (x)")
    axes.set_title(f"{data['model']}, tier {data['tier']}, {data['device']}: measured (dots), predicted (crosses)",
                   fontsize=9)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp")
    figure.savefig(tmp, format="png")
    tmp.replace(path)
    return path


def gate_lines(modality: str = "image") -> dict[str, float]:
    """PSNR thresholds to draw: the lossy (cache) gate and the exact (cp) gate of gates.json."""
    from ditgate.gates.verdicts import load_gates

    phases = load_gates()["phases"]
    lines = {}
    for phase, label in (("cache", "cache gate"), ("cp", "exact gate")):
        checks = phases[phase]["modalities"].get(modality, {}).get("checks", [])
        for check in checks:
            if check["metric"] in ("psnr", "psnr_frame_min"):
                lines[f"{label} {check['value']:g} dB"] = float(check["value"])
    return lines


def write(run_dir: Path, data: dict[str, Any]) -> None:
    from ditgate.run import store

    modality = next((r.get("modality") for r in data.get("rows", []) if r.get("modality")), "image")
    picture = plot(data, run_dir / "speedup_vs_psnr.png", gate_lines(modality if modality != "audio" else "image"))
    data["plot"] = picture.name if picture else None
    store.write_json(run_dir / "matrix.json", data)
    store.write_text(run_dir / "matrix.md", markdown(data))
