"""Where a static cache schedule's speedup goes: measured against its ideal (total steps / computed steps).

Runs one model uncached and with a static DBCache schedule (cache-dit's `steps_mask` policy), times every block,
the transformer calls and the whole pipeline call with forward hooks (on CPU every op is synchronous, so hooks are
exact), and splits the gap between the ideal and the measured speedup into:

- time outside the transformer (text encoders, VAE decode, scheduler): caching cannot shorten it;
- work a cached call still does: everything outside the blocks plus the Fn first and Bn last blocks;
- cache-dit's own bookkeeping: what remains of a cached call's time after the blocks and the outside-block work.

    OMP_NUM_THREADS=1 python benchmarks/cache_overhead.py zoo:flux --steps 28 --mask medium --repeats 5 --json out.json

The clock is the CPU time of the calling thread by default (`--clock thread`): with one torch thread all the work runs
on it, and a machine shared with other jobs stretches wall-clock time but not this one. `--clock wall` measures
latency instead.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import contextmanager


CLOCKS = {"thread": time.thread_time, "wall": time.perf_counter}


@contextmanager
def timers(pipe, clock):
    """Per-call seconds of the transformer and of all its blocks together."""
    from ditgate.run.exec.probes import block_lists, transformers_of

    spans = {"transformer": [], "blocks": []}
    start: dict[str, float] = {}
    handles = []

    def enter(key):
        return lambda *a, **k: start.__setitem__(key, clock())

    def leave(key):
        def hook(*a, **k):
            spans[key].append(clock() - start[key])
        return hook

    for transformer in transformers_of(pipe).values():
        handles += [transformer.register_forward_pre_hook(enter("transformer")),
                    transformer.register_forward_hook(leave("transformer"))]
        for blocks in block_lists(transformer).values():
            for block in blocks:
                handles += [block.register_forward_pre_hook(enter("blocks")),
                            block.register_forward_hook(leave("blocks"))]
    try:
        yield spans
    finally:
        for handle in handles:
            handle.remove()


def measure(model: str, cache: dict | None, steps: int, repeats: int, size: int, clock) -> dict:
    import cache_dit
    import torch

    from ditgate import load, zoo
    from ditgate.core import request
    from ditgate.run.define.configs import cache_config
    from ditgate.core.loader import resolve
    from ditgate.run.define.rows import Row

    path = resolve(model)
    req = request.build(zoo.read_meta(path), steps=steps, height=size, width=size)
    pipe = load(path)
    if cache:
        config, _ = cache_config(Row("c", "cache", cache=cache), steps)
        cache_dit.enable_cache(pipe, cache_config=config)
    runs = []
    for i in range(repeats + 1):
        with timers(pipe, clock) as spans, torch.no_grad():
            begin = clock()
            pipe(**req.call, generator=torch.Generator("cpu").manual_seed(0), output_type="np")
            total = clock() - begin
        if i:  # the first call warms up
            runs.append({"total": total, "transformer": sum(spans["transformer"]), "blocks": sum(spans["blocks"]),
                         "calls": len(spans["transformer"]), "block_calls": len(spans["blocks"])})
    cached = len(cache_dit.summary(pipe, logging=False)[0].cached_steps) if cache else 0
    if cache:
        cache_dit.disable_cache(pipe)
    median = {k: statistics.median(r[k] for r in runs) for k in ("total", "transformer", "blocks")}
    return median | {"calls": runs[0]["calls"], "block_calls": runs[0]["block_calls"], "cached_calls": cached,
                     "totals": [r["total"] for r in runs]}


def analyse(base: dict, cached: dict, fn: int, blocks_per_call: int) -> dict:
    calls, k = base["calls"], cached["cached_calls"]
    computed = calls - k
    per_call = base["transformer"] / calls  # one full transformer call
    per_block = base["blocks"] / base["block_calls"]
    outside_blocks = per_call - per_block * blocks_per_call  # embeddings, norm_out, proj_out per call
    cached_call_work = outside_blocks + fn * per_block  # what a cached call cannot skip
    expected_transformer = computed * per_call + k * cached_call_work
    rest = base["total"] - base["transformer"]  # text encoders, VAE decode, scheduler
    ideal = calls / computed
    with_always_run = base["transformer"] / expected_transformer
    amdahl = base["total"] / (rest + expected_transformer)
    measured = base["total"] / cached["total"]
    bookkeeping = cached["transformer"] - expected_transformer
    return {
        "ideal_steps": ideal, "ideal_with_always_run": with_always_run, "expected_end_to_end": amdahl,
        "measured": measured, "measured_over_ideal": measured / ideal,
        "transformer_measured": base["transformer"] / cached["transformer"],
        "share_outside_transformer": rest / base["total"],
        "cached_call_work_share": cached_call_work / per_call,
        "bookkeeping_s": bookkeeping, "bookkeeping_per_cached_call_ms": 1000 * bookkeeping / max(k, 1),
        "bookkeeping_share_of_cached_latency": bookkeeping / cached["total"],
        "outside_transformer_s": rest, "cached_rest_s": cached["total"] - cached["transformer"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="zoo:flux")
    parser.add_argument("--steps", type=int, default=28)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--mask", default="medium", help="cache-dit steps_mask policy (slow, medium, fast, ultra)")
    parser.add_argument("--fn", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="thread")
    parser.add_argument("--json", help="write the numbers to this file")
    args = parser.parse_args()
    import torch

    from ditgate.core.loader import resolve
    from ditgate.run.exec.probes import block_lists, transformers_of

    clock = CLOCKS[args.clock]
    base = measure(args.model, None, args.steps, args.repeats, args.size, clock)
    cache = {"Fn_compute_blocks": args.fn, "Bn_compute_blocks": 0, "mask": args.mask}
    cached = measure(args.model, cache, args.steps, args.repeats, args.size, clock)
    from ditgate import load

    blocks = sum(len(b) for t in transformers_of(load(resolve(args.model))).values() for b in block_lists(t).values())
    result = {"model": args.model, "steps": args.steps, "size": args.size, "cache": cache, "repeats": args.repeats,
              "clock": args.clock,
              "threads": torch.get_num_threads(), "baseline": base, "cached": cached,
              "analysis": analyse(base, cached, args.fn, blocks)}
    text = json.dumps(result, indent=2)
    if args.json:
        with open(args.json, "w") as handle:
            handle.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
