"""`ditgate diff`: run a row and its baseline on the same inputs up to the end of the first transformer call, and
name the first module whose output leaves the tolerance of the run's dtype.

Two passes. The summary pass records a summary of every module's output (ditgate.run.diff.divergence) on the baseline,
in this process, and on the candidate row, on its ranks (a torchrun group of `python -m ditgate.run.diff.compare`), and
compares them in the baseline's execution order. When a module diverges, the second pass runs both again and keeps
the whole tensors of the modules around it, and the whole input of the first one: exact max-abs and PSNR for the
table, and whether the module's input already differed (then the fault is in its caller's own code, between the
children it calls: an attention processor, say; ditgate.run.diff.blame). Writes diff.json, diff.md and diff.png (error against module
order) in the output folder.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import resource
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ditgate.core.errors import DitgateError
from ditgate.core.model import Model
from ditgate.run.diff.blame import locate, module_of as _module_of
from ditgate.run.diff.divergence import Recorder, capture, compare_summaries
from ditgate.run.define.rows import Row
from ditgate.run.diff.report import BEFORE, WINDOW, write



@dataclass
class DiffConfig:
    model: Model  # the model, its call, dtype and device (ditgate.core.model)
    row: Row
    baseline: Row
    out: Path
    integration: Path | None = None
    timeout: float = 600.0
    window: int = WINDOW


def tolerance(dtype: str, gates: dict | None = None) -> tuple[float, str]:
    """The largest relative max-abs error (|candidate - baseline| over the baseline's largest magnitude) a module's
    output may show in `dtype`, and the source of that number (gates.json rules.diff)."""
    from ditgate.gates.verdicts import _normalize_dtype, load_gates

    rule = (gates or load_gates())["rules"]["diff"]
    key = _normalize_dtype(dtype)
    if key not in rule["tolerance"]:
        raise DitgateError(f"no diff tolerance for dtype {dtype!r} in gates.json rules.diff")
    return float(rule["tolerance"][key]), rule["source"]


@contextlib.contextmanager
def _prepared(row: Row, cfg: dict[str, Any], local_rank: int = 0):
    """The pipeline loaded with `row` applied; everything taken back off afterwards (as ditgate.run.exec.execute)."""
    import torch

    from ditgate.core import plugin
    from ditgate.core.components import transformers_of
    from ditgate.run.exec.execute import _device_for_rank, apply
    from ditgate.run.exec.isolation import ClassSnapshot

    model = Model.from_dict(cfg["model"])
    device = _device_for_rank(model.device, local_rank)
    integration = plugin.load(cfg.get("integration"))
    pipe = model.load(device)
    unregister = None
    if integration is not None:
        unregister = integration.register_planners([type(t).__name__ for t in transformers_of(pipe).values()])
    snapshot, target = ClassSnapshot.of(pipe), None
    try:
        target = apply(row, pipe, integration, model.request)
        yield pipe
    finally:
        if target is not None and row.cache:
            import cache_dit

            cache_dit.disable_cache(target)
        snapshot.restore()
        if unregister is not None:
            unregister()
        pipe = target = None
        gc.collect()
        if device.startswith("cuda"):
            torch.cuda.empty_cache()


def _record(row: Row, cfg: dict[str, Any], recorder: Recorder, local_rank: int = 0) -> Recorder:
    with _prepared(row, cfg, local_rank) as pipe:
        return capture(pipe, Model.from_dict(cfg["model"]).request, recorder)


def _peak(device: str) -> dict[str, Any]:
    import torch

    if device.startswith("cuda"):
        return {"kind": "cuda-max-allocated", "bytes": int(torch.cuda.max_memory_allocated())}
    return {"kind": "cpu-process-peak-rss", "bytes": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024}


def _dump(path: Path, recorder: Recorder, device: str) -> None:
    import torch

    path.mkdir(parents=True, exist_ok=True)
    (path / "summaries.json").write_text(json.dumps({
        "summaries": recorder.summaries, "notes": recorder.notes, "segments": recorder.segments,
        "crash": recorder.crash, "callers": recorder.callers, "processors": recorder.processors,
        "entered": recorder.entered,
        "peak_memory": _peak(device),
        "full_bytes": sum(_nbytes(s) for s in recorder.summaries.values()),
        "summary_bytes": len(json.dumps(recorder.summaries))}))
    if recorder.tensors:
        torch.save(recorder.tensors, path / "tensors.pt")


def _nbytes(summary: dict[str, Any]) -> int:
    import math

    sizes = {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "bfloat16": 2, "float16": 2, "bool": 1}
    return math.prod(summary.get("shape") or [0]) * sizes.get(summary.get("dtype", ""), 4)


def _load(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    import torch

    data = json.loads((path / "summaries.json").read_text())
    tensors = torch.load(path / "tensors.pt") if (path / "tensors.pt").is_file() else {}
    return data, tensors


def _job_config(cfg: DiffConfig) -> dict[str, Any]:
    return {"model": cfg.model.to_dict(), "integration": str(cfg.integration) if cfg.integration else None}


def _pass(cfg: DiffConfig, name: str, full: set[str], inputs: set[str]) -> tuple[dict, dict, dict, dict]:
    """One pass: the baseline here, the candidate on its ranks; returns (baseline, candidate) data and tensors."""
    from ditgate.run.exec.launch import run_group

    job = _job_config(cfg)
    where = cfg.out / name
    base = _record(cfg.baseline, job, Recorder(full=set(full), inputs=set(inputs)))
    _dump(where / "baseline", base, cfg.model.device)
    job.update(row=cfg.row.to_dict(), reference=str(where / "baseline" / "summaries.json"),
               full=sorted(full), inputs=sorted(inputs), result=str(where / "candidate"),
               group_dir=str(where / "group"))
    if cfg.row.world_size == 1:
        _candidate(job, 0)
    else:
        outcome = run_group(job, cfg.row.world_size, timeout=cfg.timeout, module="ditgate.run.diff.compare")
        if not outcome.ok:
            raise DiffRunError(f"row {cfg.row.name!r} could not run for the diff: {outcome.describe()}")
    b, bt = _load(where / "baseline")
    c, ct = _load(where / "candidate")
    return b, c, bt, ct


class DiffRunError(DitgateError):
    """The candidate row crashed or hung before its first transformer call ended."""


def _candidate(job: dict[str, Any], rank: int, local_rank: int = 0) -> None:
    from ditgate.run.define import rows

    reference = json.loads(Path(job["reference"]).read_text())
    row = rows.from_mapping({k: v for k, v in job["row"].items() if k != "world_size"})
    from ditgate.core import plugin

    integration = plugin.load(job.get("integration"))
    recorder = Recorder(reference=reference["summaries"], segments=reference["segments"],
                        full=set(job["full"]), inputs=set(job["inputs"]),
                        split_dims=integration.cp_split_dims if integration is not None else None)
    _record(row, job, recorder, local_rank)
    if rank == 0:
        _dump(Path(job["result"]), recorder, job["model"]["device"])


def diff(cfg: DiffConfig) -> dict[str, Any]:
    """Both passes and the report files; returns the report (diff.json)."""
    start = time.perf_counter()
    tol, source = tolerance(cfg.model.dtype)
    cfg.out.mkdir(parents=True, exist_ok=True)
    b, c, _, _ = _pass(cfg, "summary", set(), set())
    lines = compare_summaries(b["summaries"], c["summaries"], tol)
    for line in lines:
        line["gathered"] = c["notes"].get(line["module"], "")
        module = _module_of(line["module"])
        line["entered"] = b.get("entered", {}).get(module, line["index"])
        caller = b.get("callers", {}).get(module)
        if caller:
            line["caller"] = caller
            if caller in c.get("processors", {}):
                line["processor"] = c["processors"][caller]
    first = next((i for i, line in enumerate(lines) if line["diverged"]), None)
    report: dict[str, Any] = {
        "row": cfg.row.name, "baseline": cfg.baseline.name, "dtype": cfg.model.dtype, "device": cfg.model.device,
        "tolerance": {"rel_max_abs": tol, "source": source}, "modules": len(lines),
        "memory": {"baseline": b["peak_memory"], "candidate_rank0": c["peak_memory"],
                   "summaries_bytes": b["summary_bytes"], "full_outputs_bytes": b["full_bytes"]},
        "first": None, "named": None, "reason": "no module left the tolerance", "lines": lines}
    report["crash"] = c.get("crash")
    skipped = [x["module"] for x in lines if x.get("skipped") is not None]
    if first is None and skipped:
        report["reason"] += (f"; {len(skipped)} per-rank tensor(s) could not be made whole and were not compared "
                             f"({', '.join(skipped[:3])}): the transformer's output, compared whole, matches")
    if first is not None and c.get("crash") and lines[first]["status"] == "not reached":
        crash = c["crash"]
        report.update(first=lines[first]["module"], named=crash["module"], reason=(
            f"the row raises inside {crash['module']} ({crash['error']}); every module before matches the baseline"))
    elif first is not None:
        rerun = lambda full, inputs: _pass(cfg, "full", full, inputs)[2:]  # noqa: E731
        from ditgate.core import plugin

        integration = plugin.load(cfg.integration)
        report.update(locate(lines, first, tol, cfg.window, rerun, integration.cp_split_dims if integration else None))
    report["wall_s"] = round(time.perf_counter() - start, 2)
    write(cfg.out, report)
    return report


def diagnose(runner) -> None:
    """The diff section of every failed exact row (`RunConfig.diff`): a row whose output failed its gate, or that
    raised (a missing gather often crashes the scheduler after the transformer call the diff needs). The row's
    `diff` record and one line among its reasons; a diff that cannot run says why; the row stays failed."""
    from ditgate.gates.verdicts import load_gates

    gates = runner.gate_table() or load_gates()
    for state in runner.states.values():
        row, base = state.row, runner.states.get(state.row.baseline or "")
        error = (state.result or {}).get("error") or {}
        failed = state.ran and state.verdict is not None and not state.verdict.get("passed")
        crashed = bool(error) and not error.get("preflight") and not error.get("timed_out")
        if (row.phase is None or not (failed or crashed) or not gates["phases"].get(row.phase, {}).get("exact")
                or base is None or not base.ran):
            continue
        out = runner.run_dir / "diff" / row.name
        runner.progress(f"diff {row.name}: recording every module of the first transformer call")
        cfg = DiffConfig(model=runner.model, row=row, baseline=base.row, out=out,
                         integration=runner.cfg.integration, timeout=runner.cfg.timeout)
        try:
            report = diff(cfg)
        except Exception as exc:  # noqa: BLE001 - a diagnosis that fails must not hide the verdict
            state.diff = {"error": f"{type(exc).__name__}: {exc}"}
            state.reasons.append(f"diff could not run: {type(exc).__name__}: {exc}")
            continue
        state.diff = {k: report[k] for k in ("named", "first", "reason", "wall_s")} | {"folder": str(out)}
        state.reasons.append(f"diff: first divergence at {report['named']}: {report['reason']} ({out / 'diff.md'})"
                             if report["named"] else
                             "diff: every module of the first transformer call is within the tolerance: the "
                             "divergence starts later (a later step, the scheduler or the VAE)")












# -- candidate ranks -----------------------------------------------------------------------------------------------
def main(job_file: str) -> int:
    from ditgate.run.exec.files import write_json
    from ditgate.run.exec.worker import error_path, status_path

    job = json.loads(Path(job_file).read_text())
    rank, local_rank = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    group_dir = Path(job["group_dir"])
    current = {"stage": "start"}

    def stage(name: str) -> None:
        current["stage"] = name
        write_json(status_path(group_dir, rank), {"rank": rank, "row": job["row"]["name"], "stage": name,
                                                  "time": time.time(), "pid": os.getpid()})

    try:
        stage("import")
        import torch
        import torch.distributed as dist

        from ditgate.run.exec import compat

        on_cuda = job["model"]["device"].startswith("cuda")
        if on_cuda:
            torch.cuda.set_device(local_rank)
        stage("init-process-group")
        dist.init_process_group("cpu:gloo,cuda:nccl" if on_cuda else "gloo")
        if not on_cuda:
            compat.apply_cpu_patches()
        stage("record")
        _candidate(job, rank, local_rank)
        stage("barrier")
        dist.barrier()
        dist.destroy_process_group()
        stage("done")
        return 0
    except BaseException as exc:  # noqa: BLE001 - the launcher reports it
        write_json(error_path(group_dir, rank), {
            "rank": rank, "row": job["row"]["name"], "stage": current["stage"], "type": type(exc).__name__,
            "message": str(exc), "traceback": traceback.format_exc()})
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
