"""Diffusers `ModularPipeline`s: loading, the output they are read by, and the block tree.

A modular pipeline is loaded in two steps, configs then weights: `ModularPipeline.from_pretrained(folder)` resolves
the pipeline class and its blocks from `modular_model_index.json` (or, for a standard folder, from `model_index.json`
through diffusers' map to the modular counterpart), and `load_components(dtype=...)` loads the weights. diffusers
only logs a warning when a component fails to load and leaves it `None`; here that is an error naming the component.

A folder is modular when it holds `modular_model_index.json`, or when `--pipeline` names a `ModularPipeline` class
(`diffusers:ModularPipeline`, or `modular` for short, runs a standard folder through its modular counterpart).
Custom blocks shipped in the folder (`modular_config.json` with an `auto_map`) are code from the model folder: they
run only with `trust_remote_code=True`.

A request is fitted to the blocks' inputs (`block_parameters`, read by `ditgate.core.request.fit_blocks`). A modular
pipeline returns values of its state by name: `call` asks for the whole state and reads the output by the name the
blocks declare (images, videos, audio); turning it into an array is `ditgate.run.exec.outputs`' job, as for any pipeline.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ditgate.core.errors import DitgateError, NotAPipelineError, PipelineClassError, RemoteCodeError

MODULAR_INDEX = "modular_model_index.json"
BLOCKS_CONFIG = "modular_config.json"
SHORTHAND = "modular"  # --pipeline modular: the standard folder through its modular counterpart
# Output names of decoded results, in the order they are looked for, with the modality each one is.
OUTPUT_NAMES = (("images", "image"), ("image", "image"), ("videos", "video"), ("video", "video"),
                ("frames", "video"), ("audios", "audio"), ("audio", "audio"))
# Call arguments of standard pipelines that a modular pipeline keeps on its guider, and the guider's name for each
# (QwenImagePipeline's true CFG scale is the modular pipeline's ClassifierFreeGuidance scale).
GUIDER_ARGS = {"guidance_scale": "guidance_scale", "true_cfg_scale": "guidance_scale"}
OUTPUT_KEY = "output"  # request.call["output"]: the state value to read, when the blocks' own names are not wanted


class ModularLoadError(DitgateError):
    """A modular pipeline's blocks or components cannot be loaded, or it cannot produce the output asked for."""


def is_modular_folder(path: Path) -> bool:
    return (Path(path) / MODULAR_INDEX).is_file()


def is_modular_class(cls: Any) -> bool:
    try:
        from diffusers import ModularPipeline
    except ImportError:  # a diffusers without modular pipelines
        return False
    return isinstance(cls, type) and issubclass(cls, ModularPipeline)


def wants_modular(path: Path, pipeline: str | None) -> bool:
    """Whether `path` (with the `--pipeline` given, if any) is loaded as a modular pipeline."""
    if pipeline == SHORTHAND:
        return True
    if pipeline:
        module_name, _, class_name = pipeline.partition(":")
        return class_name.endswith("ModularPipeline") or (module_name == "diffusers" and class_name == "")
    return is_modular_folder(path)


def read_index(path: Path) -> dict[str, Any]:
    try:
        return json.loads((Path(path) / MODULAR_INDEX).read_text())
    except json.JSONDecodeError as exc:
        raise NotAPipelineError(f"{Path(path) / MODULAR_INDEX} is not valid JSON: {exc}") from None


def remote_blocks(path: Path) -> list[Path]:
    """Python files of custom blocks in the folder that loading would execute (modular_config.json's auto_map)."""
    config = Path(path) / BLOCKS_CONFIG
    if not config.is_file():
        return []
    try:
        auto_map = json.loads(config.read_text()).get("auto_map") or {}
    except json.JSONDecodeError as exc:
        raise NotAPipelineError(f"{config} is not valid JSON: {exc}") from None
    files = []
    for ref in auto_map.values():
        module_file = str(ref).split(".")[0] + ".py"
        files.append(Path(path) / module_file)
    return files


def pipeline_class(pipeline: str | None):
    """The ModularPipeline class `--pipeline` names (diffusers' base class when none or the shorthand is given)."""
    import importlib

    from diffusers import ModularPipeline

    if not pipeline or pipeline == SHORTHAND:
        return ModularPipeline
    module_name, sep, class_name = pipeline.partition(":")
    if not sep or not module_name or not class_name:
        raise PipelineClassError(f"--pipeline must be written module:Class (or {SHORTHAND!r}), got {pipeline!r}")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise PipelineClassError(f"cannot import {pipeline} given with --pipeline: {exc}") from None
    if not is_modular_class(cls):
        raise PipelineClassError(f"{pipeline} is not a diffusers ModularPipeline class")
    return cls


def _missing_files(path: Path, pipe) -> list[str]:
    """Components the folder's index names whose files are not in the folder (config-only check)."""
    from diffusers.modular_pipelines.modular_pipeline import _is_local_component

    missing = []
    for name, spec in pipe._component_specs.items():
        if spec.default_creation_method != "from_pretrained" or not spec.pretrained_model_name_or_path:
            continue
        repo = Path(str(spec.pretrained_model_name_or_path))
        if not repo.is_dir() and (Path(path) / (spec.subfolder or name)).is_dir():
            repo = Path(path)  # a copy of a saved folder: its index still names where it was saved
        if not repo.is_dir():
            missing.append(f"{name} (from {repo}, not a local folder)")
        elif not _is_local_component(str(repo), spec):
            missing.append(f"{name} (no weights or config in {repo / (spec.subfolder or '')})")
    return missing


def from_pretrained(path: Path, pipeline: str | None = None, trust_remote_code: bool = False):
    """The pipeline with its configs and blocks, components not loaded yet (cheap: reads configs only)."""
    remote = remote_blocks(path)
    if remote and not trust_remote_code:
        raise RemoteCodeError(f"{path} ships custom pipeline blocks ({', '.join(map(str, remote))}), code from the "
                              "model folder; read it, then pass --trust-remote-code")
    cls = pipeline_class(pipeline)
    try:
        if cls.__name__ == "ModularPipeline" or remote:  # diffusers resolves the class (and custom blocks)
            pipe = cls.from_pretrained(str(path), trust_remote_code=trust_remote_code or None,
                                       local_files_only=True)
        else:  # a named class: its own default blocks (its from_pretrained maps a standard folder to the base class)
            pipe = cls(pretrained_model_name_or_path=str(path), local_files_only=True)
    except (ValueError, OSError, AttributeError, ImportError) as exc:
        raise ModularLoadError(f"{path} does not load as a modular pipeline ({cls.__name__}.from_pretrained): "
                               f"{_one_line(exc)}") from None
    if pipeline and cls.__name__ != "ModularPipeline" and not isinstance(pipe, cls):
        raise ModularLoadError(f"{path} resolves to {type(pipe).__name__}, not the {cls.__name__} given with "
                               "--pipeline")
    return pipe


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def load(path: Path, dtype: Any = None, device: str | None = "cpu", *, pipeline: str | None = None,
         trust_remote_code: bool = False):
    """Load the modular pipeline at `path` with every component, in the torch `dtype` on `device` (the caller,
    `ditgate.core.loader.load`, keeps the hub offline)."""
    pipe = from_pretrained(path, pipeline, trust_remote_code)
    missing = _missing_files(path, pipe)
    if missing:
        raise ModularLoadError(f"{type(pipe).__name__} at {path}: components cannot load: {'; '.join(missing)}")
    kwargs = {"dtype": dtype} if dtype is not None else {}
    if trust_remote_code:
        kwargs["trust_remote_code"] = True
    pipe.load_components(**kwargs)
    failed = [name for name in pipe.pretrained_component_names if getattr(pipe, name, None) is None
              and pipe._component_specs[name].pretrained_model_name_or_path]
    if failed:  # diffusers only logged a warning: load the first again to say why
        try:
            pipe._component_specs[failed[0]].load(**kwargs)
            reason = "left unset"
        except Exception as exc:  # noqa: BLE001 - the reason is reported, not handled
            reason = _one_line(exc)
        raise ModularLoadError(f"{type(pipe).__name__} at {path}: component {failed[0]} cannot load: {reason}"
                               + (f" (also failed: {', '.join(failed[1:])})" if failed[1:] else ""))
    if device is not None:
        pipe.to(device)
    for component in pipe.components.values():
        if hasattr(component, "eval"):
            component.eval()
    return pipe


def check(path: Path, pipeline: str | None, trust_remote_code: bool, call: dict[str, Any], weights: bool = True):
    """Before any row: a modular folder's blocks resolve, every component it names has its files (`weights`: its
    weight files too), the request's arguments are inputs of the blocks and the output to read is one they produce
    (configs only, nothing loaded)."""
    if not wants_modular(Path(path), pipeline):
        return
    pipe = from_pretrained(Path(path), pipeline, trust_remote_code)
    missing = _missing_files(Path(path), pipe) if weights else []
    if missing:
        raise ModularLoadError(f"{type(pipe).__name__} at {path}: components cannot load: {'; '.join(missing)}")
    output_name(pipe, call)
    call_kwargs(pipe, call)


def standard_class(path: Path) -> str | None:
    """The standard pipeline class of a standard folder run through its modular counterpart (model_index.json)."""
    try:
        return json.loads((Path(path) / "model_index.json").read_text()).get("_class_name")
    except (OSError, ValueError, AttributeError):
        return None


def block_parameters(pipe, call: dict[str, Any]) -> dict[str, Any]:
    """The blocks' inputs as `inspect.Parameter`s (a required input without a default value has none), with the request's guider
    arguments and the output name: what `ditgate.core.request.fit_blocks` fits a request to, as a `__call__`'s."""
    import inspect

    keyword, empty = inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.empty
    params = {p.name: inspect.Parameter(p.name, keyword, default=empty if p.required and p.default is None
                                        else p.default) for p in pipe.blocks.inputs if p.name}
    kinds = {p.kwargs_type for p in pipe.blocks.inputs if p.kwargs_type}  # inputs passed by kind, as a mapping
    for name in [*guider_args(pipe, call), *kinds, OUTPUT_KEY]:
        params.setdefault(name, inspect.Parameter(name, keyword, default=None))
    return params


# ------------------------------------------------------------------------------------------------ calling
def declared_outputs(pipe) -> list[str]:
    """Names the pipeline's blocks declare as outputs (falling back to their intermediate outputs)."""
    blocks = pipe.blocks
    names = [o.name for o in getattr(blocks, "outputs", []) or []]
    return names or list(getattr(blocks, "intermediate_output_names", []) or [])


def produced_names(pipe) -> set[str]:
    blocks = pipe.blocks
    names = set(declared_outputs(pipe))
    names.update(getattr(blocks, "intermediate_output_names", []) or [])
    return names


def output_name(pipe, request_call: dict[str, Any]) -> tuple[str, str]:
    """(state name of the decoded output, its modality): the request's `output`, else the blocks' own name."""
    asked = request_call.get(OUTPUT_KEY)
    produced = produced_names(pipe)
    modality_of = dict(OUTPUT_NAMES)
    if asked is not None:
        if not isinstance(asked, str) or asked not in produced:
            raise ModularLoadError(f"{type(pipe).__name__} does not produce an output named {asked!r}; its blocks "
                                   f"produce {', '.join(sorted(produced))}")
        return asked, modality_of.get(asked, "image")
    declared = declared_outputs(pipe)
    for name, modality in OUTPUT_NAMES:
        if name in declared or name in produced:
            return name, modality
    raise ModularLoadError(f"{type(pipe).__name__}'s blocks declare no decoded output (one of "
                           f"{', '.join(n for n, _ in OUTPUT_NAMES)}); they declare {', '.join(declared) or 'none'}:"
                           f" name the value to read with the call argument {OUTPUT_KEY}=NAME")


def guider_args(pipe, call: dict[str, Any]) -> dict[str, Any]:
    """The request's arguments that a modular pipeline keeps on its guider component instead of taking them as
    block inputs (a standard pipeline's `guidance_scale`, e.g. Wan, LTX, Qwen-Image; FLUX.1's distilled guidance
    stays a block input)."""
    guider = getattr(pipe, "guider", None)
    inputs = set(pipe.blocks.input_names)
    return {k: call[k] for k, attr in GUIDER_ARGS.items() if k in call and k not in inputs and hasattr(guider, attr)}


def configure_guider(pipe, call: dict[str, Any]) -> None:
    """Set the request's guider arguments on the guider (before anything counts the calls per step it makes)."""
    for key, value in guider_args(pipe, call).items():
        setattr(pipe.guider, GUIDER_ARGS[key], value)


def call_kwargs(pipe, call: dict[str, Any]) -> dict[str, Any]:
    """The request's arguments the blocks take as inputs; an argument no block (nor the guider) takes is an error."""
    inputs = set(pipe.blocks.input_names)
    kwargs_types = {p.kwargs_type for p in pipe.blocks.inputs if p.kwargs_type}
    on_guider = guider_args(pipe, call)
    args = {k: v for k, v in call.items() if k != OUTPUT_KEY and k not in on_guider}
    unknown = sorted(k for k in args if k not in inputs and k not in kwargs_types)
    if unknown:
        raise DitgateError(f"{type(pipe).__name__} takes no input {', '.join(unknown)} (its blocks take "
                           f"{', '.join(sorted(inputs))})")
    if "output_type" in inputs:
        args["output_type"] = "np"
    return args


@dataclass
class Result:
    """What one modular call produced: the state value read as the output, its name, the state's latents."""

    output: Any
    name: str
    latents: Any  # torch.Tensor or None


def call(pipe, call: dict[str, Any], generator, inputs: dict[str, Any] | None = None) -> Result:
    """Call `pipe` once with the request's arguments (and `inputs`, e.g. its input image) and read the output by
    name and the latents from its state."""
    import torch

    name, _ = output_name(pipe, call)
    configure_guider(pipe, call)
    kwargs = {**call_kwargs(pipe, call), **(inputs or {})}
    with torch.no_grad():
        state = pipe(**kwargs, generator=generator)
    output = state.get(name)
    if output is None:
        raise ModularLoadError(f"{type(pipe).__name__}'s call left no value named {name!r} in its state")
    latents = state.get("latents")
    return Result(output=output, name=name, latents=latents if isinstance(latents, torch.Tensor) else None)


def registered_adapter(pipe, **kwargs):
    """cache-dit's registered BlockAdapter for the modular pipeline, built on it (the adapter functions read
    `pipe.transformer` like any pipeline's), with has_separate_cfg as the guider decides; (adapter, None), or
    (None, why there is none). cache-dit looks adapters up by the pipeline class name's prefix
    (`BlockAdapterRegister.get_adapter`): the modular class's name less "ModularPipeline" is its standard twin's
    prefix (StableDiffusion3, Wan, QwenImage, ...); the transformer's class name is tried next (FluxTransformer...,
    Flux3Transformer...). `kwargs` go to the adapter function (skip_post_init=True)."""
    from cache_dit.caching.block_adapters.block_registers import BlockAdapterRegister

    transformer = getattr(pipe, "transformer", None)
    if transformer is None:
        return None, f"{type(pipe).__name__} has no transformer component"
    refused = None
    for name in (type(pipe).__name__.removesuffix("ModularPipeline"), type(transformer).__name__):
        for prefix, build in BlockAdapterRegister._adapters.items():
            if not name or not name.startswith(prefix):
                continue
            try:
                adapter = build(pipe, **kwargs)
            except (AssertionError, AttributeError, ValueError) as exc:
                refused = f"cache-dit's adapter for prefix {prefix!r} refuses {name}: {_one_line(exc)}"
                continue
            adapter.has_separate_cfg = expected_calls_per_step(pipe) > 1
            return adapter, None
    return None, refused or f"cache-dit registers no adapter for {type(pipe).__name__} or {type(transformer).__name__}"


# ------------------------------------------------------------------------------------------------ the block tree
def guider_facts(pipe) -> dict[str, Any] | None:
    """The guider component: its class, whether it is on, conditions (transformer calls per step) and schedule."""
    guider = getattr(pipe, "guider", None)
    if guider is None:
        return None
    enabled = bool(getattr(guider, "_enabled", True))
    conditions = int(getattr(guider, "num_conditions", 1)) if enabled else 1
    scale = getattr(guider, "guidance_scale", None)
    start, stop = getattr(guider, "_start", 0.0), getattr(guider, "_stop", 1.0)
    return {"class": type(guider).__name__, "enabled": enabled, "guidance_scale": scale, "start": start,
            "stop": stop, "calls_per_step": conditions,
            "whole_schedule": float(start) == 0.0 and float(stop) == 1.0}


def expected_calls_per_step(pipe) -> int:
    """Transformer calls a step makes as the guider decides (1 without a guider)."""
    facts = guider_facts(pipe)
    return facts["calls_per_step"] if facts else 1


def block_tree(pipe, inputs: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The pipeline blocks as rows: path, class, kind, components, whether it is a denoise loop and whether a call
    with `inputs` runs it (a conditional block runs the child its trigger inputs select, as its `__call__` does; a
    trigger counts as given when the call passes it or an earlier step that runs produces it, e.g. the image
    latents an image encoder step makes from `image`)."""
    from diffusers.modular_pipelines import LoopSequentialPipelineBlocks

    present = {k for k, v in (inputs or {}).items() if v is not None}
    rows = []

    def walk(block, path: str, depth: int, runs: bool) -> None:
        conditional = hasattr(block, "select_block") and hasattr(block, "block_trigger_inputs")
        children = getattr(block, "sub_blocks", None) or {}
        kind = ("loop" if isinstance(block, LoopSequentialPipelineBlocks) else "auto" if conditional
                else "sequential" if children else "step")
        components = sorted({c.name for c in getattr(block, "expected_components", [])})
        rows.append({"path": path or "(root)", "class": type(block).__name__, "kind": kind, "depth": depth,
                     "components": components, "runs": runs,
                     "denoise_loop": kind == "loop" and "transformer" in components})
        chosen = None
        if conditional:
            triggers = {name: True if name in present else None for name in block.block_trigger_inputs
                        if name is not None}
            chosen = block.select_block(**triggers) or block.default_block_name
        for name, child in children.items():
            walk(child, f"{path}.{name}" if path else name, depth + 1, runs and (not conditional or name == chosen))
        if runs and not children:  # what this step leaves in the state for the blocks after it
            present.update(o.name for o in getattr(block, "intermediate_outputs", []) or [] if o.name)

    walk(pipe.blocks, "", 0, True)
    return rows


def denoise_loops(pipe) -> list[str]:
    return [r["path"] for r in block_tree(pipe) if r["denoise_loop"]]
