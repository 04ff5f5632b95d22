"""The options every command that takes a model shares, and the one value they become.

`add_model_arguments` adds the model and its REQUEST options (the call, seed, dtype, device, pipeline class,
remote-code consent); `model_from(args)` resolves them once into a `ditgate.core.model.Model` that the command
hands to everything after it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ditgate.core import request as request_mod
from ditgate.core.errors import DitgateError


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


def add_server_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", choices=("auto", "off"), default="auto",
                        help="auto (default): run on a running `ditgate serve` (imports done), else here; off: here")


def add_fresh_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fresh", action="store_true",
                        help="compute every row, reusing nothing from the result store (by default a reference row "
                             "whose model, request, dtype, device, libraries, gate table and definition are "
                             "unchanged is reused from an earlier run; $DITGATE_REUSE=off does the same as --fresh)")


def reuse_from(args: argparse.Namespace) -> bool:
    """Whether the command's runs reuse stored reference rows (ditgate.run.reuse): yes unless --fresh or
    $DITGATE_REUSE=off."""
    import os

    return not args.fresh and os.environ.get("DITGATE_REUSE", "on").lower() not in ("off", "0", "no")


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


def add_twin_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--twin", choices=("auto", "off", "only"), default="auto",
                        help="twin rows (float32, on the CPU): auto (default) runs every structural row on the "
                             "model's float32 twin too when the run is not float32, and a row passes only when both "
                             "pass; only: the twin alone (the model's weights are not needed); off: never")


def add_row_arguments(parser: argparse.ArgumentParser) -> None:
    """What the rows take beyond the model, the integration and the cache configuration (run and checklist alike):
    where cache-dit comes from, the CP split dimensions without an integration file, and how rows are launched."""
    parser.add_argument("--cache-dit", type=Path, metavar="DIR",
                        help="import cache-dit from DIR, the folder that holds the cache_dit package (a checkout's "
                             "src/, an export's tree), here and in every rank; PYTHONPATH is honoured too, and the "
                             "report names the folder cache-dit came from")
    parser.add_argument("--cp-split-dims", metavar="LIST=DIM,...",
                        help="without --integration: the dimension CP divides in what each block list returns, as "
                             "an integration file's CP_SPLIT_DIMS says (e.g. spatial_blocks=1,temporal_blocks=0)")
    parser.add_argument("--launch", choices=("once", "per-row"), default="once",
                        help="once (default): the pipeline is loaded once per process and each row runs on a fresh "
                             "copy of it, one worker group per world size; per-row: every row loads from disk and "
                             "every multi-rank row starts its own torchrun group (the design before, to compare)")


def use_cache_dit_from(args: argparse.Namespace) -> None:
    """--cache-dit: import cache-dit from that folder here and in every rank (before anything imports it)."""
    if args.cache_dit is not None:
        from ditgate.core.paths import use_cache_dit

        use_cache_dit(args.cache_dit)


def use_split_dims_from(args: argparse.Namespace) -> None:
    """--cp-split-dims: the CP proof's split dimensions, for this process and its ranks."""
    if args.cp_split_dims:
        import json
        import os

        from ditgate.core import plugin

        os.environ[plugin.SPLIT_DIMS_ENV] = json.dumps(plugin.parse_split_dims(args.cp_split_dims))


def add_variant_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompts", type=Path, metavar="FILE",
                        help="judge the lossy rows (cache, quantization) on these prompts too: one per line, or a "
                             "JSON/YAML list; each gate on the worst case, the spread in the report")
    parser.add_argument("--seeds", type=int, default=1, metavar="N",
                        help="judge the lossy rows on N seeds (the request's seed and the next N-1; default 1)")


def with_variants(rows: list, args: argparse.Namespace, model) -> list:
    """`rows` plus the lossy rows' variants that --prompts / --seeds ask for (ditgate.run.define.variants)."""
    from ditgate.gates.verdicts import load_gates
    from ditgate.run.define import variants

    prompts = variants.read_prompts(args.prompts) if args.prompts else None
    return variants.expand(rows, prompts, args.seeds, model.request.seed, load_gates())


def check_out_folder(path: Path | None, option: str = "--out") -> None:
    """Refuse, before any work, an output folder that is a file or lies under one (the command would find out only
    when it makes the folder, after its runs)."""
    if path is None:
        return
    for folder in (Path(path), *Path(path).parents):
        if folder.exists():
            if not folder.is_dir():
                raise DitgateError(f"{option} {path}: {folder} is a file, not a folder")
            return


def add_junit_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--junit", type=Path, metavar="FILE",
                        help="also write JUnit XML for a CI: one test case per row (or checklist item), a failure's "
                             "message its reasons")


def model_from(args: argparse.Namespace, name: str | None = None):
    """The Model of the command's options (`name` instead of args.model when given): path, pipeline class, request
    fitted to the pipeline's call, dtype and device, all resolved here (ditgate.core.model.Model.open)."""
    from ditgate.core.model import Model

    return Model.open(name or args.model, pipeline=args.pipeline, trust_remote_code=args.trust_remote_code,
                      dtype=args.dtype, device=args.device, call=request_mod.parse_call_options(args.call),
                      call_file=args.call_file, prompt=args.prompt, height=args.height, width=args.width,
                      frames=args.frames, steps=args.steps, seed=args.seed, image=args.image,
                      weights=getattr(args, "twin", None) != "only")  # --twin only: the configs are enough
