"""Integration plugins: a plain Python file for a model cache-dit does not know yet.

`ditgate run MODEL --integration FILE` imports FILE, which may define any of:

    def block_adapter(pipe) -> cache_dit.BlockAdapter
        The blocks to cache and their ForwardPattern (cache rows use it instead of cache-dit's registry).
    def cp_plan(transformer, parallelism_config) -> dict
        The context-parallel plan in cache-dit's format: module path -> _ContextParallelInput(s) / _ContextParallelOutput.
        It may also patch the model (e.g. an attention processor) before returning the plan.
    def tp_plan(transformer, tp_mesh, parallelism_config) -> list[dict]
        Shards the transformer in place (torch.distributed.tensor.parallel.parallelize_module, shard_div_attr, ...)
        and returns the layer plans it applied, as cache-dit's TensorParallelismPlanner._apply does.
    CP_SPLIT_DIMS = {"spatial_blocks": 1, "temporal_blocks": 0}
        Not a function: for each block list, the dimension of the tensors its blocks return that context
        parallelism divides by the CP size (`None`: the list runs on the whole sequence on every rank). Keys are a
        block list's attribute, or `"transformer_2.blocks"` for a list of another transformer component. A list it
        does not name is split on dimension 1, the sequence of `[batch, sequence, dim]`. ditgate's CP proof checks
        each list on its dimension; a factorized model (attention within frames, then across frames) needs it.
        Per stream, for blocks that return several sequences: a tuple with one entry per tensor returned, in order,
        `None` for a stream kept whole: `{"blocks": (1, None)}` (video split on dimension 1, audio kept whole).
    NOT_COVERED = {"cache": ["transformer_2"]}
        Not a function: the transformer components a feature deliberately leaves alone (features `cache`, `cp`,
        `tp`). The proofs check every transformer the pipeline calls and fail a feature that acts on one and not on
        another, naming both; a transformer declared here is reported "not covered" instead (and fails if the
        feature acts on it after all).

`cp_plan` and `tp_plan` are registered as cache-dit planners for the transformer's class, ahead of any planner
cache-dit already has for it; the code moves into cache-dit unchanged as a planner's `_apply`. Planners for a text
encoder or a VAE are registered by the file itself, at import, with cache-dit's register decorators
(`TextEncoderTensorParallelismPlannerRegister.register(...)`, `AutoEncoderDataParallelismPlannerRegister.register(...)`):
every cache-dit registry is filled with cache-dit's own planners before the file runs, because cache-dit fills a
registry lazily only while it is empty and a registration made first would hide all of its own planners.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ditgate.core.errors import DitgateError

HOOKS = ("block_adapter", "cp_plan", "tp_plan")
SPLIT_DIMS = "CP_SPLIT_DIMS"
NOT_COVERED = "NOT_COVERED"
COVERED_FEATURES = ("cache", "cp", "tp")  # the features whose proofs look at every transformer


class PluginError(DitgateError):
    """The integration file cannot be used."""


@dataclass
class Integration:
    path: Path
    block_adapter: Callable | None = None
    cp_plan: Callable | None = None
    tp_plan: Callable | None = None
    cp_split_dims: dict[str, int | None] | None = None
    not_covered: dict[str, list[str]] | None = None  # feature -> transformer components it leaves alone

    def register_planners(self, class_names: list[str]) -> Callable[[], None]:
        """Make cache-dit use this file's CP/TP plans for transformers of these classes (in this process).

        Returns a function that puts cache-dit's registries back as they were, so a model inspected or run later in
        the same process sees cache-dit's own planners again.
        """
        undo: list[Callable[[], None]] = []
        if self.cp_plan is not None:
            from cache_dit.distributed.transformers.dispatch import _ensure_cp_planners_activated
            from cache_dit.distributed.transformers.register import (ContextParallelismPlanner,
                                                                      ContextParallelismPlannerRegister)

            _ensure_cp_planners_activated()  # first, or cache-dit's lazy activation would skip its own planners
            plan = self.cp_plan

            class PluginCPPlanner(ContextParallelismPlanner):
                def _apply(self, transformer=None, parallelism_config=None, **kwargs):
                    return plan(transformer, parallelism_config)

            undo.append(_put_first(ContextParallelismPlannerRegister, "_cp_planner_registry", class_names,
                                   PluginCPPlanner))
        if self.tp_plan is not None:
            from cache_dit.distributed.transformers.dispatch import _ensure_tp_planners_activated
            from cache_dit.distributed.transformers.register import (TensorParallelismPlanner,
                                                                      TensorParallelismPlannerRegister)

            _ensure_tp_planners_activated()
            shard = self.tp_plan

            class PluginTPPlanner(TensorParallelismPlanner):
                def _apply(self, transformer, parallelism_config, **kwargs):
                    layer_plans = shard(transformer, self.mesh(parallelism_config), parallelism_config)
                    return transformer, list(layer_plans or [])

            undo.append(_put_first(TensorParallelismPlannerRegister, "_tp_planner_registry", class_names,
                                   PluginTPPlanner))

        def restore() -> None:
            for step in reversed(undo):
                step()

        return restore


def _put_first(register: type, attribute: str, names: list[str], planner: type) -> Callable[[], None]:
    registry = getattr(register, attribute)
    saved = dict(registry)
    new = {name: planner for name in names}
    new.update((k, v) for k, v in registry.items() if k not in new)
    registry.clear()
    registry.update(new)  # same dict object: cache-dit's code holds no other reference, but keep it anyway

    def restore() -> None:
        registry.clear()
        registry.update(saved)

    return restore


def activate_cache_dit_planners() -> None:
    """Fill every cache-dit planner registry with its own planners (once; idempotent)."""
    from cache_dit.distributed.autoencoders.dispatch import _ensure_auto_encoder_dp_planners_activated
    from cache_dit.distributed.text_encoders.dispatch import _ensure_text_encoder_tp_planners_activated
    from cache_dit.distributed.transformers.dispatch import (_ensure_cp_planners_activated,
                                                             _ensure_tp_planners_activated)

    from cache_dit.distributed.transformers.planners import _activate_cp_planners, _activate_tp_planners

    _ensure_cp_planners_activated()
    _ensure_tp_planners_activated()
    # A transformer module registers its CP and TP planners together, and each registry activates only while empty:
    # after the CP activation the TP registry is not empty, so the TP-only modules (mochi, hunyuan_dit, ltx_video,
    # ltx2_video, glm_image, kandinsky5, an exported TP-only planner) were never imported. Both activations run in
    # full; importing a module again registers nothing twice.
    _activate_cp_planners()
    _activate_tp_planners()
    _ensure_text_encoder_tp_planners_activated()
    _ensure_auto_encoder_dp_planners_activated()


def load(path: str | Path | None) -> Integration | None:
    """Import the integration file once per process (a second import would register its planners twice)."""
    if path is None:
        return None
    path = Path(path).resolve()
    if not path.is_file():
        raise PluginError(f"integration file {path} does not exist")
    name = f"ditgate_integration_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}"
    module = sys.modules.get(name)
    if module is None or getattr(module, "_ditgate_mtime", None) != path.stat().st_mtime_ns:
        module = _import(path, name)
    hooks: dict[str, Any] = {hook: getattr(module, hook, None) for hook in HOOKS}
    for hook, value in hooks.items():
        if value is not None and not callable(value):
            raise PluginError(f"{path}: {hook} must be a function")
    if not any(hooks.values()):
        raise PluginError(f"{path} defines none of {', '.join(HOOKS)}")
    return Integration(path=path, cp_split_dims=split_dims(path, getattr(module, SPLIT_DIMS, None)),
                       not_covered=not_covered(path, getattr(module, NOT_COVERED, None)), **hooks)


def not_covered(path: Path, value: Any) -> dict[str, list[str]] | None:
    """The file's NOT_COVERED, checked: {feature: [transformer component, ...]}."""
    if value is None:
        return None
    if not isinstance(value, dict) or not all(
            k in COVERED_FEATURES and isinstance(v, (list, tuple)) and all(isinstance(n, str) and n for n in v)
            for k, v in value.items()):
        raise PluginError(f"{path}: {NOT_COVERED} must map a feature ({', '.join(COVERED_FEATURES)}) to a list of "
                          f"transformer component names, got {value!r}")
    return {k: list(v) for k, v in value.items()}


def _dim(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)


def split_dims(path: Path, value: Any) -> dict[str, Any] | None:
    """The file's CP_SPLIT_DIMS, checked: {block list: dimension, None, or a tuple of them (one per stream)}."""
    if value is None:
        return None
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and k and (_dim(v) or (isinstance(v, (tuple, list)) and v and all(map(_dim, v))))
            for k, v in value.items()):
        raise PluginError(f"{path}: {SPLIT_DIMS} must map block list names to a dimension (an int >= 0), None, or "
                          f"a tuple of them, one per tensor the blocks return (None: kept whole), got {value!r}")
    return {k: tuple(v) if isinstance(v, (tuple, list)) else v for k, v in value.items()}


def format_split_dims(dims: dict[str, Any]) -> str:
    """CP_SPLIT_DIMS as `--cp-split-dims` takes it: `blocks=1:none,refiner=none`."""
    one = lambda v: "none" if v is None else str(v)  # noqa: E731
    return ",".join(f"{k}={':'.join(map(one, v)) if isinstance(v, (tuple, list)) else one(v)}"
                    for k, v in dims.items())


SPLIT_DIMS_ENV = "DITGATE_CP_SPLIT_DIMS"


def parse_split_dims(text: str) -> dict[str, int | None]:
    """`--cp-split-dims spatial_blocks=1,temporal_blocks=0,refiner=none,blocks=1:none`: CP_SPLIT_DIMS without an
    integration file (the model's planners live in cache-dit, e.g. an exported tree), for the CP proof; `1:none`
    declares per stream (what the blocks return, in order)."""
    out: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise PluginError(f"--cp-split-dims {item!r}: write LIST=DIM (e.g. temporal_blocks=0, or LIST=none)")
        try:
            dims = [None if v.lower() == "none" else int(v) for v in value.split(":")]
        except ValueError:
            raise PluginError(f"--cp-split-dims {item!r}: the dimension is an integer or none (per stream: "
                              "1:none)") from None
        out[key] = dims[0] if len(dims) == 1 else tuple(dims)
    return split_dims(Path("--cp-split-dims"), out)


def declared_split_dims() -> dict[str, int | None] | None:
    """The split dimensions `--cp-split-dims` set for this run (inherited by its ranks), or None."""
    import json
    import os

    text = os.environ.get(SPLIT_DIMS_ENV)
    return json.loads(text) if text else None


def _import(path: Path, name: str):
    activate_cache_dit_planners()
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise PluginError(f"importing integration file {path} failed: {exc!r}") from exc
    module._ditgate_mtime = path.stat().st_mtime_ns
    return module
