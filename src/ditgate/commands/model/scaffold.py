"""`ditgate scaffold MODEL [REQUEST] --out FILE`: write an integration plugin from what inspect observes on the call,
then run its rows (cache, cp-ulysses-2, tp-2) on the model's float32 twin (`ditgate.scaffold`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "write an integration plugin from the observed call and run its rows on the model's float32 twin"
ROWS = "cache,cp-ulysses-2,tp-2"


def register(parser: argparse.ArgumentParser) -> None:
    from ditgate.commands.model.options import add_model_arguments

    add_model_arguments(parser)
    parser.add_argument("--out", type=Path, required=True, metavar="FILE", help="the plugin file to write")
    parser.add_argument("--no-run", action="store_true", help="only write the plugin")
    parser.add_argument("--rows", default=ROWS, help=f"rows to run on the twin (default {ROWS})")
    parser.add_argument("--run-dir", type=Path, metavar="DIR", help="run folder of the rows (default: under runs/)")


def main(args: argparse.Namespace) -> int:
    import contextlib
    import time

    from ditgate.commands.model.inspect import _check_writable
    from ditgate.commands.model.options import check_out_folder, model_from
    from ditgate.inspect.anatomy import write_text_atomic
    from ditgate.scaffold.write import observe, plugin_source

    _check_writable(args.out)
    check_out_folder(args.run_dir, "--run-dir")
    if not args.no_run:  # the rows are checked before the model is inspected and the plugin written
        from ditgate.run.define import rows

        rows.require_some(rows.select(rows.DEFAULT_ROWS, args.rows), args.rows)
    start = time.perf_counter()
    model = model_from(args)
    print(f"scaffold: inspecting {model.name} on its call", file=sys.stderr, flush=True)
    with contextlib.redirect_stdout(sys.stderr):
        observed = observe(model)
    write_text_atomic(args.out, plugin_source(observed))
    print(f"plugin written to {args.out} ({time.perf_counter() - start:.0f} s)")
    if args.no_run:
        return 0
    return _run_rows(args, model, start, observed)


def _twin_call(args: argparse.Namespace, model, observed) -> dict:
    """The call arguments the twin keeps: the user's, and a `max_sequence_length` under which CP splits an odd joint
    text evenly (`scaffold.cp.even_text_call`), where the user gave none."""
    import inspect

    from ditgate.commands.model.twin import _given
    from ditgate.core import loader
    from ditgate.scaffold.cp import even_text_call

    given = _given(args)
    cls = loader.call_class(model.path, model.pipeline, model.trust_remote_code)
    if cls is None or "max_sequence_length" in given:
        return given
    params = {n: p.default for n, p in inspect.signature(cls.__call__).parameters.items()}
    extra = even_text_call(observed, model.request.call, params)
    if extra:
        print(f"scaffold: the twin's call takes max_sequence_length={extra['max_sequence_length']}, so that the "
              f"{observed.anatomy.sequence.text_tokens} text tokens seen here (odd) become even and split over 2 ranks",
              file=sys.stderr, flush=True)
    return given | extra


def _run_rows(args: argparse.Namespace, model, start: float, observed) -> int:
    import contextlib
    import time

    from ditgate import twin, zoo
    from ditgate.core.model import Model
    from ditgate.run.define import rows
    from ditgate.run.report import run_report
    from ditgate.run.runner import RunConfig, run

    if model.name.startswith(zoo.ZOO_PREFIX):  # already tiny, seeded and float32: its own twin, on the same call
        print("scaffold: rows on the zoo model itself (float32)", file=sys.stderr, flush=True)
        on_twin = Model.open(model.name, pipeline=model.pipeline, dtype="float32", device="cpu",
                             request=model.request)
    else:
        print("scaffold: the float32 twin", file=sys.stderr, flush=True)
        with contextlib.redirect_stdout(sys.stderr):
            built = twin.cached(model.name, pipeline=model.pipeline, trust_remote_code=model.trust_remote_code,
                                seed=model.request.seed, call=_twin_call(args, model, observed), frames=args.frames,
                                quiet=True)
        on_twin = Model.open(built.folder, pipeline=model.pipeline, trust_remote_code=model.trust_remote_code,
                             dtype="float32", device="cpu", seed=model.request.seed)
    cfg = RunConfig(model=on_twin, rows=rows.select(rows.DEFAULT_ROWS, args.rows), out=args.run_dir,
                    integration=args.out.resolve(), twin="off")
    report = run(cfg)
    print(run_report.markdown(report), end="")
    print(f"\nscaffold and rows: {time.perf_counter() - start:.0f} s; report: {Path(report['run_dir']) / 'report.md'}")
    return 0 if report["passed"] else 1
