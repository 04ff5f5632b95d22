"""Named checks on the model and its plans: the CP plan's keys against the modules they name, planners of extra modules, the model contract, the model folder."""

from __future__ import annotations

import contextlib
import inspect
import json
from typing import Any
from ditgate.checklists.context import Context, Outcome, WEIGHT_SUFFIXES, _as_list, failed, passed


def _resolve_modules(root, key: str) -> list:
    """Modules a CP plan key addresses: '' is `root`, 'a.b' a submodule, one '*' every item of a ModuleList."""
    if key == "":
        return [root]
    found = [root]
    for part in key.split("."):
        nxt = []
        for module in found:
            if part == "*":
                nxt.extend(module.children())
            elif hasattr(module, "_modules") and part in module._modules and module._modules[part] is not None:
                nxt.append(module._modules[part])
        found = nxt
    return found


def _takes(module, name: str) -> bool:
    params = inspect.signature(module.forward).parameters
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def cp_plan_consistent(ctx: Context, args: dict[str, Any]) -> Outcome:
    import cache_dit
    from cache_dit.distributed.core import _ContextParallelInput, _ContextParallelOutput

    from ditgate.core.components import transformers_of

    pipe = ctx.pipe()
    t_name, transformer = next(iter(transformers_of(pipe).items()))
    config = cache_dit.ParallelismConfig(ulysses_size=args["ranks"])
    integration = ctx.integration()
    if integration is not None and integration.cp_plan is not None:
        source = f"cp_plan of {integration.path.name}"
        plan = integration.cp_plan(transformer, config)
    else:
        from cache_dit.distributed.transformers.dispatch import _ensure_cp_planners_activated
        from cache_dit.distributed.transformers.register import ContextParallelismPlannerRegister

        _ensure_cp_planners_activated()
        try:
            planner = ContextParallelismPlannerRegister.get_planner(transformer)
        except ValueError as exc:
            return failed(f"no CP plan: no integration file cp_plan, and cache-dit: {exc}")
        source = f"cache-dit's {planner.__name__}"
        plan = planner()._apply(transformer=transformer, parallelism_config=config)
    if not isinstance(plan, dict):
        return failed(f"{source} returned {type(plan).__name__}, not a dict of module path -> hooks")
    problems, splits, gathers = [], [], []
    for key, spec in plan.items():
        label = repr(key) if key else "'' (the transformer)"
        modules = _resolve_modules(transformer, key)
        if not modules:
            problems.append(f"{label} is not a submodule of {type(transformer).__name__}")
        for entry in _as_list(spec):
            if entry is None:
                continue
            if isinstance(entry, _ContextParallelOutput):
                gathers.append(key)
            elif isinstance(entry, dict):
                for arg, inputs in entry.items():
                    if not all(isinstance(i, _ContextParallelInput) for i in _as_list(inputs)):
                        problems.append(f"{label}: input {arg!r} maps to something other than _ContextParallelInput")
                        continue
                    splits.append(f"{key or '<root>'}:{arg}")
                    if isinstance(arg, str) and modules and not _takes(modules[0], arg):
                        problems.append(f"{label} has no input named {arg!r}")
            else:
                problems.append(f"{label}: unexpected entry {type(entry).__name__}")
    if not splits:
        problems.append("the plan splits nothing, so no rank's work is divided")
    elif not gathers:
        problems.append("the plan splits the sequence but gathers nothing (no _ContextParallelOutput): the output "
                        "stays split across ranks")
    gathered = ", ".join(g or "<root>" for g in gathers) or "nothing"
    summary = f"splits {', '.join(splits) or 'nothing'}; gathers at {gathered}"
    if problems:
        return failed(f"{source} for {t_name}: " + "; ".join(problems) + f" ({summary})")
    return passed(f"{source} for {t_name}: {summary}")


def extra_module_planner(ctx: Context, args: dict[str, Any]) -> Outcome:
    from cache_dit.utils import parse_extra_modules
    from diffusers import ModularPipeline

    from ditgate.run.exec.modular import extra_modules_visible

    module = args["module"]
    ctx.integration()  # planners an integration file registers at import count
    pipe = ctx.pipe()
    # cache-dit resolves the name as the rows' enable_cache does; a ModularPipeline is made visible the same way
    visible = extra_modules_visible(pipe) if isinstance(pipe, ModularPipeline) else contextlib.nullcontext()
    with visible:
        found = parse_extra_modules(pipe, [module])
    if not found:
        return failed(f"the pipeline has no component {module!r}")
    target = found[0]
    name = getattr(target, "_actual_module_name", module)
    if module == "text_encoder":
        from cache_dit.distributed.text_encoders.planners import _activate_text_encoder_tp_planners
        from cache_dit.distributed.text_encoders.register import TextEncoderTensorParallelismPlannerRegister as reg

        _activate_text_encoder_tp_planners()
    else:
        from cache_dit.distributed.autoencoders.planners import _activate_auto_encoder_dp_planners
        from cache_dit.distributed.autoencoders.register import AutoEncoderDataParallelismPlannerRegister as reg

        _activate_auto_encoder_dp_planners()
    try:
        planner = reg.get_planner(target)
    except ValueError as exc:
        return failed(f"{module!r} resolves to {name} ({type(target).__name__}): {exc}")
    return passed(f"{module!r} resolves to {name} ({type(target).__name__}); planner {planner.__name__}")


def model_contract(ctx: Context, args: dict[str, Any]) -> Outcome:
    from cache_dit.distributed.core._diffusers_bridge import get_diffusers_attention_classes
    from diffusers import DiffusionPipeline, ModelMixin, ModularPipeline

    from ditgate.inspect.observe import is_attention_module
    from ditgate.core.components import block_lists, transformers_of

    pipe = ctx.pipe()
    problems, notes = [], []
    if not isinstance(pipe, (DiffusionPipeline, ModularPipeline)):
        problems.append(f"{type(pipe).__name__} is neither a diffusers DiffusionPipeline nor a ModularPipeline")
    attention_classes = get_diffusers_attention_classes()
    for name, transformer in transformers_of(pipe).items():
        cls = type(transformer).__name__
        if not isinstance(transformer, ModelMixin):
            problems.append(f"{name} ({cls}) is not a diffusers ModelMixin")
        lists = block_lists(transformer)
        if not lists:
            problems.append(f"{name} ({cls}) has no block ModuleList attribute")
        block_classes = {type(b).__name__ for blocks in lists.values() for b in blocks}
        repeated = list(getattr(transformer, "_repeated_blocks", None) or [])
        if not repeated:
            problems.append(f"{name} ({cls}) sets no _repeated_blocks")
        elif missing := [r for r in repeated if r not in block_classes]:
            problems.append(f"{name}._repeated_blocks names {', '.join(missing)}, no block class of its lists "
                            f"({', '.join(sorted(block_classes))})")
        foreign = sorted({type(m).__name__ for m in transformer.modules()
                          if is_attention_module(m) and not isinstance(m, attention_classes)})
        if foreign:
            problems.append(f"{name}: attention modules that are not diffusers attention classes, so CP never sets "
                            f"their _cp_config: {', '.join(foreign)}")
        notes.append(f"{name}: {cls}, lists {', '.join(lists)}, _repeated_blocks {repeated}")
    if problems:
        return failed("; ".join(problems))
    kind = "ModularPipeline" if isinstance(pipe, ModularPipeline) else "DiffusionPipeline"
    return passed(f"{type(pipe).__name__} is a {kind}; " + "; ".join(notes))


def model_folder(ctx: Context, args: dict[str, Any]) -> Outcome:
    index = ctx.model.path / "model_index.json"
    if not index.is_file() and (ctx.model.path / "modular_model_index.json").is_file():
        index = ctx.model.path / "modular_model_index.json"  # a ModularPipeline: [library, class, loading spec]
    try:
        entries = json.loads(index.read_text())
    except (OSError, ValueError) as exc:
        return failed(f"{index}: {exc}")
    components = {k: v for k, v in entries.items()
                  if not k.startswith("_") and isinstance(v, list) and len(v) in (2, 3) and all(v[:2])}
    problems, weighted = [], []
    for name in components:
        folder = ctx.model.path / name
        if not folder.is_dir():
            problems.append(f"{name}/ is missing")
            continue
        if (folder / "config.json").is_file():  # a model component (tokenizers and schedulers have other configs)
            if any(p.name.endswith(WEIGHT_SUFFIXES) or p.name.endswith(".index.json") for p in folder.iterdir()):
                weighted.append(name)
            else:
                problems.append(f"{name}/ has a config.json but no weights")
    if problems:
        return failed(f"{ctx.model.path}: " + "; ".join(problems))
    return passed(f"{ctx.model.path}: {index.name} names {len(components)} components, every folder is present; "
                  f"weights in {', '.join(weighted)}")
