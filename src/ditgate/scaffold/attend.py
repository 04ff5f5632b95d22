"""The CP part of a scaffolded plugin that concerns attention: which attention modules the split sequence reaches
and are routed through cache-dit's dispatcher (`ditgate.scaffold.runtime.RoutedAttention`), and which run whole on
every rank without the CP config (refiners, modules called before the split, lists run on the gathered sequence).
Each choice comes back with the comment that names its observation."""

from __future__ import annotations

from typing import Any

from ditgate.scaffold.halved import split_self_attention

Observed = Any  # ditgate.scaffold.write.Observed (imported by that module, so named here without importing it)


def _before_split(observed: Observed, group: str, split_list: str | None) -> bool:
    """Whether the attention `group` (a path outside every block list) ran before the split: the transformer's child
    that holds it was first called before the first block of `split_list` (None: the split is at the root)."""
    order = observed.order
    top, split = group.split(".", 1)[0], f"{split_list}.0"
    return split_list is not None and top in order and split in order and order.index(top) < order.index(split)


def _attention_code(observed: Observed, transformer: str, notes: list[str], split_list: str | None,
                    gathered: set[str] = frozenset()) -> list[str]:
    """Route the attention groups the split sequence reaches (self or joint) through cache-dit's dispatcher where
    their processor does not pass the CP config, or where a joint key mask must be reordered for Ulysses; run those
    it does not reach (refiners, modules called before the split at `split_list`, `gathered` lists) without it."""
    a = observed.anatomy
    code = []
    for g in a.attention.groups:
        proc = observed.processors.get(g.group, {})
        if g.transformer == transformer and g.calls and ".*." not in g.group:  # outside every block list
            where = f"transformer.get_submodule({g.group!r})"
            if split_list is None and (kept := split_self_attention(observed, transformer, g, proc)):
                notes.append(kept)  # the root split reaches it: Ulysses gathers its keys
                continue
            if not _before_split(observed, g.group, split_list):
                notes.append(f"NOT HANDLED: `{g.group}` runs outside the block lists, not observed before the split "
                             "(the sequence may reach it split): decide its attention under CP by hand")
                continue
            why = (f"`{g.group}`: outside the block lists, called before the split at `{split_list}.0` (observed "
                   "order): its attention runs whole on every rank")
            code += _whole(why, proc, f"[{where}]", notes)
            continue
        attribute, _, path = g.group.partition(".*.")
        if g.transformer == transformer and g.calls and attribute in gathered:
            why = f"`{g.group}` ({g.processor}): its blocks run on the gathered sequence: its attention runs whole"
            code += _whole(why, proc, f"[block.{path} for block in transformer.{attribute}]", notes)
            continue
        if g.transformer == transformer and g.kind == "cross" and g.calls and g.mask and proc.get("passes_cp"):
            if not proc.get("routable"):
                notes.append(f"NOT HANDLED: `{g.group}`: cross-attention over a masked text that stays whole, and "
                             "its processor passes the CP config cache-dit sets on it (Ulysses would gather the text "
                             "keys against a mask of one copy): write its processor to run without it")
                continue
            notes.append(f"`{g.group}`: cross-attention (queries split, the {g.kv_len} text keys whole on every "
                         "rank, with a mask): its kernel runs without the CP config cache-dit sets on its processor "
                         "(local=True); with it, Ulysses gathers the text keys once per rank against a mask of one "
                         "copy (cp-ulysses-2 tells them apart)")
            code.append(f"    route_attention([block.{path} for block in transformer.{attribute}], local=True)")
            continue
        if g.transformer != transformer or g.kind not in ("self", "joint") or not g.calls:
            continue
        if attribute in a.sequence.refiners:
            why = (f"`{g.group}`: its list refines one part of the sequence before the split (the forward "
                   "concatenates the parts after it): its attention runs whole on every rank")
            code += _whole(why, proc, f"[block.{path} for block in transformer.{attribute}]", notes)
            continue
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
        in_code = proc.get("text_first_in_code")
        if pad is not None:
            order = (f"the text comes {'first' if text_first else 'after the image'} in the keys (the first padded "
                     f"key column observed is {pad} of {g.kv_len})")
        elif in_code is not None:
            text_first = in_code
            order = (f"no padded key was observed; its processor's code concatenates the text "
                     f"{'first' if in_code else 'after the image'} (torch.cat of its text and image projections)")
        else:
            order = "no padded key was observed: the text is taken to come after the image in the keys"
        s = a.sequence
        if g.kind == "self" and not s.joint and s.text_tokens and g.kv_len and s.image_tokens \
                and s.image_tokens < g.kv_len <= s.image_tokens + s.text_tokens:
            notes.append(f"`{g.group}`: {why}; its keys ({g.kv_len}) are the {s.image_tokens} image tokens and text "
                         "the processor joins per sample (Mochi's valid text), the text whole on every rank: each "
                         "rank attends over every rank's image keys, gathered, and its own text keys, without "
                         "Ulysses (gather_keys=True); Ulysses would gather the text once per rank")
            code.append(f"    route_attention([block.{path} for block in transformer.{attribute}], gather_keys=True)")
            continue
        notes.append(f"`{g.group}`: {why}; {order}")
        code.append(f"    route_attention([block.{path} for block in transformer.{attribute}], REORDER_MASK, "
                    f"text_first={text_first})")
    return code


def _whole(why: str, proc: dict[str, Any], modules: str, notes: list[str]) -> list[str]:
    """An attention that runs on a whole sequence on every rank: run without the CP config its processor passes on
    (`modules`: Python for the attention modules)."""
    if not proc.get("passes_cp"):
        notes.append(why + ", unrouted (its processor has no CP config attribute)")
        return []
    if not proc.get("routable"):
        notes.append(f"NOT HANDLED: {why}, but its processor passes the CP config cache-dit sets on it and "
                     "calls no `dispatch_attention_fn` the scaffold can route: write it to run without it")
        return []
    notes.append(why + ", without the CP config cache-dit sets on its processor (local=True); with it, "
                 "Ulysses would gather a whole sequence from every rank")
    return [f"    route_attention({modules}, local=True)"]
