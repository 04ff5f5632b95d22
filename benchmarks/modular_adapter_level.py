"""Which BlockAdapter level cache-dit handles correctly on a diffusers ModularPipeline, over calls of changing length.

    OMP_NUM_THREADS=1 python benchmarks/modular_adapter_level.py [--model zoo:flux] [--steps 8,6,8] [--out DIR]

The model (zoo:flux by default) is loaded as `FluxModularPipeline` (`--pipeline diffusers:FluxModularPipeline`) and
called once per entry of `--steps` with the same seeded request, under four set-ups, each on its own copy:

- `uncached`: no cache; the reference of each call's latents;
- `pipeline`: cache-dit's registered adapter for the transformer, built on the modular pipeline (`pipe=pipe`,
  what ditgate's rows give cache-dit): cache-dit wraps the pipeline class's `__call__` and resets the cache context
  on every call;
- `transformer+refresh`: the same blocks with `pipe=None` (transformer level: one persistent context), and
  `cache_dit.refresh_context(transformer, num_inference_steps=N)` before every call, as ditgate's rows do;
- `transformer`: the same without the refresh.

Two cache configurations: `static` (the cache row's DBCache F1B0 with its alternate schedule, a mask of the first
call's length) and `dynamic` (DBCache F1B0 by residual threshold, no schedule). Per call: the steps cache-dit
cached as `cache_dit.summary` reports them and as observed (the transformer calls in which the last block did not
run, counted from 0 in each call), and the largest difference of the final latents (the scheduler's last step, as
every row reads them) from the `pipeline` set-up's and from the uncached call's.

Prints the table and writes DIR/modular_adapter_level.md (default benchmarks/results/).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PIPELINE = "diffusers:FluxModularPipeline"
LEVELS = ("uncached", "pipeline", "transformer+refresh", "transformer")
CONFIGS = {
    "static": "the cache row's DBCache (F1B0, 2 warm-up steps, alternate schedule for the first call's steps)",
    "dynamic": "DBCache F1B0, 2 warm-up steps, residual threshold 0.6, no schedule",
}


def cache_config(name: str, steps: int):
    from ditgate.run.define.configs import cache_config as row_cache_config
    from ditgate.run.define.rows import DEFAULT_CACHE, Row

    fields = dict(DEFAULT_CACHE)
    if name == "dynamic":
        fields.pop("mask")
        fields["residual_diff_threshold"] = 0.6
    return row_cache_config(Row("cache", "cache", cache=fields), steps)[0]


def enable(pipe, level: str, config):
    """Enable the cache at `level`; returns (what cache_dit.summary reads, the transformer)."""
    import cache_dit

    from ditgate.core import modular
    from ditgate.run.exec import modular as modular_rows

    if level == "pipeline":  # what ditgate's rows give cache-dit
        adapter = modular_rows.block_adapter(pipe, None, for_cache=True)
    else:  # cache-dit's registered adapter for the same transformer, with pipe=None
        adapter, why = modular.registered_adapter(pipe, skip_post_init=True)
        if adapter is None:
            raise SystemExit(f"no registered cache-dit adapter: {why}")
        adapter.pipe, adapter.skip_post_init = None, False
        adapter.__post_init__()  # cache-dit's own set-up: a FakeDiffusionPipeline, the patch functor, the checks
    modular_rows.pin_separate_cfg(adapter, config)
    cache_dit.enable_cache(adapter, cache_config=config)
    modular_rows.keep_forward_signatures(pipe)
    return adapter, pipe.transformer


def one_call(pipe, req, steps: int):
    """(final latents, the steps whose transformer call skipped the last block: what was cached, observed)."""
    import torch

    from ditgate.core import modular
    from ditgate.core.steps import SchedulerSteps

    transformer, ran = pipe.transformer, []
    last_block = transformer.single_transformer_blocks[-1]
    handles = [transformer.register_forward_pre_hook(lambda *a: ran.append(False)),
               last_block.register_forward_hook(lambda *a: ran.__setitem__(-1, True))]
    try:
        with SchedulerSteps(pipe) as seen:
            modular.call(pipe, {**req.call, "num_inference_steps": steps}, torch.Generator("cpu").manual_seed(req.seed))
    finally:
        for handle in handles:
            handle.remove()
    return seen.last_sample, [i for i, computed in enumerate(ran) if not computed]


def cached_steps(target) -> list[int]:
    import cache_dit

    stats = cache_dit.summary(target, logging=False)
    return sorted({int(s) for stat in stats for s in stat.cached_steps})


def run_level(pristine, level: str, config_name: str, steps_list: list[int], req) -> list[dict]:
    import cache_dit

    pipe = copy.deepcopy(pristine)
    target = transformer = None
    if level != "uncached":
        target, transformer = enable(pipe, level, cache_config(config_name, steps_list[0]))
    out = []
    try:
        for steps in steps_list:
            if level == "transformer+refresh":
                cache_dit.refresh_context(transformer, num_inference_steps=steps)
            start = time.perf_counter()
            latents, skipped = one_call(pipe, req, steps)
            record = {"steps": steps, "latents": latents, "skipped": skipped, "wall_s": time.perf_counter() - start}
            if target is not None:
                record["cached"] = cached_steps(transformer if level != "pipeline" else target)
            out.append(record)
    finally:
        if target is not None:
            cache_dit.disable_cache(target)
    return out


def measure(model: str, steps_list: list[int]) -> dict:
    from ditgate.core import request
    from ditgate.core.model import Model
    from ditgate.core.loader import load

    req = Model.open(model, pipeline=PIPELINE).request
    pristine = load(model, pipeline=PIPELINE)
    results = {}
    for config_name in CONFIGS:
        runs = {level: run_level(pristine, level, config_name, steps_list, req) for level in LEVELS}
        for level in LEVELS:
            for i, record in enumerate(runs[level]):
                record["vs_pipeline"] = _max_diff(record["latents"], runs["pipeline"][i]["latents"])
                record["vs_uncached"] = _max_diff(record["latents"], runs["uncached"][i]["latents"])
        results[config_name] = runs
    return {"model": model, "pipeline": type(pristine).__name__, "steps": steps_list, "results": results}


def _max_diff(a, b) -> float:
    return float((a - b).abs().max())


def table(measured: dict) -> list[str]:
    header = ("| config | level | call | steps | cached (cache-dit's summary) | cached (observed) | "
              "max abs diff vs pipeline | max abs diff vs uncached |")
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    for config_name, runs in measured["results"].items():
        for level in LEVELS:
            for i, r in enumerate(runs[level]):
                cached = "–" if "cached" not in r else (",".join(map(str, r["cached"])) or "none")
                seen = ",".join(map(str, r["skipped"])) or "none"
                lines.append(f"| {config_name} | {level} | {i + 1} | {r['steps']} | {cached} | {seen} | "
                             f"{r['vs_pipeline']:.3g} | {r['vs_uncached']:.3g} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="zoo:flux")
    parser.add_argument("--steps", default="8,6,8", help="step count of each call, comma-separated")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    steps_list = [int(s) for s in args.steps.split(",")]
    import cache_dit
    import diffusers
    import torch

    start = time.perf_counter()
    measured = measure(args.model, steps_list)
    wall = time.perf_counter() - start
    rows = table(measured)
    lines = [f"# cache-dit's adapter level on a modular pipeline ({measured['pipeline']})", "",
             (f"Command: `OMP_NUM_THREADS=1 python benchmarks/modular_adapter_level.py --model {args.model} "
              f"--steps {args.steps}`; wall time {wall:.0f} s (CPU, torch {torch.__version__}, diffusers "
              f"{diffusers.__version__}, cache-dit {cache_dit.__version__})."), "",
             "Configurations: " + "; ".join(f"`{k}`: {v}" for k, v in CONFIGS.items()) + ".",
             "Levels: see the module docstring of benchmarks/modular_adapter_level.py. Steps are counted from 0.", "",
             *rows, ""]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "modular_adapter_level.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
