"""The CP choice for block lists whose blocks fold their token stream into the image grid (`traits.grid_blocks`:
Sana's block unflattens its tokens with the height and width it is handed and runs its feed-forward, a depthwise
convolution, over the grid). Split, each rank would hold a share of the tokens with the whole grid's sizes, and a
convolution over the grid needs rows another rank holds: the blocks run on the gathered sequence. An attention group
of a split list in which no attention kernel was seen (a linear attention) is named NOT HANDLED."""

from __future__ import annotations

from typing import Any

Observed = Any  # ditgate.scaffold.write.Observed


def grid_lists(observed: Observed, transformer: str, entries: list[str], notes: list[str], code: list[str]) -> set[str]:
    """The block lists of `transformer` whose blocks run on the gathered sequence (seen folding their stream into the
    grid), their comments added to `notes` and the code run before the plan is returned to `code` (`entries`: the CP
    plan's entries so far); and a NOT HANDLED comment for each attention group of another list called with no
    attention kernel seen in it (a linear attention, which a split would run over each rank's share of the keys)."""
    a = observed.anatomy
    lists = {b.attribute: b for b in a.block_lists if b.transformer == transformer}
    gathered = set()
    for g in a.traits.grid_blocks:
        attribute = g["list"].split(".", 1)[1]
        if not g["list"].startswith(transformer + ".") or attribute in a.sequence.refiners:
            continue  # another transformer's, or a list that runs whole before the split
        sizes = " x ".join(f"`{n}` = {v}" for n, v in zip(g["arguments"], g["values"]))
        seen = (f"`{attribute}` folds its {g['tokens']}-token stream into the image grid with integers its blocks "
                f"are handed ({sizes}, observed; its code: `{g['line']}`)")
        block = lists.get(attribute)
        others = [e for e in entries if e.startswith(f'"{attribute}.*"')]
        if block is None or len(block.outputs or []) != 1 or a.sequence.joint or others:
            notes.append(f"NOT HANDLED: {seen}; its blocks also take or return other split tensors (a joint text, "
                         "per-token tables split at every block): run them on the gathered sequence by hand")
            continue
        notes.append(f"{seen}: split, each rank would hand its blocks a share of the tokens with the whole grid's "
                     "sizes, and an operation over the grid (a convolution) needs rows other ranks hold. Each block "
                     f"runs on the gathered `{g['stream']}` and keeps this rank's share of what it returns "
                     "(gather_grid): exact, but every rank computes these blocks whole (no CP speed-up in them). "
                     "The other choice, a halo exchange (each rank's rows of the grid with its neighbours' edge rows, "
                     "the sizes cut to its rows), is not written; left split, cp-ulysses-2 fails")
        code.append(f"    gather_grid(transformer, transformer.{attribute}, ({g['stream']!r},))")
        gathered.add(attribute)
    for g in a.attention.groups:
        attribute = g.group.partition(".*.")[0]
        if g.transformer == transformer and g.calls and g.kind is None and ".*." in g.group \
                and attribute not in gathered and attribute not in a.sequence.refiners:
            notes.append(f"NOT HANDLED: `{g.group}` ({g.processor}) was called but no attention kernel (SDPA, "
                         "dispatch_attention_fn) was seen in it (a linear attention, or one written out by hand): "
                         "split, it would attend over this rank's share only; decide its CP by hand")
    return gathered
