"""Named checks of the cache phase: what the integration provides, the ForwardPattern, has_separate_cfg, the PatchFunctor, and the runs that must equal the baseline (caching off, a rerun)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any
from ditgate.run.define.rows import DEFAULT_CACHE, Row
from ditgate.checklists.context import Context, EXACT_PHASE, NamedCheckError, Outcome, _as_list, failed, passed


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
    plugged: bool = False  # the integration file built it: the pipeline now carries whatever its block_adapter did


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
        return AdapterView(f"block_adapter of {integration.path.name}", declared, cfg, functor, plugged=True)
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


def _observed_lists(ctx: Context, view: AdapterView) -> list[dict[str, Any]]:
    """The block lists to judge the adapter on, as the blocks were seen to run (inputs, outputs in return order).

    An integration file's block_adapter may change the model it is given (a list of its own, such as pairs of
    interleaved blocks, and a forward that loops over it): its lists are then observed on one more probe run of the
    pipeline after block_adapter ran, not taken from the inspection of the untouched model."""
    if not view.plugged:
        return ctx.need_anatomy()["block_lists"]
    if ctx.plugged_lists is None:
        from ditgate.inspect.anatomy import build_call, classify_components, run_probe
        from ditgate.inspect.blocks import _analyse_lists

        pipe = ctx.pipe()  # the one block_adapter(pipe) was given by _adapter_view
        transformers = classify_components(pipe)["transformers"]
        call, _ = build_call(pipe, ctx.model.request)
        probe = run_probe(pipe, transformers, call, ctx.model.request.seed)
        ctx.plugged_lists = [asdict(b) for name, t in transformers.items()
                             for b in _analyse_lists(name, t, probe.transformers[name])[0]]
    return ctx.plugged_lists


def _declared_of(view: AdapterView, observed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The observed lists the adapter declares (a list merged from several attributes counts with each)."""
    names = {(d.transformer, a) for d in view.lists for a in d.attributes}
    return [b for b in observed if (b["transformer"], b["attribute"]) in names]


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
    observed = {(b["transformer"], b["attribute"]): b for b in _observed_lists(ctx, view)}
    seen_as = "as observed after block_adapter ran" if view.plugged else "as observed"
    good, bad = [], []
    for declared in view.lists:
        if not declared.attributes:
            bad.append(f"a block list of {declared.transformer} that is no ModuleList attribute of it")
        for attribute in declared.attributes:
            seen = observed.get((declared.transformer, attribute))
            if seen is None:
                bad.append(f"{attribute}: not a block list of {declared.transformer} that the pipeline called "
                           "(a ModuleList attribute of blocks of one class)")
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
    return passed(f"{view.source}: " + ", ".join(good) + f" — {seen_as}, from the order the blocks return")


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
    view = _adapter_view(ctx)
    if view is None:  # no adapter: every list inspect observed could be cached by one
        lists, which = ctx.need_anatomy()["block_lists"], "every block loop inspect observed"
    else:  # only the lists the adapter caches: a list it leaves alone runs whole, its loop included
        lists = _declared_of(view, _observed_lists(ctx, view))
        which = "the loop of every block list the adapter declares" + (
            " (observed after block_adapter ran)" if view.plugged else "")
    needed = [b for b in lists if b["patch_functor_needed"]]
    if not needed:
        return passed(f"{which} does nothing but call its blocks: no PatchFunctor needed")
    if view is None:
        return _no_adapter(ctx)
    findings = "; ".join(f"{b['attribute']}: {', '.join(b['loop_findings'])}" for b in needed)
    if view.patch_functor:
        return passed(f"extra work in the block loop ({findings}); {view.source} has {view.patch_functor}")
    return failed(f"extra work in the block loop that caching would drop ({findings}); {view.source} has no "
                  "patch_functor")


def _steps(ctx: Context) -> int:
    steps = ctx.model.request.steps
    if not steps:
        raise NamedCheckError("the number of denoising steps is not known: pass --steps")
    return steps


def _all_steps_row(ctx: Context, args: dict[str, Any]) -> list[Row]:
    return [Row("cache-all-steps", baseline=None, cache=DEFAULT_CACHE | ctx.cache_config | {"mask": [1] * _steps(ctx)},
                description="the cache rows' configuration with a mask that computes every step")]


def _rerun_row(ctx: Context, args: dict[str, Any]) -> list[Row]:
    return [Row("baseline-rerun", baseline=None, description="the baseline a second time, in the same run")]


def _equals_baseline(ctx: Context, name: str, what: str) -> Outcome:
    from ditgate.run.exec import files as store
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
                       noise=load("baseline", "noise"), dtype=ctx.model.dtype, sample_rate=cand.get("sample_rate"))
    shown = ", ".join(f"{k} {format_value(k, v)}" for k, v in verdict.metrics.items() if k != "worst_tile_ssim")
    if verdict.passed:
        return passed(f"{what} equals the baseline within the exact gate (phase {EXACT_PHASE}): {shown}")
    return failed(f"{what} differs from the baseline: " + "; ".join(verdict.reasons) + f" ({shown})")


def cache_off_identical(ctx: Context, args: dict[str, Any]) -> Outcome:
    return _equals_baseline(ctx, "cache-all-steps", "with the cache applied but every step computed, the output")


def baseline_reproducible(ctx: Context, args: dict[str, Any]) -> Outcome:
    return _equals_baseline(ctx, "baseline-rerun", "a second baseline run")
