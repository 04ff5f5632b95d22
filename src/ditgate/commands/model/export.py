"""`ditgate export --integration FILE --model MODEL --to DIR`: a passing integration file becomes cache-dit's own
code in the tree DIR, proven there without the file."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ditgate.commands.model.options import add_model_arguments, check_out_folder, model_from

HELP = "write a passing integration file into a cache-dit tree as cache-dit's own code, and prove it there"


def register(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser, model_option=True)
    parser.add_argument("--integration", type=Path, metavar="FILE", required=True,
                        help="the plugin file (block_adapter / cp_plan / tp_plan) to export")
    parser.add_argument("--to", type=Path, metavar="DIR", required=True,
                        help="the folder that holds the cache_dit package (a checkout's src/, or a copy of the "
                             "installed package's parent)")
    parser.add_argument("--rows", help="rows to prove (default: cache, cp-ulysses-2, cp-ring-2, tp-2 as the file "
                                       "has block_adapter, cp_plan, tp_plan)")
    parser.add_argument("--model-id", help="the hub id the cache-dit-generate example loads (default: the model's "
                                           "name, or its folder's name for a local folder)")
    parser.add_argument("--out", type=Path, help="folder for the runs, export.patch and PR.md (default: a new "
                                                 "folder under runs/)")
    parser.add_argument("--json", action="store_true", help="print export.json")


def main(args: argparse.Namespace) -> int:
    from ditgate.export import flow
    from ditgate.export.tree import ExportError, Tree

    if not args.model:
        raise ExportError("--model MODEL is required")
    if not args.integration.is_file():
        raise ExportError(f"--integration {args.integration}: no such file")
    check_out_folder(args.out)
    if args.model_id is not None:
        from ditgate.export.written import check_model_id

        check_model_id(args.model_id)
    Tree.open(args.to).check_root_writable()
    model = model_from(args)
    rows = [r.strip() for r in args.rows.split(",") if r.strip()] if args.rows else None
    result = flow.run(model, args.integration, args.to, out=args.out, rows=rows, model_id=args.model_id)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, default=str))
    elif result.status == "unchanged":
        print(f"{result.tree.root} already holds this export: nothing written")
    else:
        print((result.out / "PR.md").read_text(), end="")
        print(f"\nexport: {result.status}; {result.out / 'PR.md'}"
              + (f", {result.out / 'export.patch'}" if result.status == "exported" else ""))
    return 0 if result.status in ("exported", "unchanged") else 1
