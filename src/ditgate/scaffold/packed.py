"""The CP plan of a batch-less layout: blocks whose streams are packed [tokens, features] tensors (no batch
dimension; Cosmos 3's text and vision streams), so the sequence is dim 0 of every stream and of every per-token
table. Each stream is split at the first block, the tables the blocks receive at every block, and each stream
gathered where the first module after the blocks returns it; attention is routed through cache-dit's dispatcher
(`ditgate.scaffold.runtime.RoutedAttention`), which pads short queries and makes a causal call exact under Ulysses."""

from __future__ import annotations

from typing import Any

SPLIT = "_ContextParallelInput(split_dim=0, expected_dims={ndim}, split_output=False)"


def _packed_cp(observed: Any, transformer: str, first) -> tuple[list[str], list[str], list[str]]:
    """(plan entries, comments, code run before the plan is returned) for `first`'s packed streams."""
    a = observed.anatomy
    s = a.sequence
    streams = s.packed
    entries, notes, code = [], [], []
    shown = ", ".join(f"`{n}` {first.call['inputs'].get(n)}" for n in streams)
    notes.append(f"the blocks of `{first.attribute}` take batch-less streams [tokens, features] ({shown}): each is "
                 f"split on dim 0 at `{first.attribute}.0` (the forward builds them from index buffers, so its own "
                 "inputs are not split)")
    entries.append(f'"{first.attribute}.0": {{' + ", ".join(f'"{n}": ' + SPLIT.format(ndim=2) for n in streams) + "}")
    uneven = {n: v for n, v in streams.items() if v % 2}
    if uneven:
        notes.append("NOT HANDLED: " + ", ".join(f"`{n}`'s {v} tokens" for n, v in uneven.items()) + " do not split "
                     "evenly over 2 ranks (cache-dit's split refuses them)")
    every: dict[str, dict[Any, str]] = {}
    for t in a.traits.per_block_tensors:
        if t["list"] != f"{transformer}.{first.attribute}" or t["dim"] != 0:
            continue
        if t.get("made_by"):
            notes.append(f"NOT HANDLED: `{t['argument']}` {t['shape']} is made by `{t['made_by']}`: split it by hand")
            continue
        add_table(every, t, SPLIT.format(ndim=len(t["shape"])), notes, f"{first.attribute}.*")
    every_block_entries(every, entries, notes, f"{first.attribute}.*")
    for name, tokens in streams.items():
        out = next((m for m in s.gather_candidates if _tokens(observed, m) == tokens), None)
        if out is None:
            notes.append(f"NOT HANDLED: no module after the blocks was seen returning `{name}`'s {tokens} tokens: "
                         "no gather point")
            continue
        notes.append(f"`{out}` is the first module after the blocks returning [{tokens}, features] (`{name}`'s "
                     "tokens): gathered there on dim 0")
        entries.append(f'"{out}": _ContextParallelOutput(gather_dim=0, expected_dims=2)')
    for g in a.attention.groups:
        if g.transformer != transformer or not g.calls or not g.group.startswith(first.attribute + ".*."):
            continue
        proc, path = observed.processors.get(g.group, {}), g.group.partition(".*.")[2]
        causal = f"kernel {transformer}.{g.group}: is_causal=True" in a.attention.mask_sources
        why = ("its kernel was called with is_causal=True over one stream (observed), which cache-dit's CP refuses; "
               "under Ulysses each rank holds the whole stream in its order after the all-to-all (a share of the "
               "heads), so an explicit causal mask over the gathered tokens is exact" if causal else "")
        if g.enable_gqa:
            why += ("; " if why else "") + ("its kernel was called with enable_gqa=True (fewer key/value heads), "
                                            "which cache-dit's CP takes only with a GQA strategy: "
                                            "replicate_kv_sequence (each rank's query heads meet their kv heads)")
        why += ("; " if why else "") + ("where a call's queries are fewer than its keys (one stream's queries "
                                        "over several streams' keys), the routed kernel pads them to the keys' "
                                        "length and drops those rows")
        if not proc.get("routable"):
            notes.append(f"NOT HANDLED: `{g.group}`: {why}; its processor calls no `dispatch_attention_fn` the "
                         "scaffold can route")
            continue
        notes.append(f"`{g.group}`: {why}; routed through cache-dit's dispatcher with the CP config (cp-ulysses-2 "
                     "fails with is_causal, or GQA without a strategy, handed on)")
        code.append(f"    route_attention([block.{path} for block in transformer.{first.attribute}])")
    return entries, notes, code


def _tokens(observed: Any, module: str) -> int | None:
    """The tokens (dim 0) of what `module` was seen taking: its first tensor input ([tokens, features])."""
    inputs = observed.child_inputs.get(module) or []
    return inputs[0][0] if inputs and len(inputs[0]) == 2 else None


def add_table(every: dict[str, dict[Any, str]], t: dict[str, Any], split: str, notes: list[str], where: str) -> None:
    """Record the split at every block (`where`) of `t`, a per-token table built in forward that the blocks take: its
    argument is a name, or `name[i]` for element i of a tuple (RoPE's cos and sin)."""
    name, _, index = t["argument"].partition("[")
    index = index.rstrip("]")
    every.setdefault(name, {})[int(index) if index.isdigit() else None] = split
    notes.append(f"`{t['argument']}` {t['shape']} is built in forward (no module makes it) and handed to every block "
                 f"of `{t['list']}` with the sequence on dim {t['dim']}: split at every block (`{where}`); left whole, "
                 "the blocks would pair each rank's tokens with the first rows of the table (cp-ulysses-2 tells them "
                 "apart)")


def every_block_entries(every: dict[str, dict[Any, str]], entries: list[str], notes: list[str], where: str) -> None:
    """The plan entry at every block (`where`) for the tables `add_table` recorded: a whole argument, or a tuple every
    element of which is split; an argument split at some elements only is named NOT HANDLED."""
    parts = []
    for name, split in every.items():
        keys = list(split)
        if keys == [None]:
            parts.append(f'"{name}": {split[None]}')
        elif None not in keys and sorted(keys) == list(range(len(keys))):
            parts.append(f'"{name}": [' + ", ".join(split[i] for i in range(len(keys))) + "]")
        else:
            notes.append(f"NOT HANDLED: `{name}` reaches the blocks with per-token tables at elements "
                         f"{sorted(str(i) for i in keys)} only: split it at `{where}` by hand")
    if parts:
        entries.append(f'"{where}": {{' + ", ".join(parts) + "}")
