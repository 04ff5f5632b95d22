"""`ditgate run MODEL`: the baseline and every integration phase, gated against the baseline."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ditgate.core import request as request_mod

HELP = "run the baseline and each phase (cache, CP, TP, TE-P, VAE-P, hybrid) and gate them"


def bounded(low: int, high: int):
    """An argparse type: a whole number from `low` to `high` (a size that would overflow is refused here)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low} to {high}, got {text}")
        return value

    parse.__name__ = "int"
    return parse


def add_model_arguments(parser: argparse.ArgumentParser, model_option: bool = False) -> None:
    """Arguments shared by every command that loads and runs a model (the model as `--model` when
    `model_option`): one request object and one device/dtype default for all of them."""
    parser.add_argument(*(["--model"] if model_option else ["model"]), help="model folder (with model_index.json) "
                        "or zoo:NAME")
    parser.add_argument("--pipeline", metavar="MODULE:CLASS", help="pipeline class, for models outside diffusers")
    parser.add_argument("--trust-remote-code", action="store_true", help="allow code shipped in the model folder")
    parser.add_argument("--height", type=bounded(1, 65536),
                        help="image/video height (default: the zoo's or the pipeline's)")
    parser.add_argument("--width", type=bounded(1, 65536), help="image/video width")
    parser.add_argument("--frames", type=bounded(1, 100000), help="number of video frames, passed under the name "
                        "the pipeline's __call__ uses (num_frames, video_length, ...)")
    parser.add_argument("--steps", type=bounded(1, 100000), help="denoising steps (default: the folder's "
                        "ditgate.json, else the pipeline's own default)")
    parser.add_argument("--prompt", help="prompt (default: the folder's ditgate.json, or a fixed test prompt)")
    parser.add_argument("--call", action="append", metavar="KEY=VALUE", help="a pipeline call argument (repeatable;"
                        " VALUE is parsed as JSON, else taken as a string), e.g. --call guidance_scale=4.5")
    parser.add_argument("--call-file", metavar="FILE", help="JSON or YAML mapping of pipeline call arguments "
                        "(--call and the named options override it)")
    parser.add_argument("--image", metavar="FILE", help="input image of an image-to-video, edit or control pipeline "
                        "(default: a seeded test image when the pipeline needs one)")
    parser.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    parser.add_argument("--dtype", default="auto", help="float32, bfloat16/bf16, float16/fp16 or auto (default: "
                        "bfloat16 on a GPU, float32 on a CPU)")
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto (default: cuda when available)")


def add_integration_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--integration", type=Path, metavar="FILE",
                        help="plugin file: block_adapter / cp_plan / tp_plan for a model cache-dit does not know")


def register(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--rows", help="comma-separated row names (default: all); their baselines are added")
    parser.add_argument("--rows-file", type=Path, help="YAML file of rows to use instead of the default rows")
    parser.add_argument("--list-rows", action="store_true", help="print the rows and exit")
    parser.add_argument("--cache-config", nargs="+", metavar="KEY=VALUE",
                        help="the default cache rows' configuration, in cache-dit's DBCacheConfig names (e.g. "
                             "max_warmup_steps=4 residual_diff_threshold=0.05 Fn_compute_blocks=2, or mask=fast, "
                             "taylorseer=1)")
    add_integration_argument(parser)
    parser.add_argument("--out", type=Path, help="run folder (default: a new folder under runs/)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out, keeping finished rows")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds a parallel group may go without progress before it is killed (default 600)")
    parser.add_argument("--warmup", type=int, help="untimed calls before the timed ones (default: 1 on a GPU, where "
                        "the first call pays one-off costs, else 0)")
    parser.add_argument("--repeats", type=int, default=1, help="timed calls; the median is reported (default 1)")
    parser.add_argument("--no-diff", action="store_true",
                        help="do not diff a failed exact row against its baseline (see `ditgate diff`)")
    parser.add_argument("--launch", choices=("once", "per-row"), default="once",
                        help="once (default): the pipeline is loaded once per process and each row runs on a fresh "
                             "copy of it, one worker group per world size; per-row: every row loads from disk and "
                             "every multi-rank row starts its own torchrun group (the design before, to compare)")
    parser.add_argument("--json", action="store_true", help="print report.json instead of the table")


def build_request(args: argparse.Namespace):
    """The request of the command's model options, fitted to the pipeline's `__call__` (ditgate.core.request)."""
    return request_mod.for_model(args.model, pipeline=args.pipeline, trust_remote_code=args.trust_remote_code,
                                 call=request_mod.parse_call_options(args.call), call_file=args.call_file,
                                 prompt=args.prompt, height=args.height, width=args.width, frames=args.frames,
                                 steps=args.steps, seed=args.seed, image=args.image)


def device_and_dtype(args: argparse.Namespace) -> tuple[str, str]:
    """--device and --dtype with "auto" resolved: the same for every command (core.request.device_and_dtype)."""
    return request_mod.device_and_dtype(args.device, args.dtype)


def _warmup(given: int | None, device: str) -> int:
    """--warmup, or its default: one untimed call on a GPU (a cold first call is timed at up to 1.6x a warm one on
    an H200), none on a CPU."""
    return given if given is not None else (1 if device.startswith("cuda") else 0)


def main(args: argparse.Namespace) -> int:
    from ditgate.run.report import run_report as report_mod
    from ditgate.run.define import rows as rows_mod
    from ditgate.run.runner import RunConfig, run

    base = rows_mod.load_rows(args.rows_file) if args.rows_file else list(rows_mod.DEFAULT_ROWS)
    chosen = rows_mod.with_cache_config(rows_mod.select(base, args.rows), rows_mod.parse_cache_config(args.cache_config))
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
    device, dtype = device_and_dtype(args)
    cfg = RunConfig(model=args.model, rows=chosen, request=build_request(args), out=args.out, dtype=dtype,
                    device=device, integration=args.integration, pipeline=args.pipeline,
                    trust_remote_code=args.trust_remote_code, timeout=args.timeout, resume=args.resume,
                    warmup=_warmup(args.warmup, device), repeats=args.repeats, diff=not args.no_diff,
                    launch=args.launch)
    report = run(cfg)
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print(report_mod.markdown(report), end="")
        print(f"\nreport: {Path(report['run_dir']) / 'report.md'}")
    return 0 if report["passed"] else 1
