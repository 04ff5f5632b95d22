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
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable

from . import store
from .errors import DitgateError
from .paths import repo_root


class GateFailed(DitgateError):
    """A phase's gate failed; the message names each failing row and why."""


class NotebookError(DitgateError):
    """A notebook cannot be run as asked: unknown name, unknown or mistyped parameter, no Jupyter kernel."""


@dataclass(frozen=True)
class Notebook:
    stem: str        # file name without .ipynb: "30_cp"
    phase: str       # what it checks; its result is <out>/<phase>.json
    title: str
    kind: str        # "inspect", "rows", "final", "matrix": which cells it has
    model: str = "zoo:flux"  # default of its `model` parameter
    world_size: int = 2      # default of its `world_size` parameter (rows of more than one rank)
    in_all: bool = True      # part of `ditgate notebook run all` (the integration route)

    @property
    def path(self) -> Path:
        return notebooks_dir() / f"{self.stem}.ipynb"


NOTEBOOKS: tuple[Notebook, ...] = (
    Notebook("00_inspect", "inspect", "Inspect: the model's anatomy and a draft plan", "inspect"),
    Notebook("10_baseline", "baseline", "Baseline: the single-process reference", "rows"),
    Notebook("20_cache", "cache", "Cache (DBCache)", "rows"),
    Notebook("30_cp", "cp", "Context parallelism (Ulysses, ring, cache + Ulysses)", "rows"),
    Notebook("40_tp", "tp", "Tensor parallelism", "rows"),
    Notebook("50_tep", "tep", "Text-encoder parallelism", "rows"),
    Notebook("60_vaep", "vaep", "VAE parallelism", "rows"),
    Notebook("70_final", "final", "Final: hybrid CP x TP and the results table", "final", world_size=4),
    Notebook("80_perf_matrix", "perf_matrix", "Perf matrix: acceptance benchmark of a supported model", "matrix",
             in_all=False),
    Notebook("90_audio", "audio", "Audio route: cache on an audio model, gated against its noise floor", "rows",
             model="zoo:stable-audio", in_all=False),
)
# What the rows of a notebook check, when it is not a phase of `ditgate run`'s rows by itself.
ROW_PHASE = {"final": "hybrid", "audio": "cache"}


def notebooks_dir() -> Path:
    return repo_root() / "notebooks"


def find(names: str) -> list[Notebook]:
    """Notebooks named in `names`: "all" (the integration route, 00-70), or a comma-separated list of phases
    ("cp") or file stems ("30_cp"). Order follows NOTEBOOKS."""
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    if wanted == ["all"]:
        return [nb for nb in NOTEBOOKS if nb.in_all]
    known = {key: nb for nb in NOTEBOOKS for key in (nb.phase, nb.stem)}
    unknown = [n for n in wanted if n not in known]
    if unknown or not wanted:
        raise NotebookError(f"unknown notebook(s) {', '.join(unknown) or '(none given)'}; use all, or any of: "
                            + ", ".join(nb.phase for nb in NOTEBOOKS))
    chosen = {known[n].stem for n in wanted}
    return [nb for nb in NOTEBOOKS if nb.stem in chosen]


# ----------------------------------------------------------------------------------------- what the cells call


def results_dir(out: str, model: str) -> Path:
    """The folder of the phase results: `out`, or a new one under runs/ named after the model."""
    if out:
        return Path(out)
    from .runner import default_out

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
    from . import rows

    if world_size < 2:
        raise DitgateError(f"world_size must be at least 2, got {world_size}")
    if phase == "baseline":
        return [rows.BASELINE]
    key = ROW_PHASE.get(phase, phase)
    chosen = [_scaled(r, world_size) for r in rows.DEFAULT_ROWS if r.phase == key]
    if not chosen:
        raise DitgateError(f"no default row checks phase {phase!r}")
    return rows.select([*rows.DEFAULT_ROWS, *chosen], [r.name for r in chosen])


def _request(model_path: Path, height: int, width: int, frames: int, steps: int):
    from . import request, zoo

    return request.build(zoo.read_meta(model_path), height=height or None, width=width or None,
                         frames=frames or None, steps=steps or None)


def run_phase(phase: str, model: str, out_dir: Path, *, rows: str = "", world_size: int = 2, integration: str = "",
              height: int = 0, width: int = 0, frames: int = 0, steps: int = 0, dtype: str = "float32",
              device: str = "auto", gates: str = "", timeout: float = 600.0, resume: bool = False,
              progress: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Run the phase's rows (or the named `rows` of `ditgate run`) in `out_dir/<phase>`; returns the report."""
    from . import rows as rows_mod
    from .commands.run import resolve_device
    from .gates import load_gates
    from .loader import resolve
    from .runner import RunConfig, run

    if gates:
        load_gates(gates)  # a broken table fails now, not after every row has run
    chosen = (rows_mod.select([*rows_mod.DEFAULT_ROWS, *phase_rows(phase, world_size)], rows) if rows
              else phase_rows(phase, world_size))
    cfg = RunConfig(model=model, rows=chosen, request=_request(resolve(model), height, width, frames, steps),
                    out=Path(out_dir) / phase, dtype=dtype, device=resolve_device(device),
                    integration=Path(integration) if integration else None, timeout=timeout, resume=resume,
                    gates=Path(gates) if gates else None)
    report = run(cfg, progress)
    report["gates"] = gates or "checklists/gates.json"
    return report


def inspect(model: str, out_dir: Path, *, height: int = 0, width: int = 0, frames: int = 0, steps: int = 0,
            dtype: str = "float32", device: str = "auto"):
    """`ditgate inspect`: the anatomy; the draft plan is written to `out_dir/plan.md`."""
    from .anatomy import inspect_model, write_text_atomic
    from .commands.run import resolve_device

    anatomy = inspect_model(model, height=height or None, width=width or None, frames=frames or None,
                            steps=steps or 2, dtype=dtype, device=resolve_device(device))
    write_text_atomic(Path(out_dir) / "plan.md", anatomy.plan)
    return anatomy


def run_matrix(model: str, out_dir: Path, *, tier: str = "A", rows: str = "", height: int = 0, width: int = 0,
               frames: int = 0, steps: int = 0, dtype: str = "auto", device: str = "auto", warmup: int = -1,
               repeats: int = 0, timeout: float = 600.0) -> dict[str, Any]:
    """`ditgate matrix` into `out_dir/perf_matrix`; returns matrix.json. -1, 0 and "" keep the command's defaults."""
    import argparse

    try:
        from .commands import matrix
    except ImportError:
        raise DitgateError("`ditgate matrix` is not part of this installation of ditgate") from None
    argv = [model, "--tier", tier, "--out", str(Path(out_dir) / "perf_matrix"), "--dtype", dtype, "--device", device,
            "--timeout", str(timeout)]
    for flag, value in (("--rows", rows), ("--height", height), ("--width", width), ("--frames", frames),
                        ("--steps", steps), ("--repeats", repeats)):
        if value:
            argv += [flag, str(value)]
    if warmup >= 0:
        argv += ["--warmup", str(warmup)]
    parser = argparse.ArgumentParser(prog="ditgate matrix")
    matrix.register(parser)
    matrix.main(parser.parse_args(argv))  # its exit status 1 (a row failed) is in matrix.json; errors raise
    return json.loads((Path(out_dir) / "perf_matrix" / "matrix.json").read_text())


# ------------------------------------------------------------------------------------------------ display


_IMAGE_LINE = re.compile(r"^!\[[^\]]*\]\([^)]*\)\s*$", re.MULTILINE)


def show(data: Any) -> None:
    """Display a result in the notebook: an anatomy; a run's table, grid and audio; a matrix's table and plot."""
    from IPython.display import Audio, Image, Markdown, display

    if hasattr(data, "block_lists"):  # an Anatomy
        from .commands.inspect import render

        display(Markdown(f"```text\n{render(data)}\n```"))
        return
    run_dir = Path(data["run_dir"])
    matrix = "tier" in data
    table = (run_dir / ("matrix.md" if matrix else "report.md")).read_text()
    display(Markdown(_IMAGE_LINE.sub("", table)))  # the picture is displayed below, not linked
    if not matrix:
        for row in data["rows"]:
            wav = store.row_dir(run_dir, row["name"]) / "output.wav"
            if row["status"] != "error" and wav.is_file():
                display(Markdown(f"**{row['name']}**"), Audio(filename=str(wav)))
    picture = data.get("plot" if matrix else "grid")
    if picture and (run_dir / picture).is_file():
        display(Image(filename=str(run_dir / picture)))


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
    reasons += [f"{r['name']}: the reference output contains NaN or Inf" for r in rows
                if r["status"] == "reference" and _not_finite(Path(data["run_dir"]), r["name"])]
    result = {"model": data["model"], "passed": bool(data["passed"]) and not reasons, "reasons": reasons,
              "run_dir": data["run_dir"], "gates": data.get("gates"), "rows": rows}
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
    print(f"{phase}: {'PASSED' if result['passed'] else 'FAILED'} -> {path}")
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
    from .report import fmt

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
    """Display the results table and write it to `<out_dir>/results.md`; returns the Markdown."""
    from IPython.display import Markdown, display

    table = results_table(out_dir, report)
    store.write_text(Path(out_dir) / "results.md", table)
    display(Markdown(table))
    return table


# ------------------------------------------------------------------------------------- running with papermill


def choose_kernel(requested: str | None, available: dict[str, str] | None = None) -> str:
    """`requested`, else "ditgate", else "python3": the first installed Jupyter kernel; a clear error if none is."""
    if available is None:
        from jupyter_client.kernelspec import KernelSpecManager

        available = KernelSpecManager().find_kernel_specs()
    install = "python -m ipykernel install --sys-prefix --name ditgate"
    if requested:
        if requested not in available:
            raise NotebookError(f"no Jupyter kernel named {requested!r}; installed: "
                                f"{', '.join(sorted(available)) or 'none'}")
        return requested
    for name in ("ditgate", "python3"):
        if name in available:
            return name
    raise NotebookError(f"neither a 'ditgate' nor a 'python3' Jupyter kernel is installed; install one with `{install}`"
                        " (scripts/setup.sh does)")


def parameters(nb: Notebook) -> dict[str, dict[str, Any]]:
    """The notebook's parameters as papermill reads them: name -> {inferred_type_name, default, help}."""
    import papermill

    return papermill.inspect_notebook(str(nb.path))


def _typed(name: str, text: str, type_name: str) -> Any:
    try:
        if type_name == "int":
            return int(text)
        if type_name == "float":
            return float(text)
        if type_name == "bool":
            lowered = text.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
    except ValueError:
        raise NotebookError(f"parameter {name} takes {type_name}, got {text!r}") from None
    return text


def notebook_parameters(nb: Notebook, given: dict[str, str]) -> dict[str, Any]:
    """The `given` values (strings) that `nb` declares, converted to the declared types."""
    declared = parameters(nb)
    return {k: _typed(k, v, declared[k]["inferred_type_name"]) for k, v in given.items() if k in declared}


@dataclass
class Outcome:
    notebook: str
    status: str            # passed, failed (the gate), error (anything else), not run
    seconds: float | None = None
    reason: str = ""
    output: str | None = None
    result: str | None = None  # path of <phase>.json, when written


def failure(path: Path) -> tuple[str, str] | None:
    """(exception name, message) of the first error output of an executed notebook; None when there is none."""
    import nbformat

    notebook = nbformat.read(str(path), as_version=4)
    for cell in notebook.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if output.get("output_type") == "error":
                return output.get("ename", ""), output.get("evalue", "")
    return None


def run_notebooks(notebooks: list[Notebook], out_dir: Path, given: dict[str, str], *, kernel: str | None = None,
                  keep_going: bool = False, progress: Callable[[str], None] | None = None) -> list[Outcome]:
    """Execute `notebooks` in order with papermill into `out_dir`; `given` (name -> text) are parameters, passed
    to the notebooks that declare them. Stops at the first failure unless `keep_going`."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    progress = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    kernel_name = choose_kernel(kernel)
    unknown = set(given) - {k for nb in notebooks for k in parameters(nb)}
    if unknown:
        raise NotebookError(f"no selected notebook takes parameter(s) {', '.join(sorted(unknown))}")
    values = [notebook_parameters(nb, given) for nb in notebooks]  # every conversion error before anything runs
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    outcomes: list[Outcome] = []
    stop = False
    for nb, params in zip(notebooks, values):
        if stop:
            outcomes.append(Outcome(nb.stem, "not run", reason="an earlier notebook failed"))
            continue
        output, result = out_dir / f"{nb.stem}.ipynb", out_dir / f"{nb.phase}.json"
        result.unlink(missing_ok=True)  # a result left by an earlier run must not stand for this one
        progress(f"{nb.stem}: running with kernel {kernel_name} -> {output}")
        start = time.perf_counter()
        try:
            papermill.execute_notebook(str(nb.path), str(output), parameters={**params, "out": str(out_dir)},
                                       kernel_name=kernel_name, progress_bar=False)
            status, reason = "passed", ""
        except PapermillExecutionError as exc:
            ename, evalue = failure(output) or (exc.ename, exc.evalue)
            status, reason = ("failed" if ename == GateFailed.__name__ else "error"), f"{ename}: {evalue}"
        except Exception as exc:  # noqa: BLE001 - the kernel died or could not start: recorded, the run goes on
            status, reason = "error", f"{type(exc).__name__}: {exc}"
        outcome = Outcome(nb.stem, status, round(time.perf_counter() - start, 1), reason, str(output),
                          str(result) if result.is_file() else None)
        outcomes.append(outcome)
        progress(f"{nb.stem}: {status} in {outcome.seconds:.1f} s")
        stop = status != "passed" and not keep_going
    store.write_json(out_dir / "notebooks.json", {"kernel": kernel_name, "parameters": given,
                                                  "notebooks": [asdict(o) for o in outcomes]})
    return outcomes


def summary(outcomes: list[Outcome], width: int = 160) -> str:
    """The summary table: notebook, status, seconds, the reason of a failure (first line, shortened)."""
    rows = [(o.notebook, o.status.upper(), "–" if o.seconds is None else f"{o.seconds:.1f}",
             (o.reason.splitlines() or [""])[0][:width]) for o in outcomes]
    headers = ("notebook", "status", "seconds", "reason")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)]) + "\n"
