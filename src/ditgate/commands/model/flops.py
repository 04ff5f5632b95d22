"""`ditgate flops MODEL --height H --width W`: FLOPs and bytes of one transformer forward, and what follows."""

from __future__ import annotations

import argparse
import json

HELP = "FLOPs and bytes of one transformer forward (attention vs GEMM, per block) and the speedups they allow"


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="zoo:NAME, a pipeline folder, a transformer folder or a transformer config.json")
    parser.add_argument("--height", type=int, required=True, help="image/video height in pixels")
    parser.add_argument("--width", type=int, required=True, help="image/video width in pixels")
    parser.add_argument("--frames", type=int, help="video frames (video models)")
    parser.add_argument("--steps", type=int, help="denoising steps for the cache schedules (default: the zoo's, "
                                                  "else 28)")
    parser.add_argument("--text-len", type=int, help="text tokens (default: the zoo's max_sequence_length, else the "
                                                     "family's: Flux 512, Wan 512, Qwen-Image 128)")
    parser.add_argument("--calls-per-step", type=int, help="transformer calls per step (default: Flux 1, Wan 2 "
                                                           "for separate CFG, Qwen-Image 1)")
    parser.add_argument("--dtype", default="bfloat16", help="dtype of weights and activations for bytes "
                                                            "(default bfloat16)")
    parser.add_argument("--fn", type=int, default=1, help="cache: blocks always run first (Fn, default 1)")
    parser.add_argument("--bn", type=int, default=0, help="cache: blocks always run last (Bn, default 0)")
    parser.add_argument("--json", action="store_true", help="print the JSON profile (keys: README, ditgate flops)")


def _si(value: float, unit: str) -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def text(data: dict) -> str:
    fwd, size, tokens = data["forward"], data["size"], data["tokens"]
    dims = "x".join(str(size[k]) for k in ("frames", "height", "width") if size.get(k))
    lines = [
        f"{data['transformer_class']} ({data['family']}) at {dims}, {data['dtype']}: {tokens['image']} image + "
        f"{tokens['text']} text tokens, {data['heads']} heads, {_si(data['parameters'], '')}parameters "
        f"({_si(data['weight_bytes'], 'B')} of weights)",
        f"one forward: {_si(fwd['flops'], 'FLOP')}; {_si(fwd['bytes'], 'B')} moved if nothing were fused",
        f"  attention {fwd['attention_share']:6.1%}  {_si(fwd['flops_by_kind']['attention'], 'FLOP'):>12}",
        f"  GEMM      {fwd['gemm_share']:6.1%}  {_si(fwd['flops_by_kind']['gemm'], 'FLOP'):>12}",
        "per block list:",
    ]
    for name, item in data["block_lists"].items():
        per = item["flops_per_block"]
        lines.append(f"  {name:<28} {item['blocks']:>3} x {_si(sum(per.values()), 'FLOP'):>11} "
                     f"(attention {_si(per['attention'], 'FLOP')}, GEMM {_si(per['gemm'], 'FLOP')})  "
                     f"{item['share']:6.1%}")
    lines.append(f"  {'outside the blocks':<28}       {_si(sum(data['outside']['flops'].values()), 'FLOP'):>11}"
                 f"{'':>40}{data['outside']['share']:6.1%}")
    cache = data.get("cache")
    if cache:
        lines += [f"cache, {cache['steps']} steps, F{cache['Fn']}B{cache['Bn']}: a cached call still runs "
                  f"{cache['always_run_share']:.1%} of a full call",
                  "  schedule  computed  steps ratio  best transformer speedup"]
        for name, item in cache["schedules"].items():
            if "refused" in item:
                lines.append(f"  {name:<8}  {item['refused']}")
            else:
                lines.append(f"  {name:<8}  {item['computed']:>3}/{item['calls']:<4}  {item['ideal_steps']:10.2f}x"
                             f"  {item['ideal']:10.2f}x")
    par = data["parallel"]
    lines += [f"parallelism: context parallelism divides {par['cp_share']:.1%} of the FLOPs, tensor parallelism "
              f"{par['tp_share']:.1%}; bytes each rank sends per step ({data['calls_per_step']} call(s)):",
              "  ranks  best CP  best TP   Ulysses      ring         TP"]
    for n, item in par["degrees"].items():
        sent = item["bytes_per_rank_per_step"]
        refused = "; ".join(dict.fromkeys(v for v in item["refused"].values() if v))
        lines.append(f"  {n:>5}  {item['ideal_speedup']['cp']:6.2f}x  {item['ideal_speedup']['tp']:6.2f}x   "
                     f"{_si(sent['ulysses'], 'B'):>10}  {_si(sent['ring'], 'B'):>10}  {_si(sent['tp'], 'B'):>10}"
                     + (f"  ({refused})" if refused else ""))
    return "\n".join(lines) + "\n"


def main(args: argparse.Namespace) -> int:
    from ditgate.inspect.flops import profile as flops

    profile = flops.analyze(args.model, height=args.height, width=args.width, frames=args.frames,
                            text_len=args.text_len, dtype=args.dtype, calls_per_step=args.calls_per_step)
    steps = args.steps or flops.source(args.model).defaults.get("num_inference_steps") or 28
    data = profile.to_dict(steps=steps, fn=args.fn, bn=args.bn)
    print(json.dumps(data, indent=2) if args.json else text(data), end="\n" if args.json else "")
    return 0
