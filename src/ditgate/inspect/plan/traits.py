"""The draft plan's lines that come from observed traits (`Anatomy.traits`): cache, CP and TP choices."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ditgate.inspect import experts
from ditgate.inspect.traits import GATED, MODULATION

if TYPE_CHECKING:
    from ditgate.inspect.model import Anatomy


def _short(name: str) -> str:
    return name.split(".", 1)[-1]


def cache_lines(a: "Anatomy") -> list[str]:
    t = a.traits
    lines = []
    for first, second in t.interleaved:
        lines.append(f"- interleaved block lists `{_short(first)}` and `{_short(second)}` (block i of one, then "
                     "block i of the other): cache-dit runs the lists it is given one after the other, so give it "
                     f"one list of pairs: a PatchFunctor that builds `ModuleList(pair(first_i, second_i))` with "
                     "whatever the loop does between them, and a forward that loops over the pairs")
    for note in t.outside_calls:
        lines.append(f"- `{_short(note.split(' ', 1)[0])}` runs outside its block's forward "
                     f"({note.split('(', 1)[-1].rstrip(')')}): code reads the block list outside the loop; cached "
                     "blocks would not reproduce it, so a PatchFunctor must move that call out of the blocks (or "
                     "keep it in the patched forward)")
    counted = {k: v for k, v in t.calls_per_step.items() if v is not None}
    if len(counted) > 1:
        lines.append("- calls per step by transformer: " + ", ".join(f"`{k}` {v:g}" for k, v in counted.items())
                     + " (two transformers called once each are not separate CFG)")
    return lines


def cp_lines(a: "Anatomy") -> list[str]:
    t = a.traits
    lines = []
    for item in t.per_block_tensors:
        lines.append(f"- `{item['argument']}` {item['shape']} reaches every block of `{_short(item['list'])}` "
                     f"unchanged, dim {item['dim']} as long as its sequence: {item['action']}")
    for p in t.part_counts:
        lines.append(f"- `{p['argument']}` = {p['value']} reaches the blocks of `{_short(p['list'])}` counting the "
                     f"{p['end']} of their {p['tokens']} tokens (`{p['made_by']}`'s output): under CP each rank "
                     "needs the count of those tokens in its own share")
    for note in t.sequence_routing:
        module = _short(note.split(":", 1)[0])
        lines.append(f"- CP hazard: routing over the whole sequence in `{module}` ({note.split(': ', 1)[-1]}): "
                     "under CP each rank would route its own slice. Sub-module form: gather the sequence before it "
                     "(`_ContextParallelOutput(gather_dim=1)` on the module whose output feeds it) and split its "
                     f"output again (`\"{module}\": {{0: _ContextParallelInput(split_dim=1, split_output=True)}}`)")
    for note in t.long_skips:
        lines.append(f"- long skip: {note.split(': ', 1)[-1]}: a split inside the first block leaves that residual "
                     "whole; split before it (the embedder's output, split_output=True) so the residual is split "
                     "too, or put the gather before the add")
    for module, calls in t.repeated_modules.items():
        lines.append(f"- `{_short(module)}` runs {calls} times per forward: `split_output=True` on it would split "
                     "every call's output; split only what feeds the split sequence (or split at the blocks)")
    for name, kind in t.output_types.items():
        if kind not in ("Tensor", "tuple", "list", "not called"):
            lines.append(f"- `{name}` returns `{kind}`: no root split or gather (`\"\"`), cache-dit's output hook "
                         "needs tensors; gather at the output projection")
    lines += experts.plan_lines(t.experts)
    for g in a.attention.groups:
        if g.kind == "joint" and g.q_len != g.kv_len:
            lines.append(f"- `{g.group}`: joint attention, image queries ({g.q_len}) on image + text keys "
                         f"({g.kv_len}) concatenated: split the text with the image (kept whole, every rank's text "
                         "keys would be gathered once per rank)" + (
                             "; the mask covers both: reorder its key columns into the order the all-to-all gives "
                             "the keys ([image_0, text_0, image_1, text_1])" if g.mask else ""))
    cross = [g for g in a.attention.groups if g.kind == "cross" and g.mask]
    for g in cross:
        lines.append(f"- `{g.group}`: cross-attention over a masked text sequence: keep it local (the text stays "
                     "whole), with a processor that calls SDPA without the CP config (cache-dit sets `_cp_config` "
                     "on every processor; Ulysses and ring both fail on that mask)")
    if t.list_layouts and len({v for v in t.list_layouts.values()}) > 1 and t.interleaved:
        lines.append("- declare `CP_SPLIT_DIMS` (which dimension of each list's output is split) in the integration "
                     "file: " + ", ".join(f"`{_short(k)}` returns {v}" for k, v in t.list_layouts.items()))
    return lines


def mask_lines(a: "Anatomy") -> list[str]:
    t = a.traits
    lines = [f"- observed mask: {line}" for line in t.mask_lines]
    kinds = {g.kind for g in a.attention.groups if g.mask}
    if kinds == {"cross"}:
        lines.append("- the mask reaches cross-attention only, which keeps the text whole: nothing to reorder")
    if t.weak_mask:
        lines.append("- every mask was nearly all True: a mask fault would not show in this run; test with a short "
                     "negative prompt or a batch of prompts of different lengths")
    return lines


def tp_lines(a: "Anatomy") -> list[str]:
    t = a.traits
    lines = []
    for name in t.chunked_modulation:
        layer, _, chunks = name.partition(" (chunk ")
        lines.append(f"- `{_short(layer)}` (output chunked in {chunks.rstrip(')')}): {MODULATION}")
    lines += [f"- `{_short(name)}`: {GATED}" for name in t.gated_mlps]
    for item in t.packed_parameters:
        lines.append(f"- packed parameter `{_short(item['parameter'])}` {item['shape']}: {item['tp']}")
    for name, rows in t.block_variants.items():
        lines.append(f"- `{_short(name)}` holds blocks of {len(rows)} structures: " + "; ".join(
            f"blocks {r['blocks']} ({', '.join(r['sublayers'])})" for r in rows)
            + ": one TP layer plan per structure (a plan naming a sub-layer a block lacks fails)")
    for norm, kind in t.attention_norms.items():
        lines.append(f"- `{_short(norm)}` normalises {'one head' if kind == 'per head' else 'every head'}: "
                     + ("acts on local heads unchanged when heads are sharded" if kind == "per head" else
                        "its statistics span the shards: gather, keep attention replicated, or norm per head"))
    return lines
