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
from ditgate.scaffold.runtime import HELPERS

SPLIT = "_ContextParallelInput(split_dim={dim}, expected_dims={ndim}, split_output={out})"


@dataclass
class Observed:
    anatomy: Any  # ditgate.inspect.model.Anatomy
    roots: dict[str, dict[str, list[int]]] = field(default_factory=dict)  # transformer -> input name -> shape
    child_inputs: dict[str, list[list[int]]] = field(default_factory=dict)  # transformer child -> its tensor inputs
    processors: dict[str, dict[str, Any]] = field(default_factory=dict)  # attention group -> what its processor does


def observe(model) -> Observed:
    """The anatomy of `model` on its call, with each transformer's first-call inputs (tensor shapes by name), the
    tensor inputs of its direct children on that call, and what each attention group's processor passes on."""
    import torch

    from ditgate.inspect.anatomy import classify_components, inspect_model

    seen = Observed(None)
    handles = []

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
                return None
            handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
            for child_name, child in module.named_children():
                def child_pre(mod, args, kwargs, key=child_name):
                    if key not in seen.child_inputs:
                        seen.child_inputs[key] = [list(a.shape) for a in (*args, *kwargs.values())
                                                  if isinstance(a, torch.Tensor)]
                handles.append(child.register_forward_pre_hook(child_pre, with_kwargs=True))
            _processors(module, seen.processors)

    try:
        seen.anatomy = inspect_model(model, on_load=hook_all)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _processors(transformer, out: dict[str, dict[str, Any]]) -> None:
    """Per attention group (`list.*.path`): whether its processor carries a CP config attribute, whether its code calls
    `dispatch_attention_fn` (so the call can be routed), and the int attributes TP must divide (heads, inner widths)."""
    import sys

    from ditgate.inspect.observe import block_lists, is_attention_module

    for attribute, blocks in block_lists(transformer).items():
        for path, module in blocks[0].named_modules():
            if not is_attention_module(module) or f"{attribute}.*.{path}" in out:
                continue
            processor = getattr(module, "processor", None)
            namespace = vars(sys.modules.get(type(processor).__module__, pyinspect)) if processor is not None else {}
            widths = {getattr(getattr(module, n, None), "out_features", None) for n in ("to_q", "to_k", "to_v")}
            heads = getattr(module, "heads", None)
            divide = [n for n, v in vars(module).items() if isinstance(v, int) and not isinstance(v, bool)
                      and ("head" in n or "inner" in n) and (v == heads or v in widths)]
            out[f"{attribute}.*.{path}"] = {
                "passes_cp": any(hasattr(processor, n) for n in ("_parallel_config", "_cp_config")),
                "routable": "dispatch_attention_fn" in namespace, "divide": divide}


def _seq_dim(shape: list[int], lengths: set[int]) -> int | None:
    """The sequence dimension of `shape`: past the batch of a 3-D or larger tensor, the first of a 2-D table
    ([tokens, features]); a 2-D [batch, features] vector whose width happens to equal a length is not one."""
    dims = range(1, len(shape)) if len(shape) >= 3 else range(min(1, len(shape)))
    return next((d for d in dims if shape[d] in lengths), None)


def _text_param(first, txt: int | None) -> str | None:
    """The block input that carries the text stream: the one whose update the block returns, else the input whose
    dim 1 was observed as long as the text."""
    if first.encoder_param:
        return first.encoder_param
    for name, summary in first.call["inputs"].items():
        dims = re.match(r"tensor\[([\d, ]+)\]", summary or "")
        shape = [int(x) for x in dims.group(1).split(",")] if dims else []
        if txt and len(shape) == 3 and shape[1] == txt:
            return name
    return None


def _root_split_ok(observed: Observed, root_split: set[str]) -> tuple[bool, str]:
    """A split at the transformer's root is right only if every per-token table the blocks receive is made from a
    tensor that is split there (else the forward builds it whole, or from each rank's share of another length)."""
    a = observed.anatomy
    s = a.sequence
    lengths = {n for n in (s.image_tokens, s.text_tokens) if n}
    for t in a.traits.per_block_tensors:
        maker = t.get("made_by")
        if maker is None:
            return False, (f"`{t['argument']}` {t['shape']} is built in forward by no module and handed to every "
                           f"block: a root split would not reach it")
        inputs = observed.child_inputs.get(maker, [])
        if not any(d in lengths for shape in inputs for d in shape):
            return False, (f"`{maker}` makes `{t['argument']}` {t['shape']} from no sequence-long tensor (its tensor "
                           f"inputs: {inputs or 'none'}): a root split would not reach it")
    return True, ""


def _cp(observed: Observed, transformer: str, first) -> tuple[list[str], list[str], list[str]]:
    """(plan entries, comments, code run before the plan is returned) of the CP plan."""
    a = observed.anatomy
    s = a.sequence
    img, txt, joint = s.image_tokens, s.text_tokens, s.joint
    lengths = {img} | ({txt} if joint and txt else set())
    root = observed.roots.get(transformer, {})
    entries, notes, code = [], [], []
    at_root = {n: (_seq_dim(shape, lengths), len(shape)) for n, shape in root.items()}
    at_root = {n: v for n, v in at_root.items() if v[0] is not None}
    root_ok, why_not = _root_split_ok(observed, set(at_root))
    if any(root[n][d] == img for n, (d, _) in at_root.items()) and root_ok:
        notes.append(f"the transformer's own inputs carry the {img}-token sequence "
                     f"({', '.join(f'{n} {root[n]}' for n in at_root)}): split them at the root, so every table "
                     "the forward builds from them (RoPE, positions) is built from each rank's share")
        if joint:
            notes.append(f"joint attention (image queries attend to image and {txt} text keys concatenated): the text "
                         "is split too; the other choice, text kept whole, is told apart by cp-ulysses-2")
        body = ", ".join(f'"{n}": ' + SPLIT.format(dim=d, ndim=nd, out=False) for n, (d, nd) in at_root.items())
        entries.append(f'"": {{{body}}}')
    else:
        hidden = first.call["positional"][0] if first.call["positional"] else "hidden_states"
        reason = why_not or f"the transformer's inputs carry no {img}-token dimension (the sequence is made inside its forward)"
        notes.append(f"{reason}: split at `{first.attribute}.0`, whose `{hidden}` is "
                     f"{first.call['inputs'].get(hidden)}")
        split = {hidden: SPLIT.format(dim=1, ndim=3, out=False)}
        text = _text_param(first, txt)
        every = {}
        if joint and text:
            returned = text == first.encoder_param  # the blocks hand it on; else the forward gives each block its own
            (split if returned else every)[text] = SPLIT.format(dim=1, ndim=3, out=False)
            notes.append(f"joint attention (keys hold image and text): the text stream `{text}` "
                         f"{first.call['inputs'].get(text)} is split with the image" + (
                             "" if returned else f", at every block (`{first.attribute}.*`: the blocks do not return "
                             "it, so the forward hands each block the whole text)")
                         + "; the other choice, text kept whole, is told apart by cp-ulysses-2")
        elif txt:
            notes.append(f"cross attention (keys from the {txt}-token text): the text stays whole on every rank")
        body = ", ".join(f'"{k}": {v}' for k, v in split.items())
        entries.append(f'"{first.attribute}.0": {{{body}}}')
        made: dict[str, list[str]] = {}
        for t in a.traits.per_block_tensors:
            if t.get("made_by") and t["shape"][t["dim"]] in lengths:
                index = t["argument"].rsplit("[", 1)[1].rstrip("]") if "[" in t["argument"] else None
                made.setdefault(t["made_by"], []).append(
                    (f"{index}: " if index is not None else "") +
                    SPLIT.format(dim=t["dim"], ndim=len(t["shape"]), out=True))
                notes.append(f"`{t['argument']}` {t['shape']} reaches every block of `{t['list']}` with the sequence "
                             f"on dim {t['dim']}, made by `{t['made_by']}`: its output is split there")
            elif not t.get("made_by") and "[" not in t["argument"] and t["shape"][t["dim"]] in lengths \
                    and t["list"] == f"{transformer}.{first.attribute}":
                every[t["argument"]] = SPLIT.format(dim=t["dim"], ndim=len(t["shape"]), out=False)
                notes.append(f"`{t['argument']}` {t['shape']} is built in forward (no module makes it) and handed to "
                             f"every block of `{t['list']}` with the sequence on dim {t['dim']}: split at every "
                             f"block (`{first.attribute}.*`); left whole, the blocks would pair each rank's tokens "
                             "with the first rows of the table (cp-ulysses-2 tells them apart)")
        if every:
            entries.append(f'"{first.attribute}.*": {{' + ", ".join(f'"{k}": {v}' for k, v in every.items()) + "}")
        for module, parts in made.items():
            entries.append(f'"{module}": ' + ("{" + ", ".join(parts) + "}" if ":" in parts[0] else parts[0]))
        for table in s.per_token_tables:
            if "image + text" in table:
                notes.append(f"NOT HANDLED: a per-token table over image and text concatenated ({table}) cannot be "
                             "split by its output; split the inputs it is made from")
    if s.gather_candidates:
        out = s.gather_candidates[-1]
        notes.append(f"`{out}` is the last module whose output keeps the {img}-token sequence: gather there")
        entries.append(f'"{out}": _ContextParallelOutput(gather_dim=1, expected_dims=3)')
    else:
        notes.append("NOT HANDLED: no module after the blocks keeps the sequence; no gather point was observed")
    code += _attention_code(observed, transformer, notes)
    code += _routing_code(observed, transformer, notes)
    return entries, notes, code


def _blocks_expr(attribute: str, span_text: str | None, length: int) -> str:
    """Python for the blocks of `attribute` named by a span ("1-2, 5"), or all of them."""
    indices = []
    for part in (span_text or "").split(","):
        if part.strip():
            lo, _, hi = part.strip().partition("-")
            indices += list(range(int(lo), int(hi or lo) + 1))
    if not indices or indices == list(range(length)):
        return f"transformer.{attribute}"
    return f"[transformer.{attribute}[i] for i in {tuple(indices)}]"


def _attention_code(observed: Observed, transformer: str, notes: list[str]) -> list[str]:
    """Route the attention groups the split sequence reaches (self or joint) through cache-dit's dispatcher where
    their processor does not pass the CP config, or where a joint key mask must be reordered for Ulysses."""
    a = observed.anatomy
    code = []
    for g in a.attention.groups:
        if g.transformer != transformer or g.kind not in ("self", "joint") or not g.calls:
            continue
        proc = observed.processors.get(g.group, {})
        masked = g.kind == "joint" and g.mask
        uneven = g.kind == "joint" and g.q_len != g.kv_len
        if proc.get("passes_cp") and not masked and not uneven:
            notes.append(f"`{g.group}` ({g.processor}) passes the CP config to its kernel itself: kept")
            continue
        why = [f"its processor {g.processor} has no CP config attribute: its kernel call would run without CP"] \
            if not proc.get("passes_cp") else []
        if uneven:
            why.append(f"its queries ({g.q_len}) are shorter than its keys ({g.kv_len}) and cache-dit's Ulysses moves "
                       "q, k and v with the query's shape, so the queries are padded with zero rows where the text "
                       "keys sit and those rows' outputs dropped")
        if masked:
            why.append("a mask over the joint keys reaches its kernel; Ulysses hands the keys over rank by rank "
                       "([image_0, text_0, image_1, text_1]), so the mask's key columns are reordered the same way "
                       "(REORDER_MASK)")
        why = "; ".join(why)
        if not proc.get("routable"):
            notes.append(f"NOT HANDLED: `{g.group}`: {why}, and its processor calls no `dispatch_attention_fn` "
                         "the scaffold can route: write its processor by hand")
            continue
        calls = a.traits.masks.get(f"{transformer}.{g.group}", [])
        pad = next((c["first_masked_key"] for c in calls if c.get("first_masked_key") is not None), None)
        text_first = pad is not None and a.sequence.text_tokens is not None and g.kv_len is not None and \
            pad < g.kv_len - a.sequence.text_tokens
        notes.append(f"`{g.group}`: {why}; " + (
            f"the text comes {'first' if text_first else 'after the image'} in the keys (the first padded key "
            f"column observed is {pad} of {g.kv_len})" if pad is not None else
            "no padded key was observed: the text is taken to come after the image in the keys"))
        attribute, _, path = g.group.partition(".*.")
        lst = next(b for b in a.block_lists if b.transformer == transformer and b.attribute == attribute)
        code.append(f"    route_attention([block.{path} for block in transformer.{attribute}], REORDER_MASK, "
                    f"text_first={text_first})" if lst else "")
    return [c for c in code if c]


def _routing_code(observed: Observed, transformer: str, notes: list[str]) -> list[str]:
    code = []
    lists = {b.attribute: b for b in observed.anatomy.block_lists if b.transformer == transformer}
    for e in observed.anatomy.traits.experts:
        if not e["layer"].startswith(transformer + "."):
            continue
        attribute, _, path = e["layer"].split(".", 1)[1].partition(".*.")
        notes.append(f"`{attribute}.*.{path}` (blocks {e['blocks'].split(' ', 1)[-1]}): {e['experts']} experts, router "
                     f"`{e['router']}`, routing {e['routing']}: {e['evidence']}")
        if e["routing"] != "expert-choice":
            continue
        notes.append("under CP each rank would route its own share of the tokens: the layer runs on the gathered "
                     "sequence and keeps its share of the output (GATHER_ROUTING; False, routing each share, is "
                     "told apart by cp-ulysses-2)")
        blocks = _blocks_expr(attribute, e["blocks"].split(" ", 1)[-1], lists[attribute].length)
        code += ["    if GATHER_ROUTING:",
                 f"        gather_routing(transformer, [block.{path} for block in {blocks}])"]
    return code


def _tp_layers(rows: list[dict[str, Any]], heads: int | None, across: set[str], chains: list[tuple[str, str]] = (),
               tp: int = 2) -> tuple[dict[str, str], list[str]]:
    """The layer plan of one block structure: only pairs whose every member was observed; attention modules in
    `across` (a q/k norm over all heads) kept whole; a Linear reading another sharded Colwise never Colwise too."""
    names = {r["layer"]: r["style"] for r in rows}
    plan, notes = {}, []
    for layer in [n for n in names if n.endswith(".to_q")]:
        p = layer[: -len(".to_q")]
        qkv = [f"{p}.to_q", f"{p}.to_k", f"{p}.to_v"]
        if not all(n in names for n in qkv) or f"{p}.to_out.0" not in names:
            notes.append(f"`{p}` has no `to_out.0` of its own (its heads feed a layer shared with other inputs): "
                         "kept whole; sharding it is the other choice, told apart by tp-2")
            continue
        if p in across:
            notes.append(f"`{p}` normalises q/k over all heads at once (observed norm width): sharding its heads "
                         "would normalise each shard alone, so it is kept whole; the other choice (shard it with a "
                         "norm over the gathered heads) is told apart by tp-2")
            continue
        if heads is None or heads % tp:
            notes.append(f"`{p}`: {heads} heads do not divide by {tp}: kept whole")
            continue
        plan.update({n: "ColwiseParallel()" for n in qkv})
        plan[f"{p}.to_out.0"] = "RowwiseParallel()"
        added = [n for n in (f"{p}.add_q_proj", f"{p}.add_k_proj", f"{p}.add_v_proj") if n in names]
        if f"{p}.add_q_proj" in names and f"{p}.to_add_out" not in names:
            notes.append(f"`{p}` has text queries with no `to_add_out` of their own: kept whole")
            for n in qkv + [f"{p}.to_out.0"]:
                plan.pop(n)
            continue
        plan.update({n: "ColwiseParallel()" for n in added})  # text keys/values (and queries): per head too
        if f"{p}.to_add_out" in names:
            plan[f"{p}.to_add_out"] = "RowwiseParallel()"
        notes.append(f"`{p}`: q/k/v read the block width and `to_out.0` reads their heads: Colwise then Rowwise, "
                     f"heads divided by {tp}")
    for layer in names:
        if layer.endswith(".net.0.proj") and names[layer].startswith("fused gated"):
            notes.append(f"`{layer}` is a fused gated MLP (its output chunked in two, one half through an activation "
                         "times the other): Colwise would give each rank the wrong halves, so the pair is kept whole; "
                         "the other choice (Colwise without relayout) is told apart by tp-2")
        elif layer.endswith(".net.0.proj") and layer.replace(".net.0.proj", ".net.2") in names:
            plan[layer] = "ColwiseParallel()"
            plan[layer.replace(".net.0.proj", ".net.2")] = "RowwiseParallel()"
            notes.append(f"`{layer}` feeds `{layer.replace('.net.0.proj', '.net.2')}` (a feed-forward pair): "
                         "Colwise then Rowwise; Colwise for both is the other choice and fails tp-2")
        elif names[layer].startswith("Colwise(output_layouts=Replicate())"):
            plan[layer] = "ColwiseParallel(output_layouts=Replicate())"
            notes.append(f"`{layer}`'s output is chunked on its features (modulation): Colwise gathered back whole")
    for first, second in chains:  # the first of a chained pair is sharded only when the second undoes it
        if first in names and first not in plan and second in plan:
            notes.append(f"`{first}` feeds `{second}` (observed): `{first}` kept whole, `{second}` "
                         f"{plan[second]}; both Colwise is the other choice and fails tp-2")
    return plan, notes


def plugin_source(observed: Observed) -> str:
    """The plugin file's text."""
    a = observed.anatomy
    called = [b for b in a.block_lists if b.called]
    if not called:
        raise DitgateError("inspect saw no block list called: nothing to scaffold")
    transformer = called[0].transformer
    lists = [b for b in called if b.transformer == transformer]
    others = sorted({b.transformer for b in called} - {transformer})
    unpatterned = [b.attribute for b in lists if not b.pattern]
    if unpatterned:
        raise DitgateError(f"no cache-dit ForwardPattern fits the blocks of {unpatterned} (work between the block "
                           "calls needs a PatchFunctor, which the scaffold does not write yet)")
    head = [f'"""Integration of {a.pipeline.cls} written by `ditgate scaffold {a.model}` from one observed call.',
            "", "Every choice below names the observation it rests on. Review it against the model's source.", '"""',
            "", "import inspect", "import sys", "", "import cache_dit", "import torch", "import torch.distributed as dist",
            "from cache_dit.attention import _dispatch_attention_fn",
            "from cache_dit.distributed.core import _ContextParallelInput, _ContextParallelOutput",
            "from cache_dit.distributed.utils import shard_div_attr",
            "from torch.distributed._tensor import Replicate",
            "from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module",
            "", ""]
    blocks = ", ".join(f"t.{b.attribute}" for b in lists)
    patterns = ", ".join(f"cache_dit.ForwardPattern.{b.pattern}" for b in lists)
    cache = ["def block_adapter(pipe):"]
    for b in lists:
        cache.append(f"    # `{b.attribute}`: {b.length} x {b.block_class}, returns {b.outputs} -> {b.pattern} "
                     f"({b.pattern_reason})")
    cache.append(f"    # {a.calls_per_step:g} transformer call(s) per step -> has_separate_cfg={a.has_separate_cfg}; "
                 "the other value is told apart by the cache row" if a.calls_per_step is not None else
                 "    # calls per step not measured")
    if others:
        cache.append(f"    # NOT HANDLED: the pipeline also calls {others}; only `{transformer}` is adapted here")
    cache += [f"    t = pipe.{transformer}",
              f"    return cache_dit.BlockAdapter(pipe=pipe, transformer=t, blocks=[{blocks}],",
              f"                                  forward_pattern=[{patterns}], "
              f"has_separate_cfg={a.has_separate_cfg})", "", ""]
    entries, notes, code = _cp(observed, transformer, lists[0])
    switches = []
    if any("route_attention" in c for c in code):
        switches.append("REORDER_MASK = True  # the joint key mask in Ulysses' gathered order (see cp_plan)")
    if any("gather_routing" in c for c in code):
        switches.append("GATHER_ROUTING = True  # sequence-dependent routing run on the whole sequence (see cp_plan)")
    cp = ["def cp_plan(transformer, parallelism_config):", *[f"    # {n}" for n in notes], *code, "    return {",
          *[f"        {e}," for e in entries], "    }", "", ""]
    tp = ["def tp_plan(transformer, tp_mesh, parallelism_config):", "    tp = tp_mesh.size()", "    plans = []"]
    heads = a.attention.heads
    chains = [(x.split(".*.", 1)[-1], y.split(".*.", 1)[-1]) for x, y in a.traits.linear_chains]
    for key, rows in a.tp_layers.items():
        cls, _, span_text = key.partition("[")
        listed = [b for b in lists if b.block_class == cls]
        if not listed:
            continue
        across = {n.split(".*.", 1)[-1].rsplit(".", 1)[0] for n in a.attention.qk_norm_across_heads}
        plan, tnotes = _tp_layers(rows, heads, across, chains)
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
        attn = sorted({k.rsplit(".to_", 1)[0] for k in plan if ".to_out.0" in k})
        tp.append("    plan = {" + ", ".join(f'"{k}": {v}' for k, v in plan.items()) + "}")
        for b in listed:
            tp += [f"    for block in {_blocks_expr(b.attribute, span_text.rstrip(']'), b.length)}:"]
            for p in attn:
                divide = observed.processors.get(f"{b.attribute}.*.{p}", {}).get("divide") or ["heads"]
                tp += [f"        shard_div_attr(block.{p}, \"{n}\", tp)" for n in divide]
            tp += ["        parallelize_module(block, tp_mesh, plan)"]
        tp.append("    plans.append(plan)")
    tp += ["    return plans", ""]
    helpers = [HELPERS.strip("\n"), "", ""] if code else []
    return "\n".join(head + switches + ([""] if switches else []) + helpers + cache + cp + tp)
