"""The papermill notebooks (`notebooks/NN_phase.ipynb`): what their cells call, and running them in order.

A notebook is thin. Its `parameters` cell holds typed values (`model`, `integration`, `height`, ... with 0 or ""
meaning "the default"); the next cells call this module: `results_dir` picks the folder, `run_phase` (or
`inspect`, `run_matrix`) does the work, `show` displays the results table and the image grid, and the last cell,
`finish`, writes `<out>/<phase>.json` and raises `GateFailed` when the phase's gate fails. Thresholds come from
`checklists/gates.json` (or the table named by the `gates` parameter); a notebook holds none.

`run_notebooks` executes notebooks with papermill into one folder (`<out>/<NN_phase>.ipynb` beside the phase
results), in order, stopping at the first failure unless asked to go on; `ditgate notebook run` is its front end.

    <out>/<phase>/                a `ditgate run` folder (report.json, report.md, grid.png, rows/)
    <out>/<phase>.json            the phase's result: passed, reasons, one line per row
    <out>/<NN_phase>.ipynb        the executed notebook
    <out>/notebooks.json          the summary of `run_notebooks`
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from ditgate.core import request as request_mod
from ditgate.run.exec import files as store
from ditgate.core.errors import DitgateError
from ditgate.notebooks.catalog import NOTEBOOKS, ROW_PHASE
from ditgate.notebooks.catalog import GateFailed, GateInconclusive
from ditgate.notebooks.display import captured














# ----------------------------------------------------------------------------------------- what the cells call


def results_dir(out: str, model: str) -> Path:
    """The folder of the phase results: `out`, or a new one under runs/ named after the model."""
    if out:
        return Path(out)
    from ditgate.run.runner import default_out

    folder = default_out(model)
    return folder.with_name(f"notebooks-{folder.name}")


def _scaled(row, world_size: int):
    """`row` (a default row of 2 ranks, or the 4-rank hybrid) for `world_size` ranks."""
    if row.world_size == 1 or row.world_size == world_size:
        return row
    p = dict(row.parallel)
    if row.phase == "hybrid":
        if world_size < 4 or world_size % 2:
            raise DitgateError(f"the hybrid row needs an even world_size of at least 4, got {world_size}")
        p["tp_size"] = world_size // 2
        return replace(row, name=f"hybrid-u{p['ulysses_size']}xtp{p['tp_size']}", parallel=p,
                       description=f"Ulysses-{p['ulysses_size']} x TP-{p['tp_size']} on {world_size} ranks")
    p = {k: world_size if k in ("ulysses_size", "ring_size", "tp_size") and v == 2 else v for k, v in p.items()}
    two = re.compile(r"\b2\b")
    return replace(row, name=two.sub(str(world_size), row.name), parallel=p,
                   description=two.sub(str(world_size), row.description))


def phase_rows(phase: str, world_size: int = 2) -> list:
    """The rows a phase's notebook runs (baselines added): the default rows of `ditgate run` whose phase it is,
    their parallel sizes set to `world_size`."""
    from ditgate.run.define import rows

    if world_size < 2:
        raise DitgateError(f"world_size must be at least 2, got {world_size}")
    if phase == "baseline":
        return [rows.BASELINE]
    key = ROW_PHASE.get(phase, phase)
    chosen = [_scaled(r, world_size) for r in rows.DEFAULT_ROWS if r.phase == key]
    if not chosen:
        raise DitgateError(f"no default row checks phase {phase!r}")
    return rows.select([*rows.DEFAULT_ROWS, *chosen], [r.name for r in chosen])


def _model(model: str, opts: dict[str, Any], dtype: str, device: str):
    """The one model value (ditgate.core.model.Model), from a notebook's parameters: "" and 0 keep the defaults."""
    from ditgate.core.model import Model

    call = opts.get("call") or ""
    try:
        call = json.loads(call) if isinstance(call, str) and call else (call or {})
    except ValueError as exc:
        raise DitgateError(f"call: not a JSON object ({exc})") from None
    if not isinstance(call, dict):
        raise DitgateError("call: expected a JSON object of argument names to values")
    return Model.open(model, pipeline=opts.get("pipeline") or None,
                      trust_remote_code=bool(opts.get("trust_remote_code")), dtype=dtype, device=device, call=call,
                      call_file=opts.get("call_file") or None, image=opts.get("image") or None,
                      **{k: opts.get(k) or None for k in ("height", "width", "frames", "steps")})


def run_phase(phase: str, model: str, out_dir: Path, *, rows: str = "", world_size: int = 2, integration: str = "",
              dtype: str = "auto", device: str = "auto", gates: str = "", timeout: float = 600.0,
              resume: bool = False, progress: Callable[[str], None] | None = None, twin: str = "auto",
              **request_opts) -> dict[str, Any]:
    """Run the phase's rows (or the named `rows` of `ditgate run`) in `out_dir/<phase>`; returns the report.
    `request_opts`: pipeline, trust_remote_code, call (a JSON object), call_file, image, height, width, frames,
    steps, as the commands take them; `twin`: twin rows as `ditgate run --twin` (auto: in reduced precision)."""
    from ditgate.run.define import rows as rows_mod
    from ditgate.gates.verdicts import load_gates
    from ditgate.run.runner import RunConfig, run

    if gates:
        load_gates(gates)  # a broken table fails now, not after every row has run (and before anything is written)
    log_path = Path(out_dir) / f"{phase}.log"
    with captured(log_path) as log:  # the libraries' imports and messages, the ranks' output: into the log
        chosen = (rows_mod.select([*rows_mod.DEFAULT_ROWS, *phase_rows(phase, world_size)], rows) if rows
                  else phase_rows(phase, world_size))
        cfg = RunConfig(model=_model(model, request_opts, dtype, device), rows=chosen, out=Path(out_dir) / phase,
                        integration=Path(integration) if integration else None, timeout=timeout, resume=resume,
                        gates=Path(gates) if gates else None, twin=twin, diff=True)
        report = run(cfg, progress or (lambda line: print(line, file=log, flush=True)))
    report["gates"] = gates or "checklists/gates.json"
    report["log"] = str(log_path)
    return report


def inspect(model: str, out_dir: Path, *, dtype: str = "auto", device: str = "auto", **request_opts):
    """`ditgate inspect`: the anatomy; the draft plan is written to `out_dir/plan.md`."""
    from ditgate.inspect.anatomy import inspect_model, write_text_atomic

    log_path = Path(out_dir) / "inspect.log"
    with captured(log_path):
        anatomy = inspect_model(_model(model, request_opts, dtype, device))
    write_text_atomic(Path(out_dir) / "plan.md", anatomy.plan)
    anatomy.log = str(log_path)  # shown folded by `show`
    return anatomy


def run_matrix(model: str, out_dir: Path, *, tier: str = "A", rows: str = "", integration: str = "",
               dtype: str = "auto", device: str = "auto", warmup: int = -1, repeats: int = 0, timeout: float = 600.0,
               **request_opts) -> dict[str, Any]:
    """`ditgate matrix` into `out_dir/perf_matrix`; returns matrix.json. -1, 0 and "" keep the command's defaults."""
    from ditgate.perf import acceptance

    warmup, repeats, tier = (1 if warmup < 0 else warmup), (repeats or 3), tier.upper()
    acceptance.check_options(tier, request_mod.resolve_device(device), warmup, repeats, 1)
    log_path = Path(out_dir) / "perf_matrix.log"
    with captured(log_path):
        opened = _model(model, request_opts, dtype, device)
        chosen, profile, note = acceptance.plan_rows(opened, tier, rows=rows or None)
        acceptance.run_matrix(opened, chosen, profile, note, tier=tier, out=Path(out_dir) / "perf_matrix",
                              warmup=warmup, repeats=repeats, timeout=timeout,
                              integration=Path(integration) if integration else None)
    return json.loads((Path(out_dir) / "perf_matrix" / "matrix.json").read_text()) | {"log": str(log_path)}


# ------------------------------------------------------------------------------------------------ display


def _verdict(data: dict[str, Any]) -> tuple[bool, str, list[str]]:
    """(passed, title, reasons) of a run's report or a matrix, as the banner shows them."""
    if "tier" in data:
        failed = [r for r in data["rows"] if r["status"] in ("failed", "error")]
        ran = [r for r in data["rows"] if r["status"] not in ("refused", "reference")]
        return (bool(data["passed"]), f"matrix of {data['model']}: {len(ran) - len(failed)} of {len(ran)} rows passed",
                [f"{r['name']}: {'; '.join(r.get('reasons') or []) or r['status']}" for r in failed])
    result = _run_result("", data, Path(data["run_dir"]).parent)
    gated = [r for r in data["rows"] if r.get("phase")]
    passed = [r for r in gated if r["status"] == "passed"]
    return result["passed"], f"{data['model']}: {len(passed)} of {len(gated)} gated rows passed", result["reasons"]


def show(data: Any, results_of: Path | None = None) -> None:
    """Display a result in the notebook, in reading order: the PASS/FAIL banner, the gates (threshold, value,
    margin), the table (report.md, matrix.md, or with `results_of` the results table of every phase in that
    folder, written to results.md), audio players, where a failed exact row departs from its baseline, the picture,
    and the folded log."""
    from IPython.display import HTML, Audio, Image, Markdown, display

    from ditgate.notebooks import display as view

    if hasattr(data, "block_lists"):  # an Anatomy
        from ditgate.inspect.text import render

        result = inspect_result(data.to_dict())
        display(HTML(view.banner(result["passed"], f"inspect {result['model']}", result["reasons"])))
        display(Markdown(f"```text\n{render(data)}\n```"))
        if getattr(data, "log", None):
            display(HTML(view.folded_log(data.log)))
        return
    run_dir = Path(data["run_dir"])
    matrix = "tier" in data
    display(HTML(view.banner(*_verdict(data))))
    gates = view.gate_table(data["rows"])
    if gates:
        display(Markdown("**Gates** (margin: how far inside its threshold each value is; − outside)\n\n" + gates))
    if results_of is not None:
        table = results_table(results_of, data)
        store.write_text(Path(results_of) / "results.md", table)
    else:
        table = view.strip_pictures((run_dir / ("matrix.md" if matrix else "report.md")).read_text())
        table = table.replace("](rows/", f"]({run_dir.name}/rows/")  # links from the notebook, one folder up
    display(Markdown(table))
    if not matrix:
        for row in data["rows"]:
            wav = store.row_dir(run_dir, row["name"]) / "output.wav"
            if row["status"] != "error" and wav.is_file():
                display(Markdown(f"**{row['name']}**"), Audio(filename=str(wav)))
        view.show_diff(run_dir, [r for r in data["rows"] if r.get("diff")])
    picture = data.get("plot" if matrix else "grid")
    if picture and (run_dir / picture).is_file():
        display(Image(filename=str(run_dir / picture)))
    if data.get("log"):
        display(HTML(view.folded_log(data["log"])))


# ------------------------------------------------------------------------------------------------- results

_ROW_KEYS = ("name", "phase", "baseline", "world_size", "status", "modality", "latency_s", "speedup", "metrics",
             "psnr", "ssim", "max_abs", "reasons")


def inspect_result(anatomy: dict[str, Any]) -> dict[str, Any]:
    """The gate check's verdict on an anatomy (`Anatomy.to_dict()`): every block list that ran has a pattern."""
    lists = anatomy["block_lists"]
    reasons = []
    if not lists:
        reasons.append("inspect found no block ModuleList directly on a transformer")
    elif not any(b["called"] for b in lists):
        reasons.append("no block list was called during the observed run")
    for b in lists:
        if b["called"] and b["pattern"] is None:
            reasons.append(f"{b['transformer']}.{b['attribute']}: no cache-dit ForwardPattern fits "
                           f"({b['pattern_reason']})")
    return {"model": anatomy["model"], "passed": not reasons, "reasons": reasons,
            "block_lists": [{"list": f"{b['transformer']}.{b['attribute']}", "length": b["length"],
                             "pattern": b["pattern"], "called": b["called"]} for b in lists],
            "has_separate_cfg": anatomy["has_separate_cfg"], "warnings": anatomy["warnings"], "anatomy": anatomy}


def _not_finite(run_dir: Path, name: str) -> bool:
    import numpy as np

    output = store.load_array(run_dir, name, "output")
    return output is not None and not np.isfinite(output).all()


def _run_result(phase: str, data: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    rows = [{k: r.get(k) for k in _ROW_KEYS if k in r} for r in data["rows"]]
    reasons = [f"{r['name']}: {'; '.join(r['reasons']) or r['status']}" for r in rows
               if r["status"] not in ("passed", "reference", "refused")]
    unjudged = bool(reasons) and all(r["status"] in ("passed", "reference", "refused", "inconclusive") for r in rows)
    reasons += [f"{r['name']}: the reference output contains NaN or Inf" for r in rows
                if r["status"] == "reference" and _not_finite(Path(data["run_dir"]), r["name"])]
    result = {"model": data["model"], "passed": bool(data["passed"]) and not reasons, "reasons": reasons,
              "run_dir": data["run_dir"], "gates": data.get("gates"), "rows": rows,
              "inconclusive": unjudged and len(reasons) == sum(r["status"] == "inconclusive" for r in rows)}
    if phase == "final":
        earlier = collect(out_dir)
        result["phases"] = {p: r["passed"] for p, r in earlier.items()}
        result["reasons"] += [f"phase {p} failed (see {p}.json)" for p, r in earlier.items() if not r["passed"]]
        result["passed"] = result["passed"] and all(r["passed"] for r in earlier.values())
    return result


def finish(phase: str, data: Any, out_dir: Path) -> dict[str, Any]:
    """Write `<out_dir>/<phase>.json` and raise GateFailed when the phase did not pass; returns the result."""
    if hasattr(data, "block_lists"):  # an Anatomy
        data = data.to_dict()
    body = inspect_result(data) if "block_lists" in data else _run_result(phase, data, Path(out_dir))
    result = {"phase": phase, **body}
    path = Path(out_dir) / f"{phase}.json"
    store.write_json(path, result)
    print(f"{phase}: {'PASSED' if result['passed'] else 'INCONCLUSIVE' if result.get('inconclusive') else 'FAILED'} "
          f"-> {path}")
    if not result["passed"] and result.get("inconclusive"):
        raise GateInconclusive(f"{phase} could not be judged: " + " | ".join(result["reasons"]))
    if not result["passed"]:
        raise GateFailed(f"{phase} gate failed: " + " | ".join(result["reasons"] or ["(no reason recorded)"]))
    return result


def collect(out_dir: Path) -> dict[str, dict[str, Any]]:
    """The phase results in `out_dir` (not the final one), in notebook order."""
    found = {}
    for nb in NOTEBOOKS:
        path = Path(out_dir) / f"{nb.phase}.json"
        if nb.phase != "final" and path.is_file():
            found[nb.phase] = json.loads(path.read_text())
    return found


def results_table(out_dir: Path, report: dict[str, Any] | None = None) -> str:
    """Markdown: every gated row of the phase results in `out_dir`, then `report`'s rows; each row once."""
    from ditgate.run.report.run_report import fmt

    lines = ["| phase | row | ranks | latency (s) | speedup | PSNR (dB) | SSIM | max-abs (latents) | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    sources = [(p, r.get("rows", [])) for p, r in collect(out_dir).items()]
    if report is not None:
        sources.append(("final", report["rows"]))
    seen = set()
    for phase, rows in sources:
        for r in rows:
            if r.get("status") == "reference" or r["name"] in seen:  # e.g. the cache row, also cp's reference
                continue
            seen.add(r["name"])
            m = r.get("metrics") or {}
            psnr = m.get("psnr", m.get("psnr_frame_min", r.get("psnr")))
            ssim = m.get("ssim", m.get("ssim_frame_min", r.get("ssim")))
            lines.append(f"| {phase} | {r['name']} | {r.get('world_size', '–')} | {fmt(r.get('latency_s'), '.3f')} | "
                         f"{fmt(r.get('speedup'), '.2f')} | {fmt(psnr, '.2f')} | {fmt(ssim, '.4f')} | "
                         f"{fmt(m.get('max_abs', r.get('max_abs')), '.2e')} | {str(r.get('status', '–')).upper()} |")
    return "\n".join(lines) + "\n"


def show_results(out_dir: Path, report: dict[str, Any] | None = None) -> str:
    """Display the results table alone and write it to `<out_dir>/results.md`; returns the Markdown (the final
    notebook shows it through `show(report, results_of=out_dir)`, with the banner and the gates)."""
    from IPython.display import Markdown, display

    table = results_table(out_dir, report)
    store.write_text(Path(out_dir) / "results.md", table)
    display(Markdown(table))
    return table


# ------------------------------------------------------------------------------------- running with papermill
















