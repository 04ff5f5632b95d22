"""`ditgate run MODEL`: the baseline and every integration phase, gated against the baseline."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ditgate.commands.model.options import (add_fresh_argument, add_integration_argument, add_junit_argument,
                                            add_model_arguments, add_row_arguments, add_server_argument,
                                            add_twin_argument, add_variant_arguments, model_from, reuse_from,
                                            use_cache_dit_from, use_split_dims_from, with_variants)

HELP = "run the baseline and each phase (cache, CP, TP, TE-P, VAE-P, hybrid) and gate them"


def register(parser: argparse.ArgumentParser) -> None:
    add_server_argument(parser)
    add_model_arguments(parser)
    parser.add_argument("--rows", help="comma-separated row names (default: all); their baselines are added")
    parser.add_argument("--rows-file", type=Path, help="YAML file of rows to use instead of the default rows")
    parser.add_argument("--list-rows", action="store_true", help="print the rows and exit")
    parser.add_argument("--cache-config", nargs="+", metavar="KEY=VALUE",
                        help="the default cache rows' configuration, in cache-dit's DBCacheConfig names (e.g. "
                             "max_warmup_steps=4 residual_diff_threshold=0.05 Fn_compute_blocks=2, or mask=fast, "
                             "taylorseer=1)")
    add_integration_argument(parser)
    add_row_arguments(parser)
    add_twin_argument(parser)
    parser.add_argument("--out", type=Path, help="run folder (default: a new folder under runs/)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out, keeping finished rows")
    add_fresh_argument(parser)
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds a parallel group may go without progress before it is killed (default 600)")
    parser.add_argument("--warmup", type=int, help="untimed calls before the timed ones (default: 1 on a GPU, where "
                        "the first call pays one-off costs, else 0)")
    parser.add_argument("--repeats", type=int, default=1, help="timed calls; the median is reported (default 1)")
    parser.add_argument("--no-diff", action="store_true",
                        help="do not diff a failed exact row against its baseline (see `ditgate diff`)")
    parser.add_argument("--json", action="store_true", help="print report.json instead of the table")
    add_junit_argument(parser)
    add_variant_arguments(parser)


def _warmup(given: int | None, device: str) -> int:
    """--warmup, or its default: one untimed call on a GPU (a cold first call is timed at up to 1.6x a warm one on
    an H200), none on a CPU."""
    return given if given is not None else (1 if device.startswith("cuda") else 0)


def warm(args: argparse.Namespace) -> None:
    """What `ditgate serve` prepares before it forks this command: the FLOP profile of its model and size (the
    speedup predictions), counted once and kept there for every run after (ditgate.run.define.predict)."""
    from ditgate.run.define.predict import profile_for

    model = model_from(args)
    profile_for(model.path, model.request, model.dtype)


def main(args: argparse.Namespace) -> int:
    from ditgate.run.report import run_report as report_mod
    from ditgate.run.define import rows as rows_mod
    from ditgate.run.define.configs import parse_cache_config
    from ditgate.run.report import junit
    from ditgate.run.runner import RunConfig, run

    junit.check_writable(args.junit)  # before any row runs: the file is written at the end
    use_cache_dit_from(args)
    base = rows_mod.load_rows(args.rows_file) if args.rows_file else list(rows_mod.DEFAULT_ROWS)
    chosen = rows_mod.with_cache_config(rows_mod.require_some(rows_mod.select(base, args.rows), args.rows),
                                      parse_cache_config(args.cache_config))
    if args.list_rows and args.json:
        print(json.dumps([row.to_dict() | {"world_size": row.world_size, "description": row.description}
                          for row in chosen], indent=2, default=str))
        return 0
    if args.list_rows:
        for row in chosen:
            print(f"{row.name:<18} phase={row.phase or '-':<6} ranks={row.world_size} vs={row.baseline or '-':<15}"
                  f" {row.description}")
        if rows_mod.CALIBRATION not in chosen:
            c = rows_mod.CALIBRATION
            print(f"{c.name:<18} phase={'-':<6} ranks=1 vs={'-':<15} {c.description} (added by itself only where a "
                  "gated row uses its floor; a floor that comes out infinite or not finite is unusable, and the "
                  "report says the defaults were kept)")
        return 0
    use_split_dims_from(args)
    model = model_from(args)
    chosen = with_variants(chosen, args, model)
    cfg = RunConfig(model=model, rows=chosen, out=args.out, integration=args.integration, timeout=args.timeout,
                    resume=args.resume, warmup=_warmup(args.warmup, model.device), repeats=args.repeats,
                    diff=not args.no_diff, launch=args.launch, twin=args.twin, reuse=reuse_from(args))
    report = run(cfg)
    if args.junit:
        junit.write(args.junit, f"ditgate run {report['model']}",
                    junit.row_cases(report["rows"], f"ditgate.run.{report['model']}"), report.get("wall_s"))
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print(report_mod.markdown(report), end="")
        print(f"\nreport: {Path(report['run_dir']) / 'report.md'}")
    return exit_status(report)


def exit_status(report: dict) -> int:
    """0: every row passed; 1: a row failed or did not run; 3 (EXIT_INCONCLUSIVE): none did, but a row could not be
    judged."""
    from ditgate.core.errors import EXIT_INCONCLUSIVE

    if report["passed"]:
        return 0
    return EXIT_INCONCLUSIVE if report.get("outcome") == "inconclusive" else 1
