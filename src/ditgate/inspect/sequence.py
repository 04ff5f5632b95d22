"""The sequence a transformer call sees: lengths of the image and text parts, tensors built once and handed to every block, what the ranks must divide."""

from __future__ import annotations

from ditgate.inspect.model import E
from ditgate.inspect.blocks import _positional

import math
from typing import Any
from ditgate.inspect.model import BlockList, RANKS, Sequence


# -- sequence and divisibility ------------------------------------------------------------------------------------
def analyse_sequence(record, lists: list[BlockList]) -> tuple[Sequence, int | None]:
    """The sequence entering the first block list that runs, its batch, per-token tables and gather points."""
    import torch

    sequence = Sequence()
    called = [b for b in lists if b.called]
    first_event: dict[str, int] = {}
    for i, event in enumerate(record.events):
        first_event.setdefault(event.rsplit(".", 1)[0], i)
    called.sort(key=lambda b: first_event.get(b.attribute, math.inf))
    if not called:
        return sequence, None
    refiners = _refiners(record, called)
    first = next(b for b in called if b.attribute not in refiners)
    sequence.block_list, sequence.refiners = first.attribute, refiners
    bound = record.lists[first.attribute].first_call.bound
    hidden = _hidden(record, first)
    batch = None
    if isinstance(hidden, torch.Tensor) and hidden.ndim == 3:
        batch, sequence.image_tokens = hidden.shape[0], hidden.shape[1]
    e_param = first.encoder_param or (E if E in bound else None)
    text = bound.get(e_param) if e_param else None
    if isinstance(text, torch.Tensor) and text.ndim == 3:
        sequence.text_tokens = text.shape[1]
    sequence.attention_tokens = sequence.image_tokens
    _tables_and_gathers(record, sequence, hidden, text, first.attribute)
    if isinstance(hidden, torch.Tensor) and hidden.ndim == 2:
        _packed(record, sequence, first, hidden, e_param)
    return sequence, batch


def _packed(record, sequence: Sequence, first: BlockList, hidden, e_param: str | None) -> None:
    """A batch-less layout: the blocks' streams (the first input and the one they return updated) are [tokens,
    features] tensors, tokens on dim 0. The gather candidates are then the modules run after the blocks whose output
    is [tokens of a stream, features]."""
    import torch

    bound = record.lists[first.attribute].first_call.bound
    names = [_positional(first.signature)[0]] + ([e_param] if e_param else [])
    for name in names:
        value = bound.get(name)
        if isinstance(value, torch.Tensor) and value.ndim == 2 and value.shape[-1] == hidden.shape[-1]:
            sequence.packed[name] = int(value.shape[0])
    events = record.events
    last_block = max((i for i, e in enumerate(events) if e.rsplit(".", 1)[0] in record.lists), default=-1)
    for name in dict.fromkeys(events[last_block + 1:]):
        out = record.child_outputs.get(name)
        if isinstance(out, torch.Tensor) and out.ndim == 2 and int(out.shape[0]) in sequence.packed.values() \
                and out.shape[-1] == hidden.shape[-1]:
            sequence.gather_candidates.append(name)


def _hidden(record, b):
    """The first positional input of `b`'s first block on its first call."""
    h_param = _positional(b.signature)[0] if _positional(b.signature) else None
    return record.lists[b.attribute].first_call.bound.get(h_param)


def _text_stream(record, b) -> bool:
    bound = record.lists[b.attribute].first_call.bound
    return bool(b.encoder_param) or getattr(bound.get(E), "ndim", 0) == 3


def _refiners(record, called: list[BlockList]) -> list[str]:
    """Block lists that refine one part of the sequence before the main blocks (Lumina2's and Z-Image's noise and
    context refiners): run before a later list, without a text stream of their own, on a sequence shorter than
    that later list's, which the forward concatenates from their outputs."""
    out = []
    for i, b in enumerate(called):
        hidden = _hidden(record, b)
        if _text_stream(record, b) or getattr(hidden, "ndim", 0) != 3:
            break
        later = [_hidden(record, c) for c in called[i + 1:]]
        if not any(getattr(h, "ndim", 0) == 3 and h.shape[1] > hidden.shape[1] for h in later):
            break
        out.append(b.attribute)
    return out


def _leaves(value: Any):
    """Tensors inside a value (tuples, lists and dicts are searched)."""
    if isinstance(value, (tuple, list)):
        for v in value:
            yield from _leaves(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif hasattr(value, "shape"):
        yield value


def _tables_and_gathers(record, sequence: Sequence, hidden, text, first_list: str) -> None:
    """Per-token tables (outputs of modules run before the blocks that reach the blocks with a sequence-long dim)
    and gather candidates (modules run after the blocks whose output still has the image sequence)."""
    import torch

    s_img, s_txt = sequence.image_tokens, sequence.text_tokens
    lengths = {n: what for n, what in ((s_img, "image"), (s_txt, "text"),
                                       ((s_img + s_txt) if s_img and s_txt else None, "image + text")) if n}
    events = record.events
    block_inputs = {id(t) for t in _leaves(record.lists[first_list].first_call.bound)}
    first_block = events.index(f"{first_list}.0") if f"{first_list}.0" in events else len(events)
    last_block = max((i for i, e in enumerate(events) if e.rsplit(".", 1)[0] in record.lists), default=-1)
    for name in dict.fromkeys(events[:first_block]):
        found = []
        for i, out in enumerate(_leaves(record.child_outputs.get(name))):
            if out is hidden:
                sequence.hidden_made_by = name
            if out is hidden or out is text or id(out) not in block_inputs:
                continue
            dims = [d for d, n in enumerate(out.shape) if n in lengths]
            if dims:
                found.append(f"output {i} {list(out.shape)} (dim {dims[0]}: {lengths[out.shape[dims[0]]]} tokens)")
        if found:
            sequence.per_token_tables.append(f"{name}: " + ", ".join(found))
    for name in dict.fromkeys(events[last_block + 1:]):
        out = record.child_outputs.get(name)
        if isinstance(out, torch.Tensor) and out.ndim == 3 and out.shape[1] == s_img:
            sequence.gather_candidates.append(name)


def divisibility(sequence: Sequence, heads: int | None, kv_heads: int | None) -> dict[str, dict[str, Any]]:
    """Per rank count: whether the split sequences (the text only under joint attention; cross-attention keeps it
    whole) and the query and key/value heads reaching the kernel (after any expansion) divide."""
    def div(n: int | None, r: int) -> bool | None:
        return None if n is None else n % r == 0

    table = {}
    text = sequence.text_tokens if sequence.joint else None
    for r in RANKS:
        row = {"image_tokens": div(sequence.image_tokens, r), "text_tokens": div(text, r),
               "heads": div(heads, r), "kv_heads": div(kv_heads, r)}
        split = [row["image_tokens"]] + ([row["text_tokens"]] if sequence.joint else [])
        seq_ok = all(x is not False for x in split)
        row["ulysses"] = "ok" if seq_ok and row["heads"] is not False and row["kv_heads"] is not False \
            else "ulysses-anything"
        row["ring"] = seq_ok
        row["tp"] = row["heads"] is not False and row["kv_heads"] is not False
        table[str(r)] = row
    return table
