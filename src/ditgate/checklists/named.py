"""Named checks: checklist items that are neither one runner row nor one inspect fact.

A checklist item `check: {kind: named, name: NAME, args: {...}}` runs the check `NAME` of `CHECKS`, the one
registry. Each check says what it needs: the inspect anatomy of the model, the loaded pipeline, extra runner rows
(batched into the checklist's single runner call) or a pipeline it may change (run last, on a fresh load). Each
returns an `Outcome`: pass or fail with the evidence, in words. A check that cannot be evaluated raises; the
checklist records that item as an error.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ditgate.core.errors import DitgateError
from ditgate.core.request import Request
from ditgate.run.rows import DEFAULT_CACHE, Row

EXACT_PHASE = "cp"  # the gate used for "equals the baseline": an exact phase (image gate + float32 tensor rule)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf")


class NamedCheckError(DitgateError):
    """A named check cannot be evaluated (missing input, unknown argument)."""


@dataclass(frozen=True)
class Outcome:
    status: str  # "pass" or "fail"
    evidence: str


def passed(evidence: str) -> Outcome:
    return Outcome("pass", evidence)


def failed(evidence: str) -> Outcome:
    return Outcome("fail", evidence)


@dataclass
class Context:
    """What a check may look at. The checklist runner fills `anatomy`, `run_dir` and `report` as it goes."""

    model: str
    model_path: Path
    request: Request
    dtype: str = "float32"
    device: str = "cpu"
    integration_path: Path | None = None
    pipeline: str | None = None
    trust_remote_code: bool = False
    anatomy: dict[str, Any] | None = None
    run_dir: Path | None = None
    report: dict[str, Any] | None = None
    _integration: Any = field(default=None, repr=False)
    _pipe: Any = field(default=None, repr=False)

    def integration(self):
        """The integration file, imported once (None without --integration)."""
        if self.integration_path is None:
            return None
        if self._integration is None:
            from ditgate.core import plugin

            self._integration = plugin.load(self.integration_path)
        return self._integration

    def pipe(self):
        if self._pipe is None:
            from ditgate.core.loader import load

            self._pipe = load(self.model_path, dtype=self.dtype, device=self.device, pipeline=self.pipeline,
                              trust_remote_code=self.trust_remote_code)
        return self._pipe

    def drop_pipe(self) -> None:
        import gc

        self._pipe = None
        gc.collect()

    def need_anatomy(self) -> dict[str, Any]:
        if self.anatomy is None:
            raise NamedCheckError("the inspect anatomy of the model is not available")
        return self.anatomy

    def row(self, name: str) -> dict[str, Any] | None:
        rows = (self.report or {}).get("rows", [])
        return next((r for r in rows if r["name"] == name), None)


@dataclass(frozen=True)
class Arg:
    kind: type = str
    choices: tuple[Any, ...] | None = None
    required: bool = False
    default: Any = None


@dataclass(frozen=True)
class NamedCheck:
    name: str
    summary: str
    run: Callable[[Context, dict[str, Any]], Outcome]
    args: dict[str, Arg] = field(default_factory=dict)
    anatomy: bool = False  # needs the inspect anatomy
    pipe: bool = False  # needs the loaded pipeline (not changed)
    mutates: bool = False  # changes the pipeline it is given: runs after the runner, on a fresh load
    rows: Callable[[Context, dict[str, Any]], list[Row]] | None = None  # runner rows it is judged on

    def arg_errors(self, args: Any) -> list[tuple[str, str]]:
        """(field, problem) for every argument that does not fit this check."""
        if not isinstance(args, dict):
            return [("args", "must be a mapping")]
        problems = [(f"args.{k}", f"unknown argument of {self.name}; it takes: {', '.join(self.args) or 'none'}")
                    for k in args if k not in self.args]
        for key, spec in self.args.items():
            if key not in args:
                if spec.required:
                    problems.append((f"args.{key}", f"{self.name} needs this argument"))
                continue
            value = args[key]
            if not isinstance(value, spec.kind) or isinstance(value, bool) and spec.kind is not bool:
                problems.append((f"args.{key}", f"must be {spec.kind.__name__}, got {value!r}"))
            elif spec.choices is not None and value not in spec.choices:
                problems.append((f"args.{key}", f"{value!r} is not one of {', '.join(map(str, spec.choices))}"))
        return problems

    def with_defaults(self, args: dict[str, Any] | None) -> dict[str, Any]:
        return {k: a.default for k, a in self.args.items() if a.default is not None} | dict(args or {})


# ------------------------------------------------------------------------------------------------ helpers
def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _component_name(pipe, module) -> str:
    for name, value in getattr(pipe, "components", {}).items():
        if value is module:
            return name
    return type(module).__name__


def _list_attributes(transformer, blocks) -> list[str]:
    """Attribute name(s) of a block ModuleList on `transformer`; a list merged from several names them all."""
    import torch

    lists = {n: c for n, c in transformer.named_children() if isinstance(c, torch.nn.ModuleList)}
    for name, child in lists.items():
        if child is blocks:
            return [name]
    members = {id(m) for m in blocks}
    return [n for n, c in lists.items() if len(c) and all(id(m) in members for m in c)]


@dataclass(frozen=True)
class Declared:
    """One block list as an adapter declares it."""

    transformer: str
    attributes: list[str]
    pattern: str


@dataclass(frozen=True)
class AdapterView:
    source: str  # where the adapter comes from, in words
    lists: list[Declared]
    has_separate_cfg: bool  # the value cache-dit will use when the cache config leaves it unset
    patch_functor: str | None


def _adapter_view(ctx: Context) -> AdapterView | None:
    """The block adapter the cache rows use: the integration file's, else the one cache-dit registers."""
    integration = ctx.integration()
    if integration is not None and integration.block_adapter is not None:
        from cache_dit.caching.block_adapters.block_registers import BlockAdapterRegister

        pipe = ctx.pipe()
        adapter = integration.block_adapter(pipe)
        transformers = _as_list(adapter.transformer)
        blocks = adapter.blocks if len(transformers) > 1 else [adapter.blocks]
        patterns = adapter.forward_pattern if len(transformers) > 1 else [adapter.forward_pattern]
        declared = []
        for transformer, t_blocks, t_patterns in zip(transformers, blocks, patterns):
            t_blocks, t_patterns = _as_list(t_blocks), _as_list(t_patterns)
            t_name = _component_name(pipe, transformer)
            if len(t_blocks) != len(t_patterns):
                raise NamedCheckError(f"the adapter gives {len(t_blocks)} block list(s) of {t_name} but "
                                      f"{len(t_patterns)} forward pattern(s)")
            for b, p in zip(t_blocks, t_patterns):
                declared.append(Declared(t_name, _list_attributes(transformer, b), getattr(p, "name", str(p))))
        cfg = bool(adapter.has_separate_cfg) or BlockAdapterRegister.has_separate_cfg(pipe)
        functor = type(adapter.patch_functor).__name__ if adapter.patch_functor is not None else None
        return AdapterView(f"block_adapter of {integration.path.name}", declared, cfg, functor)
    registered = ctx.need_anatomy()["cache_dit"].get("adapter")
    if not registered or registered.get("error"):
        return None
    declared = []
    for t_name, t_lists, t_patterns in zip(registered["transformers"], registered["block_lists"],
                                           registered["forward_patterns"]):
        for names, pattern in zip(t_lists, t_patterns):
            declared.append(Declared(t_name, names.split(" + "), pattern))
    return AdapterView(f"cache-dit's registered adapter {registered['function']} (prefix {registered['prefix']!r})",
                       declared, bool(registered["has_separate_cfg"]), registered.get("patch_functor"))


def _no_adapter(ctx: Context) -> Outcome:
    error = ctx.need_anatomy()["cache_dit"].get("adapter_error")
    return failed("no block adapter: no integration file defines block_adapter, and cache-dit registers none for "
                  f"{ctx.need_anatomy()['pipeline']['cls']}" + (f" ({error})" if error else ""))


# ------------------------------------------------------------------------------------------------ checks
def integration_provides(ctx: Context, args: dict[str, Any]) -> Outcome:
    hook = args["hook"]
    from ditgate.core.plugin import PluginError

    try:
        integration = ctx.integration()
    except PluginError as exc:
        return failed(str(exc))
    if integration is not None and getattr(integration, hook) is not None:
        return passed(f"{integration.path.name} defines {hook}")
    support = ctx.need_anatomy()["cache_dit"]
    if hook == "block_adapter":
        adapter = support.get("adapter")
        if adapter and not adapter.get("error"):
            return passed(f"cache-dit registers the adapter {adapter['function']} (prefix {adapter['prefix']!r})")
        return _no_adapter(ctx)
    planners = support["cp_planners" if hook == "cp_plan" else "tp_planners"]
    kind = "CP" if hook == "cp_plan" else "TP"
    missing = [t for t, p in planners.items() if not p]
    if planners and not missing:
        return passed(", ".join(f"{t}: cache-dit's {p}" for t, p in planners.items()))
    where = f"the integration file defines no {hook}" if integration is not None else "no integration file"
    return failed(f"{where}, and cache-dit has no {kind} planner for {', '.join(missing) or 'the transformer'}")


def forward_pattern_matches(ctx: Context, args: dict[str, Any]) -> Outcome:
    view = _adapter_view(ctx)
    if view is None:
        return _no_adapter(ctx)
    observed = {(b["transformer"], b["attribute"]): b for b in ctx.need_anatomy()["block_lists"]}
    good, bad = [], []
    for declared in view.lists:
        if not declared.attributes:
            bad.append(f"a block list of {declared.transformer} that is no ModuleList attribute of it")
        for attribute in declared.attributes:
            seen = observed.get((declared.transformer, attribute))
            if seen is None:
                bad.append(f"{attribute}: not a block list inspect found on {declared.transformer}")
            elif seen["pattern"] is None:
                bad.append(f"{attribute}: declared {declared.pattern}, but no ForwardPattern fits what inspect "
                           f"observed ({seen['pattern_reason'] or 'the list was not called'})")
            elif seen["pattern"] != declared.pattern:
                bad.append(f"{attribute}: declared {declared.pattern}, observed {seen['pattern']} "
                           f"(outputs {', '.join(seen['outputs'] or [])})")
            else:
                good.append(f"{attribute} {declared.pattern}")
    if bad:
        return failed(f"{view.source}: " + "; ".join(bad))
    return passed(f"{view.source}: " + ", ".join(good) + " — as observed")


def separate_cfg_matches(ctx: Context, args: dict[str, Any]) -> Outcome:
    view = _adapter_view(ctx)
    if view is None:
        return _no_adapter(ctx)
    anatomy = ctx.need_anatomy()
    calls = anatomy["calls_per_step"]
    observed = bool(anatomy["has_separate_cfg"])
    text = (f"the pipeline call made {calls:g} transformer call(s) per step (has_separate_cfg={observed}); "
            f"with {view.source} cache-dit uses has_separate_cfg={view.has_separate_cfg}")
    return passed(text) if observed == view.has_separate_cfg else failed(text)


def patch_functor_when_needed(ctx: Context, args: dict[str, Any]) -> Outcome:
    needed = [b for b in ctx.need_anatomy()["block_lists"] if b["patch_functor_needed"]]
    if not needed:
        return passed("every block loop inspect observed does nothing but call its blocks: no PatchFunctor needed")
    view = _adapter_view(ctx)
    if view is None:
        return _no_adapter(ctx)
    findings = "; ".join(f"{b['attribute']}: {', '.join(b['loop_findings'])}" for b in needed)
    if view.patch_functor:
        return passed(f"extra work in the block loop ({findings}); {view.source} has {view.patch_functor}")
    return failed(f"extra work in the block loop that caching would drop ({findings}); {view.source} has no "
                  "patch_functor")


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

    module = args["module"]
    ctx.integration()  # planners an integration file registers at import count
    pipe = ctx.pipe()
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
    from diffusers import DiffusionPipeline, ModelMixin

    from ditgate.inspect.observe import is_attention_module
    from ditgate.core.components import block_lists, transformers_of

    pipe = ctx.pipe()
    problems, notes = [], []
    if not isinstance(pipe, DiffusionPipeline):
        problems.append(f"{type(pipe).__name__} is not a diffusers DiffusionPipeline")
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
    return passed(f"{type(pipe).__name__} is a DiffusionPipeline; " + "; ".join(notes))


def model_folder(ctx: Context, args: dict[str, Any]) -> Outcome:
    index = ctx.model_path / "model_index.json"
    try:
        entries = json.loads(index.read_text())
    except (OSError, ValueError) as exc:
        return failed(f"{index}: {exc}")
    components = {k: v for k, v in entries.items()
                  if not k.startswith("_") and isinstance(v, list) and len(v) == 2 and all(v)}
    problems, weighted = [], []
    for name in components:
        folder = ctx.model_path / name
        if not folder.is_dir():
            problems.append(f"{name}/ is missing")
            continue
        if (folder / "config.json").is_file():  # a model component (tokenizers and schedulers have other configs)
            if any(p.name.endswith(WEIGHT_SUFFIXES) or p.name.endswith(".index.json") for p in folder.iterdir()):
                weighted.append(name)
            else:
                problems.append(f"{name}/ has a config.json but no weights")
    if problems:
        return failed(f"{ctx.model_path}: " + "; ".join(problems))
    return passed(f"{ctx.model_path}: model_index.json names {len(components)} components, every folder is present; "
                  f"weights in {', '.join(weighted)}")


def _steps(ctx: Context) -> int:
    steps = ctx.request.steps
    if not steps:
        raise NamedCheckError("the number of denoising steps is not known: pass --steps")
    return steps


def _all_steps_row(ctx: Context, args: dict[str, Any]) -> list[Row]:
    return [Row("cache-all-steps", baseline=None, cache=DEFAULT_CACHE | {"mask": [1] * _steps(ctx)},
                description="the cache rows' configuration with a mask that computes every step")]


def _rerun_row(ctx: Context, args: dict[str, Any]) -> list[Row]:
    return [Row("baseline-rerun", baseline=None, description="the baseline a second time, in the same run")]


def _equals_baseline(ctx: Context, name: str, what: str) -> Outcome:
    from ditgate.run import store
    from ditgate.gates.verdicts import evaluate, format_value

    base, cand = ctx.row("baseline"), ctx.row(name)
    if base is None or base["status"] != "reference":
        raise NamedCheckError("the baseline row did not run: " + "; ".join((base or {}).get("reasons") or []))
    if cand is None:
        raise NamedCheckError(f"the row {name} is not in the run")
    if cand["status"] == "error":
        error = cand.get("error") or {}
        if error.get("preflight"):
            raise NamedCheckError(error.get("message", "not run"))
        return failed(f"{what} raised: {error.get('message', 'unknown error')}")
    load = lambda row, key: store.load_array(ctx.run_dir, row, key)  # noqa: E731
    latents = (load("baseline", "latents"), load(name, "latents"))
    verdict = evaluate(EXACT_PHASE, cand["modality"], load("baseline", "output"), load(name, "output"),
                       latents=latents if all(x is not None for x in latents) else None,
                       noise=load("baseline", "noise"), dtype=ctx.dtype, sample_rate=cand.get("sample_rate"))
    shown = ", ".join(f"{k} {format_value(k, v)}" for k, v in verdict.metrics.items() if k != "worst_tile_ssim")
    if verdict.passed:
        return passed(f"{what} equals the baseline within the exact gate (phase {EXACT_PHASE}): {shown}")
    return failed(f"{what} differs from the baseline: " + "; ".join(verdict.reasons) + f" ({shown})")


def cache_off_identical(ctx: Context, args: dict[str, Any]) -> Outcome:
    return _equals_baseline(ctx, "cache-all-steps", "with the cache applied but every step computed, the output")


def baseline_reproducible(ctx: Context, args: dict[str, Any]) -> Outcome:
    return _equals_baseline(ctx, "baseline-rerun", "a second baseline run")


CHECKS: dict[str, NamedCheck] = {c.name: c for c in (
    NamedCheck("integration-provides", "the integration file defines HOOK, or cache-dit registers one for the class",
               integration_provides, {"hook": Arg(choices=("block_adapter", "cp_plan", "tp_plan"), required=True)},
               anatomy=True),
    NamedCheck("forward-pattern-matches", "each block list's declared ForwardPattern is the one inspect observed",
               forward_pattern_matches, anatomy=True, pipe=True),
    NamedCheck("separate-cfg-matches", "the has_separate_cfg cache-dit will use matches the observed calls per step",
               separate_cfg_matches, anatomy=True, pipe=True),
    NamedCheck("patch-functor-when-needed", "a block loop that does more than call blocks has a PatchFunctor",
               patch_functor_when_needed, anatomy=True, pipe=True),
    NamedCheck("cache-off-identical", "with the cache applied but every step computed, the output equals the baseline",
               cache_off_identical, rows=_all_steps_row),
    NamedCheck("baseline-reproducible", "a second baseline run equals the first", baseline_reproducible,
               rows=_rerun_row),
    NamedCheck("cp-plan-consistent", "the CP plan's keys and inputs exist, and what it splits it also gathers",
               cp_plan_consistent, {"ranks": Arg(kind=int, default=2)}, pipe=True, mutates=True),
    NamedCheck("extra-module-planner", "cache-dit has a planner for the module 'text_encoder' or 'vae' resolves to",
               extra_module_planner, {"module": Arg(choices=("text_encoder", "vae"), required=True)}, pipe=True),
    NamedCheck("model-contract", "DiffusionPipeline, ModelMixin transformers, block lists, _repeated_blocks, "
               "diffusers attention classes", model_contract, pipe=True),
    NamedCheck("model-folder", "model_index.json and every component folder it names, with weights", model_folder),
)}
