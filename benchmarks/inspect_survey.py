"""Survey: how much of `ditgate inspect`'s anatomy works on every transformer class diffusers exports.

For each class in `diffusers.models.transformers`:

1. build it tiny: the `__init__` defaults, scaled down by parameter name (layers -> 2, heads -> 4, head dim -> 16,
   model width -> 64, FFN width -> 128, text/condition widths -> 32, RoPE axis lists rescaled to the new head dim);
   a second attempt sets every text/condition width to the model width, since some classes require that;
2. read its block lists statically (attribute, length, block class, signature) and what cache-dit registers for the
   class (BlockAdapter through cache-dit's transformer-only lookup, CP and TP planners);
3. call its forward once with dummy inputs made from the forward signature (latents as [B, C, H, W],
   [B, C, F, H, W] or packed [B, S, C]; text as [B, 8, width]; timesteps; masks; Flux-style ids), under the same
   hooks `ditgate inspect` uses, and derive each block list's ForwardPattern from what the blocks returned;
4. compare that pattern with the one cache-dit's registered adapter declares.

Usage: `python benchmarks/inspect_survey.py [--only NAME ...] [--json OUT] [--timeout S]`. Prints a Markdown table
and a summary; `--json` writes one record per class. CPU only; a few minutes on two cores.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import signal
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from ditgate.inspect.anatomy import observe_transformer, static_block_lists  # noqa: E402

HEADS, HEAD_DIM, KV_HEADS = 4, 16, 2
WIDTH = HEADS * HEAD_DIM
FFN, TEXT, TEXT_LEN, BATCH = 128, 32, 8, 1
TEXT_DIMS = {"joint_attention_dim", "cross_attention_dim", "text_dim", "caption_channels", "text_embed_dim",
             "cap_feat_dim", "context_in_dim", "in_text_dim", "in_text_dim2", "text_in_dim", "pooled_projection_dim",
             "cond_token_dim", "text_emb_dim", "text_hidden_dim", "dit_text_dim",
             "llm_features_dim", "condition_dim", "global_cond_dim", "cross_attention_input_dim",
             "global_states_input_dim", "encoder_hid_dim", "condition_channels"}
NONE_DEFAULTS = {"in_channels": 4, "patch_size": 2, "sample_size": 16, "attention_head_dim": HEAD_DIM,
                 "num_attention_heads": HEADS}
WIDTHS = {"hidden_size", "dim", "model_dim", "embed_dim", "token_dim", "dit_dim", "d_model", "inner_dim",
          "caption_projection_dim"}


@dataclass
class Result:
    cls: str
    built: bool = False
    build_note: str = ""
    lists: list[dict[str, Any]] = field(default_factory=list)
    forward: str = "not tried"  # "ok" | error text
    layout: str | None = None
    adapter: str | None = None
    adapter_patterns: list[str] = field(default_factory=list)
    cp_planner: str | None = None
    tp_planner: str | None = None
    agreement: str = "-"  # observed patterns vs cache-dit's adapter
    seconds: float = 0.0


# -- tiny configs -------------------------------------------------------------------------------------------------
def _even_split(total: int, parts: int) -> list[int]:
    base = [total // parts // 2 * 2] * parts
    base[-1] += total - sum(base)
    return base


def tiny_config(cls, text_width: int) -> dict[str, Any]:
    params = inspect.signature(cls.__init__).parameters
    defaults = {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty}
    old_heads = next((v for n, v in defaults.items() if isinstance(v, int) and "heads" in n and "kv" not in n
                      and "key_value" not in n and "cross" not in n), None)
    old_head_dim = next((v for n, v in defaults.items() if isinstance(v, int) and n.endswith("head_dim")), None)
    if old_head_dim is None and old_heads:
        width = next((v for n, v in defaults.items() if n in WIDTHS and isinstance(v, int)), None)
        old_head_dim = width // old_heads if width else None
    config = {}
    layers = 2
    for name, value in defaults.items():
        if isinstance(value, bool) or name in ("self", "kwargs"):
            continue
        low = name.lower()
        if value is None and name in NONE_DEFAULTS:
            config[name] = NONE_DEFAULTS[name]
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value) \
                and "layer" in low:  # indices of layers (e.g. VACE layers): keep those that still exist
            config[name] = type(value)([v for v in value if v < layers] or [0])
        elif isinstance(value, int):
            if ("layers" in low or "depth" in low or low.endswith("_blocks")) and value > layers:
                config[name] = layers
            elif "heads" in low:
                kv = "kv" in low or "key_value" in low
                config[name] = KV_HEADS if kv and old_heads and value < old_heads else HEADS
            elif low.endswith("head_dim") or low == "d_kv":
                config[name] = HEAD_DIM
            elif name in WIDTHS:
                config[name] = WIDTH
            elif any(k in low for k in ("ffn", "intermediate", "ff_dim", "ff_inner", "mlp_hidden")) and value > FFN:
                config[name] = FFN
            elif name in TEXT_DIMS:
                config[name] = text_width
            elif low == "multiple_of":
                config[name] = 16
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value):
            if any(k in low for k in ("axes", "rope_dim", "mrope", "axes_dim")) and old_head_dim:
                total = sum(value)
                target = HEAD_DIM if total == old_head_dim else HEAD_DIM // 2 if total * 2 == old_head_dim else None
                if target:
                    config[name] = type(value)(_even_split(target, len(value)))
    return config


def build(cls, text_width: int) -> tuple[torch.nn.Module | None, str]:
    try:
        torch.manual_seed(0)
        return cls(**tiny_config(cls, text_width)).eval(), f"text width {text_width}"
    except Exception as exc:  # noqa: BLE001 - a class that cannot be built this way is a survey finding
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}" if str(exc) else type(exc).__name__


# -- dummy inputs -------------------------------------------------------------------------------------------------
def _channels(model) -> int:
    cfg = model.config
    for key in ("in_channels", "in_dim", "io_channels", "in_visual_dim", "latent_channels", "latent_dim",
                "input_dims"):
        if isinstance(cfg.get(key), int):
            return cfg[key]
    return 4


def _text_width(model) -> int:
    cfg = model.config
    return next((cfg[k] for k in sorted(TEXT_DIMS) if isinstance(cfg.get(k), int)), TEXT)


def layouts(cls_name: str, channels: int) -> list[tuple[str, tuple[int, ...]]]:
    image = ("image [B,C,H,W]", (BATCH, channels, 16, 16))
    video = ("video [B,C,F,H,W]", (BATCH, channels, 3, 16, 16))
    video2 = ("video [B,C,F,H,W] F=2", (BATCH, channels, 2, 16, 16))
    frames_first = ("video [B,F,C,H,W]", (BATCH, 3, channels, 16, 16))
    packed = ("packed [B,S,C]", (BATCH, 64, channels))
    audio = ("sequence [B,C,L]", (BATCH, channels, 32))
    if "3D" in cls_name or "Video" in cls_name:
        return [video, video2, frames_first, packed, image]
    if "1D" in cls_name or "Audio" in cls_name:
        return [audio, packed, image]
    return [image, packed, video]


def dummy_inputs(model, forward, layout: tuple[str, tuple[int, ...]]) -> dict[str, Any]:
    name, shape = layout
    params = inspect.signature(forward).parameters
    text_width = _text_width(model)
    patch = model.config.get("patch_size") or 1
    patch = patch[-1] if isinstance(patch, (list, tuple)) else patch
    grid = shape[-2:] if len(shape) >= 4 else (8 * patch, 8 * patch)  # packed: an 8 x 8 token grid
    tokens = shape[1] if name.startswith("packed") else None
    axes = len(model.config.get("axes_dims_rope") or (0, 0, 0))  # Flux-style position ids per token
    inputs: dict[str, Any] = {}
    for i, (pname, param) in enumerate(params.items()):
        low = pname.lower()
        required = param.default is inspect.Parameter.empty
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if i == 0:
            inputs[pname] = torch.randn(shape)
        elif "mask" in low and ("encoder" in low or "text" in low or "context" in low or "prompt" in low):
            inputs[pname] = torch.ones(BATCH, TEXT_LEN, dtype=torch.bool)
        elif low in ("encoder_hidden_states", "context", "encoder_hidden_states_t5", "prompt_embeds",
                     "text_embeds", "caption", "cap_feats", "encoder_hidden_states_llm") or \
                (required and ("encoder" in low or "text" in low or "context" in low)):
            inputs[pname] = torch.randn(BATCH, TEXT_LEN, text_width)
        elif low in ("timestep", "timesteps", "t", "time", "sigma", "noise_level"):
            inputs[pname] = torch.full((BATCH,), 500.0)
        elif "pooled" in low or low in ("global_embed", "global_hidden_states"):
            inputs[pname] = torch.randn(BATCH, model.config.get("pooled_projection_dim") or text_width)
        elif low == "img_ids":
            inputs[pname] = torch.zeros((tokens or grid[0] * grid[1] // (patch * patch)), axes)
        elif low == "txt_ids":
            inputs[pname] = torch.zeros(TEXT_LEN, axes)
        elif low in ("class_labels", "labels"):
            inputs[pname] = torch.zeros(BATCH, dtype=torch.long)
        elif low.endswith("_size") and low.split("_")[0] in ("original", "target") or low == "crop_coords":
            inputs[pname] = torch.tensor([[grid[0] * 8.0, grid[1] * 8.0]])
        elif required and "mask" in low:
            inputs[pname] = torch.ones(BATCH, TEXT_LEN, dtype=torch.bool)
        elif low == "guidance" and (required or model.config.get("guidance_embeds")):
            inputs[pname] = torch.full((BATCH,), 3.5)
        elif low in ("num_frames", "frames"):
            inputs[pname] = shape[2] if len(shape) == 5 else 1
        elif low in ("height", "width"):
            inputs[pname] = grid[0] if low == "height" else grid[1]
        elif low == "img_shapes":
            inputs[pname] = [[(shape[2] if len(shape) == 5 else 1, grid[0] // 2, grid[1] // 2)]] if tokens is None \
                else [[(1, 8, 8)]]
        elif low == "added_cond_kwargs":
            inputs[pname] = {"resolution": torch.tensor([[grid[0] * 8.0, grid[1] * 8.0]]),
                             "aspect_ratio": torch.tensor([[1.0]])}
        elif low == "return_dict":
            inputs[pname] = False
        elif required:
            inputs[pname] = None
    return inputs


class _Timeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: int):
    def handler(signum, frame):
        raise _Timeout(f"no result within {seconds} s")

    previous = signal.signal(signal.SIGALRM, handler)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# -- one class ----------------------------------------------------------------------------------------------------
def _lists(block_lists) -> list[dict[str, Any]]:
    return [{"attribute": b.attribute, "length": b.length, "block_class": b.block_class, "called": b.called,
             "outputs": b.outputs, "pattern": b.pattern, "check_forward_pattern": b.check_forward_pattern,
             "patch_functor_needed": b.patch_functor_needed, "findings": b.loop_findings,
             "reason": b.pattern_reason} for b in block_lists]


def cache_dit_view(model, result: Result) -> None:
    from ditgate.inspect.plan.support import _planner_name, activate_registries, describe_adapter
    from cache_dit.distributed.transformers.register import (ContextParallelismPlannerRegister,
                                                             TensorParallelismPlannerRegister)

    with contextlib.redirect_stdout(sys.stderr):
        activate_registries()
        adapter, error = describe_adapter(model)
    if adapter is not None:
        result.adapter = f"{adapter.prefix} ({adapter.function})"
        for names, patterns in zip(adapter.block_lists[0], adapter.forward_patterns[0]):
            for name in names.split(" + "):
                result.adapter_patterns.append(f"{name}={patterns}")
    elif error:
        result.adapter = error[:120]
    result.cp_planner = _planner_name(ContextParallelismPlannerRegister, model)
    result.tp_planner = _planner_name(TensorParallelismPlannerRegister, model)


def try_forward(model, cls_name: str) -> tuple[list | None, str | None, list[str]]:
    """Observed block lists and the layout that worked, or None and the error of every layout tried."""
    errors = []
    for layout in layouts(cls_name, _channels(model)):
        inputs = dummy_inputs(model, model.forward, layout)
        try:
            lists, _, _ = observe_transformer(model, lambda: model(**inputs))
            return lists, layout[0], errors
        except _Timeout:
            raise
        except Exception as exc:  # noqa: BLE001 - record why the dummy forward failed
            message = str(exc).splitlines()[0][:140] if str(exc) else ""
            errors.append(f"{layout[0]}: {type(exc).__name__}: {message}")
    return None, None, errors


def survey_class(cls, timeout: int) -> Result:
    result = Result(cls.__name__)
    start = time.perf_counter()
    errors: list[str] = []
    try:
        with time_limit(timeout):
            for text_width in (TEXT, WIDTH):
                model, note = build(cls, text_width)
                if model is None:
                    errors.append(f"build ({text_width}): {note}")
                    continue
                if not result.built:
                    result.built, result.build_note = True, note
                    result.lists = _lists(static_block_lists(model))
                    cache_dit_view(model, result)
                lists, layout, tried = try_forward(model, cls.__name__)
                errors += [f"[{note}] {e}" for e in tried]
                if lists is not None:
                    result.forward, result.layout, result.build_note = "ok", layout, note
                    result.lists = _lists(lists)
                    break
            if result.forward != "ok":
                result.forward = " / ".join(errors) or "no layout"
                if not result.built:
                    result.build_note = result.forward
    except _Timeout as exc:
        result.forward = str(exc)
    except Exception as exc:  # noqa: BLE001
        result.forward = f"survey error: {type(exc).__name__}: {exc}"
        traceback.print_exc(file=sys.stderr)
    finally:
        result.seconds = round(time.perf_counter() - start, 2)
    result.agreement = agreement(result)
    return result


def agreement(result: Result) -> str:
    if not result.adapter_patterns or result.forward != "ok":
        return "-"
    declared = dict(item.split("=", 1) for item in result.adapter_patterns)
    observed = {b["attribute"]: b["pattern"] for b in result.lists if b["called"]}
    common = [n for n in declared if n in observed]
    if not common:
        return "no common list"
    same = [n for n in common if declared[n] == observed[n]]
    return "agree" if len(same) == len(common) else \
        "differ: " + ", ".join(f"{n} {observed[n]} vs {declared[n]}" for n in common if n not in same)


# -- report -------------------------------------------------------------------------------------------------------
def markdown(results: list[Result]) -> str:
    lines = ["| class | built | block lists (n x class) | forward | observed patterns | cache-dit adapter: patterns "
             "| agreement | CP | TP |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lists = "; ".join(f"{b['attribute']} ({b['length']} x {b['block_class']})" for b in r.lists) or "none"
        observed = ", ".join(f"{b['attribute']}={b['pattern'] or 'none'}" + ("*" if b["patch_functor_needed"] else "")
                             for b in r.lists if b["called"]) or "-"
        forward = "ok (" + r.layout + ")" if r.forward == "ok" else r.forward.replace("|", "/")[:90]
        lines.append(f"| {r.cls} | {'yes' if r.built else 'no: ' + r.build_note[:80].replace('|', '/')} | "
                     f"{lists if r.built else '-'} | {forward if r.built else '-'} | {observed} | "
                     f"{(r.adapter or 'none')}{': ' + ', '.join(r.adapter_patterns) if r.adapter_patterns else ''}"
                     f" | {r.agreement} | {r.cp_planner or '-'} | {r.tp_planner or '-'} |")
    return "\n".join(lines)


def summary(results: list[Result]) -> dict[str, Any]:
    built = [r for r in results if r.built]
    with_lists = [r for r in built if r.lists]
    ran = [r for r in built if r.forward == "ok"]
    patterned = [r for r in ran if any(b["called"] and b["pattern"] for b in r.lists)]
    compared = [r for r in ran if r.agreement not in ("-", "no common list")]
    return {
        "classes": len(results), "built": len(built), "block_lists_found": len(with_lists),
        "forward_ran": len(ran), "pattern_observed": len(patterned),
        "compared_with_cache_dit": len(compared), "agree_with_cache_dit": sum(r.agreement == "agree" for r in compared),
        "not_built": [r.cls for r in results if not r.built],
        "no_block_list": [r.cls for r in built if not r.lists],
        "forward_failed": [r.cls for r in built if r.forward != "ok"],
        "disagreements": {r.cls: r.agreement for r in compared if r.agreement != "agree"},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="class names to survey (default: all)")
    parser.add_argument("--json", help="write the per-class records and the summary to this file")
    parser.add_argument("--timeout", type=int, default=90, help="seconds per class (default 90)")
    args = parser.parse_args(argv)

    import diffusers
    import diffusers.models.transformers as transformers

    torch.set_num_threads(2)
    classes = [getattr(transformers, n) for n in sorted(dir(transformers)) if not n.startswith("_")]
    classes = [c for c in classes if inspect.isclass(c) and issubclass(c, torch.nn.Module)]
    if args.only:
        classes = [c for c in classes if c.__name__ in args.only]
    results = []
    for cls in classes:
        result = survey_class(cls, args.timeout)
        print(f"{cls.__name__}: built={result.built} forward={result.forward[:80]} ({result.seconds}s)",
              file=sys.stderr)
        results.append(result)
    report = summary(results)
    print(f"diffusers {diffusers.__version__}, torch {torch.__version__}\n")
    print(markdown(results))
    print("\n" + json.dumps(report, indent=2))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"summary": report, "classes": [asdict(r) for r in results]},
                                              indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
