"""Export: a passing integration file becomes cache-dit's own code (registrations, planners, an example and a
test), written into a cache-dit tree and proven there without the file.

`code_edits(tree, source, names)` composes the code (`ditgate.export.compose`) into the tree's pending edits
(`ditgate.export.tree.Tree`) after refusing a tree that already registers the name.

May import: `ditgate.core`, `ditgate.zoo`, `ditgate.twin`, `ditgate.metrics`, `ditgate.gates`, `ditgate.inspect`,
`ditgate.run`.
"""

from __future__ import annotations

from ditgate.export import compose
from ditgate.export.compose import Names
from ditgate.export.source import Source
from ditgate.export.tree import ADAPTERS, ADAPTERS_INIT, PLANNERS, ExportError, Tree

__all__ = ["ExportError", "Names", "Source", "Tree", "code_edits"]


def code_edits(tree: Tree, source: Source, names: Names) -> list[str]:
    """Add the adapter, its functor module and the planner module to the tree's edits; returns what cache-dit
    1.5.3 cannot take from the file (one line each), empty when it takes everything."""
    planners = compose.planner_module(source, names)
    functor, functor_names = compose.functor_module(source, names)
    adapter = compose.adapter_function(source, names, functor_names)
    origin = source.path.name
    marker = names.marker(origin)
    adapter_block = f"{marker}\n{adapter}\n" if adapter else None
    init_line = f'{names.slug}_adapter = _safe_import(".adapters", "{names.slug}_adapter")\n'
    planner_rel = f"cache_dit/distributed/transformers/{names.slug}.py"
    functor_rel = f"cache_dit/caching/patch_functors/functor_{names.slug}.py"
    _refuse_taken(tree, names, {ADAPTERS: adapter_block or "", planner_rel: planners or ""},
                  cache=adapter is not None, parallel=planners is not None)
    if adapter:
        tree.append(ADAPTERS, adapter_block)
        tree.append(ADAPTERS_INIT, init_line)
    if functor:
        tree.new_file(functor_rel, functor)
    if planners:
        module = names.slug
        if source.function("cp_plan") is not None:
            tree.insert_in_function(PLANNERS, "_activate_cp_planners", [
                f"  {names.prefix}ContextParallelismPlanner = _safe_import(  # noqa: F841",
                f'    ".{module}", "{names.prefix}ContextParallelismPlanner", ImportErrorContextParallelismPlanner)'],
                before_try=True)
        if source.function("tp_plan") is not None:
            tree.insert_in_function(PLANNERS, "_activate_tp_planners", [
                f"  {names.prefix}TensorParallelismPlanner = _safe_import(  # noqa: F841",
                f'    ".{module}", "{names.prefix}TensorParallelismPlanner", ImportErrorTensorParallelismPlanner)'])
        tree.new_file(planner_rel, planners)
    return []


def _refuse_taken(tree: Tree, names: Names, ours: dict[str, str], cache: bool, parallel: bool) -> None:
    for register, key, rel in tree.registrations(ours):
        adapter = register == "BlockAdapterRegister"
        if (adapter and not cache) or (not adapter and not parallel):
            continue
        matched = names.pipeline_class if adapter else names.transformer_class
        if key == names.prefix or matched.startswith(key):
            raise ExportError(f"{tree.root} already registers {key!r} ({register} in {rel}), which matches "
                              f"{matched}: cache-dit would use that entry, not the exported one")
