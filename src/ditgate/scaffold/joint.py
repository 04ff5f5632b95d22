"""The CP part of a scaffolded plugin for a joint text the forward assembles: text pieces made by a list of modules
that do not chain (HiDream's per-layer caption projections), joined along the sequence into the blocks' text, split
where they are made (`watch_pieces` observes which), and a per-token table over the image then the text tokens cut to
each rank's image share joined to its text share (`split_joint_output`)."""

from __future__ import annotations

import re
from typing import Any

SPLIT = "_ContextParallelInput(split_dim={dim}, expected_dims={ndim}, split_output=True)"


def watch_pieces(transformer, name: str, seen: Any, handles: list) -> None:
    """On `transformer`'s first call: for each block list whose blocks did not chain so far (no block was handed the
    previous block's output or a part of it), which input of another list's first block holds one of its outputs
    along which dimension: `seen.pieces[name][list] = (input, dim, output ndim)`."""
    import inspect as pyinspect

    import torch

    from ditgate.inspect.observe import block_lists, carries

    kept: dict[str, list] = {}  # list -> its blocks' outputs, while it has not chained
    found = seen.pieces.setdefault(name, {})
    done = []

    def bound(mod, args, kwargs):
        try:
            return pyinspect.signature(mod.forward).bind_partial(*args, **kwargs).arguments
        except TypeError:
            return dict(kwargs)

    for attribute, blocks in block_lists(transformer).items():
        for index, block in enumerate(blocks):
            def pre(mod, args, kwargs, attribute=attribute, index=index):
                if done:
                    return
                inputs = {k: v for k, v in bound(mod, args, kwargs).items() if torch.is_tensor(v)}
                previous = kept.get(attribute)
                if index and previous and any(v is previous[-1] or carries(previous[-1], v) is not None
                                              for v in inputs.values()):
                    kept[attribute] = None  # it chains: a loop, not pieces
                if index == 0:
                    for other, outputs in kept.items():
                        for param, value in inputs.items():
                            dims = {carries(o, value) for o in outputs or ()} - {None}
                            if other != attribute and len(dims) == 1 and other not in found:
                                found[other] = (param, dims.pop(), outputs[0].ndim)

            def post(mod, args, kwargs, output, attribute=attribute):
                if not done and kept.get(attribute, []) is not None and torch.is_tensor(output):
                    kept.setdefault(attribute, []).append(output)

            handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))
            handles.append(block.register_forward_hook(post, with_kwargs=True))
    handles.append(transformer.register_forward_hook(lambda *a: done.append(True)))


def text_pieces(observed: Any, transformer: str, first, text: str | None) -> tuple[list[str], list[str]]:
    """(plan entries, notes) splitting, where they are made, the pieces the first block's text `text` is joined from
    along the sequence (dim 1) by lists of modules that do not chain; none when there are no such pieces."""
    loose = {b.attribute for b in observed.anatomy.block_lists if b.transformer == transformer and not b.chained}
    pieces = {m: v for m, v in observed.pieces.get(transformer, {}).items()
              if m in loose and v[0] == text and v[1] == 1}
    if not text or not pieces:
        return [], []
    entries = [f'"{m}.*": {{0: ' + SPLIT.format(dim=1, ndim=ndim) + "}" for m, (_, _, ndim) in pieces.items()]
    return entries, [f"the text `{text}` the blocks get is joined along the sequence from what "
                     f"{', '.join(f'`{m}.*`' for m in pieces)} return (observed: a whole slice of their outputs in "
                     f"`{first.attribute}.0`'s `{text}`, dim 1), each run on an input of its own: each output is "
                     "split where it is made, so every rank joins its share of each piece (the text is not split at "
                     "the first block, where it is already each rank's own)"]


def joint_tables(tables: list[str], lists: list, image_tokens: int, notes: list[str]) -> list[str]:
    """Code cutting, at the blocks of `lists`, each per-token table over the image then the text tokens (inspect's
    `per_token_tables`, found in a block's inputs by its shape) to this rank's image rows and its text rows."""
    code = []
    for table in tables:
        module, _, outputs = table.partition(": ")
        cut = len(code)
        for shape, dim in re.findall(r"output \d+ (\[[^\]]*\]) \(dim (\d+): image \+ text tokens\)", outputs):
            if not 1 <= int(dim) < len(shape.split(",")) - 1:  # a [batch, features] vector is no per-token table
                continue
            for b in lists:
                positional = [p.name for p in b.signature if p.kind in ("positional_only", "positional_or_keyword")]
                for param, summary in (b.call or {}).get("inputs", {}).items():
                    if not (summary or "").startswith(f"tensor{shape}") or not positional:
                        continue
                    notes.append(f"`{b.attribute}` gets `{param}` {shape} from `{module}`, a per-token table over the "
                                 f"{image_tokens} image tokens then the text (dim {dim}): each rank takes its share of "
                                 "the image rows and its share of the text rows (all of them where the forward made "
                                 "them from its own text), in the order of its own stream ([image_r, text_r]; "
                                 "cut_joint_table); right where the text rows it takes fit its text tokens (the cp "
                                 "row tells); left whole, cp-ulysses-2 fails")
                    code.append(f"    cut_joint_table(transformer, transformer.{b.attribute}, {param!r}, {dim}, "
                                f"{positional[0]!r}, {b.encoder_param!r})")
        if "image + text" in outputs and len(code) == cut:
            notes.append(f"NOT HANDLED: a per-token table over image and text concatenated ({table}) cannot be "
                         "split by its output; split the inputs it is made from")
    return code
