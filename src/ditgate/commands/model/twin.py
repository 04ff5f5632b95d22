"""`ditgate twin MODEL OUT`: a small float32 copy of the model, built from its configs, on which faults that hide
under the bf16 noise floor fail by orders of magnitude (`ditgate.twin`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HELP = "build a small float32 twin of a model from its configs (same widths, one block of each kind)"


def register(parser: argparse.ArgumentParser) -> None:
    from ditgate.commands.model.run import add_model_arguments

    add_model_arguments(parser)
    parser.add_argument("out", type=Path, help="folder to write the twin in (new or empty, unless --overwrite)")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT when it holds a model")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def _given(args: argparse.Namespace) -> dict:
    """The call arguments the user fixed: the twin's call keeps them, and chooses the rest."""
    from ditgate.core.errors import DitgateError
    from ditgate.core.request import parse_call_options, read_call_file

    if args.image is not None:
        raise DitgateError("--image: a twin's call uses ditgate's seeded test image; give --image to the command "
                           "that runs the twin")
    if args.dtype not in ("auto", "float32", "fp32"):
        raise DitgateError(f"--dtype {args.dtype}: a twin is built and checked in float32")
    if args.device not in ("auto", "cpu"):
        raise DitgateError(f"--device {args.device}: a twin is built and checked on the CPU")
    call = read_call_file(args.call_file) | parse_call_options(args.call)
    for key, value in (("prompt", args.prompt), ("height", args.height), ("width", args.width),
                       ("num_inference_steps", args.steps)):
        if value is not None:
            call[key] = value
    return call


def main(args: argparse.Namespace) -> int:
    from ditgate import twin
    from ditgate.core.model import Model

    call = _given(args)
    # the call the user fixed is fitted to the pipeline's signature before anything is built (a --frames the
    # pipeline does not take, a height that is a word): refused in one line, not after the build
    Model.open(args.model, pipeline=args.pipeline, trust_remote_code=args.trust_remote_code, call=call,
               frames=args.frames, weights=False)
    made = twin.build(args.model, args.out, pipeline=args.pipeline, trust_remote_code=args.trust_remote_code,
                      seed=args.seed, call=call, frames=args.frames, overwrite=args.overwrite,
                      quiet=args.json)
    if args.json:
        print(json.dumps(made.to_dict(), indent=2, default=str))
    else:
        print(made.text(), end="")
    return 0
