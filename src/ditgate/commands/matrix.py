"""`ditgate matrix MODEL [--tier A|B|C]`: acceptance benchmark of a model cache-dit supports."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .run import add_model_arguments, build_request, resolve_device

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
    parser.add_argument("--json", action="store_true", help="print matrix.json instead of the table")


def _check_tier(tier: str, device: str) -> None:
    from ..errors import DitgateError
    from ..perf import TIERS

    if not device.startswith("cuda"):
        return
    import torch

    have = torch.cuda.device_count()
    if TIERS[tier] > have:
        lower = [t for t, n in TIERS.items() if n <= have]
        raise DitgateError(f"tier {tier} needs {TIERS[tier]} GPUs and this machine has {have}"
                           + (f": run --tier {lower[-1]}" if lower else ""))


def main(args: argparse.Namespace) -> int:
    from .. import perf
    from .. import rows as rows_mod
    from ..errors import DitgateError
    from ..loader import resolve
    from ..runner import RunConfig, run

    if args.warmup < 0 or args.repeats < 1:
        raise DitgateError("--warmup must be >= 0 and --repeats >= 1")
    device = resolve_device(args.device)
    dtype = args.dtype
    if dtype.startswith("auto"):
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    _check_tier(args.tier, device)
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
