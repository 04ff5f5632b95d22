"""Twin rows: the structure of a reduced-precision run proven again on the model's twin, in float32.

A bf16 run of a real model is judged against a calibrated noise floor, under which realistic integration faults
can hide (a CP attention that ignores the CP config passed a bf16 row by 0.47 dB). The model's twin
(`ditgate.twin`: the same classes and widths, a few blocks, seeded float32 weights, a call at which every feature
acts) runs the same integration in float32, where the tensor rule separates a wrong integration from a right one by
orders of magnitude. So when a run is not in float32 (`--twin auto`, the default) the runner runs every structural
row on the twin, on the CPU, in its own run folder (`RUN/twin/`): first, when the model runs on the CPU too; beside
the model's rows, in a process of its own, when the model runs on a GPU (`start`). A row passes only when both pass,
and the report shows both verdicts. `--twin only` runs the twin alone (the model's
weights need not be there: a folder of configs is enough), `--twin off` never builds one.

What the twin judges of each row: exact rows (cp, tp, tep, vaep, hybrid; cache+CP against the cache row) their own
gate's checks (the float32 tensor rule among them) and their proofs; a cache row its caching-off check (the adapter
applied, nothing cached: exact) and its proofs, not its lossy gate, which judges a cache's approximation, not its
structure, and on random weights cannot. Lossy comparisons a row makes on the side (`also_against` of phase cache)
are left to the model's own rows.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from ditgate.core.errors import DitgateError
from ditgate.core.request import FRAME_NAMES
from ditgate.run.define import rows as rows_mod
from ditgate.run.define.rows import Row

MODES = ("auto", "off", "only")
STRUCTURAL_PHASES = ("cp", "tp", "tep", "vaep", "hybrid")  # exact phases the twin proves (compile is timing)
FOLDER = "twin"
# call arguments the twin chooses for itself (a size every feature acts at); every other argument of the call is kept
_CHOSEN = {"height", "width", "num_inference_steps", "max_sequence_length", *FRAME_NAMES,
           "audio_end_in_s", "audio_length_in_s", "audio_duration_s", "duration", "duration_s", "seconds"}


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise DitgateError(f"--twin {mode!r}: use one of {', '.join(MODES)}")


def wanted(mode: str, dtype: str) -> bool:
    """Does a run in `dtype` with `--twin mode` run twin rows? auto: when it is not float32."""
    return mode == "only" or (mode == "auto" and str(dtype) not in ("float32", "fp32"))


def covers(row: Row) -> bool:
    """Does the twin judge `row`: a structural exact row, or a single-process cache row (its caching-off check)?"""
    return row.phase in STRUCTURAL_PHASES or (row.phase == "cache" and row.world_size == 1 and bool(row.cache))


def rows_for(rows: list[Row]) -> list[Row]:
    """The rows the twin runs: those it judges and the rows they are compared with (the reference rows: each is
    the twin's own, computed on it)."""
    names = [r.name for r in rows if covers(r)]
    return rows_mod.select(rows, names) if names else []


def twin_model(model, log: Callable[[str], None]):
    """The twin of `model` (ditgate.core.model.Model), built once per configuration under $DITGATE_HOME/twins, opened
    in float32 on the CPU with the user's call arguments but for the sizes the twin chooses; (Model, Twin)."""
    from ditgate import twin
    from ditgate.core.model import Model

    given = {k: v for k, v in model.request.call.items() if k not in _CHOSEN}
    log(f"twin: building (or reusing) the float32 twin of {model.name}")
    built = twin.cached(model.path, pipeline=model.pipeline, trust_remote_code=model.trust_remote_code,
                        call=given, quiet=True)
    opened = Model.open(built.folder, pipeline=model.pipeline, trust_remote_code=model.trust_remote_code,
                        dtype="float32", device="cpu", seed=model.request.seed)
    return replace(opened, name=f"twin of {model.name}"), built


def run_twin(cfg, run_dir: Path, run: Callable, progress: Callable[[str], None]) -> dict[str, Any]:
    """Run the twin rows of `cfg` (a RunConfig) into `run_dir/twin` with `run` (ditgate.run.runner.run); returns a
    record of what happened: the twin's summary and its report, or why it could not run."""
    start = time.perf_counter()
    chosen = rows_for(cfg.rows)
    record: dict[str, Any] = {"mode": cfg.twin, "folder": str(run_dir / FOLDER), "rows": [r.name for r in chosen]}
    if not chosen:
        return record | {"status": "no rows", "detail": "no row of this run is one the twin judges"}
    try:
        model, built = twin_model(cfg.model, progress)
        record["twin"] = {"folder": str(built.folder), "params": built.params, "bytes": built.bytes,
                          "call": model.request.call}
        sub = replace(cfg, model=model, rows=chosen, out=run_dir / FOLDER, warmup=0, repeats=1, twin="off",
                      gates=cfg.gates)
        progress(f"twin: running {len(chosen)} row(s) on the twin in float32 (CPU): {', '.join(record['rows'])}")
        report = run(sub, progress=lambda line: progress(f"twin {line}"))
    except Exception as exc:  # noqa: BLE001 - a twin that cannot be built or run judges nothing, and says why
        return record | {"status": "inconclusive", "detail": f"{type(exc).__name__}: {exc}",
                         "traceback": traceback.format_exc(), "wall_s": round(time.perf_counter() - start, 2)}
    record.update(status="ran", report=str(Path(report["run_dir"]) / "report.md"),
                  wall_s=round(time.perf_counter() - start, 2))
    record["verdicts"] = {r["name"]: verdict(r) for r in report["rows"] if r["name"] in
                          {x.name for x in chosen if covers(x)}}
    return record


def start(cfg, run_dir: Path, run: Callable, progress: Callable[[str], None], beside: bool) -> Callable[[], dict]:
    """Start the twin rows of `cfg`; returns a function that gives their record (`run_twin`'s) when they are done.

    `beside` (the model runs on a GPU): the twin runs in a process of its own, started now, with no GPU visible, so
    its CPU rows overlap the model's GPU rows and the run waits only for what is left of them at the end (the
    record's `waited_s`). Otherwise (the model on the CPU, where both would share the same cores) it runs here,
    first: structure before numerics."""
    if not beside:
        record = run_twin(cfg, run_dir, run, progress)
        return lambda: record
    import multiprocessing
    import os

    context = multiprocessing.get_context("spawn")  # a fresh interpreter: nothing of this process's CUDA state
    receiver, sender = context.Pipe(duplex=False)
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the twin's process and its ranks see no GPU
    try:
        process = context.Process(target=_beside, args=(cfg, run_dir, run, sender), name="ditgate-twin", daemon=True)
        process.start()
    finally:
        if saved is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES")
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved
    sender.close()
    progress("twin: running beside the model's rows, in a process of its own on the CPU")

    def result() -> dict[str, Any]:
        began = time.perf_counter()
        try:
            record = receiver.recv()
        except (EOFError, OSError):
            process.join(timeout=30)
            record = {"mode": cfg.twin, "status": "inconclusive", "rows": [r.name for r in rows_for(cfg.rows)],
                      "detail": f"the twin's process ended without a result (exit {process.exitcode})"}
        process.join(timeout=120)  # it has sent its record: only its exit is left
        if process.is_alive():
            process.terminate()
            process.join(timeout=10)
        return record | {"beside": True, "waited_s": round(time.perf_counter() - began, 2)}

    return result


def _beside(cfg, run_dir: Path, run: Callable, sender) -> None:
    """The twin's own process: run the twin rows and send their record back."""
    from ditgate.core import logs

    try:
        record = run_twin(cfg, run_dir, run, lambda line: logs.progress(f"[twin] {line}"))
    except BaseException as exc:  # noqa: BLE001 - whatever ends it, the run hears why
        record = {"mode": cfg.twin, "status": "inconclusive", "detail": f"{type(exc).__name__}: {exc}"}
    sender.send(record)
    sender.close()


def verdict(row: dict[str, Any]) -> dict[str, Any]:
    """The twin's verdict on one of its rows (a report.json row): passed, failed, or inconclusive, with the reasons."""
    if row["status"] == "error":
        return {"status": "failed", "reasons": row["reasons"][:2] or ["the row did not run on the twin"]}
    v = row.get("verdict") or {}
    failed = [f"{p['feature']} did not act: {p['detail']}" for p in row.get("proofs") or [] if not p["passed"]]
    if row["phase"] == "cache":
        off = v.get("cache_off")
        if off is None:
            return {"status": "inconclusive", "reasons": ["the caching-off check did not run on the twin"] + failed}
        if not off["passed"]:
            failed.insert(0, off["detail"])
        shown = {"cache_off_max_abs": off.get("max_abs")}
    else:
        failed[:0] = [f"{c['metric']} {c['value']:.4g} is not {c['op']} {c['threshold']:.4g}"
                      for c in v.get("checks") or [] if not c["passed"]]
        shown = {c["metric"]: c["value"] for c in v.get("checks") or [] if c["metric"] in ("max_abs", "psnr")}
    if failed:
        return {"status": "failed", "reasons": failed, "metrics": shown}
    discriminates = v.get("discriminates")
    if discriminates is not None and not discriminates.get("passed"):
        return {"status": "inconclusive", "metrics": shown,
                "reasons": [f"the twin's gate cannot tell a broken model apart: {discriminates.get('detail')}"]}
    return {"status": "passed", "reasons": [], "metrics": shown}


def merge(states: dict[str, Any], record: dict[str, Any] | None) -> None:
    """Put the twin's verdict on every row it judges (`RowState.twin`); a twin that could not run leaves each of them
    inconclusive, with the reason."""
    if not record or record.get("status") == "no rows" or record.get("mode") == "only":
        return
    for state in states.values():
        if not covers(state.row):
            continue
        if record.get("status") != "ran":
            state.twin = {"status": "inconclusive", "reasons": [f"the twin could not run: {record.get('detail')}"]}
        else:
            state.twin = record["verdicts"].get(state.row.name) or {
                "status": "inconclusive", "reasons": ["the row did not run on the twin"]}
        if state.twin["status"] == "failed":
            state.reasons.insert(0, "twin (float32): " + "; ".join(state.twin["reasons"][:2]))
        elif state.twin["status"] == "inconclusive":
            state.reasons.append("twin: could not judge: " + "; ".join(state.twin["reasons"][:1]))


def only(cfg, run: Callable, progress: Callable[[str], None]) -> dict[str, Any]:
    """`--twin only`: the rows run on the twin alone, into the run folder itself (the model's weights are not
    needed); the report says it is the twin's."""
    model, built = twin_model(cfg.model, progress)
    record = {"mode": "only", "status": "ran", "source": cfg.model.name,
              "twin": {"folder": str(built.folder), "params": built.params, "bytes": built.bytes,
                       "call": model.request.call}}
    sub = replace(cfg, model=model, twin="off", twin_record=record)
    progress(f"twin: running on the float32 twin only ({built.params:,} parameters); the model itself is not run")
    return run(sub, progress=progress)
