"""The CP part of a scaffolded plugin: where the sequence is split (the root or the first block), which per-token
tables and streams are split with it, where it is gathered, and the code the plan runs first: attention routed
through cache-dit's dispatcher (`ditgate.scaffold.attend`) and sequence-dependent routing run on the gathered
sequence (`GatheredRouting`). Each choice comes back with the comment that names its observation."""

from __future__ import annotations

import re
from typing import Any

from ditgate.scaffold.attend import _attention_code
from ditgate.scaffold.grid import grid_lists
from ditgate.scaffold.halved import _seq_dim, note, reached
from ditgate.scaffold.joint import joint_tables, text_pieces
from ditgate.scaffold.packed import _packed_cp, add_table, every_block_entries

Observed = Any  # ditgate.scaffold.write.Observed (imported by that module, so named here without importing it)
SPLIT = "_ContextParallelInput(split_dim={dim}, expected_dims={ndim}, split_output={out})"


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


def _text_mask(first, txt: int | None) -> str | None:
    """The block input that masks the text: a [batch, text tokens] tensor whose name says mask."""
    for name, summary in first.call["inputs"].items():
        dims = re.match(r"tensor\[([\d, ]+)\]", summary or "")
        if "mask" in name.lower() and dims and [int(x) for x in dims.group(1).split(",")][1:] == [txt]:
            return name
    return None


def _own(tensors: list[dict[str, Any]], transformer: str) -> list[dict[str, Any]]:
    """The per-block tensors of `transformer`'s lists (another transformer of the pipeline has its own)."""
    return [t for t in tensors if t["list"].startswith(transformer + ".")]


def _root_split_ok(observed: Observed, transformer: str) -> tuple[bool, str]:
    """A split at the transformer's root is right only if every per-token table the blocks receive is made from a
    tensor that is split there (else the forward builds it whole, or from each rank's share of another length)."""
    a = observed.anatomy
    s = a.sequence
    lengths = {n for n in (s.image_tokens, s.text_tokens) if n}
    both = s.image_tokens + s.text_tokens if s.joint and s.image_tokens and s.text_tokens else None
    root = [d for shape in observed.roots.get(transformer, {}).values() for d in shape[:2]]
    for t in _own(a.traits.per_block_tensors, transformer):
        maker = t.get("made_by")
        if both and t["shape"][t["dim"]] == both and s.image_tokens in root and s.text_tokens in root:
            continue  # a joint table built from the text's and the image's positions, both split at the root
        if maker is None:
            return False, (f"`{t['argument']}` {t['shape']} is built in forward by no module and handed to every "
                           f"block: a root split would not reach it")
        if t["shape"][t["dim"]] == s.image_tokens:  # its output splits whatever the module builds it from
            return False, (f"`{maker}` makes `{t['argument']}` {t['shape']} for the image tokens: split at its output "
                           "(a root split is right only when it builds the table from the split input, which the "
                           "shapes do not show; LTX's RoPE reads the frame grid, not the tokens)")
        inputs = observed.child_inputs.get(maker, [])
        if not any(d in lengths for shape in inputs for d in shape):
            return False, (f"`{maker}` makes `{t['argument']}` {t['shape']} from no sequence-long tensor (its tensor "
                           f"inputs: {inputs or 'none'}): a root split would not reach it")
    return True, ""


def _cp(observed: Observed, transformer: str, first) -> tuple[list[str], list[str], list[str]]:
    """(plan entries, comments, code run before the plan is returned) of the CP plan."""
    if observed.anatomy.sequence.packed:  # batch-less [tokens, features] streams
        return _packed_cp(observed, transformer, first)
    a = observed.anatomy
    s = a.sequence
    img, txt, joint = s.image_tokens, s.text_tokens, s.joint
    lengths = {img} | ({txt} if joint and txt else set())
    root = observed.roots.get(transformer, {})
    entries, notes, code = [], [], []
    at_root = {n: (_seq_dim(shape, lengths), len(shape)) for n, shape in root.items()}
    at_root = {n: v for n, v in at_root.items() if v[0] is not None and "mask" not in n.lower()}  # never the stream
    root_ok, why_not = _root_split_ok(observed, transformer)
    if not root_ok and (firsts := reached(observed, transformer)):  # every list, refiners too, gets its share
        notes.append(note(observed, transformer, firsts, why_not))
        root_ok, why_not, s.refiners[:] = True, "", []
    split_at_root = any(root[n][d] == img for n, (d, _) in at_root.items()) and root_ok
    if split_at_root:
        notes.append(f"the transformer's own inputs carry the {img}-token sequence "
                     f"({', '.join(f'{n} {root[n]}' for n in at_root)}): split them at the root, so every table "
                     "the forward builds from them (RoPE, positions) is built from each rank's share")
        if joint:
            notes.append(f"joint attention (image queries attend to image and {txt} text keys concatenated): the text "
                         "is split too; the other choice, text kept whole, is told apart by cp-ulysses-2")
        body = ", ".join(f'"{n}": ' + SPLIT.format(dim=d, ndim=nd, out=False) for n, (d, nd) in at_root.items())
        entries.append(f'"": {{{body}}}')
        given = observed.root_lists.get(transformer, {})
        lists = {n: dims.pop() for n, shapes in given.items()
                 if len(dims := {_seq_dim(shape, lengths) for shape in shapes}) == 1 and None not in dims}
        if lists:
            seen = ", ".join(f"`{n}` {len(given[n])} x {given[n][0]}" for n in lists)
            notes.append(f"the transformer takes lists of sequence-long tensors ({seen}), which a root split does not "
                         "reach (it takes tensors): each element is split on its sequence dimension with the tensors "
                         "it meets (split_list_inputs); left whole, cp-ulysses-2 fails")
            code.append(f"    split_list_inputs(transformer, {lists!r})")
    else:
        hidden = first.call["positional"][0] if first.call["positional"] else "hidden_states"
        reason = why_not or f"the transformer's inputs carry no {img}-token dimension (the sequence is made inside its forward)"
        notes.append(f"{reason}: split at `{first.attribute}.0`, whose `{hidden}` is "
                     f"{first.call['inputs'].get(hidden)}")
        split = {hidden: SPLIT.format(dim=1, ndim=3, out=False)}
        skip = [n for n in a.traits.long_skips if n.startswith(transformer + ":")]
        if skip and s.hidden_made_by:
            split = {}
            entries.append(f'"{s.hidden_made_by}": {{0: ' + SPLIT.format(dim=1, ndim=3, out=True) + "}")
            notes.append(f"long skip ({skip[0].split(': ', 1)[-1]}): the stream is split where it is made, at the "
                         f"output of `{s.hidden_made_by}`, so the residual taken before the first block is split "
                         f"too; a split at `{first.attribute}.0` would leave it whole (cp-ulysses-2 tells them apart)")
        elif skip:
            notes.append(f"NOT HANDLED: long skip ({skip[0]}) and no module was seen making the first block's input")
        text = _text_param(first, txt)
        every, (pieces, more) = {}, text_pieces(observed, transformer, first, text) if joint else ([], [])
        notes += more
        if joint and text and not pieces:
            returned = text == first.encoder_param  # the blocks hand it on; else the forward gives each block its own
            text_split = SPLIT.format(dim=1, ndim=3, out=False)  # at every block: one split of the whole argument
            (split if returned else every)[text] = text_split if returned else {None: text_split}
            notes.append(f"joint attention (keys hold image and text): the text stream `{text}` "
                         f"{first.call['inputs'].get(text)} is split with the image" + (
                             "" if returned else f", at every block (`{first.attribute}.*`: the blocks do not return "
                             "it, so the forward hands each block the whole text)")
                         + "; the other choice, text kept whole, is told apart by cp-ulysses-2")
        elif txt and not pieces:
            notes.append(f"cross attention (keys from the {txt}-token text): the text stays whole on every rank")
        if body := ", ".join(f'"{k}": {v}' for k, v in split.items()):
            entries.append(f'"{first.attribute}.0": {{{body}}}')
        entries += pieces
        made: dict[str, list[str]] = {}
        keyed: dict[str, dict[str, int]] = {}  # module -> {key of its dict output: sequence dim}
        for t in _own(a.traits.per_block_tensors, transformer):
            if t.get("made_by") and t["shape"][t["dim"]] in lengths:
                index = t["argument"].rsplit("[", 1)[1].rstrip("]") if "[" in t["argument"] else None
                if index is None and (t.get("output") or "").startswith("["):  # one element of what it returns
                    every.setdefault(t["argument"], {})[None] = SPLIT.format(dim=t["dim"], ndim=len(t["shape"]),
                                                                              out=False)
                    notes.append(f"`{t['argument']}` {t['shape']} reaches every block of `{t['list']}` with the "
                                 f"sequence on dim {t['dim']}, as element {t['output']} of what `{t['made_by']}` "
                                 f"returns (cache-dit's output split takes tensors only): split at every block "
                                 f"(`{first.attribute}.*`)")
                    continue
                if index is not None and index[:1] in "'\"":  # a dict output: cache-dit's split takes no dict
                    keyed.setdefault(t["made_by"], {})[index.strip("'\"")] = t["dim"]
                    notes.append(f"`{t['argument']}` {t['shape']} reaches every block of `{t['list']}` with the "
                                 f"sequence on dim {t['dim']}, in a dict made by `{t['made_by']}`: each entry cut to "
                                 "this rank's share where it is made (split_dict_output; a CP plan entry cannot "
                                 "split a dict)")
                    continue
                made.setdefault(t["made_by"], []).append(
                    (f"{index}: " if index is not None else "") +
                    SPLIT.format(dim=t["dim"], ndim=len(t["shape"]), out=True))
                notes.append(f"`{t['argument']}` {t['shape']} reaches every block of `{t['list']}` with the sequence "
                             f"on dim {t['dim']}, made by `{t['made_by']}`: its output is split there")
            elif not t.get("made_by") and t["shape"][t["dim"]] in lengths \
                    and t["list"] == f"{transformer}.{first.attribute}":
                add_table(every, t, SPLIT.format(dim=t["dim"], ndim=len(t["shape"]), out=False), notes,
                          f"{first.attribute}.*")
        every_block_entries(every, entries, notes, f"{first.attribute}.*")
        for module, parts in made.items():
            entries.append(f'"{module}": {{' + ", ".join(p if ":" in p else f"0: {p}" for p in parts) + "}")
        for module, dims in keyed.items():
            code.append(f"    split_dict_output(transformer, transformer.{module}, {dims!r})")
        code += joint_tables(s.per_token_tables, [b for b in a.block_lists if b.transformer == transformer
                                                  and b.called and b.chained], img, notes) if joint else []
    gathered = grid_lists(observed, transformer, entries, notes, code)  # lists run on the gathered stream
    code += count_code(a, transformer, split_at_root, notes)
    uneven = {n: v for n, v in (("image", img), ("text", txt if joint else None)) if v and v % 2}
    mask = _text_mask(first, txt) if "text" in uneven and entries and entries[0].startswith(f'"{first.attribute}.0"') \
        else None
    if mask:
        del uneven["text"]
        notes.append(f"the {txt} text tokens do not split evenly over the ranks: under CP the text and its mask "
                     f"`{mask}` get masked zero tokens up to a length the ranks divide (pad_text), the mask split with "
                     "the text at every block; the routed attention gathers every rank's key mask in Ulysses' order")
        code.append(f"    pad_text(transformer, transformer.{first.attribute}, (\"{_text_param(first, txt)}\", "
                    f"\"{mask}\"), {txt})")
        entries.append(f'"{first.attribute}.*": {{"{mask}": ' + SPLIT.format(dim=1, ndim=2, out=False) + "}")
    if uneven:
        notes.append("NOT HANDLED: " + ", ".join(f"the {v} {n} tokens" for n, v in uneven.items()) + " do not split "
                     "evenly over 2 ranks (cache-dit's split refuses them): choose a size or max_sequence_length "
                     "that makes them even (or Ulysses-anything on GPUs)")
    if s.gather_candidates:
        out = s.gather_candidates[0]
        notes.append(f"`{out}` is the first module after the blocks whose output keeps the {img}-token sequence: "
                     "gather there, so whatever the forward does after it (a per-token scale and shift) meets whole "
                     f"tensors; gathering later (at `{s.gather_candidates[-1]}`) is the other choice")
        entries.append(f'"{out}": _ContextParallelOutput(gather_dim=1, expected_dims=3)')
    elif _last_list(a, transformer, first) and len(first.outputs or []) == 1 and entries \
            and not entries[0].startswith('"": '):
        last = f"{first.attribute}.{first.length - 1}"
        notes.append(f"no module after the blocks keeps the sequence (the forward unpatchifies per sample): gather at "
                     f"the output of the last block `{last}`, which returns the split stream alone")
        entries.append(f'"{last}": _ContextParallelOutput(gather_dim=1, expected_dims=3)')
    else:
        notes.append("NOT HANDLED: no module after the blocks keeps the sequence; no gather point was observed")
    code += _attention_code(observed, transformer, notes, None if split_at_root else first.attribute, gathered)
    code += _routing_code(observed, transformer, notes)
    return entries, notes, code


def count_code(a, transformer: str, split_at_root: bool, notes: list[str]) -> list[str]:
    """The code that gives each rank the count of the tokens its share holds, for every integer a block list of
    `transformer` receives counting one end of its sequence (`a.traits.part_counts`); NOT HANDLED under a split at
    the transformer's inputs (`split_at_root`), where a rank's stream is no contiguous slice of the whole one."""
    code = []
    for p in a.traits.part_counts:
        attribute = p["list"].split(".", 1)[-1]
        if not p["list"].startswith(transformer + ".") or attribute in a.sequence.refiners:
            continue
        counted = (f"`{p['argument']}` = {p['value']} reaches every block of `{attribute}` as an integer counting "
                   f"the {p['end']} of its {p['tokens']}-token sequence (observed: those tokens are `{p['made_by']}`'s "
                   "output)")
        if split_at_root:  # count_parts takes each rank's stream for one contiguous slice of the whole one
            notes.append(f"NOT HANDLED: {counted}, and the sequence is split at the transformer's inputs, so each "
                         "rank's stream is its share of every part the forward joins, not one slice of the whole: "
                         "give each rank the count of those tokens in its own stream by hand")
            continue
        notes.append(f"{counted}: a split of the sequence would hand every rank the whole count, so each rank gets the "
                     "count of those tokens in its own share (count_parts); left whole, cp-ulysses-2 fails")
        code.append(f"    count_parts(transformer, transformer.{attribute}, {p['argument']!r}, {p['end']!r})")
    return code


def _last_list(a, transformer: str, first) -> bool:
    """Whether `first` is the only list of `transformer` the split sequence reaches (the others refine parts of it
    before the split): no later list needs the split stream, so its last block may gather it."""
    return all(b.attribute == first.attribute or b.attribute in a.sequence.refiners
               for b in a.block_lists if b.transformer == transformer and b.called)


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


def even_text_call(observed: Observed, call: dict, params: dict) -> dict:
    """Call arguments for the twin under which CP splits a joint text evenly over 2 ranks: when the observed text
    tokens are odd and the pipeline pads its text to `max_sequence_length` (SD3: 77 CLIP tokens + T5's), one more
    than the observed call's (`call`, else the `__call__` default in `params`, parameter name -> default)."""
    s = observed.anatomy.sequence
    if not (s.joint and s.text_tokens and s.text_tokens % 2 and "max_sequence_length" in params):
        return {}
    used = call.get("max_sequence_length", params["max_sequence_length"])
    return {"max_sequence_length": used + 1} if isinstance(used, int) and not isinstance(used, bool) else {}
