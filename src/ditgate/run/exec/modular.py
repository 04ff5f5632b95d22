"""Rows on a diffusers ModularPipeline: what cache-dit is given, and one generation.

cache-dit 1.5.3 accepts no ModularPipeline (`enable_cache` raises "type … is not valid"), so every row hands it a
`BlockAdapter` whose `pipe` is the modular pipeline (pipeline level). cache-dit then wraps the pipeline class's
`__call__` and resets the cache context on every call; `disable_cache` and the class snapshot take the wrapper off
again. Measured on zoo:flux loaded as FluxModularPipeline, calls of 8, 6 and 8 steps on one pipeline
(benchmarks/modular_adapter_level.py, results/modular_adapter_level.md): the pipeline level and the transformer
level (`pipe=None`) with `refresh_context` before each call give bit-identical latents and the same cached steps on
every call, with the static schedule and with a residual threshold. Without the refresh the transformer level keeps
counting steps across calls: the 6-step call caches its step 0 (no warm-up), its latents move 0.046 from the
pipeline level's (0.023 between the cached and uncached call), and `cache_dit.summary` still reports the first
call's cached steps. An adapter with `pipe=None` (transformer level) from an integration file is therefore
refreshed here before every call, with that call's step count.

The adapter is the integration file's `block_adapter(pipe)`, else cache-dit's registered adapter (looked up by the
standard twin's name, then the transformer's class: `ditgate.core.modular.registered_adapter`), called with the
modular pipeline (it reads `pipe.transformer` like any pipeline). Parallel
rows without a cache get an adapter too: cache-dit then takes the transformer from it and the text encoder / VAE
from its `pipe`.

The guider decides how many transformer calls a step makes. cache-dit counts steps from `has_separate_cfg`, so the
row records the value cache-dit used next to the calls per step it observed; the proofs compare them.
"""

from __future__ import annotations

import contextlib
from typing import Any

from ditgate.core import modular
from ditgate.core.errors import DitgateError


def is_transformer_level(adapter) -> bool:
    from cache_dit.caching.block_adapters import FakeDiffusionPipeline

    return adapter is not None and (adapter.pipe is None or isinstance(adapter.pipe, FakeDiffusionPipeline))


def block_adapter(pipe, integration, *, for_cache: bool, call: dict[str, Any] | None = None):
    """The BlockAdapter every row of a modular pipeline gives cache-dit (the request's guider arguments set first:
    the guider decides the calls per step the adapter declares)."""
    from cache_dit import BlockAdapter

    modular.configure_guider(pipe, call or {})
    if integration is not None and integration.block_adapter is not None:
        return integration.block_adapter(pipe)
    adapter, why = modular.registered_adapter(pipe)
    if adapter is not None:
        adapter.has_separate_cfg = modular.expected_calls_per_step(pipe) > 1  # the guider decides, not the name
        return adapter
    if for_cache:
        raise DitgateError(f"no block adapter for {type(pipe).__name__} ({why}): write block_adapter(pipe) in an "
                           "integration file (references/modular_pipeline.md) and pass --integration FILE")
    # parallelism only: cache-dit reads the transformer (and pipe, for the text encoder and VAE) from the adapter
    return BlockAdapter(pipe=pipe, transformer=pipe.transformer, skip_post_init=True)


@contextlib.contextmanager
def extra_modules_visible(pipe):
    """Let `enable_cache` find the text encoder and VAE of a modular pipeline (TE-P, VAE-P, quantized components).

    cache-dit resolves `extra_parallel_modules` names with `parse_extra_modules(adapter.pipe, names)`, which takes
    anything that is not a DiffusionPipeline for an adapter and reads its `.pipe`: for a ModularPipeline that is
    None, and every name was dropped without a word (measured: tp-2+tep and tp-2+vaep on FluxModularPipeline
    sharded no text-encoder weight and decoded every tile on rank 0). While cache-dit is enabled the pipeline is its
    own `.pipe`."""
    pipe.pipe = pipe
    try:
        yield
    finally:
        del pipe.pipe


def separate_cfg(adapter, cache_config) -> bool:
    """The has_separate_cfg cache-dit uses for `adapter` under `cache_config` (its own rule, cache_adapter.py)."""
    from cache_dit.caching.block_adapters.block_registers import BlockAdapterRegister

    if cache_config is not None and cache_config.enable_separate_cfg is not None:
        return bool(cache_config.enable_separate_cfg)
    return bool(BlockAdapterRegister.has_separate_cfg(adapter)
                or BlockAdapterRegister.has_separate_cfg(adapter.pipe))


def pin_separate_cfg(adapter, cache_config) -> bool:
    """Make cache-dit use the adapter's own has_separate_cfg (its registry would otherwise fall back to the pipeline
    class name, e.g. every `Wan…` pipeline counts as separate CFG whatever its guider does); returns the value and
    keeps it on the adapter for `row_facts`."""
    if cache_config.enable_separate_cfg is None:
        cache_config.enable_separate_cfg = bool(adapter.has_separate_cfg)
    adapter._ditgate_separate_cfg = separate_cfg(adapter, cache_config)
    return adapter._ditgate_separate_cfg


def row_facts(pipe, cache_target) -> dict[str, Any]:
    """What a modular row records besides the probes: the guider, and for a cache row how cache-dit counts steps."""
    facts: dict[str, Any] = {"pipeline": type(pipe).__name__, "guider": modular.guider_facts(pipe),
                             "expected_calls_per_step": modular.expected_calls_per_step(pipe)}
    if cache_target is not None:
        facts["adapter_level"] = "transformer" if is_transformer_level(cache_target) else "pipeline"
        facts["separate_cfg"] = getattr(cache_target, "_ditgate_separate_cfg", None)
    return facts


def keep_forward_signatures(pipe) -> list[str]:
    """Give every wrapped transformer `forward` its model's signature back; returns the components fixed.

    cache-dit's cache and parallelism hooks replace `transformer.forward` with `(*args, **kwargs)` wrappers. Several
    modular denoisers (FLUX.3, LTX-2, Qwen-Image, Wan-Animate 2, Cosmos, Helios) pick the keyword arguments to pass
    by reading `inspect.signature(transformer.forward)`; through the wrapper they pass none of them, and the call
    fails (`forward() missing … 'img_ids'`). The wrapper's own behaviour is unchanged; only its signature is set.
    """
    import inspect

    from ditgate.core.components import transformers_of

    fixed = []
    for name, transformer in transformers_of(pipe).items():
        wanted = inspect.signature(type(transformer).forward.__get__(transformer))
        current = transformer.forward
        if inspect.signature(current) == wanted:
            continue
        holder = getattr(current, "__func__", current)  # a bound method takes attributes on its function
        if holder is type(transformer).forward:
            continue
        holder.__signature__ = wanted if holder is current else inspect.signature(type(transformer).forward)
        fixed.append(name)
    return fixed


def generate(pipe, request, probes, target=None):
    """One call of the modular pipeline, refreshing a transformer-level cache first. The latents are the denoise
    loop's last scheduler step, seen by the probes as for any pipeline (a family that unpacks its latents after the
    loop, e.g. FLUX.1's (1, 1024, 16) tokens into (1, 4, 64, 64), keeps the unpacked ones in its state); the output
    goes to `ditgate.run.exec.outputs` under its state name, which tells its modality where that name is a known one."""
    import cache_dit
    import torch

    from ditgate.core.request import input_image
    from ditgate.run.exec.outputs import FIELDS

    if target is not None and is_transformer_level(target) and request.steps:
        for transformer in _as_list(target.transformer):
            cache_dit.refresh_context(transformer, num_inference_steps=request.steps)
    generator = torch.Generator("cpu").manual_seed(request.seed)
    image = input_image(request)
    result = modular.call(pipe, request.call, generator, None if image is None else {request.image_key: image})
    return {result.name: result.output} if result.name in dict(FIELDS) else result.output


def _as_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]
