"""Traits of a transformer that decide its CP and TP plans, read from what one run did (`Probe` and `Trace`).

Each finding says what was observed and what the plan does about it; `ditgate.inspect.plan.draft` and `.text` show them.
"""

from __future__ import annotations

from typing import Any

from ditgate.inspect.model import E, H, Traits

GATED = ("fused gated MLP: one Linear, output chunked in two, one half through an activation times the other; "
         "Colwise shards would pair the wrong halves: relay out its rows per rank (gate_r, up_r) then Colwise, or "
         "keep it replicated")
MODULATION = "Colwise(output_layouts=Replicate()) (chunked modulation: every rank needs every chunk)"
WEAK_MASK = 0.05  # a mask with less padding than this share of its entries hardly tests mask handling


def _leaves(value: Any, path: str = ""):
    if isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            yield from _leaves(v, f"{path}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, f"{path}[{k!r}]")
    elif hasattr(value, "shape"):
        yield path, value


def per_block_tensors(t_name: str, record, lists: list) -> list[dict[str, Any]]:
    """Tensors that reach every block of a list unchanged and have a dimension as long as the list's sequence."""
    found = []
    made_by = {id(t): (child, path) for child, out in record.child_outputs.items() for path, t in _leaves(out)}
    for b in lists:
        lr = record.lists.get(b.attribute)
        if lr is None or lr.first_call is None or b.length < 2:
            continue
        bound = lr.first_call.bound
        positional = [p.name for p in b.signature if p.kind in ("positional_only", "positional_or_keyword")]
        hidden = bound.get(positional[0]) if positional else None
        streams = {positional[0]} | ({b.encoder_param} if b.encoder_param else set()) | ({E} & set(bound))
        lengths = {int(bound[s].shape[1]) for s in streams if getattr(bound.get(s), "ndim", 0) >= 3}
        if getattr(hidden, "ndim", 0) == 2:  # batch-less [tokens, features] streams: the tokens on dim 0
            lengths = {int(bound[s].shape[0]) for s in streams if getattr(bound.get(s), "ndim", 0) == 2}
        changed = {a for tr in lr.transitions for a in tr.changed_args}
        if hidden is None or not lengths:
            continue
        for param, value in bound.items():
            if param in streams or param in changed or "mask" in param.lower():
                continue
            for leaf, tensor in _leaves(value):
                dims = [d for d in range(tensor.ndim - 1) if tensor.shape[d] in lengths]
                if not dims:
                    continue
                child, output = made_by.get(id(tensor), (None, None))
                how = (f"made by `{child}`: split its output there (split_output=True), or at `{b.attribute}.*`"
                       if child else f"built in forward, no module makes it: split it at `{b.attribute}.*`")
                if interleaved(record):
                    how += f" where `{b.attribute}`'s sequence (dim 1) is the one split"
                found.append({"list": f"{t_name}.{b.attribute}", "argument": param + leaf,
                              "shape": list(tensor.shape), "dim": dims[0], "made_by": child, "action": how,
                              "output": output})  # where in the module's output: "" (the output), "[3]", ...
    return found


def part_counts(t_name: str, record, lists: list) -> list[dict[str, Any]]:
    """Integers a list's blocks receive that count the tokens at one end of their stream (Helios'
    `original_context_length`: the video tokens after the history the forward prepends). The end is observed, not
    guessed: a direct child's output (its tokens, grid dimensions flattened) equals the stream's first or last n."""
    import torch

    found = []
    for b in lists:
        lr = record.lists.get(b.attribute)
        positional = [p.name for p in b.signature if p.kind in ("positional_only", "positional_or_keyword")]
        hidden = lr.first_call.bound.get(positional[0]) if lr and lr.first_call and positional else None
        if not isinstance(hidden, torch.Tensor) or hidden.ndim != 3:
            continue
        for param, n in lr.first_call.bound.items():
            if isinstance(n, bool) or not isinstance(n, int) or not 0 < n < hidden.shape[1]:
                continue
            for child, out in record.child_outputs.items():
                for _, t in _leaves(out):
                    tokens = t.flatten(2).transpose(1, 2) if t.ndim > 3 else t
                    if tokens.shape != (hidden.shape[0], n, hidden.shape[2]) or tokens.dtype != hidden.dtype:
                        continue
                    end = next((e for e, part in (("tail", hidden[:, -n:]), ("head", hidden[:, :n]))
                                if torch.equal(tokens, part)), None)
                    where = f"{t_name}.{b.attribute}"
                    if end and not any((f["list"], f["argument"]) == (where, param) for f in found):
                        found.append({"list": where, "argument": param, "value": n,
                                      "tokens": int(hidden.shape[1]), "end": end, "made_by": child})
    return found


def grid_blocks(t_name: str, record, lists: list, modules: dict) -> list[dict[str, Any]]:
    """Block lists whose blocks fold their stream into the image grid: a line of the block's own forward that
    unflattens, views or reshapes names integers the block was handed whose observed values multiply to its stream's
    length (Sana's `unflatten(1, (height, width))` before the depthwise convolution of its feed-forward). Split, the
    stream reaches each rank with a share of the tokens and the whole grid's sizes. `modules`: list -> its blocks."""
    import inspect
    import math
    import re

    import torch

    found = []
    for b in lists:
        lr = record.lists.get(b.attribute)
        positional = [p.name for p in b.signature if p.kind in ("positional_only", "positional_or_keyword")]
        hidden = lr.first_call.bound.get(positional[0]) if lr and lr.first_call and positional else None
        blocks = modules.get(b.attribute) or []
        if not isinstance(hidden, torch.Tensor) or hidden.ndim != 3 or not blocks:
            continue
        ints = {p: n for p, n in lr.first_call.bound.items() if type(n) is int and n > 1}
        try:
            code = inspect.getsource(type(blocks[0]).forward)
        except (OSError, TypeError):
            continue
        for line in code.splitlines():
            if not re.search(r"\.(unflatten|view|reshape)\(", line):
                continue
            names = [p for p in ints if re.search(rf"\b{re.escape(p)}\b", line)]
            if len(names) >= 2 and math.prod(ints[p] for p in names) == hidden.shape[1]:
                found.append({"list": f"{t_name}.{b.attribute}", "arguments": names,
                              "values": [ints[p] for p in names], "tokens": int(hidden.shape[1]),
                              "stream": positional[0], "line": line.strip()})
                break
    return found


def interleaved(record) -> list[tuple[str, str]]:
    """Pairs of block lists whose blocks alternate in the loop (a.0, b.0, a.1, b.1, ...)."""
    order = [e for e in record.events if e.rsplit(".", 1)[0] in record.lists]
    pairs = []
    for a, b in zip(order, order[1:]):
        la, lb = a.rsplit(".", 1)[0], b.rsplit(".", 1)[0]
        if la != lb and (la, lb) not in pairs and f"{la}.1" in order and order.index(f"{la}.1") > order.index(b):
            pairs.append((la, lb))
    return pairs


def packed_parameters(t_name: str, transformer, lists: dict) -> list[dict[str, Any]]:
    import torch

    found = []
    from ditgate.inspect.variants import variants

    for attribute, blocks in lists.items():
        firsts = [blocks[g[0]] for g in variants(blocks)]  # every structure of the list, not block 0 alone
        for block, path, param in [(b, p, q) for b in firsts for p, q in b.named_parameters()]:
            owner = block.get_submodule(path.rsplit(".", 1)[0]) if "." in path else block
            # several matrices stacked on dim 0 (experts); a [1, n, dim] table is a per-block constant
            if param.ndim >= 3 and param.shape[0] > 1 and not isinstance(owner, torch.nn.modules.conv._ConvNd) \
                    and f"{t_name}.{attribute}.*.{path}" not in [f["parameter"] for f in found]:
                found.append({"parameter": f"{t_name}.{attribute}.*.{path}", "shape": list(param.shape),
                              "tp": "not a Linear: ColwiseParallel/RowwiseParallel cannot take it; keep it replicated,"
                                    " or shard each expert's hidden dimension by hand (distribute_tensor, Shard) and "
                                    "reduce the output over the ranks"})
    return found


def mask_findings(masks: dict[str, list]) -> tuple[list[str], bool | None]:
    """One line per attention group with a mask; whether every mask was nearly all True (a weak test)."""
    lines, weak = [], None
    for group, calls in masks.items():
        shares = [c["padding_share"] for c in calls]
        samples = [s for c in calls for s in c["per_sample"]]
        lines.append(f"{group}: mask {calls[0]['shape']} on {len(calls)} call(s) of the first step, padding share "
                     + ", ".join(f"{s:.1%}" for s in shares)
                     + (f" (per sample {min(samples):.1%} to {max(samples):.1%})" if len(set(samples)) > 1 else ""))
        weak = (weak is not False) and max(shares) < WEAK_MASK
    return lines, weak


def analyse_traits(transformers: dict, probe, trace, lists: list, sequence_tokens: int | None) -> Traits:
    from ditgate.inspect.experts import find_experts
    from ditgate.inspect.observe import block_lists
    from ditgate.inspect.variants import describe

    traits = Traits()
    for t_name, transformer in transformers.items():
        record, tr = probe.transformers[t_name], trace.records[t_name]
        t_lists = [b for b in lists if b.transformer == t_name and b.called]
        traits.per_block_tensors += per_block_tensors(t_name, record, t_lists)
        traits.part_counts += part_counts(t_name, record, t_lists)
        traits.grid_blocks += grid_blocks(t_name, record, t_lists, block_lists(transformer))
        for a, b in interleaved(record):
            if [f"{t_name}.{b}", f"{t_name}.{a}"] not in traits.interleaved:
                traits.interleaved.append([f"{t_name}.{a}", f"{t_name}.{b}"])
        traits.packed_parameters += packed_parameters(t_name, transformer, block_lists(transformer))
        traits.block_variants.update(describe(t_name, block_lists(transformer)))
        traits.experts += find_experts(t_name, block_lists(transformer), tr.block_sorts)
        for layer, use in tr.linears.items():
            name = f"{t_name}.{layer}"
            if use.gated:
                traits.gated_mlps.append(name)
            elif use.chunks and use.chunks > 1:
                traits.chunked_modulation.append(f"{name} (chunk {use.chunks})")
            if use.input_from is None and use.in_features != use.out_features and not use.chunks:
                traits.reads_block_input.append(name)
            for source in dict.fromkeys([use.input_from, *use.inputs_from]) if use.input_from else ():
                traits.linear_chains.append([f"{t_name}.{source}", name])
        traits.sequence_routing += [f"{t_name}.{s}" for s in tr.sequence_sorts]
        traits.attention_norms.update({f"{t_name}.{k}": v for k, v in tr.attention_norms.items()})
        traits.repeated_modules.update({f"{t_name}.{k}": v for k, v in tr.repeated_modules.items()})
        traits.output_types[t_name] = tr.output_type or "not called"
        traits.long_skips += [f"{t_name}: {note}" for note in tr.long_skips]
        traits.outside_calls += [f"{t_name}.{note}" for note in tr.outside_calls]
        traits.masks.update({f"{t_name}.{g}": [vars(c) for c in calls] for g, calls in tr.masks.items()})
        traits.calls_per_step[t_name] = _calls_per_step(tr.calls, probe.step_calls)
        traits.steps_by_transformer[t_name] = _steps_served(tr.calls, probe.step_calls)
        for b in t_lists:
            shapes = [s for s in b.output_shapes if s.startswith("tensor")]
            if shapes:
                traits.list_layouts[f"{t_name}.{b.attribute}"] = shapes[0]
    traits.mask_lines, traits.weak_mask = mask_findings(traits.masks)
    return traits


def _steps_served(calls: list[int], step_marks: list[int]) -> list[int]:
    """The denoising steps (from 0) in which this transformer was called (pipeline call numbers against the step
    ends); empty where the pipeline reported no step."""
    bounds = [0] + step_marks
    return [i for i, (a, b) in enumerate(zip(bounds, bounds[1:])) if any(a < c <= b for c in calls)]


def _calls_per_step(calls: list[int], step_marks: list[int]) -> float | None:
    """The most common number of this transformer's calls in the steps it ran in (pipeline call numbers against the
    step ends): a high-/low-noise pair each run once per step of their own half."""
    if not calls:
        return 0.0
    if not step_marks:
        return None
    from collections import Counter

    bounds = [0] + step_marks
    counts = [n for n in (sum(1 for c in calls if a < c <= b) for a, b in zip(bounds, bounds[1:])) if n]
    return float(Counter(counts).most_common(1)[0][0]) if counts else 0.0


def split_points(traits: Traits, first_list: str, hidden: str = H) -> str:
    """Where the draft splits the sequence, given the interleaved lists."""
    if traits.interleaved:
        a, b = (name.split(".", 1)[-1] for name in traits.interleaved[0])
        layouts = ", ".join(f"{k.split('.', 1)[-1]} {v}" for k, v in traits.list_layouts.items())
        return (f"split before both `{a}` and `{b}` (the embedder's output, "
                "split_output=True, or the root): a split at the first block of one list changes what the other "
                "list's blocks receive; declare each list's split dimension in CP_SPLIT_DIMS "
                f"(observed layouts: {layouts})")
    return f"split at `{first_list}.0`: `{hidden}` (dim 1)"


def revise_tp_layers(tp: dict[str, list[dict[str, Any]]], traits: Traits) -> None:
    """Replace name-based TP guesses with what the run showed (chunked modulation, gated MLPs, input projections)."""
    def layer(name: str) -> str:
        return name.split(".*.", 1)[-1].split(" (chunk")[0]

    modulation = {layer(n) for n in traits.chunked_modulation}
    gated = {layer(n) for n in traits.gated_mlps}
    inputs = {layer(n) for n in traits.reads_block_input}
    for rows in tp.values():
        for row in rows:
            if row["layer"] in gated:
                row["style"] = "fused gated MLP: relayout per rank then Colwise, or Replicate"
            elif row["layer"] in modulation:
                row["style"] = "Colwise(output_layouts=Replicate())"
            elif row["layer"] in inputs and row["style"].startswith("Rowwise"):
                row["style"] = "review: reads no other layer of the block (an input projection): Colwise or Replicate"
    for rows in tp.values():  # a chained pair (one Linear's output feeds the other): never Colwise twice
        styles = {row["layer"]: row for row in rows}
        for first, second in ((layer(a), layer(b)) for a, b in traits.linear_chains):
            one, two = styles.get(first), styles.get(second)
            if one and two and one["style"].startswith("Colwise") and "Replicate" not in one["style"] \
                    and two["style"].startswith("Colwise"):
                one["style"] = (f"keep whole: its output feeds `{second}` ({two['style']}); Colwise for both would "
                                "hand it a shard it cannot read (Colwise then Rowwise, or this one whole)")
