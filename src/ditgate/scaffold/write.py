"""The plugin `ditgate scaffold` writes, from an observed anatomy.

`observe(model)` inspects the model on its call (`ditgate.inspect.anatomy.inspect_model`) and records the
transformer's own inputs on its first call; `plugin_source(observed)` returns the plugin's Python source. Every
decision is a comment naming the observation behind it; where another choice is possible it is named with the row
(`cp-ulysses-2`, `tp-2`, `cache`) that tells the two apart.
"""

from __future__ import annotations

import inspect as pyinspect
import re
from dataclasses import dataclass, field
from typing import Any

from ditgate.core.errors import DitgateError
from ditgate.scaffold.cp import _blocks_expr, _cp
from ditgate.scaffold.halved import run_halved
from ditgate.scaffold.joint import watch_pieces
from ditgate.scaffold.loop import FUNCTOR, _functor
from ditgate.scaffold.runtime import HELPERS
from ditgate.scaffold.tp import _tp_layers

# the names an attention gives the size of one head, which TP never divides (Krea 2's `head_dim`, diffusers' `dim_head`)
PER_HEAD_SIZE = re.compile(r"(attn_|attention_)?(head_dim|dim_head|head_size)")


@dataclass
class Observed:
    anatomy: Any  # ditgate.inspect.model.Anatomy
    roots: dict[str, dict[str, list[int]]] = field(default_factory=dict)  # transformer -> input name -> shape
    root_lists: dict[str, dict[str, list[list[int]]]] = field(default_factory=dict)  # inputs given as tensor lists
    pieces: dict[str, dict[str, tuple]] = field(default_factory=dict)  # list -> (first-block input, dim, ndim)
    child_inputs: dict[str, list[list[int]]] = field(default_factory=dict)  # transformer child -> its tensor inputs
    processors: dict[str, dict[str, Any]] = field(default_factory=dict)  # attention group -> what its processor does
    order: list[str] = field(default_factory=list)  # transformer children and first blocks ("list.0"), as first called
    halved: dict[str, Any] = field(default_factory=dict)  # transformer -> its call whole and halved (scaffold.halved)


def observe(model) -> Observed:
    """The anatomy of `model` on its call, with each transformer's first-call inputs (tensor shapes by name), the
    tensor inputs of its direct children (and each block list's first block) on that call, the order they were first
    called in, and what each attention group's processor passes on."""
    import torch

    from ditgate.inspect.anatomy import classify_components, inspect_model
    from ditgate.inspect.observe import block_lists

    seen = Observed(None)
    handles, first_calls = [], {}

    def hook_all(pipe):
        for name, module in classify_components(pipe)["transformers"].items():
            def pre(mod, args, kwargs, name=name):
                if name in seen.roots:
                    return None
                try:
                    bound = pyinspect.signature(mod.forward).bind_partial(*args, **kwargs).arguments
                except TypeError:
                    bound = dict(kwargs)
                seen.roots[name] = {k: list(v.shape) for k, v in bound.items() if isinstance(v, torch.Tensor)}
                first_calls[name] = (mod, {k: v.clone() if torch.is_tensor(v) else v for k, v in bound.items()})
                seen.root_lists[name] = {k: [list(x.shape) for x in v] for k, v in bound.items()
                                         if isinstance(v, (list, tuple)) and v and all(torch.is_tensor(x) for x in v)}
                return None
            handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
            firsts = [(f"{attribute}.0", blocks[0]) for attribute, blocks in block_lists(module).items() if blocks]
            for child_name, child in [*module.named_children(), *firsts]:
                def child_pre(mod, args, kwargs, key=child_name):
                    if key not in seen.order:
                        seen.order.append(key)
                    if key not in seen.child_inputs:
                        seen.child_inputs[key] = [list(a.shape) for a in (*args, *kwargs.values())
                                                  if isinstance(a, torch.Tensor)]
                handles.append(child.register_forward_pre_hook(child_pre, with_kwargs=True))
            _processors(module, seen.processors, handles)
            watch_pieces(module, name, seen, handles)

    try:
        seen.anatomy = inspect_model(model, on_load=hook_all)
    finally:
        for handle in handles:
            handle.remove()
    run_halved(seen, first_calls)
    return seen


def _processors(transformer, out: dict[str, dict[str, Any]], handles: list) -> None:
    """Per attention group (`list.*.path`, or the path of a module outside every block list): whether its processor
    carries a CP config attribute, whether its code calls `dispatch_attention_fn` (so the call can be routed), the int
    attributes TP must divide (the query and key/value head counts whatever their name, inner widths, a width the
    processor computes with; never a per-head size), and (filled on the call) the keyword tables it receives with one
    row per head (`head_tables`: Mochi's RoPE, learned per head, [tokens, heads, dim])."""
    import sys

    import torch

    from ditgate.inspect.attention import _module_heads
    from ditgate.inspect.observe import _group_name, block_lists, is_attention_module

    lists = set(block_lists(transformer))
    for path, module in transformer.named_modules():  # a block list's first block stands for the list's group
        key = _group_name(path, lists)
        if not is_attention_module(module) or key in out:
            continue
        processor = getattr(module, "processor", None)
        namespace = vars(sys.modules.get(type(processor).__module__, pyinspect)) if processor is not None else {}
        widths = {getattr(getattr(module, n, None), "out_features", None) for n in ("to_q", "to_k", "to_v")}
        heads, kv_heads, _ = _module_heads(module)  # as inspect reads them (kv heads: to_k width / head size)
        try:  # a CP config attribute counts only where the processor's code hands it on
            code = pyinspect.getsource(type(processor).__call__) if processor is not None else ""
        except (OSError, TypeError):
            code = ""
        # widths TP divides: head counts and inner widths, and any width the processor reshapes with (OmniGen's
        # `attn.out_dim`, the heads' joint width before the output projection); an attribute the code only tests
        # against None (Flux's `attn.added_kv_proj_dim is not None`, the text's input width) shapes nothing; a per-head
        # size is told by its name, not its value (stable-audio's `sliceable_head_dim` is its 8 heads, of size 8)
        used = set(re.findall(r"\battn\.(\w+)\b(?!\s+is\b)", code))
        divide = [n for n, v in vars(module).items() if isinstance(v, int) and not isinstance(v, bool)
                  and ("head" in n or "inner" in n or n in used)
                  and (v in widths or v in (heads, kv_heads)) and not PER_HEAD_SIZE.fullmatch(n)]
        group = out[key] = {
            "passes_cp": any(hasattr(processor, n) and n.lstrip("_") in code
                             for n in ("_parallel_config", "_cp_config")),
            "routable": "dispatch_attention_fn" in namespace or "scaled_dot_product_attention" in code,
            "divide": divide, "head_tables": [], "heads": heads, "text_first_in_code": _text_first(code)}

        def tables(mod, args, kwargs, group=group, heads=heads):
            for name, value in kwargs.items():
                leaves = value if isinstance(value, (tuple, list)) else [value]
                if heads and heads > 1 and name not in group["head_tables"] and any(
                        isinstance(x, torch.Tensor) and x.ndim >= 3 and x.shape[-2] == heads for x in leaves):
                    group["head_tables"].append(name)
        handles.append(module.register_forward_pre_hook(tables, with_kwargs=True))


def _text_first(code: str) -> bool | None:
    """Whether a processor's code concatenates the text projection before the image one (`torch.cat([encoder_query,
    query], dim=1)`: Flux, Chroma) or after it (SD3), read from its first `torch.cat` naming an `encoder_` tensor."""
    for items in re.findall(r"torch\.cat\(\s*[\[(]([^\])]*)[\])]", code):
        names = [n.strip() for n in items.split(",") if n.strip()]
        if len(names) >= 2 and any(n.startswith("encoder_") for n in names):
            return names[0].startswith("encoder_")
    return None


def _split_dims(a, transformer: str, lists: list) -> list[str]:
    """`CP_SPLIT_DIMS` (the dimension CP divides in what each block list returns, which ditgate's CP proof checks):
    read from each list's observed output, the dimension as long as the split sequence (the second by default)."""
    dims, why = {}, []
    for b in lists:
        layout = a.traits.list_layouts.get(f"{transformer}.{b.attribute}", "")
        shape = [int(x) for x in re.findall(r"\d+", layout.split("]")[0])] if layout.startswith("tensor[") else []
        found = [d for d in range(len(shape) - 1) if shape[d] == a.sequence.image_tokens]  # never the features
        dims[b.attribute] = 1 if not found or 1 in found else found[0]
        if a.sequence.packed and b.attribute == a.sequence.block_list:  # [tokens, features] streams: dim 0 of each
            dims[b.attribute] = (0,) * len(b.outputs or [0]) if len(b.outputs or []) > 1 else 0
            why.append(f"`{b.attribute}` returns {', '.join(b.output_shapes)}, batch-less: tokens on dim 0")
            continue
        why.append(f"`{b.attribute}` returns {layout or 'an unobserved layout'}")
        if len(b.outputs or []) == 2 and b.encoder_param and not a.sequence.joint:  # the text it returns stays whole
            dims[b.attribute] = (dims[b.attribute], None)
            why[-1] += ", its text whole on every rank (None)"
        if b.attribute in a.sequence.refiners:  # it runs before the split, on a whole part of the sequence
            dims[b.attribute] = None
            why[-1] += ", whole on every rank (it refines a part before the split: None)"
    body = ", ".join(f'"{k}": {v}' for k, v in dims.items())
    return [f"# the dimension CP divides in what each block list returns ({'; '.join(why)})",
            f"CP_SPLIT_DIMS = {{{body}}}"]


def _adapter(a, by_t: dict[str, list], alike: list[str], functor: str | None = None,
             functor_notes: list[str] = ()) -> tuple[list[str], list[str]]:
    """`block_adapter` over every transformer whose block lists all have a ForwardPattern (cache-dit enables cache
    and parallelism on the transformers its adapter names, so one left out runs uncached and whole on every rank),
    and the guard the CP/TP plans start with where a transformer is not of the first one's class and layout."""
    from ditgate.inspect.model import serves

    first = next(iter(by_t))
    adapted = list(by_t)  # every transformer with a block list a ForwardPattern fits
    cache = ["def block_adapter(pipe):"]
    for t in by_t:
        cache.append(f"    # {serves(a, t)}")
        for b in by_t[t]:
            cache.append(f"    #   `{t}.{b.attribute}`: {b.length} x {b.block_class}, returns {b.outputs} -> "
                         f"{b.pattern} ({b.pattern_reason})")
    silent = [t for t, n in a.transformer_calls.items() if n and t not in by_t]
    if silent:
        cache.append(f"    # NOT HANDLED: {silent} called, with no block list a ForwardPattern fits observed: left out "
                     "of the adapter")
    if len(adapted) > 1:
        cache.append(f"    # every transformer the pipeline calls is adapted: one left out would run uncached and, "
                     "under CP/TP, whole on every rank (the cache, cp and tp rows name it)")
    cache.append(f"    # {a.calls_per_step:g} transformer call(s) per step -> has_separate_cfg={a.has_separate_cfg}; "
                 "the other value is told apart by the cache row" if a.calls_per_step is not None else
                 "    # calls per step not measured")
    unchecked = [f"{b.transformer}.{b.attribute}" for t in adapted for b in by_t[t] if b.check_forward_pattern is False]
    if unchecked:
        cache.append(f"    # cache-dit's static check of the block parameter names fails for {unchecked} (the pattern "
                     "was observed from what the blocks do): check_forward_pattern=False")
    cache += [f"    # {n}" for n in functor_notes]
    listed = lambda items: "[" + ", ".join(items) + "]"  # noqa: E731
    per_t = lambda f: [[f(b) for b in by_t[t]] for t in adapted]  # noqa: E731  one list per transformer
    blocks, patterns = per_t(lambda b: f"pipe.{b.transformer}.{b.attribute}"), \
        per_t(lambda b: f"cache_dit.ForwardPattern.{b.pattern}")
    if len(adapted) > 1:  # cache-dit's nested form: [[lists of transformer], [lists of transformer_2]]
        blocks, patterns = listed(map(listed, blocks)), listed(map(listed, patterns))
    else:
        blocks, patterns = listed(blocks[0]), listed(patterns[0])
    modules = ", ".join(f"pipe.{t}" for t in adapted)
    cache += [f"    return cache_dit.BlockAdapter(pipe=pipe, transformer={listed([modules]) if len(adapted) > 1 else modules},",
              f"                                  blocks={blocks},",
              f"                                  forward_pattern={patterns}, has_separate_cfg={a.has_separate_cfg}"
              + (", check_forward_pattern=False" if unchecked else "")
              + (f",\n                                  patch_functor={functor}" if functor else "") + ")", "", ""]
    guard = []
    if len(by_t) > 1:
        cls = next((c.cls for c in a.components.get("transformers", []) if c.name == first), None)
        guard.append(f"    # called for each adapted transformer; {', '.join(f'`{t}`' for t in alike)}: class {cls}, "
                     "the same block lists: this plan serves " + ("each" if len(alike) > 1 else "it"))
        others = [t for t in adapted if t not in alike]
        if others:
            guard += [f"    # NOT HANDLED: {others} are of another class or block layout, and this plan was derived "
                      f"from `{first}`'s call only: write theirs by hand",
                      f"    if type(transformer).__name__ != {cls!r}:",
                      f"        raise NotImplementedError(f\"no plan for {{type(transformer).__name__}} (scaffolded from "
                      f"{first}, {cls})\")"]
    return cache, guard


def plugin_source(observed: Observed) -> str:
    """The plugin file's text."""
    a = observed.anatomy
    called = [b for b in a.block_lists if b.called]
    if not called:
        raise DitgateError("inspect saw no block list called: nothing to scaffold")
    by_t: dict[str, list] = {}
    for b in called:
        by_t.setdefault(b.transformer, []).append(b)
    left = [b for b in called if not b.pattern]  # no ForwardPattern fits what their blocks return
    by_t = {t: [b for b in ls if b.pattern] for t, ls in by_t.items()}
    if not next(iter(by_t.values())):
        raise DitgateError(f"no cache-dit ForwardPattern fits the blocks of {[b.attribute for b in left]} (what they "
                           "return needs a PatchFunctor that adapts it, which the scaffold does not write)")
    by_t = {t: ls for t, ls in by_t.items() if ls}
    transformer, lists = next(iter(by_t.items()))
    head = [f'"""Integration of {a.pipeline.cls} written by `ditgate scaffold {a.model}` from one observed call.',
            "", "Every choice below names the observation it rests on. Review it against the model's source.", '"""',
            "", "import contextlib", "import functools", "import inspect", "import sys", "", "import cache_dit", "import torch", "import torch.distributed as dist",
            "from cache_dit.attention import _dispatch_attention_fn",
            "from cache_dit.distributed.core import _ContextParallelInput, _ContextParallelOutput",
            "from cache_dit.distributed.utils import shard_div_attr",
            "from torch.distributed._tensor import Replicate",
            "from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module",
            "", ""]
    classes = {c.name: c.cls for c in a.components.get("transformers", [])}
    shapes = {t: [(b.attribute, b.block_class) for b in ls] for t, ls in by_t.items()}
    alike = [t for t in by_t if classes.get(t) == classes.get(transformer) and shapes[t] == shapes[transformer]]
    outside, outside_notes = _outside(a.traits.outside_calls, transformer, lists)
    functor, functor_notes = _functor(lists, outside)
    functor_notes = outside_notes + functor_notes
    functor_notes += [("" if not b.chained else "NOT HANDLED: ") + f"`{b.transformer}.{b.attribute}` ({b.length} x "
                      f"{b.block_class}) left out of the adapter" + (", uncached" if b.chained else "")
                      + f": {b.pattern_reason}" for b in left]
    cache, guard = _adapter(a, by_t, alike, functor, functor_notes)
    entries, notes, code = _cp(observed, transformer, next(
        (b for b in lists if b.attribute == a.sequence.block_list), lists[0]))
    switches = _split_dims(a, transformer, lists)
    if any("REORDER_MASK" in c for c in code):
        switches.append("REORDER_MASK = True  # the joint key mask in Ulysses' gathered order (see cp_plan)")
    if any("gather_routing" in c for c in code):
        switches.append("GATHER_ROUTING = True  # sequence-dependent routing run on the whole sequence (see cp_plan)")
    cp = ["def cp_plan(transformer, parallelism_config):", *guard, *[f"    # {n}" for n in notes], *code,
          "    return {", *[f"        {e}," for e in entries], "    }", "", ""]
    tp = ["def tp_plan(transformer, tp_mesh, parallelism_config):", *guard, "    tp = tp_mesh.size()", "    plans = []"]
    heads = a.attention.heads
    chains = list(dict.fromkeys((x.split(".*.", 1)[-1], y.split(".*.", 1)[-1]) for x, y in a.traits.linear_chains
                                if x.startswith(transformer + ".")))
    for key, rows in a.tp_layers.items():
        cls, _, span_text = key.partition("[")
        listed = [b for b in lists if b.block_class == cls]
        if not listed:
            continue
        across = {n.split(".*.", 1)[-1].rsplit(".", 1)[0] for n in a.attention.qk_norm_across_heads}
        own = {k.split(".*.", 1)[1]: g["heads"] for k, g in observed.processors.items()  # each attention's heads
               if k.split(".*.", 1)[0] in {b.attribute for b in listed} and ".*." in k and g.get("heads")}
        plan, tnotes = _tp_layers(rows, heads, across, chains, group_heads=own)
        for e in a.traits.experts:
            if e["layer"].startswith(transformer + ".") and (not span_text or e["blocks"].endswith(span_text[:-1])):
                tnotes.append(f"`{e['layer'].split('.*.', 1)[-1]}`: {e['experts']} experts "
                              f"({', '.join(e['packed']) or e['expert_list']}) and their router `{e['router']}` "
                              "kept whole on every rank (packed experts are no Linear; sharding each expert's hidden "
                              f"dimension by hand is the other choice); shared expert(s) {e['shared'] or 'none'} "
                              "as observed above")
        tp += [f"    # {key} (in {', '.join(b.attribute for b in listed)}):", *[f"    #   {n}" for n in tnotes]]
        if not plan:
            tp.append("    #   nothing sharded")
            continue
        attn = sorted({k.rsplit(".to_", 1)[0] for k in plan if k.endswith((".to_out.0", ".to_out"))})
        tp.append("    plan = {" + ", ".join(f'"{k}": {v}' for k, v in plan.items()) + "}")
        for b in listed:
            tp += [f"    for block in {_blocks_expr(b.attribute, span_text.rstrip(']'), b.length)}:"]
            for p in attn:
                group = observed.processors.get(f"{b.attribute}.*.{p}", {})
                if group.get("head_tables"):
                    tp += [f"        # `{p}` receives {group['head_tables']} with one row per head (observed "
                           f"[..., {group['heads']}, dim]): cut to this rank's heads; left whole, tp-2 fails",
                           f"        cut_head_tables(block.{p}, {group['heads']}, tp_mesh, "
                           f"{tuple(group['head_tables'])!r})"]
                divide = group.get("divide") or ["heads"]
                tp += [f"        shard_div_attr(block.{p}, \"{n}\", tp)" for n in divide]
            tp += ["        parallelize_module(block, tp_mesh, plan)"]
        tp.append("    plans.append(plan)")
    tp += ["    return plans", ""]
    helpers = ([HELPERS.strip("\n"), "", ""] if code or any("cut_head_tables(" in line for line in tp) else []) \
        + ([FUNCTOR.strip("\n"), "", ""] if functor else [])
    return "\n".join(head + switches + ([""] if switches else []) + helpers + cache + cp + tp)


def _outside(outside_calls: list[str], transformer: str, lists: list) -> tuple[dict[str, list], list[str]]:
    """Block sub-modules the forward runs outside the loop (`transformer_blocks.0.norm1.emb`, observed called while
    its block was not running): {list: [(index, attribute)]} for block 0 (the one place the cached list keeps)."""
    reads, notes = {}, []
    names = {b.attribute for b in lists}
    for call in outside_calls:
        parts = call.split(" ", 1)[0].split(".")
        if len(parts) < 4 or parts[0] != transformer or parts[1] not in names or not parts[2].isdigit():
            continue
        found = (int(parts[2]), parts[3])
        if found in reads.get(parts[1], []):
            continue
        if found[0]:
            notes.append(f"NOT HANDLED: the forward reads `{'.'.join(parts[1:4])}` outside the loop; the cached list "
                         "holds one wrapper in place of the blocks, so that block is not there during a call")
            continue
        reads.setdefault(parts[1], []).append(found)
        notes.append(f"the forward reads `{'.'.join(parts[1:4])}` outside the loop (observed: `{'.'.join(parts[1:])}` "
                     f"ran while block {found[0]} was not running); during a call the cached list holds one wrapper "
                     "there: BlockLoop hands the wrapper that sub-module (without it the cache row errors)")
    return reads, notes
