"""The block-loop PatchFunctor of a scaffolded plugin (`ditgate.scaffold.runtime.FUNCTOR`'s `BlockLoop`), from what
the loop was seen doing around its block calls: per-block arguments, a block's sub-module read outside the loop, and
skips inside the loop (a block handed an earlier block's output). What it does not cover is named NOT HANDLED."""

from __future__ import annotations


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


SKIP_FINDING = "(a skip inside the loop)"  # ditgate.inspect.blocks.audit_loop's finding, handled by `skips`


def _skips(b) -> tuple[dict[str, dict[int, tuple[int, int]]], str]:
    """`BlockLoop`'s `skips` entry of list `b` (argument -> {block: (earlier block, output position)}) and its note."""
    skips = {a: {int(j): tuple(src) for j, src in receivers.items()} for a, receivers in b.skip_sources.items()}
    pairs = "; ".join(f"`{a}`: " + ", ".join(f"block {j} <- block {src[0]}" for j, src in sorted(r.items()))
                      for a, r in skips.items())
    return skips, (f"`{b.attribute}`: the loop hands later blocks an earlier block's output (observed, the same "
                   f"tensor: {pairs}), a skip stack inside the loop; cache-dit's cached block list calls every block "
                   "with the first one's arguments, so BlockLoop keeps each call's outputs of those earlier blocks "
                   "and hands each later block its own (without it the cache row errors or departs: the later "
                   "blocks get no skip)")


def _functor(lists: list, outside: dict[str, list] | None = None) -> tuple[str | None, list[str]]:
    """The PatchFunctor the block loop needs, from what it was seen doing between block calls: per-block arguments
    (each block handed its own value, not the previous block's output) are recorded per call and handed back to
    each block, and an earlier block's output handed to a later block (a skip inside the loop) is kept per call and
    handed on (`BlockLoop`); a stream the loop changes between blocks, or a module it calls there, is
    named NOT HANDLED (the fix is the model's own loop moved into a functor by hand)."""
    entries, skips, notes = [], {}, []
    for b in lists:
        if b.stream_changed_between or any("also calls" in f for f in b.loop_findings):
            notes.append(f"NOT HANDLED: `{b.attribute}`: {'; '.join(b.loop_findings)}; write a PatchFunctor that "
                         "moves that work into the blocks (cache-dit's HunyuanDiT and ControlNet functors do)")
            continue
        if b.skip_sources:
            skips[b.attribute], note = _skips(b)
            notes.append(note)
        if not b.per_block_arguments:
            left = [f for f in b.loop_findings if SKIP_FINDING not in f]
            if b.patch_functor_needed and (left or not b.skip_sources or "PatchFunctor" in b.pattern_reason):
                notes.append(f"NOT HANDLED: `{b.attribute}` needs a PatchFunctor the scaffold does not write: "
                             f"{'; '.join(left) or b.pattern_reason}")
            continue
        positional = [p.name for p in b.signature if p.kind in ("positional_only", "positional_or_keyword")]
        names = {"hidden_states": positional[0] if positional else None, "encoder_hidden_states": b.encoder_param}
        returns = [names.get(role) for role in b.outputs or []]
        if None in returns:
            notes.append(f"NOT HANDLED: `{b.attribute}` gets per-block {b.per_block_arguments}, and what it returns "
                         f"({b.outputs}) does not map onto its inputs")
            continue
        entries.append(f'"{b.attribute}": ({b.per_block_arguments!r}, {returns!r})')
        notes.append(f"`{b.attribute}`: block 1 was handed other {b.per_block_arguments} than block 0 (observed), "
                     "while its stream inputs are the previous block's outputs; cache-dit's cached block list "
                     "would hand every block the first one's: BlockLoop records each block's own per call "
                     "and hands it back; without it the cache row's caching-off check departs from the baseline")
    if not entries and not outside and not skips:
        return None, notes
    return "BlockLoop({" + ", ".join(entries) + "}" + (f", outside={outside!r}" if outside else "") \
        + (f", skips={skips!r}" if skips else "") + ")", notes
