"""`ditgate inspect MODEL`: the model's anatomy (what the GATE CHECK asks) and a draft integration plan."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from ditgate.inspect.text import render

HELP = "show a pipeline's anatomy (block lists, ForwardPattern, CFG calls, attention, sequence) and draft a plan"


def register(parser: argparse.ArgumentParser) -> None:
    from ditgate.commands.model.options import add_server_argument, add_model_arguments
    add_server_argument(parser)

    add_model_arguments(parser)  # the call `ditgate run` makes: the tables describe the rows it will gate
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.add_argument("--plan", metavar="FILE", help="write the draft integration plan (Markdown) to FILE")


def _check_writable(path: Path) -> None:
    """Refuse a --plan FILE that cannot be written, before the model is loaded."""
    import tempfile

    from ditgate.core.errors import DitgateError

    if path.is_dir():
        raise DitgateError(f"--plan {path} is a folder; give a file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(prefix=f".{path.name}.", dir=path.parent):
            pass
    except OSError as exc:
        raise DitgateError(f"--plan {path}: cannot write there ({exc.strerror or exc})") from None


def main(args: argparse.Namespace) -> int:
    import contextlib

    from ditgate.commands.model.options import model_from
    from ditgate.inspect.anatomy import inspect_model, write_text_atomic

    if args.plan:
        _check_writable(Path(args.plan))
    # Libraries print progress and log lines while loading and running; keep stdout for the report.
    with contextlib.redirect_stdout(sys.stderr):
        anatomy = inspect_model(model_from(args), log=lambda line: print(line, file=sys.__stderr__, flush=True))
    if args.plan:
        write_text_atomic(args.plan, anatomy.plan)
    if args.json:
        print(json.dumps(anatomy.to_dict(), indent=2, default=str))
    else:
        print(render(anatomy))
        print(f"Draft plan written to {args.plan}" if args.plan else
              "Draft plan: add --plan FILE to write it (it is also in --json).")
    return 0
