"""The phase runner: the baseline and every row, on real cache-dit, compared, gated and reported.

The run loads the pipeline once (`launch="once"`, the default): single-process rows run in this process, one after
the other, each on a fresh copy of it (ditgate.run.exec.isolation.Pristine). Rows of one world size share one worker
group that starts once and loads once (on CPU its ranks are forked from this process and inherit the pipeline).
A row that crashes or hangs ends its group; the report records the rank and its error, and the group is started
again for the rows after it. `launch="per-row"` is the design before: every row loads from disk, and every
multi-rank row starts its own torchrun group (kept to compare the two: benchmarks/launch_once.py).
"""

from __future__ import annotations

import itertools
import os
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ditgate.core import logs, warm
from ditgate.run.progress import Lines, planned
from ditgate.run.exec import files as store
from ditgate.run.judge.gating import audio_floor, judge_row
from ditgate.run import twinned
from ditgate.run.judge import variants, volatility
from ditgate.core.errors import DitgateError, ModelLoadError
from ditgate.core.model import Model
from ditgate.run.exec.folder import (FolderLock, RunFolderError, check_options, check_resumable,  # noqa: F401
                                abandon, copy_finished_rows, default_out, prepare, versions)
from ditgate.run.exec.folder import done as _done
from ditgate.run.exec.worker import warm_calls
from ditgate.run.define.preflight import why_not
from ditgate.run.define.rows import Row


LAUNCHES = ("once", "per-row")


@dataclass
class RunConfig:
    model: Model  # the model, its call, dtype and device (ditgate.core.model)
    rows: list[Row]
    out: Path | None = None
    integration: Path | None = None
    timeout: float = 600.0
    resume: bool = False
    warmup: int = 0
    repeats: int = 1
    gates: Path | None = None  # gate table to judge with; None: checklists/gates.json
    diff: bool = False  # a failed exact row gets a `ditgate diff` section (ditgate.run.diff.compare.diagnose)
    launch: str = "once"  # "once": load once per process, one group per world size; "per-row": see the docstring
    twin: str = "auto"  # twin rows (ditgate.run.twinned): auto (when not float32), off, or only
    twin_record: dict[str, Any] | None = None  # set on a run of the twin itself: what the twin is (the report's)
    reuse: bool = False  # reference rows from the result store when their key matches (ditgate.run.reuse)
    warm_once: bool = True  # `warmup` calls once per process (the first row there), not per row; the matrix: False


@dataclass
class RowState:
    row: Row
    result: dict[str, Any] | None = None
    verdict: dict[str, Any] | None = None
    proofs: list[dict[str, Any]] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    measured: dict[str, Any] | None = None  # the calibration row: the noise floor it measured
    diff: dict[str, Any] | None = None  # a failed exact row: where it first departs from its baseline
    twin: dict[str, Any] | None = None  # the twin's verdict on this row (ditgate.run.twinned.verdict)

    @property
    def ran(self) -> bool:
        return bool(self.result) and self.result.get("status") == "ok"

    @property
    def passed(self) -> bool:
        if not self.ran:
            return False
        if self.row.phase is None:
            return True
        return (bool(self.verdict and self.verdict["passed"]) and all(p["passed"] for p in self.proofs)
                and (self.twin is None or self.twin["status"] != "failed"))


class Runner:
    def __init__(self, cfg: RunConfig, progress: Callable[[str], None] | None = None, profile=None):
        self.cfg = cfg
        self.model = cfg.model
        self.profile = profile  # ditgate.inspect.flops.profile.Profile at the request's size; counted when the report needs it
        check_options(cfg)
        self.model_path = cfg.model.path
        self.run_dir, self._lock = prepare(cfg, versions)
        self.states = {row.name: RowState(row) for row in cfg.rows}
        self.progress = progress or logs.progress
        if cfg.launch not in LAUNCHES:
            raise DitgateError(f"unknown launch {cfg.launch!r}; known: {', '.join(LAUNCHES)}")
        self.lines = Lines(self.progress, planned(list(cfg.rows), self.model.request.steps, self.model.dtype,
                                                  self.model.call_class, self.gate_table()))
        self._start = time.perf_counter()
        self._pristine = None  # the pipeline loaded once in this process (launch="once")
        self._load_due = 0.0  # its load time, paid by the next row that runs on it
        self._groups = itertools.count(1)  # the groups' folders: groups/world{size}-{n}
        self._warmed = False  # a row in this process made its warm-up calls (warm_once)
        self.twin_record = cfg.twin_record  # the twin rows' record (ditgate.run.twinned.run_twin)

    # -- running -------------------------------------------------------------------------------------------------
    def _announce(self, state: RowState) -> None:
        self.lines.row(state.row, state.result or {}, len(self.states))

    def _record(self, state: RowState, result: dict[str, Any]) -> None:
        state.result = result
        self._announce(state)

    def _error(self, row: Row, message: str, **extra: Any) -> None:
        from ditgate.run.exec.execute import save_error

        self._record(self.states[row.name], save_error(self.run_dir, row, {"message": message, **extra}))

    def run(self) -> dict[str, Any]:
        twin = None
        if twinned.wanted(self.cfg.twin, self.model.dtype):  # the float32 twin: first on a CPU, beside on a GPU
            twin = twinned.start(self.cfg, self.run_dir, run, self.progress, self.model.device.startswith("cuda"))
        pending = []
        for row in self.cfg.rows:
            done = _done(self.run_dir, row, self.cfg.resume)
            if done:
                self._record(self.states[row.name], done | {"resumed": True})
                continue
            store.discard_result(self.run_dir, row.name)
            reason = why_not(row, model_path=self.model.path, request=self.model.request, device=self.model.device)
            if reason:
                self._error(row, f"not run: {reason}", preflight=True)
                continue
            pending.append(row)
        for row in [r for r in pending if r.world_size == 1]:
            if not self._reference_failed(row):
                self._run_in_process(row)
        # the rows the verdicts need, while the pipeline is still loaded (after the release they would load again)
        later = [r for r in pending if r.world_size > 1 and r.phase]
        self._calibrate(later)
        self._sensitivity(later)
        self._cache_off()
        if self.model.device.startswith("cuda") and any(r.world_size > 1 for r in pending):
            self._release()  # the groups' ranks need the GPU memory (with none, the run's end may keep it)
        pending = [r for r in pending if r.world_size == 1 or not self._reference_failed(r)]
        for size in sorted({r.world_size for r in pending if r.world_size > 1}):
            group = [r for r in pending if r.world_size == size]
            for rows in ([[r] for r in group] if self.cfg.launch == "per-row" else [group]):
                self._run_group(rows, size)
        self._calibrate()
        self._sensitivity()
        self._cache_off()
        self._release(keep=True)
        if twin is not None:
            self.twin_record = twin()
        return self.finish()

    def _reference_failed(self, row: Row) -> bool:
        """True (and the row recorded as not run) when the row it compares with ended in an error: nothing runs
        against a missing reference."""
        base = self.states.get(row.baseline) if row.baseline else None
        if base is None or not base.result or base.result.get("status") != "error":
            return False
        self._error(row, f"not run: its baseline row {row.baseline!r} failed, so there is nothing to compare with",
                    preflight=True)
        return True

    def _cache_off(self) -> None:
        """The caching-off twin of every single-process cache row that ran (see ditgate.run.judge.cache_off)."""
        from ditgate.run.judge.cache_off import twin

        for state in [s for s in self.states.values() if s.ran]:
            row = twin(state.row, self.model.request.steps)
            if row is not None and row.name not in self.states:
                self._run_check(row)

    def _gated_modalities(self, later: list[Row] = ()) -> list[str | None]:
        """The modality of every gated row that ran, and the baseline's for the gated rows still to run (`later`)."""
        from ditgate.run.define.rows import BASELINE
        from ditgate.run.judge.outputs import modalities

        found = [m for s in self.states.values() if s.ran and s.row.phase
                 for m in [s.result.get("modality"), *modalities(s.result)]]
        base = self.states.get(BASELINE.name)
        if later and base is not None and base.ran:
            found += [base.result.get("modality"), *modalities(base.result)]  # frames and audio: both gated
        return found

    def _sensitivity(self, later: list[Row] = ()) -> None:
        """Run the sensitivity rows needed by the gated rows that ran or are to run (`later`; run.judge.discrimination)."""
        from ditgate.run.judge.discrimination import needed

        phases = [s.row.phase for s in self.states.values() if s.ran and s.row.phase] + [r.phase for r in later]
        for row in needed(phases, self._gated_modalities(later), self.model.dtype, self.gate_table()):
            if row.name not in self.states:
                self._run_check(row, warmup=0, repeats=1)  # timed by nothing: no warm-up, one call

    def _pristine_pipeline(self):
        """The pipeline loaded once in this process; None with launch="per-row"."""
        from ditgate.run.exec.execute import load_pristine

        if self.cfg.launch == "per-row":
            return None
        if self._pristine is None:
            self._pristine = load_pristine(self.model)
            self._load_due = self._pristine.load_s
        return self._pristine

    def _release(self, keep: bool = False) -> None:
        """Let the pristine pipeline go; `keep` (the run's end): give it back to a process that runs commands one
        after another (ditgate.core.warm), unless this is the twin's run."""
        if self._pristine is not None:
            self._pristine.release()
            kept = keep and self.twin_record is None and self._pristine.give_back()
            self._pristine = None
            if not kept:
                warm.release_memory()

    def _calibrate(self, later: list[Row] = ()) -> None:
        """Run the calibration row when a gated row uses its floor (an audio row, or any row of a run in reduced
        precision) and the run has none yet (see ditgate.gates.calibration.uses_floor). `later`: gated rows still to
        run, of the baseline's modality."""
        from ditgate.gates.calibration import uses_floor
        from ditgate.run.define.rows import CALIBRATION

        if CALIBRATION.name in self.states or not any(
                uses_floor(m, self.model.dtype, self.gate_table()) for m in self._gated_modalities(later)):
            return
        self._run_check(CALIBRATION)

    def _run_check(self, row: Row, **counts: int) -> None:
        """A row the verdicts use (calibration, sensitivity, caching off): resumed from the folder, or run here."""
        self.states[row.name] = RowState(row)
        done = _done(self.run_dir, row, self.cfg.resume)
        self._record(self.states[row.name], done | {"resumed": True}) if done else self._run_in_process(row, **counts)

    def _run_in_process(self, row: Row, warmup: int | None = None, repeats: int | None = None) -> None:
        from ditgate.core import plugin
        from ditgate.run import reuse
        from ditgate.run.exec.execute import run_row, save_outcome
        from ditgate.run.reuse import Store

        try:
            integration = plugin.load(self.cfg.integration)
            key = reuse.key_in_run(self.cfg, self.run_dir, row, integration)
            if key is not None and (reused := Store().get(key, self.run_dir, row.name)):
                self._record(self.states[row.name], reused)
                return
            pristine = self._pristine_pipeline()
            calls = warm_calls(self.cfg.warmup if warmup is None else warmup, row, self.cfg.warm_once and self._warmed)
            self._warmed = self._warmed or calls > 0
            outcome = run_row(row, self.model, integration=integration, warmup=calls,
                              repeats=self.cfg.repeats if repeats is None else repeats, pristine=pristine)
        except ModelLoadError:
            raise  # the folder itself cannot be loaded: the run ends here (see `run`)
        except Exception as exc:  # noqa: BLE001 - recorded in the report
            self._error(row, f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc(), rank=0)
            return
        outcome.overhead.update(launch_s=0.0, load_s=outcome.overhead["load_s"] + self._load_due)
        self._load_due = 0.0
        self._record(self.states[row.name], save_outcome(self.run_dir, row, outcome))
        if key is not None:
            Store().put(key, self.run_dir, row.name)

    def _run_group(self, rows: list[Row], size: int) -> None:
        from ditgate.run.exec.launch import run_group

        remaining = list(rows)
        while remaining:
            job = {"model": self.model.to_dict(), "rows": [r.to_dict() for r in remaining],
                   "integration": str(self.cfg.integration) if self.cfg.integration else None,
                   "warmup": self.cfg.warmup, "repeats": self.cfg.repeats, "run_dir": str(self.run_dir),
                   "group_dir": str(self.run_dir / "groups" / f"world{size}-{next(self._groups)}"),
                   "launch": self.cfg.launch, "warm_once": self.cfg.warm_once}
            # on CPU the ranks are forked from this process and run on its pipeline (ditgate.run.exec.launch)
            pristine = None
            if self.model.device == "cpu" and hasattr(os, "fork"):
                try:
                    pristine = self._pristine_pipeline()
                except Exception:  # noqa: BLE001 - torchrun's ranks meet the same error and report it per rank
                    pristine = None
            job["parent_load_s"], self._load_due = (self._load_due, 0.0) if pristine is not None else (0.0,
                                                                                                       self._load_due)
            seen: set[str] = set()

            def poll() -> None:
                for row in remaining:
                    if row.name not in seen and (result := store.load_result(self.run_dir, row.name)):
                        seen.add(row.name)
                        self._record(self.states[row.name], result)
                self.lines.beat([r for r in remaining if r.name not in seen], size, job["group_dir"])

            self.lines.group_started(remaining, size)
            outcome = run_group(job, size, timeout=self.cfg.timeout, on_poll=poll, pristine=pristine)
            poll()
            left = [r for r in remaining if r.name not in seen]
            if outcome.ok or not left:
                if left:  # torchrun ended cleanly without these rows: should not happen, but never hide it
                    for row in left:
                        self._error(row, f"the worker group ended without a result: {outcome.describe()}")
                return
            failed_name = self._failed_row(outcome, left)
            message = outcome.describe()
            first_failure_first = sorted(outcome.errors, key=lambda e: e.get("time", 0))
            detail = {"ranks": first_failure_first, "stages": outcome.stages, "timed_out": outcome.timed_out,
                      "log_tail": outcome.log_tail}
            if failed_name is None:  # the group failed before any row: every row fails with it
                for row in left:
                    self._error(row, message, **detail)
                return
            failed = next(r for r in left if r.name == failed_name)
            self._error(failed, message, **detail)
            remaining = left[left.index(failed) + 1:]

    @staticmethod
    def _failed_row(outcome, left: list[Row]) -> str | None:
        names = {r.name for r in left}
        for record in sorted(outcome.errors, key=lambda e: e.get("time", 0)) + outcome.stages:
            if record.get("row") in names:
                return record["row"]
        return None

    # -- judging and reporting -------------------------------------------------------------------------------------
    def finish(self) -> dict[str, Any]:
        from ditgate.core.errors import NonFiniteError
        from ditgate.run.report import run_report as report

        for state in self.states.values():
            try:
                judge_row(self, state)
            except NonFiniteError as exc:  # a reference that holds NaN/Inf: the row fails, the report is written
                state.verdict = {"passed": False, "metrics": {}, "checks": []}
                state.reasons.append(f"cannot be judged: {exc}; its reference {state.row.baseline!r} produced "
                                     f"non-finite values without the feature (the model or its call is broken: "
                                     f"check the weights, the dtype and the call)")
        variants.fold(self.states)  # a lossy row over several prompts and seeds: each gate on its worst case
        twinned.merge(self.states, self.twin_record)
        volatility.settle(self.states, self.gate_table())  # after every verdict: it reads them all
        audio_floor(self)  # the calibration row's measurement shows in the report even without an audio row gated
        if self.cfg.diff:
            from ditgate.run.diff.compare import diagnose

            diagnose(self)
        note = None
        if self.profile is None and any(s.ran and (s.row.cache or s.row.world_size > 1)
                                        for s in self.states.values()):
            from ditgate.run.define.predict import profile_for

            self.profile, note = profile_for(self.model_path, self.model.request, self.model.dtype)
        from ditgate.run.define.rows import FAULT_SIZE, SENSITIVITY

        def is_check(state) -> bool:  # these live in the verdicts, not in the table
            return state.row.name in (SENSITIVITY.name, FAULT_SIZE.name) or state.row.name.endswith("-cache-off")

        shown = [s for s in self.states.values() if not is_check(s)]
        checks = [s.result for s in self.states.values() if is_check(s) and s.ran]
        return report.write(self.run_dir, self.cfg, shown, twin=self.twin_record,
                            wall_s=round(time.perf_counter() - self._start, 2), profile=self.profile,
                            profile_note=note, checks=checks)

    def judged(self, inputs: dict[str, Any], compute: Callable[[], dict]) -> dict[str, Any]:
        """A check of stored outputs, measured once across the runs that reuse (ditgate.run.reuse.judged)."""
        from ditgate.run.reuse import judged

        return judged(self.cfg, self.run_dir, inputs, compute)

    def gate_table(self) -> dict | None:
        """The run's own gate table (`gates=`), read once; None: gates.json."""
        if self.cfg.gates and not hasattr(self, "_gate_table"):
            from ditgate.gates.verdicts import load_gates

            self._gate_table = load_gates(self.cfg.gates)
        return getattr(self, "_gate_table", None)


def run(cfg: RunConfig, progress: Callable[[str], None] | None = None, profile=None) -> dict[str, Any]:
    """Run every row of `cfg` and write the report; returns the report (see ditgate.run.report.run_report).

    `profile`: the FLOP profile at the request's size when the caller has one (else counted when needed)."""
    from ditgate.run.judge.gating import check_judgeable_size

    twinned.check_mode(cfg.twin)
    check_judgeable_size(cfg.model.request.call)
    if cfg.twin == "only":
        return twinned.only(cfg, run, progress or logs.progress)
    runner = Runner(cfg, progress, profile)
    try:
        return runner.run()
    except ModelLoadError:  # a user error: refused in one line, and a run folder this run made is not left behind
        runner._release()
        if not any(state.result for state in runner.states.values()):
            abandon(runner.run_dir, runner._lock, runner._lock.created)
        raise
    finally:
        runner._release()  # also after a failure: the pipeline and its memory are not kept
        runner._lock.release()
