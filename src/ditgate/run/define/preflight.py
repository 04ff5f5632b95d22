"""Why a row cannot run on this model and machine, said before any weights are loaded.

Each check reads only configs and the machine: the GPU count, the attention heads and tokens the parallel sizes
must divide, the cache schedule for the step count, what torch.compile needs (a C++ compiler on CPU, Triton on a
GPU, CUDA for CUDA graphs), and what cache-dit's quantization needs (CUDA, torchao, a recent enough GPU).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

from ditgate.core.errors import DitgateError
from ditgate.core.request import Request
from ditgate.run.define.rows import Row

# torch.compile modes that capture CUDA graphs
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
# Minimum CUDA compute capability per quantization family (cache_dit/quantization/torchao/quantize_ao.py asserts)
CAPABILITY = {"float8": (8, 9), "nvfp4": (10, 0)}


def _transformer_config(model_path: Path) -> dict:
    path = model_path / "transformer" / "config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def devices(row: Row, device: str) -> str | None:
    if not device.startswith("cuda"):
        return None  # on CPU, ranks are processes and gloo runs any number of them
    import torch

    have = torch.cuda.device_count()
    if row.world_size > have:
        return f"needs {row.world_size} GPUs, this machine has {have}"
    return None


def heads(row: Row, config: dict) -> str | None:
    count = config.get("num_attention_heads")
    parallel = row.parallel or {}
    if not isinstance(count, int):
        return None
    if row.tp_size > 1 and count % row.tp_size:
        return (f"the transformer has {count} attention heads, which {row.tp_size} tensor-parallel ranks "
                "do not divide")
    ulysses = parallel.get("ulysses_size") or 1
    if ulysses > 1 and not parallel.get("ulysses_anything") and (count // row.tp_size) % ulysses:
        per_rank = f"{count // row.tp_size} per tensor-parallel rank" if row.tp_size > 1 else str(count)
        return (f"the transformer has {per_rank} attention heads, which {ulysses} Ulysses ranks do not divide "
                "(ulysses_anything pads them)")
    return None


def tokens(row: Row, model_path: Path, request: Request) -> str | None:
    """Image tokens at the request's size must divide over the context-parallel ranks."""
    parallel = row.parallel or {}
    if row.cp_size < 2 or parallel.get("ulysses_anything") or parallel.get("ring_anything"):
        return None
    call = request.call
    if not (isinstance(call.get("height"), int) and isinstance(call.get("width"), int)):
        return None
    from ditgate.inspect.flops import profile as flops

    try:
        src = flops.source(model_path)
        family = flops.family_of(src.class_name)
        geometry = family.geometry(src.transformer, src.vae, call["height"], call["width"], call.get("num_frames"),
                                   1)
    except DitgateError:
        return None  # a model ditgate has no geometry for: cache-dit's own check speaks at run time
    if geometry.image_tokens % row.cp_size:
        return (f"{geometry.image_tokens} image tokens at {call['height']}x{call['width']} are not divisible by "
                f"{row.cp_size} context-parallel ranks (choose another size, or ulysses_anything)")
    return None


def cache(row: Row, request: Request) -> str | None:
    if not row.cache:
        return None
    from ditgate.run.define.configs import cache_config

    try:
        cache_config(row, request.steps)
    except DitgateError as exc:
        return str(exc)
    return None


def compile_(row: Row, device: str) -> str | None:
    options = row.compile_options
    if options is None:
        return None
    mode, backend = options.get("mode"), options.get("backend", "inductor")
    if not device.startswith("cuda"):
        if mode in CUDA_GRAPH_MODES:
            return f"torch.compile mode {mode!r} captures CUDA graphs, which need a GPU"
        compiler = os.environ.get("CXX", "g++")
        if backend == "inductor" and not shutil.which(compiler):
            return f"torch.compile's inductor backend on CPU needs a C++ compiler ({compiler} not found)"
        return None
    if backend == "inductor":
        from torch.utils._triton import has_triton

        if not has_triton():
            return "torch.compile's inductor backend on a GPU needs Triton, which is not installed"
    return None


def quantize(row: Row, device: str) -> str | None:
    if not row.quantize:
        return None
    quant_type = str(row.quantize.get("quant_type", "")).lower()
    if quant_type.startswith("svdq"):
        if not device.startswith("cuda"):
            return f"{quant_type} runs cache-dit's SVDQuant CUDA kernels, which need a GPU"
        try:
            from cache_dit.kernels import svdq_extension_is_available
        except ImportError:
            return "this cache-dit has no SVDQuant kernels"
        return None if svdq_extension_is_available() else "cache-dit's SVDQuant CUDA extension is not built"
    if not device.startswith("cuda"):
        return (f"cache-dit quantizes ({quant_type}) through torchao on CUDA devices only "
                "(cache_dit/quantization/torchao/quantize_ao.py asserts a CUDA device)")
    if importlib.util.find_spec("torchao") is None:
        return "cache-dit's quantization needs torchao (pip install cache-dit[quantization])"
    import torch

    for prefix, needed in CAPABILITY.items():
        have = torch.cuda.get_device_capability()
        if quant_type.startswith(prefix) and have < needed:
            return (f"{quant_type} needs a GPU of compute capability {needed[0]}.{needed[1]} or newer, this one is "
                    f"{have[0]}.{have[1]}")
    return None


def why_not(row: Row, *, model_path: Path, request: Request, device: str) -> str | None:
    """The first reason `row` cannot run here, or None."""
    config = _transformer_config(model_path)
    for reason in (devices(row, device), heads(row, config), tokens(row, model_path, request), cache(row, request),
                   compile_(row, device), quantize(row, device)):
        if reason:
            return reason
    return None
