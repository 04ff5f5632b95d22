"""What an export writes into cache-dit's tree, composed from the integration file's source.

- `caching/block_adapters/adapters.py`: the file's `block_adapter` as `@BlockAdapterRegister.register(PREFIX)`
  `<slug>_adapter(pipe, **kwargs)`, the keyword arguments cache-dit passes (`skip_post_init`, ...) handed to
  `BlockAdapter`, the imports it uses inside it (as cache-dit's adapters import their classes);
  `caching/block_adapters/__init__.py` imports it with `_safe_import` like every built-in adapter;
- `caching/patch_functors/functor_<slug>.py`: what the adapter needs besides (a patch of the transformer, a block
  wrapper), where cache-dit keeps its patch functors;
- `distributed/transformers/<slug>.py`: `cp_plan` / `tp_plan` and every helper and processor they use, and the
  `ContextParallelismPlanner` / `TensorParallelismPlanner` subclasses registered for the transformer's class;
  `planners.py`' `_activate_cp_planners` / `_activate_tp_planners` import them.

Every edit of an existing file is one block at a fixed place, so that composing again yields the same tree.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from ditgate.export.source import DITGATE_ONLY, Source, two_space

HOOKS = ("block_adapter", "cp_plan", "tp_plan")


@dataclass(frozen=True)
class Names:
    """How the model is named in cache-dit: the registry prefix, the module slug, the class names it matches."""
    prefix: str  # "TinyMM": registry key of the adapter and the planners (cache-dit matches class-name prefixes)
    slug: str  # "tinymm": module and function names
    pipeline_class: str
    transformer_class: str

    @classmethod
    def of(cls, pipeline_class: str, transformer_class: str) -> "Names":
        prefix = pipeline_class[:-len("Pipeline")] if pipeline_class.endswith("Pipeline") else pipeline_class
        if not transformer_class.startswith(prefix):
            cut = transformer_class.find("Transformer")
            prefix = transformer_class[:cut] if cut > 0 else transformer_class
        slug = re.sub(r"\W", "_", prefix).lower()
        return cls(prefix=prefix, slug=slug, pipeline_class=pipeline_class, transformer_class=transformer_class)

    def marker(self, origin: str) -> str:
        return f"# {self.prefix}: exported by ditgate from {origin}"


def header(names: Names, origin: str, what: str) -> str:
    return f'"""{names.prefix}: {what}.\n\nExported by ditgate from the integration file {origin}."""\n'


def planner_module(source: Source, names: Names) -> str | None:
    roots = [h for h in ("cp_plan", "tp_plan") if source.function(h) is not None]
    if not roots:
        return None
    definitions = source.needed(roots, exclude=set(DITGATE_ONLY))
    uses = source.uses_of(definitions)
    lines = [header(names, source.path.name, "context- and tensor-parallel planners"), ""]
    lines += source.imports_for(uses)
    registers = []
    if "cp_plan" in roots:
        registers += ["ContextParallelismPlanner", "ContextParallelismPlannerRegister"]
    if "tp_plan" in roots:
        registers += ["TensorParallelismPlanner", "TensorParallelismPlannerRegister"]
    lines.append("from .register import (\n" + "".join(f"    {r},\n" for r in registers) + ")")
    body = [source.text(definitions)]
    if "cp_plan" in roots:
        body.append(f'@ContextParallelismPlannerRegister.register("{names.prefix}")\n'
                    f"class {names.prefix}ContextParallelismPlanner(ContextParallelismPlanner):\n\n"
                    "    def _apply(self, transformer=None, parallelism_config=None, **kwargs):\n"
                    "        return cp_plan(transformer, parallelism_config)")
    if "tp_plan" in roots:
        body.append(f'@TensorParallelismPlannerRegister.register("{names.prefix}")\n'
                    f"class {names.prefix}TensorParallelismPlanner(TensorParallelismPlanner):\n\n"
                    "    def _apply(self, transformer, parallelism_config, **kwargs):\n"
                    "        layer_plans = tp_plan(transformer, self.mesh(parallelism_config), parallelism_config)\n"
                    "        return transformer, list(layer_plans or [])")
    return two_space(_module(lines, "\n\n\n".join(body)))


def functor_module(source: Source, names: Names) -> tuple[str | None, list[str]]:
    """The module of what the adapter needs besides itself, and the names the adapter imports from it."""
    if source.function("block_adapter") is None:
        return None, []
    definitions = [n for n in source.needed(["block_adapter"], exclude=set(DITGATE_ONLY)) if n != "block_adapter"]
    if not definitions:
        return None, []
    direct = sorted(source.uses_of(["block_adapter"]) & set(definitions))
    lines = [header(names, source.path.name, "what its BlockAdapter patches"), ""]
    lines += source.imports_for(source.uses_of(definitions))
    return two_space(_module(lines, source.text(definitions))), direct


def _module(head: list[str], body: str) -> str:
    """A module's text: its docstring, its imports (if any), two blank lines, the body."""
    doc, imports = head[0], [line for line in head[1:] if line]
    return doc + ("\n" + "\n".join(imports) if imports else "") + "\n\n\n" + body + "\n"


def adapter_function(source: Source, names: Names, functor_names: list[str]) -> str | None:
    node = source.function("block_adapter")
    if node is None:
        return None
    if not node.args.args:
        raise ValueError("block_adapter takes the pipeline as its first argument")
    pipe = node.args.args[0].arg
    text = _with_kwargs(source, node)
    body_start = node.body[0].lineno
    body = text.split("\n")[body_start - node.lineno:]
    local_imports = source.imports_for(source.uses_of(["block_adapter"]) - set(functor_names))
    if functor_names:
        local_imports.append(f"from cache_dit.caching.patch_functors.functor_{names.slug} import "
                             f"({', '.join(functor_names)})")
    indent = " " * (len(body[0]) - len(body[0].lstrip()))
    code = "\n".join([f'@BlockAdapterRegister.register("{names.prefix}")',
                      f"def {names.slug}_adapter({pipe}, **kwargs) -> BlockAdapter:"]
                     + [indent + line for line in local_imports] + ([""] if local_imports else []) + body)
    return two_space(code)


def _with_kwargs(source: Source, node: ast.FunctionDef) -> str:
    """The function's source (from its `def` line) with `**kwargs` handed to every BlockAdapter(...) it makes."""
    lines = source.lines[node.lineno - 1:node.end_lineno]
    edits = []
    for call in ast.walk(node):
        if not isinstance(call, ast.Call):
            continue
        func = call.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name != "BlockAdapter" or any(k.arg is None for k in call.keywords):
            continue
        last = max([*call.args, *call.keywords], key=lambda a: (a.end_lineno, a.end_col_offset), default=None)
        if last is None:
            edits.append((call.func.end_lineno, call.func.end_col_offset + 1, "**kwargs"))
        else:
            edits.append((last.end_lineno, last.end_col_offset, ", **kwargs"))
    for line, col, text in sorted(edits, reverse=True):
        row = line - node.lineno
        lines[row] = lines[row][:col] + text + lines[row][col:]
    return "\n".join(lines)
