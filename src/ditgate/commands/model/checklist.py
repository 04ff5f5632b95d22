"""`ditgate checklist PHASE --model MODEL`: run a phase's (or route's) checklist; `--validate` checks the files.

PHASE is a checklist name (`cache`, `cp`, ..., see checklists/*.yaml), several separated by commas (they share one
inspect pass and one runner call), or a path to a checklist file. Exit status: 0 when every automated item passes
(manual items are listed, they do not fail the run), 1 when one fails or could not be checked, 2 on bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

HELP = "run a phase's checklist (automated items checked, manual items listed) and write a filled-in copy"

_MARK = {"pass": "PASS", "fail": "FAIL", "error": "ERROR", "manual": "MANUAL", "inconclusive": "INCONCL"}


def register(parser: argparse.ArgumentParser) -> None:
    from ditgate.commands.model.options import (add_fresh_argument, add_junit_argument, add_model_arguments,
                                                add_row_arguments, add_server_argument, add_twin_argument,
                                                add_variant_arguments)
    add_server_argument(parser)

    parser.add_argument("phase", metavar="PHASE", nargs="?",
                        help="checklist name(s), comma-separated (cache, cp, tp, ...), or a checklist file")
    parser.add_argument("--validate", action="store_true",
                        help="check the checklist files (all of them when PHASE is not given) and exit")
    parser.add_argument("--list-checks", action="store_true", help="print the named checks and exit")
    add_model_arguments(parser, model_option=True)
    parser.add_argument("--integration", type=Path, metavar="FILE",
                        help="plugin file: block_adapter / cp_plan / tp_plan for a model cache-dit does not know")
    add_twin_argument(parser)
    parser.add_argument("--cache-config", nargs="+", metavar="KEY=VALUE",
                        help="the cache rows' configuration, as `ditgate run --cache-config` takes it (e.g. "
                             "Fn_compute_blocks=2 max_warmup_steps=4): a cache phase that needs its own schedule")
    add_row_arguments(parser)  # as `ditgate run` takes them: --cache-dit, --cp-split-dims, --launch
    add_variant_arguments(parser)  # --prompts, --seeds: the lossy rows judged on more prompts and seeds
    parser.add_argument("--out", type=Path, help="run folder for the rows and the filled-in checklists (new or "
                        "empty; default: a new folder under runs/)")
    parser.add_argument("--from-run", type=Path, metavar="RUN",
                        help="a run folder of `ditgate run` on the same model and request: its finished rows are "
                             "copied into --out and not computed again")
    add_fresh_argument(parser)  # the result store, as `ditgate run` uses it
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds a parallel group may go without progress before it is killed (default 600)")
    parser.add_argument("--json", action="store_true", help="print the filled-in checklists as JSON")
    add_junit_argument(parser)


def _names(phase: str | None) -> list[str] | None:
    return [p.strip() for p in phase.split(",") if p.strip()] if phase else None


def _validate(phase: str | None, as_json: bool) -> int:
    from ditgate.checklists import validate_all

    checked = validate_all(_names(phase))
    if as_json:
        print(json.dumps([{"name": c.name, "path": str(c.path), "items": len(c.items),
                           "automated": sum(i.automated for i in c.items)} for c in checked], indent=2))
        return 0
    for checklist in checked:
        automated = sum(i.automated for i in checklist.items)
        print(f"ok  {checklist.name:<14} {len(checklist.items):>2} items ({automated} automated, "
              f"{len(checklist.items) - automated} manual)  {checklist.path}")
    return 0


def _list_checks(as_json: bool) -> int:
    from ditgate.checklists.named import CHECKS

    if as_json:
        print(json.dumps([{"name": c.name, "summary": c.summary,
                           "args": {k: {"kind": a.kind.__name__, "choices": list(a.choices) if a.choices else None,
                                        "required": a.required, "default": a.default} for k, a in c.args.items()}}
                          for c in CHECKS.values()], indent=2, default=str))
        return 0
    for check in CHECKS.values():
        args = ", ".join(f"{k}={'|'.join(map(str, a.choices)) if a.choices else a.kind.__name__}"
                         + ("" if a.required else f" (default {a.default})") for k, a in check.args.items())
        print(f"{check.name:<26} {check.summary}" + (f"  [args: {args}]" if args else ""))
    return 0


def render(filled: dict, path: Path) -> str:
    counts = filled["run"]["counts"]
    lines = [f"{filled['name']}: {filled['title']}  ({filled['run']['model']})"]
    for item in filled["items"]:
        result = item["result"]
        lines.append(f"  {_MARK[result['status']]:<7} {item['id']:<28} {result['evidence']}")
    unjudged = f"{counts['inconclusive']} inconclusive, " if counts.get("inconclusive") else ""
    lines.append(f"  {counts['pass']} passed, {counts['fail']} failed, {counts['error']} errors, {unjudged}"
                 f"{counts['manual']} to check by hand -> {path}")
    return "\n".join(lines) + "\n"


def _row_args(args: argparse.Namespace) -> list[str]:
    """The row options given, as words of the reproducing command."""
    words = []
    for option, value in (("--cache-dit", args.cache_dit), ("--cp-split-dims", args.cp_split_dims),
                          ("--prompts", args.prompts)):
        if value is not None:
            words += [option, str(value)]
    if args.launch != "once":
        words += ["--launch", args.launch]
    return words + (["--seeds", str(args.seeds)] if args.seeds != 1 else [])


def main(args: argparse.Namespace) -> int:
    from ditgate.core.errors import DitgateError

    if args.list_checks:
        return _list_checks(args.json)
    if args.validate:
        return _validate(args.phase, args.json)
    if not args.phase or not args.model:
        raise DitgateError("ditgate checklist: give PHASE and --model MODEL (or --validate / --list-checks)")

    from ditgate.checklists import RunOptions, load, run_checklists, write_filled
    from ditgate.commands.model.options import model_from
    from ditgate.run.report import junit

    junit.check_writable(args.junit)  # before anything runs: the file is written at the end
    if args.integration is not None and not args.integration.is_file():
        raise DitgateError(f"--integration {args.integration}: no such file")

    checklists = [load(name) for name in _names(args.phase)]
    from ditgate.commands.model.options import reuse_from, use_cache_dit_from, use_split_dims_from, with_variants
    from ditgate.run.define.configs import parse_cache_config

    use_cache_dit_from(args)
    use_split_dims_from(args)
    model = model_from(args)
    with_variants([], args, model)  # a bad --prompts file or --seeds exits 2 before anything runs
    opts = RunOptions(model=model, integration=args.integration, twin=args.twin, out=args.out,
                      timeout=args.timeout, from_run=args.from_run, cache_config=parse_cache_config(args.cache_config),
                      launch=args.launch, variants=lambda rows: with_variants(rows, args, model),
                      row_args=_row_args(args), reuse=reuse_from(args))
    with contextlib.redirect_stdout(sys.stderr):  # libraries log to stdout; keep it for the result
        filled = run_checklists(checklists, opts)
    paths = [write_filled(f) for f in filled]
    if args.junit:
        junit.write(args.junit, f"ditgate checklist {args.phase}", junit.checklist_cases(filled))
    if args.json:
        print(json.dumps([f | {"file": str(p)} for f, p in zip(filled, paths)], indent=2, default=str))
    else:
        sys.stdout.write("\n".join(render(f, p) for f, p in zip(filled, paths)))
    if all(f["run"]["passed"] for f in filled):
        return 0
    from ditgate.core.errors import EXIT_INCONCLUSIVE

    return 1 if any(f["run"].get("outcome") == "failed" for f in filled) else EXIT_INCONCLUSIVE
