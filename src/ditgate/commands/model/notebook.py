"""`ditgate notebook run PHASE|all MODEL` (or `--model MODEL`): execute the phase notebooks with papermill, in order.

`ditgate notebook list` prints the notebooks and their parameters. Exit status of `run`: 0 when every notebook
passed, 1 when one failed (its gate) or raised, 3 when none did but a gate could not judge a row (inconclusive), 2 on
bad input.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HELP = "run the phase notebooks (notebooks/*.ipynb) with papermill and summarise them"


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    run = sub.add_parser("run", help="execute notebooks in order into one folder",
                         description="Execute notebooks with papermill into --out (<out>/NN_phase.ipynb beside each "
                                     "phase's <phase>.json and run folder), in order.")
    run.add_argument("names", metavar="PHASE|all",
                     help="all (the integration route 00-70), or phases / notebook names, comma-separated "
                          "(inspect, baseline, cache, cp, tp, tep, vaep, final, perf_matrix, audio; or 30_cp)")
    run.add_argument("model", nargs="?", metavar="MODEL", help="model folder (with model_index.json) or zoo:NAME")
    run.add_argument("--model", dest="model_option", metavar="MODEL", help="the same as MODEL (kept for old scripts)")
    run.add_argument("--out", type=Path, help="results folder (default: a new folder under runs/)")
    run.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("KEY", "VALUE"),
                     help="a notebook parameter (typed as the notebook declares it), e.g. -p steps 4; repeatable")
    run.add_argument("--keep-going", action="store_true", help="run the remaining notebooks after a failure")
    run.add_argument("--kernel", help="Jupyter kernel (default: ditgate if installed, else python3)")
    listing = sub.add_parser("list", help="print the notebooks and their parameters")
    listing.add_argument("--json", action="store_true", help="print the list as JSON")


def _list(as_json: bool) -> int:
    from ditgate.notebooks import NOTEBOOKS, parameters

    if as_json:
        print(json.dumps([{"name": nb.stem, "phase": nb.phase, "title": nb.title, "in_all": nb.in_all,
                           "path": str(nb.path),
                           "parameters": {name: {"type": p["inferred_type_name"], "default": p["default"]}
                                          for name, p in parameters(nb).items()}} for nb in NOTEBOOKS], indent=2))
        return 0
    for nb in NOTEBOOKS:
        params = ", ".join(f"{name}: {p['inferred_type_name']} = {p['default']}" for name, p in parameters(nb).items())
        print(f"{nb.stem:<15} {nb.phase:<12} {'all ' if nb.in_all else '    '} {nb.title}\n{'':<16}{params}")
    return 0


def main(args: argparse.Namespace) -> int:
    from ditgate.core.errors import DitgateError
    from ditgate.notebooks import find, results_dir, run_notebooks, summary

    if args.action == "list":
        return _list(args.json)
    if args.model and args.model_option and args.model != args.model_option:
        raise DitgateError(f"two models given: {args.model} and --model {args.model_option}; give one")
    args.model = args.model or args.model_option
    if not args.model:
        raise DitgateError("no model: give it after the notebooks, e.g. `ditgate notebook run cp zoo:flux`")
    given = dict(args.parameter)
    for reserved in ("model", "out"):
        if reserved in given:
            raise DitgateError(f"give {reserved} as {'MODEL' if reserved == 'model' else '--out'}, not -p {reserved}")
    out = Path(args.out) if args.out else results_dir("", args.model)
    outcomes = run_notebooks(find(args.names), out, {"model": args.model, **given}, kernel=args.kernel,
                             keep_going=args.keep_going)
    print(summary(outcomes), end="")
    print(f"\nexecuted notebooks and results: {out.resolve()}")
    if all(o.status == "passed" for o in outcomes):
        return 0
    from ditgate.core.errors import EXIT_INCONCLUSIVE

    return EXIT_INCONCLUSIVE if all(o.status in ("passed", "inconclusive") for o in outcomes) else 1
