"""`ditgate inspect MODEL`: the model's anatomy (what the GATE CHECK asks) and a draft integration plan."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from ditgate.inspect.text import render

HELP = "show a pipeline's anatomy (block lists, ForwardPattern, CFG calls, attention, sequence) and draft a plan"


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="model folder (with model_index.json) or zoo:NAME")
    parser.add_argument("--height", type=_positive, help="image height of the observed run (default: the zoo "
                        "model's call, else the pipeline's default)")
    parser.add_argument("--width", type=_positive, help="image width of the observed run")
    parser.add_argument("--frames", type=_positive, help="number of frames (video pipelines)")
    parser.add_argument("--steps", type=_positive, default=2,
                        help="denoising steps of the observed run (default 2; calls per step are counted over them)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.add_argument("--plan", metavar="FILE", help="write the draft integration plan (Markdown) to FILE")
    parser.add_argument("--pipeline", metavar="MODULE:CLASS", help="pipeline class when it is not the one "
                        "model_index.json names")
    parser.add_argument("--trust-remote-code", action="store_true", help="allow code inside the model folder to run")
    parser.add_argument("--dtype", default="float32", help="dtype to load the pipeline in (default float32)")
    parser.add_argument("--device", default="cpu", help="device to run on (default cpu)")










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

    from ditgate.inspect.anatomy import inspect_model, write_text_atomic

    if args.plan:
        _check_writable(Path(args.plan))
    # Libraries print progress and log lines while loading and running; keep stdout for the report.
    with contextlib.redirect_stdout(sys.stderr):
        anatomy = inspect_model(args.model, height=args.height, width=args.width, frames=args.frames,
                                steps=args.steps, pipeline=args.pipeline, trust_remote_code=args.trust_remote_code,
                                dtype=args.dtype, device=args.device)
    if args.plan:
        write_text_atomic(args.plan, anatomy.plan)
    if args.json:
        print(json.dumps(anatomy.to_dict(), indent=2, default=str))
    else:
        print(render(anatomy))
        print(f"Draft plan written to {args.plan}" if args.plan else
              "Draft plan: add --plan FILE to write it (it is also in --json).")
    return 0
