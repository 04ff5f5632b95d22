"""`ditgate matrix MODEL [--tier A|B|C]`: acceptance benchmark of a model cache-dit supports."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from pathlib import Path

from ditgate.commands.run import add_model_arguments, build_request
from ditgate.core.request import resolve_device

HELP = "acceptance matrix: speed and quality of cache presets, compile, quantization, CP and TP against a baseline"


def register(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser, dtype="auto: bfloat16 on a GPU, float32 on CPU")
    parser.add_argument("--tier", default="A", type=str.upper, choices=["A", "B", "C"],
                        help="A: 1-2 devices (default); B adds 4-device rows; C adds 8-device rows and hybrid CP x TP")
    parser.add_argument("--rows", help="comma-separated row names of the tier (default: all); baselines are added")
    parser.add_argument("--rows-file", type=Path, help="YAML file of rows to use instead of the tier's rows")
    parser.add_argument("--list-rows", action="store_true", help="print the rows and exit")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls before the timed ones (default 1)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls; the median is reported (default 3)")
    parser.add_argument("--out", type=Path, help="run folder (default: a new folder under runs/)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out, keeping finished rows")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds a parallel group may go without progress before it is killed (default 600)")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU only: threads of every process, the single-process rows and each rank alike, so "
                             "an N-rank row has N times the cores of the baseline (default 1)")
    parser.add_argument("--json", action="store_true", help="print matrix.json instead of the table")


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
    from ditgate.perf.matrix.matrix import TIERS

    if tier == "A" or TIERS[tier] <= gpus:
        return None
    lower = [t for t, n in TIERS.items() if n <= gpus]
    return f"tier {tier} needs {TIERS[tier]} GPUs and this machine has {gpus}" + (
        f": run --tier {lower[-1]}, or on a machine with {TIERS[tier]} GPUs" if lower else "")


def main(args: argparse.Namespace) -> int:
    from ditgate.perf.matrix import matrix as perf
    from ditgate.run import rows as rows_mod
    from ditgate.core.errors import DitgateError
    from ditgate.core.loader import resolve
    from ditgate.run.runner import RunConfig, run

    if args.warmup < 0 or args.repeats < 1 or args.threads < 1:
        raise DitgateError("--warmup must be >= 0, --repeats and --threads >= 1")
    device = resolve_device(args.device)
    dtype = args.dtype
    if dtype.startswith("auto"):
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    if device.startswith("cuda"):
        import torch

        refusal = tier_refusal(args.tier, torch.cuda.device_count())
        if refusal:
            raise DitgateError(refusal)
    request = build_request(args)
    model_path = resolve(args.model)
    profile, note = perf.profile_for(model_path, request, dtype)
    base = rows_mod.load_rows(args.rows_file) if args.rows_file else perf.matrix_rows(args.tier, perf.max_fn(profile))
    chosen = rows_mod.select(base, args.rows)
    if args.list_rows:
        for row in chosen:
            print(f"{row.name:<28} phase={row.phase or '-':<12} ranks={row.world_size}  {row.description}")
        return 0
    cfg = RunConfig(model=args.model, rows=chosen, request=request, out=args.out, dtype=dtype, device=device,
                    pipeline=args.pipeline, trust_remote_code=args.trust_remote_code, timeout=args.timeout,
                    resume=args.resume, warmup=args.warmup, repeats=args.repeats)
    with cpu_threads(args.threads) if not device.startswith("cuda") else contextlib.nullcontext():
        report = run(cfg, profile=profile)
        data = perf.matrix(report, args.tier, args.warmup, args.repeats, prediction_note=note)
    run_dir = Path(report["run_dir"])
    perf.write(run_dir, data)
    if args.json:
        print(json.dumps(data, indent=2, default=str))
    else:
        print(perf.markdown(data), end="")
        print(f"\nmatrix: {run_dir / 'matrix.md'}  (JSON: matrix.json, plot: speedup_vs_psnr.png)")
    return 0 if data["passed"] else 1
