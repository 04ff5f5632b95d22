"""Acceptance benchmarking: the perf matrix of a model cache-dit supports, and speedup predictions.

The matrix is a set of rows run by the phase runner (`ditgate.run.runner`) against one baseline: cache presets with and
without TaylorSeer, torch.compile, quantization, context and tensor parallelism and their hybrids. Each row gets its
median latency, speedup, PSNR/SSIM against the baseline under its phase's gate, peak memory and a verdict.

Predictions come from a FLOP count of the transformer at the run's size (`ditgate.inspect.flops.profile`) and from what the probes
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
from ditgate.run.define.rows import BASELINE, Row
from ditgate.run.define.predict import ABOVE_CEILING, FAR_BELOW

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




# ------------------------------------------------------------------------------------------------ predictions










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
            "reasons": r["reasons"], "verdict": r.get("verdict"),
        })
    ran = [r for r in rows if r["status"] not in ("refused", "reference")]
    return {
        "model": report["model"], "tier": tier, "device": report["device"], "dtype": report["dtype"],
        "request": report["request"], "versions": report["versions"], "warmup": warmup, "repeats": repeats,
        "cpu_threads": None if str(report["device"]).startswith("cuda") else torch.get_num_threads(),
        "run_dir": report["run_dir"], "flops": report.get("flops"),
        "prediction_note": prediction_note or report.get("prediction_note"),
        "passed": all(r["status"] == "passed" for r in ran),
        "outcome": report.get("outcome") or ("passed" if all(r["status"] == "passed" for r in ran) else "failed"),
        "far_below": FAR_BELOW, "rows": rows,
    }


def markdown(data: dict[str, Any]) -> str:
    from ditgate.run.report import spread
    from ditgate.run.report.run_report import fmt, size_text, steps_text

    call = data["request"]["call"]
    size = size_text(call)
    bad = [r["name"] for r in data["rows"] if r["status"] in ("failed", "error")]
    unjudged = [r["name"] for r in data["rows"] if r["status"] == "inconclusive"]
    verdict = (f"failed: {', '.join(bad)}" if bad else f"could not judge: {', '.join(unjudged)}" if unjudged
               else "every row that ran passed its gate")
    lines = [
        f"# ditgate matrix: {data['model']} (tier {data['tier']})", "",
        f"- verdict: **{'PASS' if data['passed'] else 'INCONCLUSIVE' if unjudged and not bad else 'FAIL'}** ({verdict})",
        f"- size {size or 'the pipeline default'}, {steps_text(data['request'])}, {data['dtype']} on "
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
    if unjudged:
        lines += ["", "## Rows that could not be judged (inconclusive)", ""] + [
            f"- **{r['name']}**: " + "; ".join(r["reasons"]) for r in data["rows"] if r["status"] == "inconclusive"]
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
    lines += spread.lines(data["rows"])
    lines += ["", "![speedup against PSNR](speedup_vs_psnr.png)"]
    return "\n".join(lines) + "\n"


def _speedup_range(row: dict[str, Any], base_latency: float | None) -> tuple[float, float] | None:
    """(lowest, highest) speedup over the row's timed repeats against the baseline's median; None with one repeat."""
    times = [t for t in row.get("times") or [] if t]
    if len(times) < 2 or not base_latency:
        return None
    return base_latency / max(times), base_latency / min(times)


def plot(data: dict[str, Any], path: Path, gates: dict[str, float] | None = None) -> Path | None:
    """speedup_vs_psnr.png: each row that ran at (PSNR against the baseline, speedup), numbered, its name in the
    legend beside the plot; error bars: the speedup over its repeats (slowest to fastest); predictions as crosses;
    the PSNR gates as vertical lines named in the legend; identical outputs (infinite PSNR) as triangles at an
    "inf" tick on the right."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    points = [r for r in data["rows"] if r["speedup"] is not None and r["psnr"] is not None]
    if not points:
        return None
    def psnr_of(r):
        return float(r["psnr"]) if isinstance(r["psnr"], (int, float)) else math.inf

    finite = [psnr_of(r) for r in points if math.isfinite(psnr_of(r))]
    top = max(finite + list((gates or {}).values()) + [40.0])
    cap = top + max(5.0, 0.08 * top)  # where identical outputs (infinite PSNR) are drawn
    base = next((r for r in data["rows"] if r["name"] == "baseline"), None)
    base_latency = (base or {}).get("latency_s")
    figure = Figure(figsize=(10, 5.5), dpi=110)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    colours = {"passed": "tab:green", "failed": "tab:red", "error": "tab:red", "inconclusive": "tab:orange"}
    handles = []
    for i, r in enumerate(points, 1):
        x = psnr_of(r) if math.isfinite(psnr_of(r)) else cap
        colour = colours.get(r["status"], "tab:gray")
        spread = _speedup_range(r, base_latency)
        yerr = [[max(0.0, r["speedup"] - spread[0])], [max(0.0, spread[1] - r["speedup"])]] if spread else None
        axes.errorbar([x], [r["speedup"]], yerr=yerr, fmt="^" if x == cap else "o", color=colour, ecolor=colour,
                      elinewidth=0.8, capsize=3, zorder=3)
        axes.annotate(str(i), (x, r["speedup"]), textcoords="offset points", xytext=(5, 3), fontsize=8,
                      fontweight="bold")
        handles.append(Line2D([], [], marker="o", linestyle="none", color=colour,
                              label=f"{i}  {r['name']} ({r['status']})"))
        if r["predicted"]:
            axes.plot([x, x], [r["speedup"], r["predicted"]], color="tab:gray", linestyle=":", linewidth=0.8)
            axes.scatter([x], [r["predicted"]], marker="x", color="tab:gray", zorder=2)
    axes.axhline(1.0, color="black", linewidth=0.6)
    for (label, value), style in zip((gates or {}).items(), ("--", "-.", ":")):
        handles.append(axes.axvline(value, color="tab:blue", linestyle=style, linewidth=0.9, label=label))
    handles.append(Line2D([], [], marker="x", linestyle="none", color="tab:gray", label="predicted (FLOPs)"))
    if any(not math.isfinite(psnr_of(r)) for r in points):
        ticks = [t for t in axes.get_xticks() if t < cap - 0.5 * (cap - top)]
        axes.set_xticks(ticks + [cap], [f"{t:g}" for t in ticks] + ["inf"])
    axes.set_xlabel("PSNR against the baseline (dB)")
    axes.set_ylabel("speedup over the baseline (x); bars: slowest to fastest repeat")
    axes.set_title(f"{data['model']}, tier {data['tier']}, {data['device']}: measured (dots), predicted (crosses)",
                   fontsize=9)
    axes.grid(alpha=0.3)
    axes.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
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
    from ditgate.run.exec import files as store

    modality = next((r.get("modality") for r in data.get("rows", []) if r.get("modality")), "image")
    picture = plot(data, run_dir / "speedup_vs_psnr.png", gate_lines(modality if modality != "audio" else "image"))
    data["plot"] = picture.name if picture else None
    store.write_json(run_dir / "matrix.json", data)
    store.write_text(run_dir / "matrix.md", markdown(data))
