"""Running the acceptance matrix: the tier's rows through the phase runner, then the matrix table, JSON and plot.

`ditgate matrix` and the perf-matrix notebook both call `run_matrix`.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from ditgate.core.errors import DitgateError
from ditgate.core.model import Model
from ditgate.perf import matrix as perf
from ditgate.run.define import predict
from ditgate.run.define import rows as rows_mod
from ditgate.run.define.rows import Row
from ditgate.run.runner import RunConfig, run


@contextlib.contextmanager
def cpu_threads(count: int):
    """Run torch with `count` threads here and in every torchrun rank (OMP_NUM_THREADS), then put both back."""
    import torch

    saved = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(count)
    os.environ["OMP_NUM_THREADS"] = str(count)
    try:
        yield
    finally:
        torch.set_num_threads(saved[0])
        if saved[1] is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = saved[1]


def tier_refusal(tier: str, gpus: int) -> str | None:
    """Why a GPU machine with `gpus` devices cannot run `tier`; None when it can. Tier A runs on one GPU (its
    2-device rows are then refused one by one); B and C exist for their multi-device rows and need all of them."""
    if tier == "A" or perf.TIERS[tier] <= gpus:
        return None
    lower = [t for t, n in perf.TIERS.items() if n <= gpus]
    return f"tier {tier} needs {perf.TIERS[tier]} GPUs and this machine has {gpus}" + (
        f": run --tier {lower[-1]}, or on a machine with {perf.TIERS[tier]} GPUs" if lower else "")


def check_options(tier: str, device: str, warmup: int, repeats: int, threads: int) -> None:
    """Refuse counts out of range and a tier this GPU machine cannot run, before anything loads."""
    if warmup < 0 or repeats < 1 or threads < 1:
        raise DitgateError("--warmup must be >= 0, --repeats and --threads >= 1")
    if device.startswith("cuda"):
        import torch

        refusal = tier_refusal(tier, torch.cuda.device_count())
        if refusal:
            raise DitgateError(refusal)


def plan_rows(model: Model, tier: str, rows_file: Path | None = None,
              rows: str | None = None) -> tuple[list[Row], Any, str | None]:
    """The rows to run (the tier's, or a rows file's, narrowed by `rows`), the FLOP profile and its note."""
    profile, note = predict.profile_for(model.path, model.request, model.dtype)
    base = rows_mod.load_rows(rows_file) if rows_file else perf.matrix_rows(tier, predict.max_fn(profile))
    return rows_mod.require_some(rows_mod.select(base, rows), rows), profile, note


def run_matrix(model: Model, chosen: list[Row], profile: Any, note: str | None, *, tier: str, out: Path | None,
               warmup: int, repeats: int, threads: int = 1, timeout: float = 600.0, resume: bool = False,
               integration: Path | None = None, twin: str = "auto") -> tuple[dict[str, Any], Path]:
    """Run the matrix rows; write matrix.md, matrix.json and the plot into the run folder; (matrix data, folder).
    Callers refuse bad options first (`check_options`), before the FLOP profile is counted. `integration`: the
    plugin file of a model cache-dit does not know (as for `ditgate run --integration`)."""
    cfg = RunConfig(model=model, rows=chosen, out=out, integration=integration, timeout=timeout, resume=resume, twin=twin,
                    warmup=warmup, repeats=repeats, warm_once=False)
    with cpu_threads(threads) if not model.device.startswith("cuda") else contextlib.nullcontext():
        report = run(cfg, profile=profile)
        data = perf.matrix(report, tier, warmup, repeats, prediction_note=note)
    run_dir = Path(report["run_dir"])
    perf.write(run_dir, data)
    return data, run_dir
