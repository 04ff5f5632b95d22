"""What the installed cache-dit already provides for a pipeline's classes, read from cache-dit's own registries.

Nothing here initialises torch.distributed: the planner modules only register classes when imported.

cache-dit activates its planner registries lazily, and only when the registry is still empty
(`_ensure_cp_planners_activated` and friends check `supported_planners()[0] == 0`). A planner module imported
early registers itself alone, after which the lazy activation skips every other planner. So this module calls
the `_activate_*` functions themselves, which import every built-in planner module; importing a module twice
registers nothing twice, so calling them again is harmless.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import re
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ditgate.core import modular


@dataclass
class AdapterInfo:
    """A registered BlockAdapter as cache-dit would build it (without applying it)."""

    prefix: str  # the registry key that matched the pipeline class name
    function: str
    transformers: list[str]  # pipeline attribute names of the adapted transformer(s)
    block_lists: list[list[str]]  # per transformer: the block lists, as attribute names ("a + b" when merged)
    blocks_name: list[Any]
    dummy_blocks_names: list[Any]
    forward_patterns: list[list[str]]
    has_separate_cfg: bool  # what cache-dit will use (adapter flag, else its pipeline-name list)
    patch_functor: str | None
    check_forward_pattern: bool | None
    error: str | None = None


@dataclass
class Support:
    cache_dit_version: str
    adapter: AdapterInfo | None
    adapter_error: str | None
    cp_planners: dict[str, str | None] = field(default_factory=dict)  # transformer attribute -> planner class
    tp_planners: dict[str, str | None] = field(default_factory=dict)
    text_encoder_planners: dict[str, str | None] = field(default_factory=dict)  # component -> planner class
    vae_planners: dict[str, str | None] = field(default_factory=dict)
    cli_examples: list[str] = field(default_factory=list)  # `cache-dit-generate` examples using this pipeline

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _prefix_match(name: str, prefixes: list[str]) -> str | None:
    """The first registry key that `name` starts with: cache-dit's lookup rule (registration order wins)."""
    return next((p for p in prefixes if name.startswith(p)), None)


def _planner_name(register, module: torch.nn.Module) -> str | None:
    prefixes = register.supported_planners()[1]
    if _prefix_match(type(module).__name__, prefixes) is None:
        return None
    return register.get_planner(module).__name__


def _list_names(transformer: torch.nn.Module, blocks: torch.nn.ModuleList) -> str:
    """Attribute name(s) of `blocks` on `transformer`; a merged list is written 'a + b'."""
    lists = {name: child for name, child in transformer.named_children() if isinstance(child, torch.nn.ModuleList)}
    for name, child in lists.items():
        if child is blocks:
            return name
    members = {id(m) for m in blocks}
    parts = [name for name, child in lists.items() if len(child) and all(id(m) in members for m in child)]
    return " + ".join(parts) if parts else "<unnamed ModuleList>"


def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def describe_adapter(pipe) -> tuple[AdapterInfo | None, str | None]:
    """The registered BlockAdapter for `pipe` (a pipeline, or a bare transformer as cache-dit also accepts),
    built with `skip_post_init=True` so nothing is patched."""
    from cache_dit.caching.block_adapters import BlockAdapterRegister

    if modular.is_modular_class(type(pipe)):  # looked up by the transformer's class, as ditgate's rows do
        transformer = getattr(pipe, "transformer", None)
        prefix = _prefix_match(type(transformer).__name__, BlockAdapterRegister.supported_pipelines()[1])
        adapter, why = modular.registered_adapter(pipe, skip_post_init=True)
        if adapter is None:
            return None, (why if prefix else None)
    else:
        prefix = _prefix_match(type(pipe).__name__, BlockAdapterRegister.supported_pipelines()[1])
        if prefix is None:
            return None, None
        try:
            adapter = BlockAdapterRegister.get_adapter(pipe, skip_post_init=True)
        except Exception as exc:  # noqa: BLE001 - a registered adapter that rejects this pipeline is a finding
            return None, f"cache-dit's {prefix!r} adapter rejects this pipeline: {type(exc).__name__}: {exc}"
    components = getattr(pipe, "components", None) or {"transformer": pipe}
    transformers = _as_list(adapter.transformer)
    names = [next((k for k, v in components.items() if v is t), type(t).__name__) for t in transformers]
    blocks = _as_list(adapter.blocks)
    if len(transformers) == 1:
        blocks = [blocks]
    patterns = _as_list(adapter.forward_pattern)
    if len(transformers) == 1:
        patterns = [patterns]
    block_lists = [[_list_names(t, b) for b in _as_list(bs)] for t, bs in zip(transformers, blocks)]
    separate = bool(adapter.has_separate_cfg) or (not modular.is_modular_class(type(pipe))
                                                  and BlockAdapterRegister.has_separate_cfg(pipe))
    functor = adapter.patch_functor
    info = AdapterInfo(
        prefix=prefix, function=BlockAdapterRegister._adapters[prefix].__name__, transformers=names,
        block_lists=block_lists, blocks_name=_as_list(adapter.blocks_name) if adapter.blocks_name else [],
        dummy_blocks_names=list(adapter.dummy_blocks_names or []),
        forward_patterns=[[p.name for p in _as_list(ps)] for ps in patterns],
        has_separate_cfg=separate, patch_functor=type(functor).__name__ if functor is not None else None,
        check_forward_pattern=adapter.check_forward_pattern)
    return info, None


def cli_examples(pipeline_class: str) -> list[str]:
    """Names of `cache-dit-generate` examples whose code sets `pipeline_class=<pipeline_class>`."""
    from cache_dit._utils import examples  # noqa: F401 - registers the examples
    from cache_dit._utils.registers import ExampleRegister

    pattern = re.compile(r"\bpipeline_class\s*=\s*" + re.escape(pipeline_class) + r"\b")
    found = []
    for name in ExampleRegister.list_examples():
        try:
            source = inspect.getsource(ExampleRegister._example_registry[name])
        except (OSError, TypeError, KeyError):
            continue
        if pattern.search(source):
            found.append(name)
    return sorted(found)


def activate_registries() -> None:
    """Import every built-in planner module of cache-dit, so that all four planner registries are complete."""
    from cache_dit.distributed.autoencoders.planners import _activate_auto_encoder_dp_planners
    from cache_dit.distributed.text_encoders.planners import _activate_text_encoder_tp_planners
    from cache_dit.distributed.transformers.planners import _activate_cp_planners, _activate_tp_planners

    _activate_cp_planners()
    _activate_tp_planners()
    _activate_text_encoder_tp_planners()
    _activate_auto_encoder_dp_planners()


@contextlib.contextmanager
def _quiet():
    """cache-dit logs to stdout; keep its info and warnings (e.g. from adapter builders) out of our output."""
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def lookup(pipe, transformers: dict[str, torch.nn.Module], text_encoders: dict[str, torch.nn.Module],
           vaes: dict[str, torch.nn.Module]) -> Support:
    """Everything cache-dit registers for these components, by name."""
    import cache_dit
    from cache_dit.distributed.autoencoders.register import AutoEncoderDataParallelismPlannerRegister
    from cache_dit.distributed.text_encoders.register import TextEncoderTensorParallelismPlannerRegister
    from cache_dit.distributed.transformers.register import (ContextParallelismPlannerRegister,
                                                             TensorParallelismPlannerRegister)

    with _quiet():
        activate_registries()
        adapter, adapter_error = describe_adapter(pipe)
        examples = cli_examples(type(pipe).__name__)
    vae_registry = AutoEncoderDataParallelismPlannerRegister.supported_planners()[1]
    return Support(
        cache_dit_version=getattr(cache_dit, "__version__", "unknown"),
        adapter=adapter, adapter_error=adapter_error,
        cp_planners={n: _planner_name(ContextParallelismPlannerRegister, m) for n, m in transformers.items()},
        tp_planners={n: _planner_name(TensorParallelismPlannerRegister, m) for n, m in transformers.items()},
        text_encoder_planners={n: _planner_name(TextEncoderTensorParallelismPlannerRegister, m)
                               for n, m in text_encoders.items()},
        # VAE planners are looked up by the exact class name, not by prefix.
        vae_planners={n: (AutoEncoderDataParallelismPlannerRegister.get_planner(m).__name__
                          if type(m).__name__ in vae_registry else None) for n, m in vaes.items()},
        cli_examples=examples,
    )
