"""Export: a passing integration file becomes cache-dit's own code (registrations, planners, an example and a
test), written into a cache-dit tree and proven there without the file.

`code_edits(tree, source, names)` composes the code (`ditgate.export.compose`) into the tree's pending edits
(`ditgate.export.tree.Tree`) after refusing a tree that already registers the name.

May import: `ditgate.core`, `ditgate.zoo`, `ditgate.twin`, `ditgate.metrics`, `ditgate.gates`, `ditgate.inspect`,
`ditgate.run`.
"""

from __future__ import annotations

from pathlib import Path

from ditgate.export import compose
from ditgate.export.compose import Names
from ditgate.export.source import Source
from ditgate.export.tree import ADAPTERS, ADAPTERS_INIT, PLANNERS, ExportError, Tree

__all__ = ["ExportError", "Names", "Source", "Tree", "code_edits"]


def code_edits(tree: Tree, source: Source, names: Names, hooks: set[str] | None = None) -> None:
    """Add the adapter, its functor module and the planner module to the tree's edits, after refusing a tree that
    already registers the name. A shorter prefix the tree registers that also matches the model's classes ("Flux"
    for Flux3) would catch them first (cache-dit takes the first prefix that matches, in registration order): the
    exported entries go in ahead of it. `hooks`: the ones to export (those the proving rows cover; all when None)."""
    source = source.only(hooks) if hooks is not None else source
    planners = compose.planner_module(source, names)
    functor, functor_names = compose.functor_module(source, names)
    adapter = compose.adapter_function(source, names, functor_names)
    marker = names.marker(source.path.name)
    adapter_block = f"{marker}\n{adapter}\n" if adapter else None
    planner_rel = f"cache_dit/distributed/transformers/{names.slug}.py"
    functor_rel = f"cache_dit/caching/patch_functors/functor_{names.slug}.py"
    ahead = _refuse_taken(tree, names, {ADAPTERS: adapter_block or "", planner_rel: planners or ""},
                          cache=adapter is not None, parallel=planners is not None)
    if adapter:
        tree.insert_before(ADAPTERS, adapter_block, [f'@BlockAdapterRegister.register("{k}")'
                                                     for k in ahead.get("BlockAdapterRegister", [])])
        tree.append(ADAPTERS_INIT, f'{names.slug}_adapter = _safe_import(".adapters", "{names.slug}_adapter")\n')
    if functor:
        tree.new_file(functor_rel, functor)
    if planners:
        for kind, function, hook in (("Context", "_activate_cp_planners", "cp_plan"),
                                     ("Tensor", "_activate_tp_planners", "tp_plan")):
            if source.function(hook) is None:
                continue
            modules = [Path(rel).stem for rel in ahead.get(f"{kind}ParallelismPlannerRegister", [])]
            tree.insert_in_function(PLANNERS, function, [
                f"  {names.prefix}{kind}ParallelismPlanner = _safe_import(  # noqa: F841",
                f'    ".{names.slug}", "{names.prefix}{kind}ParallelismPlanner", ImportError{kind}ParallelismPlanner)'],
                before_try=kind == "Context", before_modules=modules)
        tree.new_file(planner_rel, planners)


def _refuse_taken(tree: Tree, names: Names, ours: dict[str, str], cache: bool, parallel: bool) -> dict[str, list]:
    """Refuse a tree that registers the prefix itself; the registrations of shorter prefixes that match the model's
    classes ({register: [key (adapters) or file (planners)]}), which the export goes ahead of."""
    ahead: dict[str, list] = {}
    for register, key, rel in tree.registrations(ours):
        adapter = register == "BlockAdapterRegister"
        if register == "ExampleRegister" or (adapter and not cache) or (not adapter and not parallel):
            continue
        matched = names.pipeline_class if adapter else names.transformer_class
        if key == names.prefix:
            raise ExportError(f"{tree.root} already registers {key!r} ({register} in {rel}): cache-dit would use "
                              "that entry, not the exported one; export into a tree without it")
        if matched.startswith(key):
            ahead.setdefault(register, []).append(key if adapter else rel)
    return ahead
