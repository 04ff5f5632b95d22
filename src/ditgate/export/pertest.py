"""MODEL in cache-dit: caching and context/tensor parallelism checked on the model's twin.

This file is the template `ditgate export` renders into cache-dit's tests/ (the header and the constants block are
replaced; nothing below `# -- body --` is). It imports torch, diffusers, transformers and cache_dit only.
"""

# -- imports --
import importlib
import inspect
import json
import math
import multiprocessing
import os
import socket
import sys
import traceback
import zlib
from pathlib import Path

import pytest
import torch

# -- constants --
HERE = Path(__file__).resolve().parent
TWIN = HERE / "model_twin"  # the twin's config folder (configs, scheduler, tokenizer; no weights)
CALL = {"prompt": "a tiny red cube", "num_inference_steps": 4}  # the pipeline call
SEED = 0
TENSOR_RULE = 1e-4  # max |candidate - baseline| <= TENSOR_RULE x max |baseline| over the final latents
CACHE = {"Fn_compute_blocks": 1, "Bn_compute_blocks": 0, "max_warmup_steps": 2}
PARALLEL = {"ulysses-2": {"ulysses_size": 2}, "ring-2": {"ring_size": 2}, "tp-2": {"tp_size": 2}}
CACHED = True  # the model registers a BlockAdapter
# -- body --
STEPS = int(CALL["num_inference_steps"])
MODULAR = (TWIN / "modular_model_index.json").is_file()  # a diffusers ModularPipeline
# the static schedule: the warm-up steps, then every other step, always the last one
MASK = [1 if i < 2 or (i - 2) % 2 == 1 or i == STEPS - 1 else 0 for i in range(STEPS)]


def _seed(name: str) -> int:
    return (SEED * 1_000_003 + zlib.crc32(name.encode())) % (2**31)


def _redraw_zeros(model, seed: int) -> None:
    """Draw again what the model initialises to zero on purpose (adaLN-zero gates, a zero output layer): a twin
    whose blocks add nothing or whose output is constant could hide any fault."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            own = dict(module.named_parameters(recurse=False))
            weight = own.get("weight")
            weight_zero = weight is not None and weight.dim() >= 2 and weight.numel() > 0 and not weight.any()
            for name, param in own.items():
                if param.numel() == 0 or param.any():
                    continue
                if param.dim() >= 2 or (name == "bias" and weight_zero) or name not in ("bias", "weight"):
                    fan_in = param[0].numel() if param.dim() >= 2 else param.numel()
                    noise = torch.rand(param.shape, generator=generator) * 2 - 1
                    param.copy_(noise / math.sqrt(max(fan_in, 1)))


def _class(spec):
    module, name = spec if isinstance(spec, list) else ("diffusers", spec)
    return getattr(importlib.import_module(module), name)


def build_pipeline():
    """The twin: every component built from its config with seeded float32 weights (no weight file is read)."""
    import diffusers
    import transformers

    code = TWIN / "code"  # the model's own package, for a model outside diffusers
    if code.is_dir() and str(code) not in sys.path:
        sys.path.insert(0, str(code))
    index = json.loads((TWIN / ("modular_model_index.json" if MODULAR else "model_index.json")).read_text())
    parts = {}
    for name, spec in index.items():
        if name.startswith("_") or not isinstance(spec, list):
            continue
        if MODULAR and len(spec) > 2 and isinstance(spec[2], dict) and spec[2].get("type_hint"):
            spec = list(spec[2]["type_hint"])
        if spec[0] is None or spec[1] is None:
            parts[name] = None
            continue
        cls, folder = _class(spec), TWIN / name
        if issubclass(cls, diffusers.ModelMixin):
            torch.manual_seed(_seed(name))
            model = cls.from_config(cls.load_config(folder))
            if not (name.startswith("vae") or cls.__name__.startswith("Autoencoder")):
                _redraw_zeros(model, _seed(name) + 1)
        elif issubclass(cls, transformers.PreTrainedModel):
            torch.manual_seed(_seed(name))
            model = cls._from_config(cls.config_class.from_pretrained(folder), dtype=torch.float32)
        else:  # scheduler, tokenizer, processor: files
            parts[name] = cls.from_pretrained(folder)
            continue
        parts[name] = model.to(torch.float32).eval()
    if MODULAR:  # its blocks from the index, then the components built here
        pipe = diffusers.ModularPipeline.from_pretrained(str(TWIN))
        pipe.update_components(**{k: v for k, v in parts.items() if v is not None})
    else:
        pipe = _class(index["_class_name"])(**parts)
    if hasattr(pipe, "set_progress_bar_config"):
        pipe.set_progress_bar_config(disable=True)
    return pipe


def _modular_call(pipe):
    """A modular pipeline's call: the arguments its blocks take; the others its guider keeps (guidance_scale)."""
    inputs = set(pipe.blocks.input_names)
    guider = getattr(pipe, "guider", None)
    for key, value in CALL.items():
        if key not in inputs and guider is not None and hasattr(guider, key):
            setattr(guider, key, value)
    return {k: v for k, v in CALL.items() if k in inputs}


def generate(pipe) -> torch.Tensor:
    """The final latents of the call (from the step callback, else the latent output; a modular pipeline's state)."""
    if MODULAR:
        with torch.no_grad():
            state = pipe(**_modular_call(pipe), generator=torch.Generator("cpu").manual_seed(SEED))
        return state.get("latents")
    kwargs = dict(CALL)
    params = inspect.signature(type(pipe).__call__).parameters
    seen = {}

    def grab(_pipe, _step, _timestep, tensors):
        seen["latents"] = tensors["latents"].detach().clone()
        return tensors

    if "callback_on_step_end" in params:
        kwargs["callback_on_step_end"] = grab
        if "callback_on_step_end_tensor_inputs" in params:
            kwargs["callback_on_step_end_tensor_inputs"] = ["latents"]
    elif "output_type" in params:
        kwargs["output_type"] = "latent"
    with torch.no_grad():
        out = pipe(**kwargs, generator=torch.Generator("cpu").manual_seed(SEED))
    if "latents" in seen:
        return seen["latents"]
    first = out[0] if isinstance(out, tuple) else next(iter(out.values()))
    return first if isinstance(first, torch.Tensor) else torch.as_tensor(first)


def assert_tensor_rule(candidate: torch.Tensor, baseline: torch.Tensor, what: str) -> float:
    scale = float(baseline.abs().max())
    error = float((candidate.float() - baseline.float()).abs().max())
    assert error <= TENSOR_RULE * scale, (f"{what}: final latents differ from the baseline by max-abs {error:.3g}, "
                                          f"allowed {TENSOR_RULE * scale:.3g} ({TENSOR_RULE:g} x {scale:.3g})")
    return error


@pytest.fixture(scope="module")
def baseline():
    return generate(build_pipeline())


def _cache_config(mask):
    import cache_dit

    return cache_dit.DBCacheConfig(**CACHE, num_inference_steps=STEPS, steps_computation_mask=mask,
                                   steps_computation_policy="static")


def _cached(pipe, mask):
    """Enable the cache through the registered adapter; the object cache-dit was given. cache-dit's
    enable_cache(pipe) refuses a ModularPipeline (and get_adapter asserts an nn.Module), so for one the adapter
    function registered under the class name's prefix is called directly, with has_separate_cfg as many transformer
    calls per step as its guider makes."""
    import cache_dit

    assert cache_dit.BlockAdapterRegister.is_supported(pipe), "the pipeline has no registered BlockAdapter"
    target = pipe
    if MODULAR:
        names = (type(pipe).__name__.removesuffix("ModularPipeline"), type(pipe.transformer).__name__)
        build = next(f for n in names for p, f in cache_dit.BlockAdapterRegister._adapters.items() if n.startswith(p))
        target = build(pipe)
        target.has_separate_cfg = _calls_per_step(pipe) > 1
    cache_dit.enable_cache(target, cache_config=_cache_config(mask))
    _keep_signature(pipe)
    return target


def _keep_signature(pipe) -> None:
    """cache-dit's hooks wrap `transformer.forward` as `(*args, **kwargs)`; a modular denoiser picks the keyword
    arguments it passes from `inspect.signature(transformer.forward)` and would pass none. Give the wrapper the
    model's signature back (its behaviour is unchanged)."""
    if not MODULAR:
        return
    transformer = pipe.transformer
    wanted = inspect.signature(type(transformer).forward.__get__(transformer))
    current = transformer.forward
    holder = getattr(current, "__func__", current)
    if inspect.signature(current) != wanted and holder is not type(transformer).forward:
        holder.__signature__ = wanted if holder is current else inspect.signature(type(transformer).forward)


def _calls_per_step(pipe) -> float:
    calls = []
    handle = pipe.transformer.register_forward_pre_hook(lambda *args: calls.append(1))
    try:
        generate(pipe)
    finally:
        handle.remove()
    return len(calls) / STEPS


@pytest.mark.skipif(not CACHED, reason="no BlockAdapter was exported")
def test_caching_off_matches_the_baseline(baseline):
    """The registered BlockAdapter and its patch functors, every step computed: the model is unchanged."""
    pipe = build_pipeline()
    _cached(pipe, [1] * STEPS)
    assert_tensor_rule(generate(pipe), baseline, "caching off")


@pytest.mark.skipif(not CACHED, reason="no BlockAdapter was exported")
def test_cache_reports_cached_steps(baseline):
    import cache_dit

    pipe = build_pipeline()
    target = _cached(pipe, MASK)
    latents = generate(pipe)
    cached = sorted({int(step) for s in cache_dit.summary(target, logging=False) for step in s.cached_steps})
    assert cached, "cache-dit reports no cached step"
    assert torch.isfinite(latents).all()


# -- parallel rows: two ranks forked from this process, gloo on the CPU --
def _cpu_patches() -> None:
    """What cache-dit 1.5.3 lacks on a CPU: a CPU kernel for the flash-attention op ring attention asks for (its
    log-sum-exp), a CPU device mesh for TP (`torch.accelerator.current_accelerator()` is None without an
    accelerator), and its PyTorch merge of ring steps instead of a GPU kernel."""
    def flash_for_cpu(q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal,
                                                                              scale=scale)
        empty = q.new_empty(0)
        return out, lse, empty, empty, 0, 0, empty, empty, empty

    library = torch.library.Library("aten", "IMPL")
    library.impl("_scaled_dot_product_flash_attention", flash_for_cpu, "CPU")
    _cpu_patches.library = library
    torch.accelerator.current_accelerator = lambda check_available=False: torch.device("cpu")
    importlib.import_module("cache_dit.distributed.core._templated_ring").fused_merge_attn_states = None


def _rank(rank: int, world: int, port: int, parallel: dict, out: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), CUDA_VISIBLE_DEVICES="")
    torch.set_num_threads(1)  # a rank forked after this process's thread pool ran must not start its own
    try:
        import cache_dit
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor

        dist.init_process_group("gloo")
        _cpu_patches()
        pipe = build_pipeline()
        # a ModularPipeline goes to cache-dit as a BlockAdapter (enable_cache refuses the pipeline itself)
        target = cache_dit.BlockAdapter(pipe=pipe, transformer=pipe.transformer, skip_post_init=True) \
            if MODULAR else pipe
        cache_dit.enable_cache(target, parallelism_config=cache_dit.ParallelismConfig(**parallel))
        _keep_signature(pipe)
        acted = {"cp_plan": bool(getattr(pipe.transformer, "_cp_plan", None)),
                 "sharded": sum(isinstance(p, DTensor) for p in pipe.transformer.parameters())}
        latents = generate(pipe)
        dist.barrier()
        if rank == 0:
            torch.save({"latents": latents, "acted": acted}, out)
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - the parent reports it
        Path(f"{out}.rank{rank}.error").write_text(traceback.format_exc())
        os._exit(1)
    os._exit(0)


def run_ranks(parallel: dict, tmp_path: Path, world: int = 2, timeout: float = 600.0) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path / "rank0.pt")
    context = multiprocessing.get_context("fork")
    ranks = [context.Process(target=_rank, args=(r, world, port, parallel, out)) for r in range(world)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(timeout)
    for p in ranks:
        if p.is_alive():
            p.kill()
    errors = [Path(f"{out}.rank{r}.error") for r in range(world)]
    failed = [f"rank {r}:\n{e.read_text()}" for r, e in enumerate(errors) if e.exists()]
    assert not failed and all(p.exitcode == 0 for p in ranks), "\n".join(failed) or \
        f"ranks exited with {[p.exitcode for p in ranks]}"
    return torch.load(out)


@pytest.mark.parametrize("row", sorted(PARALLEL))
def test_parallel_row_matches_the_baseline(row, baseline, tmp_path):
    parallel = PARALLEL[row]
    found = run_ranks(parallel, tmp_path)
    if parallel.get("tp_size", 1) > 1:
        assert found["acted"]["sharded"] > 0, "TP sharded no weight of the transformer"
    if parallel.get("ulysses_size", 1) > 1 or parallel.get("ring_size", 1) > 1:
        assert found["acted"]["cp_plan"], "no context-parallel plan was applied to the transformer"
    assert_tensor_rule(found["latents"], baseline, row)
