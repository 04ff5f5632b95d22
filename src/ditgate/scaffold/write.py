"""The plugin `ditgate scaffold` writes, from an observed anatomy.

`observe(model)` inspects the model on its call (`ditgate.inspect.anatomy.inspect_model`) and records the
transformer's own inputs on its first call; `plugin_source(observed)` returns the plugin's Python source. Every
decision is a comment naming the observation behind it; where another choice is possible it is named with the row
(`cp-ulysses-2`, `tp-2`, `cache`) that tells the two apart.
"""

from __future__ import annotations

import inspect as pyinspect
from dataclasses import dataclass, field
from typing import Any

from ditgate.core.errors import DitgateError

SPLIT = "_ContextParallelInput(split_dim={dim}, expected_dims={ndim}, split_output={out})"


@dataclass
class Observed:
    anatomy: Any  # ditgate.inspect.model.Anatomy
    roots: dict[str, dict[str, list[int]]] = field(default_factory=dict)  # transformer -> input name -> shape


def observe(model) -> Observed:
    """The anatomy of `model` on its call, with each transformer's first-call inputs (tensor shapes by name)."""
    import torch

    from ditgate.inspect.anatomy import classify_components, inspect_model

    roots: dict[str, dict[str, list[int]]] = {}
    handles = []

    def hook_all(pipe):
        for name, module in classify_components(pipe)["transformers"].items():
            def pre(mod, args, kwargs, name=name):
                if name in roots:
                    return None
                try:
                    bound = pyinspect.signature(mod.forward).bind_partial(*args, **kwargs).arguments
                except TypeError:
                    bound = dict(kwargs)
                roots[name] = {k: list(v.shape) for k, v in bound.items() if isinstance(v, torch.Tensor)}
                return None
            handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))

    try:
        anatomy = inspect_model(model, on_load=hook_all)
    finally:
        for handle in handles:
            handle.remove()
    return Observed(anatomy, roots)


def _seq_dim(shape: list[int], lengths: set[int]) -> int | None:
    """The sequence dimension of `shape`: past the batch of a 3-D or larger tensor, the first of a 2-D table
    ([tokens, features]); a 2-D [batch, features] vector whose width happens to equal a length is not one."""
    dims = range(1, len(shape)) if len(shape) >= 3 else range(min(1, len(shape)))
    return next((d for d in dims if shape[d] in lengths), None)


def _cp(observed: Observed, transformer: str, first) -> tuple[list[str], list[str]]:
    """(plan entries, comments) of the CP plan."""
    a = observed.anatomy
    s = a.sequence
    img, txt, joint = s.image_tokens, s.text_tokens, s.joint
    lengths = {img} | ({txt} if joint and txt else set())
    root = observed.roots.get(transformer, {})
    entries, notes = [], []
    at_root = {n: (_seq_dim(shape, lengths), len(shape)) for n, shape in root.items()}
    at_root = {n: v for n, v in at_root.items() if v[0] is not None}
    if any(root[n][d] == img for n, (d, _) in at_root.items()):
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
        notes.append(f"the transformer's inputs carry no {img}-token dimension (the sequence is made inside its "
                     f"forward): split at `{first.attribute}.0`, whose `{hidden}` is "
                     f"{first.call['inputs'].get(hidden)}")
        split = {hidden: SPLIT.format(dim=1, ndim=3, out=False)}
        if joint and first.encoder_param:
            split[first.encoder_param] = SPLIT.format(dim=1, ndim=3, out=False)
            notes.append("joint attention: the text stream is split with the image; the other choice, text kept "
                         "whole, is told apart by cp-ulysses-2")
        elif txt:
            notes.append(f"cross attention (keys from the {txt}-token text): the text stays whole on every rank")
        body = ", ".join(f'"{k}": {v}' for k, v in split.items())
        entries.append(f'"{first.attribute}.0": {{{body}}}')
        made: dict[str, list[str]] = {}
        for t in a.traits.per_block_tensors:
            if t.get("made_by") and t["shape"][t["dim"]] == img:
                index = t["argument"].rsplit("[", 1)[1].rstrip("]") if "[" in t["argument"] else None
                made.setdefault(t["made_by"], []).append(
                    (f"{index}: " if index is not None else "") +
                    SPLIT.format(dim=t["dim"], ndim=len(t["shape"]), out=True))
                notes.append(f"`{t['argument']}` {t['shape']} reaches every block of `{t['list']}` with the sequence "
                             f"on dim {t['dim']}, made by `{t['made_by']}`: its output is split there")
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
    if a.attention.mask:
        notes.append("an attention mask reaches attention: check it is reordered, not split (cp-ulysses-2)")
    return entries, notes


def _tp_layers(rows: list[dict[str, Any]], heads: int | None, across: set[str],
               tp: int = 2) -> tuple[dict[str, str], list[str]]:
    """The layer plan of one block class: only pairs whose every member was observed; attention modules in `across`
    (a q/k norm over all heads) kept whole."""
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
        added = [f"{p}.add_q_proj", f"{p}.add_k_proj", f"{p}.add_v_proj"]
        if all(n in names for n in added) and f"{p}.to_add_out" in names:
            plan.update({n: "ColwiseParallel()" for n in added})
            plan[f"{p}.to_add_out"] = "RowwiseParallel()"
        notes.append(f"`{p}`: q/k/v read the block width and `to_out.0` reads their heads: Colwise then Rowwise, "
                     f"heads divided by {tp}")
    for layer in names:
        if layer.endswith(".net.0.proj") and layer.replace(".net.0.proj", ".net.2") in names:
            plan[layer] = "ColwiseParallel()"
            plan[layer.replace(".net.0.proj", ".net.2")] = "RowwiseParallel()"
            notes.append(f"`{layer}` feeds `{layer.replace('.net.0.proj', '.net.2')}` (a feed-forward pair): "
                         "Colwise then Rowwise; Colwise for both is the other choice and fails tp-2")
        elif names[layer].startswith("Colwise(output_layouts=Replicate())"):
            plan[layer] = "ColwiseParallel(output_layouts=Replicate())"
            notes.append(f"`{layer}`'s output is chunked on its features (modulation): Colwise gathered back whole")
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
            "", "import cache_dit",
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
    entries, notes = _cp(observed, transformer, lists[0])
    cp = ["def cp_plan(transformer, parallelism_config):", *[f"    # {n}" for n in notes], "    return {",
          *[f"        {e}," for e in entries], "    }", "", ""]
    tp = ["def tp_plan(transformer, tp_mesh, parallelism_config):", "    tp = tp_mesh.size()", "    plans = []"]
    heads = a.attention.heads
    for cls, rows in a.tp_layers.items():
        listed = [b for b in lists if b.block_class == cls]
        if not listed:
            continue
        across = {n.split(".*.", 1)[-1].rsplit(".", 1)[0] for n in a.attention.qk_norm_across_heads}
        plan, tnotes = _tp_layers(rows, heads, across)
        tp += [f"    # {cls} (in {', '.join(b.attribute for b in listed)}):", *[f"    #   {n}" for n in tnotes]]
        if not plan:
            tp.append("    #   nothing sharded")
            continue
        attn = sorted({k.rsplit(".to_", 1)[0] for k in plan if ".to_out.0" in k})
        tp.append("    plan = {" + ", ".join(f'"{k}": {v}' for k, v in plan.items()) + "}")
        for b in listed:
            tp += [f"    for block in transformer.{b.attribute}:"]
            tp += [f"        shard_div_attr(block.{p}, \"heads\", tp)" for p in attn]
            tp += ["        parallelize_module(block, tp_mesh, plan)"]
        tp.append("    plans.append(plan)")
    tp += ["    return plans", ""]
    return "\n".join(head + cache + cp + tp)
