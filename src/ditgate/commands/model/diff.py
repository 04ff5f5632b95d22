"""`ditgate diff MODEL --row ROW`: the first module where a row departs from its baseline."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ditgate.commands.model.options import add_server_argument, add_model_arguments, model_from
from ditgate.core.errors import DitgateError

HELP = "name the first module whose output differs between a row and its baseline (first transformer call)"


def register(parser: argparse.ArgumentParser) -> None:
    add_server_argument(parser)
    add_model_arguments(parser)
    parser.add_argument("--row", required=True, help="the row to diff (a default row or one of --rows-file)")
    parser.add_argument("--rows-file", type=Path, help="YAML file of rows to take --row from")
    parser.add_argument("--integration", type=Path, metavar="FILE", help="plugin file (as for `ditgate run`)")
    parser.add_argument("--out", type=Path, help="folder for diff.json, diff.md, diff.png (default: under runs/)")
    parser.add_argument("--window", type=int, default=3, help="modules shown past the first divergence (default 3)")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds the row's ranks may go without progress before they are killed (default 600)")
    parser.add_argument("--json", action="store_true", help="print diff.json instead of the table")


def main(args: argparse.Namespace) -> int:
    from ditgate.run.define import rows as rows_mod
    from ditgate.run.diff.compare import DiffConfig, diff
    from ditgate.run.diff.report import markdown
    from ditgate.run.runner import default_out

    if not args.row.strip() or "," in args.row:
        raise DitgateError(f"--row {args.row!r}: name one row (ditgate run MODEL --list-rows shows them)")
    base = rows_mod.load_rows(args.rows_file) if args.rows_file else list(rows_mod.DEFAULT_ROWS)
    args.row = args.row.strip()
    chosen = {r.name: r for r in rows_mod.select(base, args.row)}
    row = chosen[args.row]
    if not row.baseline:
        raise DitgateError(f"row {row.name!r} is a reference row: it has no baseline to diff against")
    if args.window < 0:
        raise DitgateError("--window must be >= 0")
    if not 0 < args.timeout < float("inf"):  # 0 or nan would end the diff's ranks at once
        raise DitgateError(f"--timeout must be a positive number of seconds, got {args.timeout!r}")
    out = args.out or Path(f"{default_out(args.model)}-diff-{row.name}")
    cfg = DiffConfig(model=model_from(args), row=row, baseline=chosen[row.baseline], out=out,
                     integration=args.integration, timeout=args.timeout, window=args.window)
    report = diff(cfg)
    if args.json:
        print(json.dumps(json.loads((out / "diff.json").read_text()), indent=1))
    else:
        print(markdown(report), end="")
        print(f"\nreport: {out / 'diff.md'}  plot: {out / 'diff.png'}")
    return 1 if report["named"] else 0
