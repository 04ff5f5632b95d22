"""Run one row in this process (one rank of it in a worker group): copy, apply the row, generate, record.

A row runs on its own copy of the pipeline, made from the process's pristine pipeline (`ditgate.run.exec.isolation.
Pristine`, loaded once): cache-dit's hooks and tensor-parallel weights cannot be taken off again reliably, and a
copy that is thrown away after the row keeps rows independent without reading the weights from disk again. Without
a pristine pipeline (`--launch per-row`) the row loads its own from disk.

Order of features, as cache-dit wants it: cache, then parallelism, then quantization (one `enable_cache` call),
then torch.compile of the transformer(s) with cache-dit's recommended compiler settings. The warm-up calls absorb
compilation; the compiler settings are put back when the row ends.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ditgate.run.exec import audio
from ditgate.run.exec import compat
from ditgate.run.exec import modular as modular_rows
from ditgate.core import modular
from ditgate.core import request as request_mod
from ditgate.gates.calibration import OutputNoise
from ditgate.core.errors import DitgateError
from ditgate.run.exec.isolation import ClassSnapshot, Pristine
from ditgate.core import plugin
from ditgate.core.plugin import Integration
from ditgate.core.components import transformers_of
from ditgate.run.exec.probes import Probes, compiled_modules, quantized_weights, sharded_weights
from ditgate.core.model import Model
from ditgate.core.request import Request
from ditgate.run.exec.outputs import decoded, further
from ditgate.run.define.configs import cache_config, parallelism_config, quantize_config
from ditgate.run.define.rows import CACHE_OFF_SUFFIX, Row
from ditgate.run.exec.probes import ResidualChange


WAV_FILE = "output.wav"  # audio rows: the waveform as 16-bit PCM, next to output.npy


@dataclass
class Outcome:
    """What one row produced on this rank."""

    output: np.ndarray  # decoded image (H,W,C), video (F,H,W,C) or audio (C,S); float32
    modality: str
    latents: np.ndarray | None
    noise: np.ndarray | None
    times: list[float]
    peak_memory: dict[str, Any]
    facts: dict[str, Any] = field(default_factory=dict)
    sample_rate: int | None = None  # audio: samples per second of `output` (the VAE's sampling rate)
    overhead: dict[str, float] = field(default_factory=dict)  # seconds outside the pipeline calls (see run_row)
    first_step: np.ndarray | None = None  # the transformer's output at its first call (ditgate.gates.first_step)
    warmup: int = 0  # untimed calls made before the timed ones
    further: dict[str, dict[str, Any]] = field(default_factory=dict)  # outputs beside `output` (outputs.further)


def compile_transformers(pipe, options: dict[str, Any]) -> None:
    """torch.compile every transformer of `pipe` in place: its repeated blocks (regional, as cache-dit's CLI does by
    default) when the model names them, else the whole module."""
    from cache_dit.compile import set_compile_configs

    set_compile_configs()
    kwargs = {k: v for k, v in options.items() if k != "regional"}
    for module in transformers_of(pipe).values():
        if options.get("regional", True) and getattr(module, "_repeated_blocks", None):
            module.compile_repeated_blocks(**kwargs)
        else:
            module.compile(**kwargs)


@contextlib.contextmanager
def _compiler_settings(active: bool):
    """Put torch's dynamo and inductor settings back after a compiled row (cache-dit's helper changes them)."""
    if not active:
        yield
        return
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config

    saved = (dynamo_config.save_config(), inductor_config.save_config())
    try:
        yield
    finally:
        dynamo_config.load_config(saved[0])
        inductor_config.load_config(saved[1])


def apply(row: Row, pipe, integration: Integration | None, request: Request):
    """Apply the row's features to `pipe` in place; returns the object cache-dit was given (for summary/disable)."""
    import cache_dit

    if row.vae_tiling or (row.parallel or {}).get("vae"):
        # VAE parallelism decodes tiles on several ranks and calls enable_tiling() itself, which keeps tile sizes
        # set here: the tiled baseline and the VAE-parallel row then cut the same tiles.
        pipe.vae.enable_tiling(**request.vae_tiling)
    target = None
    if row.parallel or row.quantize:
        compat.skip_settle_sleeps()  # cache-dit sleeps two seconds after parallelizing or quantizing
    if row.cache or row.parallel or row.quantize:
        target = pipe
        cc, calibrator = cache_config(row, request.steps) if row.cache else (None, None)
        if modular.is_modular_class(type(pipe)):  # cache-dit takes a BlockAdapter, never the modular pipeline
            target = modular_rows.block_adapter(pipe, integration, for_cache=bool(row.cache), call=request.call)
            if cc is not None:
                modular_rows.pin_separate_cfg(target, cc)
        elif integration is not None and integration.block_adapter is not None:
            target = integration.block_adapter(pipe)
        pc = parallelism_config(row) if row.parallel else None
        qc = quantize_config(row) if row.quantize else None
        if modular.is_modular_class(type(pipe)):
            with modular_rows.extra_modules_visible(pipe):
                cache_dit.enable_cache(target, cache_config=cc, calibrator_config=calibrator, parallelism_config=pc,
                                       quantize_config=qc)
            modular_rows.keep_forward_signatures(pipe)
        else:
            cache_dit.enable_cache(target, cache_config=cc, calibrator_config=calibrator, parallelism_config=pc,
                                   quantize_config=qc)
    if row.compile:
        compile_transformers(pipe, row.compile_options)
    return target


def _device_for_rank(device: str, local_rank: int) -> str:
    if device.startswith("cuda") and ":" not in device:
        return f"cuda:{local_rank}"
    return device


def _peak_memory(device: str, resident: int = 0) -> dict[str, Any]:
    if device.startswith("cuda"):  # `resident`: the pristine copy this process keeps on the GPU, not the row's
        return {"kind": "cuda-max-allocated", "bytes": int(torch.cuda.max_memory_allocated(device)) - resident}
    # ru_maxrss is in KiB on Linux: the peak resident set of this process since it started
    return {"kind": "cpu-process-peak-rss", "bytes": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024}


def generate(pipe, request: Request, probes: Probes, target=None):
    if modular.is_modular_class(type(pipe)):
        return modular_rows.generate(pipe, request, probes, target)
    kwargs = request_mod.call_kwargs(pipe, request)
    params = inspect.signature(type(pipe).__call__).parameters
    if "callback_on_step_end" in params:
        kwargs["callback_on_step_end"] = probes.step_callback
        if "callback_on_step_end_tensor_inputs" in params:
            kwargs["callback_on_step_end_tensor_inputs"] = ["latents"]
    elif "callback" in params:  # the older per-step callback(step, timestep, latents)
        kwargs["callback"] = probes.legacy_callback
        if "callback_steps" in params:
            kwargs["callback_steps"] = 1
    if "output_type" in params:
        kwargs["output_type"] = "np"
    generator = torch.Generator("cpu").manual_seed(request.seed)
    # no_grad, not inference_mode: under inference_mode DTensor (TP) resolves aten.linear's sharding through its
    # uncached decomposition path on every call, 7x slower on zoo:flux tp-2 (see references/tp.md)
    with torch.no_grad():
        return pipe(**kwargs, generator=generator)


def run_row(row: Row, model: Model, *, integration: Integration | None = None, warmup: int = 0, repeats: int = 1,
            local_rank: int = 0, on_stage=None, pristine: Pristine | None = None) -> Outcome:
    """Copy the pristine pipeline (or load the model when there is none), apply `row`, generate `warmup + repeats`
    times; the last call's outputs are kept. `Outcome.overhead` says where the row's time outside the pipeline
    calls went: `load_s` (from disk), `restore_s` (the copy of the pristine pipeline), `setup_s` (applying the row,
    taking it off again); `generate_s` is the sum of every call, warm-up included."""
    with _compiler_settings(bool(row.compile)):
        return _run_row(row, model, device=_device_for_rank(model.device, local_rank), integration=integration,
                        warmup=warmup, repeats=repeats, stage=on_stage or (lambda name: None), pristine=pristine)


def load_pristine(model: Model, *, local_rank: int = 0) -> Pristine:
    """The pipeline of a run, loaded once in this process, for every row that runs here (see isolation.Pristine)."""
    from ditgate.core import loader, warm

    device = _device_for_rank(model.device, local_rank)
    # what it is loaded from, taken before the load: a process that runs commands one after another keeps it for the
    # next (ditgate.core.warm.give_back); a folder changed since is read again
    load_key = None if model.trust_remote_code else warm.key(model.path, loader.torch_dtype(model.dtype),
                                                             model.pipeline)
    start = time.perf_counter()
    pipe = model.load(device)
    return Pristine(pipe, device, load_s=time.perf_counter() - start, load_key=load_key)


def _run_row(row: Row, model: Model, *, device: str, integration: Integration | None, warmup: int, repeats: int,
             stage, pristine: Pristine | None) -> Outcome:
    began = time.perf_counter()
    overhead = {"load_s": 0.0, "restore_s": 0.0}
    request = row.request_for(model.request)
    if pristine is None:
        stage("load")
        pipe = model.load(device)
        overhead["load_s"] = time.perf_counter() - began
    else:
        stage("restore")
        pipe, overhead["restore_s"] = pristine.fresh()
    unregister = None
    if integration is not None:
        unregister = integration.register_planners([type(t).__name__ for t in transformers_of(pipe).values()])
    snapshot = ClassSnapshot.of(pipe)
    target, perturbation, times, volatility = None, None, [], None
    # the uncached single-process rows (the baseline) measure how fast the transformer's output moves between steps
    probes = Probes()
    try:
        stage("apply")
        target = apply(row, pipe, integration, request)
        if row.perturb is not None:  # before the probes: their output hook records the perturbed output
            perturbation = OutputNoise(row.perturb, request.seed).attach(pipe)
        probes.attach(pipe, compiled=bool(row.compile))
        if row.name.endswith(CACHE_OFF_SUFFIX):  # caching off, every step computed: how fast its residuals change
            volatility = ResidualChange(probes.scheduler_steps).attach(pipe)
        for i in range(warmup + repeats):
            stage("compile" if row.compile and i == 0 else "generate")
            probes.reset()
            if volatility is not None:
                volatility.reset()
            if perturbation is not None:
                perturbation.reset()  # every call draws the same perturbation, whatever --warmup/--repeats say
            if device.startswith("cuda"):
                torch.cuda.synchronize(device)
                if i == warmup:
                    torch.cuda.reset_peak_memory_stats(device)
            start = time.perf_counter()
            out = generate(pipe, request, probes, target)
            if device.startswith("cuda"):
                torch.cuda.synchronize(device)
            took = time.perf_counter() - start
            overhead["generate_s"] = overhead.get("generate_s", 0.0) + took
            if i >= warmup:
                times.append(took)
        output, modality = decoded(out)
        extra = further(out)
        for value in extra.values():
            if value.get("modality") == "audio":
                value["sample_rate"] = audio.sample_rate(pipe)
        facts = probes.facts(request.steps)
        facts["cp_split_dims"] = integration.cp_split_dims if integration is not None else plugin.declared_split_dims()
        facts["not_covered"] = integration.not_covered if integration is not None else None
        facts["cache"] = _cache_stats(target) if row.cache else None
        if row.cache and getattr(target, "patch_functor", None) is not None:  # an adapter given as a BlockAdapter
            facts["patch_functor"] = type(target.patch_functor).__name__
        if volatility is not None:
            facts["residual_change"] = volatility.summary()
        if modular.is_modular_class(type(pipe)):
            facts["modular"] = modular_rows.row_facts(pipe, target if row.cache else None)
        facts["sharded"] = {name: sharded_weights(m) for name, m in _components(pipe).items()} if row.parallel else {}
        if row.quantize:  # what run.proofs checks: the feature left a trace
            facts["quantized"] = {name: quantized_weights(m) for name, m in transformers_of(pipe).items()}
        if row.compile:
            facts["compiled"] = {name: compiled_modules(m) for name, m in transformers_of(pipe).items()}
        if perturbation is not None:
            facts["perturbed_calls"] = perturbation.calls
        start_noise, (latents, _) = probes.initial_noise(), probes.final_latents()
        return Outcome(output=output, modality=modality,
                       sample_rate=audio.sample_rate(pipe) if modality == "audio" else None,
                       latents=None if latents is None else latents.numpy(),
                       noise=None if start_noise is None else start_noise.numpy(),
                       times=times, peak_memory=_peak_memory(device, pristine.resident_bytes if pristine else 0),
                       facts=facts, overhead=overhead, warmup=warmup,
                       first_step=None if probes.first_output is None else probes.first_output.numpy(),
                       further=extra)
    finally:
        probes.detach()
        if volatility is not None:
            volatility.detach()
        if perturbation is not None:
            perturbation.detach()
        if target is not None and row.cache:
            import cache_dit

            cache_dit.disable_cache(target)  # cache-dit patches the pipeline class; take that back off
        snapshot.restore()  # and patches classes for parallelism: take those off too (see ditgate.run.exec.isolation)
        if unregister is not None:
            unregister()  # a model inspected or run later in this process sees cache-dit's own planners again
        # Drop every reference before collecting: pipelines hold reference cycles, and a collection made while
        # `target` still points at the pipeline keeps a whole model alive into the next row (measured on an H200:
        # 26 GB of FLUX.1-dev weights still allocated while the next row loaded its own).
        pipe = target = None
        gc.collect()
        if device.startswith("cuda"):
            torch.cuda.empty_cache()  # the next row's peak memory starts from its own weights
        overhead["setup_s"] = (time.perf_counter() - began - overhead["load_s"] - overhead["restore_s"]
                               - overhead.get("generate_s", 0.0))


def _components(pipe) -> dict[str, torch.nn.Module]:
    return {k: v for k, v in getattr(pipe, "components", {}).items() if isinstance(v, torch.nn.Module)}


def _cache_stats(target) -> list[dict[str, Any]]:
    import cache_dit

    stats = []
    for s in cache_dit.summary(target, logging=False):
        stats.append({"cached_steps": [int(x) for x in s.cached_steps],
                      "cfg_cached_steps": [int(x) for x in s.cfg_cached_steps],
                      "residual_diffs": {str(k): float(v) for k, v in s.residual_diffs.items()}})
    return stats


def save_outcome(run_dir: Path, row: Row, outcome: Outcome) -> dict[str, Any]:
    """Store a finished row in the run folder; returns its result record."""
    from ditgate.run.exec import files as store

    result = {
        "name": row.name, "fingerprint": row.fingerprint(), "row": row.to_dict(), "status": "ok",
        "modality": outcome.modality, "sample_rate": outcome.sample_rate, "times": outcome.times,
        "latency_s": float(np.median(outcome.times)) if outcome.times else None,
        "peak_memory": outcome.peak_memory, "facts": outcome.facts,
        "generate_s": outcome.overhead.get("generate_s"), "warmup_calls": outcome.warmup,
        "overhead": {k: round(v, 4) for k, v in outcome.overhead.items() if k != "generate_s"},
    }
    files = store.viewable(outcome.output, outcome.modality)
    if outcome.modality == "audio" and outcome.sample_rate and np.isfinite(outcome.output).all():
        files[WAV_FILE] = audio.wav_bytes(outcome.output, outcome.sample_rate)
    arrays = {"output": outcome.output, "latents": outcome.latents, "noise": outcome.noise,
              "first_step": outcome.first_step}
    if outcome.further:  # each further output beside output.npy as output_NAME.npy (a waveform also as a WAV file)
        result["outputs"] = {name: {k: v for k, v in value.items() if k != "output"}
                             for name, value in outcome.further.items()}
        for name, value in outcome.further.items():
            arrays[f"output_{name}"] = value.get("output")
            if value.get("sample_rate") and value["output"] is not None and np.isfinite(value["output"]).all():
                files[f"output_{name}.wav"] = audio.wav_bytes(value["output"], value["sample_rate"])
    result["media"] = sorted(files)
    store.save_row(run_dir, row.name, result, arrays, files)
    return result


def save_error(run_dir: Path, row: Row, error: dict[str, Any]) -> dict[str, Any]:
    from ditgate.run.exec import files as store

    result = {"name": row.name, "fingerprint": row.fingerprint(), "row": row.to_dict(), "status": "error",
              "error": error}
    store.save_row(run_dir, row.name, result, {})
    return result
