"""`ditgate matrix MODEL [--tier A|B|C]`: acceptance benchmark of a model cache-dit supports."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ditgate.commands.model.options import (add_integration_argument, add_junit_argument, add_model_arguments,
                                            add_twin_argument, add_variant_arguments, model_from, with_variants)

HELP = "acceptance matrix: speed and quality of cache presets, compile, quantization, CP and TP against a baseline"


def register(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_integration_argument(parser)
    add_twin_argument(parser)
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
    add_junit_argument(parser)
    add_variant_arguments(parser)


def main(args: argparse.Namespace) -> int:
    from ditgate.perf import acceptance
    from ditgate.perf import matrix as perf
    from ditgate.run.report import junit

    junit.check_writable(args.junit)  # before any row runs: the file is written at the end
    model = model_from(args)
    acceptance.check_options(args.tier, model.device, args.warmup, args.repeats, args.threads)
    chosen, profile, note = acceptance.plan_rows(model, args.tier, args.rows_file, args.rows)
    chosen = with_variants(chosen, args, model)
    if args.list_rows and args.json:
        print(json.dumps([row.to_dict() | {"world_size": row.world_size, "description": row.description}
                          for row in chosen], indent=2, default=str))
        return 0
    if args.list_rows:
        for row in chosen:
            print(f"{row.name:<28} phase={row.phase or '-':<12} ranks={row.world_size}  {row.description}")
        return 0
    data, run_dir = acceptance.run_matrix(
        model, chosen, profile, note, tier=args.tier, out=args.out, warmup=args.warmup, repeats=args.repeats,
        threads=args.threads, timeout=args.timeout, resume=args.resume, integration=args.integration,
        twin=args.twin)
    if args.junit:
        junit.write(args.junit, f"ditgate matrix {data.get('model', model.name)}",
                    junit.row_cases(data["rows"], f"ditgate.matrix.{data.get('model', model.name)}"))
    if args.json:
        print(json.dumps(data, indent=2, default=str))
    else:
        print(perf.markdown(data), end="")
        print(f"\nmatrix: {run_dir / 'matrix.md'}  (JSON: matrix.json, plot: speedup_vs_psnr.png)")
    from ditgate.commands.model.run import exit_status

    return exit_status(data)
