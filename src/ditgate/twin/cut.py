"""Depth cuts of one model component, found from its config alone and checked by building the cut config again.

1. The component is built on the meta device from its config; its block lists are found (`blocks.block_lists`).
2. Each integer config key whose value equals a list's length is tried: built again with the key one higher, the
   lists whose length follows it are the lists it counts (`num_layers` counts `transformer_blocks`; `patch_size`,
   also 2, counts nothing). Keys that count several lists (a refiner pair, spatial and temporal lists) are cut
   together.
3. Every block gets a kind (`blocks` module docstring); the kept indices are the first block of each kind. The
   config is rewritten: the count, each per-layer list key of the same config (`layer_types`) cut to the kept
   indices, each index-list key (`fullatt_block_indexes`, `dual_attention_layers`) renumbered, and, where that is
   what rebuilds the same kinds, layer boundaries (`first_k_dense_replace`) moved to the kept positions.
4. The rewritten config is built again on the meta device; the cut stands only when every kept block has the
   kind and structure of the source block it stands for. Else a leading run of blocks is tried (the shortest one
   that holds every kind and rebuilds the same: one whole period of a pattern set by a period), else the list is
   kept whole and the plan says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Hashable

from ditgate.twin import blocks as blocks_mod
from ditgate.twin.meta import Library, Path_, TwinError, count, dotted, flatten, get, is_int, on_meta, with_values

_LIST_HINTS = ("layer", "block", "types", "pattern", "per_")
_INDEX_HINTS = ("index", "indices", "idx", "layers", "blocks", "layer_ids")
_BOUND_HINTS = ("layer", "block", "dense", "first", "last", "moe", "start", "end", "skip")
_NOT_TEXT = ("vision", "visual", "audio", "image")


@dataclass
class ListCut:
    path: str  # the list, dotted ("transformer_blocks")
    key: str  # the config key that counts it ("num_layers")
    before: int
    after: int
    kept: list[int]
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"list": self.path, "key": self.key, "before": self.before, "after": self.after, "kept": self.kept,
                "why": self.why}


@dataclass
class Plan:
    config: dict[str, Any]  # the twin's config
    cuts: list[ListCut] = field(default_factory=list)
    whole: dict[str, str] = field(default_factory=dict)  # list path -> why it is kept whole
    changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # dotted key -> (source, twin)
    params_source: int = 0
    params_twin: int = 0


@dataclass
class _Group:
    key: Path_
    value: int
    lists: dict[str, tuple[int, int]]  # list path -> (factor, offset): length = factor * value + offset


def plan(cls, library: Library, config: dict[str, Any], what: str, *, min_layers: int = 1,
         need_reason: str = "", denoiser: bool = False, encoder_depths: list[tuple[int, int]] | None = None,
         text: bool = False, deeper: int = 0) -> Plan:
    """The cut of the component `cls(config)`; `min_layers` is the fewest blocks a text model's main list keeps
    (hidden-state indices the pipeline reads, `need_reason` says which). A `denoiser` keeps two blocks of one list:
    a cache computes the first block of each list it caches (`Fn_compute_blocks=1`) and must have one behind it to
    skip; of several lists, the longest top-level list, of those as long the one whose block is smallest (only lists
    a config key counts are block lists here: a feed-forward's `net` in an embedder is not one). A `text` encoder keeps its first `min_layers`
    blocks of each text list (one or two layers: the pipeline reads its output, not each kind of block). `deeper`:
    a denoiser's lists keep that many blocks more than the fewest that keep their kinds (a call failed on those: a
    forward that pairs its blocks by count, as Hunyuan-DiT's skips do, needs an even count).
    `encoder_depths`: (source, twin) layer counts of the pipeline's text encoders, for a denoiser config that
    indexes their layers (`_encoder_layers`)."""
    source = on_meta(cls, library, config, what)
    config = full_config(source, library, config)
    lists = blocks_mod.block_lists(source)
    result = Plan(config=config, params_source=count(source))
    groups, counted, shared = _groups(cls, library, config, lists, what)
    for path in lists:
        if path not in counted:
            result.whole[path] = f"no config key sets its length ({len(lists[path])})"
    current, current_model = config, source
    kept: dict[Path_, list[int]] = {}
    blocks = counted - shared  # the block lists: those a config key counts, none shared between counts
    top = [p for p in blocks if "." not in p]
    # the main list: the longest top-level one (a refiner's few blocks are not what a cache caches: Lumina2's and
    # Z-Image's noise/context refiners), the smaller block between lists as long
    main = min(top, key=lambda p: (-len(lists[p]), count(lists[p][0]))) if denoiser and len(blocks) > 1 and top \
        else None
    for group in groups:
        textual = not any(part in _NOT_TEXT for k in group.key for part in k.lower().split("_"))
        need = min_layers if textual else 1
        why = need_reason
        if denoiser and (len(blocks) == 1 or main in group.lists):
            need, why = max(need, 2), "a cache computing the first block of a list has the second to skip"
        found = _cut_group(cls, library, current, current_model, source, group, need, what, why, shared,
                           first=text and textual, deeper=deeper if denoiser else 0)
        if isinstance(found, str):
            for path in group.lists:
                result.whole[path] = found
            continue
        current, current_model, cuts, changes = found
        kept[group.key] = cuts[0].kept
        result.cuts.extend(cuts)
        result.changes.update(changes)
    later = _spanning(config, groups, kept)
    if denoiser:
        own = {p for g in groups for p in _scope_keys(config, g.key, g.value)[1]}  # indices of its own blocks
        later.update(_encoder_layers(config, later, own, encoder_depths or []))
    if later:
        current = with_values(current, later)
        current_model = on_meta(cls, library, current, what)
        result.changes.update({dotted(k): (get(config, k), v) for k, v in later.items()})
    result.config = current
    result.params_twin = count(current_model)
    return result


def _spanning(config: dict[str, Any], groups: list[_Group], kept: dict[Path_, list[int]]) -> dict[Path_, Any]:
    """A per-block list that runs over several cut block lists in turn (HiDream's `llama_layers`: one entry per
    double-stream then single-stream block, 16 + 32): its length is the sum of their counts, in the order the
    config names them; cut to each list's kept blocks."""
    changes: dict[Path_, Any] = {}
    for scope in {g.key[:-1] for g in groups}:
        cut = [g for g in groups if g.key[:-1] == scope and g.key in kept]
        if len(cut) < 2:
            continue
        total = sum(g.value for g in cut)
        for path, value in flatten(config):
            if path[:-1] != scope or not isinstance(value, list) or len(value) != total \
                    or not any(h in path[-1].lower() for h in _LIST_HINTS):
                continue
            new, start = [], 0
            for group in cut:
                new += [value[start + i] for i in kept[group.key]]
                start += group.value
            changes[path] = new
    return changes


def _encoder_layers(config: dict[str, Any], cut: dict[Path_, Any], own: set[Path_],
                    depths: list[tuple[int, int]]) -> dict[Path_, Any]:
    """A denoiser config list of layer indices of a text encoder (HiDream's `llama_layers`: hidden states 0..31 of
    the 32-layer Llama) would index past the twin's cut encoder: each index i of the encoder of D layers cut to d is
    mapped to i * d // D (the same spread over fewer layers). Index lists of the denoiser's own blocks (`own`,
    renumbered by the cuts) are left alone; the encoder is the shallowest one deep enough for the source's list
    (`config`; `cut`: lists already cut to the kept blocks)."""
    changes: dict[Path_, Any] = {}
    for path, value in flatten(config):
        if "layer" not in path[-1].lower() or path in own or not isinstance(value, list) or not value \
                or not all(is_int(v) and v >= 0 for v in value):
            continue
        deep = sorted((before, after) for before, after in depths if before > max(value))
        value = cut.get(path, value)
        if not deep or max(value) < deep[0][1]:
            continue
        before, after = deep[0]
        changes[path] = [v * after // before for v in value]
    return changes


def full_config(model, library: Library, given: dict[str, Any]) -> dict[str, Any]:
    """The config with every default the class filled in (a diffusers config file may name only what differs)."""
    if library.name == "transformers":
        return model.config.to_dict()
    return {**given, **{k: v for k, v in dict(model.config).items() if not k.startswith("_")}}


def _groups(cls, library, config, lists, what) -> tuple[list[_Group], set[str], set[str]]:
    """Config keys that count block lists (found by building with each candidate key one higher, its per-layer
    lists one longer), the lists counted, and the shared ones: a list whose length is the sum of several counts
    (HiDream's `caption_projection`, one per double- and single-stream block and one more) follows each cut and
    belongs to no group."""
    lengths = {path: len(blocks) for path, blocks in lists.items()}
    candidates = [(path, value) for path, value in flatten(config) if is_int(value) and value in lengths.values()]
    found = []
    for key, value in candidates:
        bump: dict[Path_, Any] = {key: value + 1}
        for path in _scope_keys(config, key, value)[0]:
            old = list(get(config, path))
            bump[path] = [*old, old[-1]]
        try:
            probe = on_meta(cls, library, with_values(config, bump), what)
        except TwinError:
            continue
        moved = {}
        for path, blocks in blocks_mod.block_lists(probe).items():
            if path in lengths and len(blocks) > lengths[path]:
                factor = len(blocks) - lengths[path]
                moved[path] = (factor, lengths[path] - factor * value)
        if moved:
            found.append(_Group(key, value, moved))
    owners: dict[str, list[_Group]] = {}
    for group in found:
        for path in group.lists:
            owners.setdefault(path, []).append(group)
    shared = {path for path, gs in owners.items() if len(gs) > 1 and all(g.lists[path][1] != 0 for g in gs)}
    groups, counted = [], set(shared)
    for group in found:
        mine = {p: fo for p, fo in group.lists.items() if p not in counted}
        if mine:
            groups.append(_Group(group.key, group.value, mine))
            counted.update(mine)
    return groups, counted, shared


def _scope_keys(config: dict[str, Any], key: Path_, n: int) -> tuple[list[Path_], list[Path_], list[Path_]]:
    """Per-layer list keys, index-list keys and boundary keys beside the count `key` in its config."""
    per_layer, index, bounds = [], [], []
    for path, value in flatten(config):
        if path[:-1] != key[:-1] or path == key:
            continue
        name = path[-1].lower()
        if isinstance(value, (list, tuple)) and value:
            ints = all(is_int(v) for v in value)
            if ints and len(set(value)) == len(value) and all(0 <= v < n for v in value) and len(value) < n \
                    and any(h in name for h in _INDEX_HINTS):
                index.append(path)
            elif len(value) == n and any(h in name for h in _LIST_HINTS):
                per_layer.append(path)
        elif is_int(value) and 0 < value < n and any(h in name for h in _BOUND_HINTS):
            bounds.append(path)
    return per_layer, index, bounds


def _config_kinds(config: dict[str, Any], per_layer: list[Path_], index: list[Path_], n: int) -> list[Hashable]:
    lists = [list(get(config, p)) for p in per_layer]
    members = [set(get(config, p)) for p in index]
    return [(tuple(repr(values[i]) for values in lists), tuple(i in m for m in members)) for i in range(n)]


def _cut_group(cls, library, config, model, source, group: _Group, need: int, what: str, need_reason: str,
               shared: set[str] = frozenset(), first: bool = False, deeper: int = 0):
    """(config, model, cuts, changes) of the first variant that rebuilds the kinds it should, or why none does.

    Variants, in order: the first block of each kind (boundary keys moved, then not); each leading run that holds
    every kind (rebuilt block by block the same as the source's run); each shorter count whose rebuilt blocks are
    of the source's kinds, every kind present (a layout set by rules on the count, e.g. "the first three and the
    last block dense": its kept indices are the first source block of each rebuilt block's kind)."""
    src_lists = blocks_mod.block_lists(source)
    paths = list(group.lists)
    skips = {path: blocks_mod.positional_settings(src_lists[path]) for path in paths}
    sigs = {path: blocks_mod.signatures(src_lists[path], skips[path]) for path in paths}
    n = group.value
    direct = all(fo == (1, 0) for fo in group.lists.values())
    per_layer, index, bounds = _scope_keys(config, group.key, n) if direct else ([], [], [])
    if direct:
        extra = _config_kinds(config, per_layer, index, n)
        kinds = [(tuple(sigs[p][i] for p in paths), extra[i]) for i in range(n)]
    else:  # lists of several lengths per count: each list is judged alone
        kinds = [tuple(sigs[p][i] if i < len(sigs[p]) else None for p in paths) for i in range(n)]
    every = set(kinds)
    variants: list[tuple[list[int], str]] = []
    extended = ""
    if direct:
        keep = blocks_mod.cover(kinds)
        if deeper:
            need, need_reason = max(need, len(keep)) + deeper, "the twin's call failed with fewer"
        if len(keep) < need and need_reason:
            extended = f"; {min(need, n)} kept: {need_reason}"
        for i in range(n):
            if len(keep) >= need:
                break
            if i not in keep:
                keep = sorted([*keep, i])
        if len(keep) < n:
            variants += [(keep, "moved"), (keep, "selected")]
    start = max(1, need)
    if first and direct:
        variants.insert(0, (list(range(start)), "first"))
    variants += [(list(range(m)), "leading") for m in range(start, n) if set(kinds[:m]) == every or not direct]
    variants += [(list(range(m)), "any") for m in range(start, n)]
    if n == 1:
        return "nothing to cut (one block)"
    if need >= n:
        return f"all {n} kept: {need_reason}" if need_reason else f"all {n} kept"
    for keep, mode in variants:
        changes = _changes(config, group, keep, per_layer, index, bounds, mode == "moved")
        candidate = with_values(config, changes)
        try:
            rebuilt = on_meta(cls, library, candidate, what)
        except TwinError:
            continue
        kept = _check(rebuilt, model, group, keep, mode, sigs, skips, candidate, per_layer, index, kinds, shared)
        if kept is None:
            continue
        why = blocks_mod.describe(kinds, kept, mode) + extended
        new_lists = blocks_mod.block_lists(rebuilt)
        cuts = [ListCut(path, dotted(group.key), len(src_lists[path]), len(new_lists[path]),
                        kept if direct else list(range(len(new_lists[path]))), why) for path in paths]
        return candidate, rebuilt, cuts, {dotted(k): (get(config, k), v) for k, v in changes.items()
                                           if get(config, k) != v}
    if len(every) == n:
        return f"each of its {n} blocks is of its own kind"
    return "no shorter count rebuilds its kinds of block"


def _changes(config, group: _Group, keep, per_layer, index, bounds, move_bounds: bool) -> dict[Path_, Any]:
    changes: dict[Path_, Any] = {group.key: len(keep)}
    for path in per_layer:
        values = list(get(config, path))
        changes[path] = [values[i] for i in keep]
    for path in index:
        old = list(get(config, path))
        changes[path] = [keep.index(i) for i in old if i in keep]
    if move_bounds:
        for path in bounds:
            changes[path] = sum(1 for i in keep if i < get(config, path))
    return changes


def _check(rebuilt, model, group: _Group, keep, mode, sigs, skips, candidate, per_layer, index, kinds,
           shared: set[str] = frozenset()):
    """The source indices the rebuilt blocks stand for, or None when the rebuilt model is not what `mode` asks: the
    kept blocks' kinds in order ("moved", "selected", "leading"), or only the source's kinds, every one ("any").
    Every list outside the group but the shared ones must keep its length."""
    new_lists = blocks_mod.block_lists(rebuilt)
    for path, blocks in blocks_mod.block_lists(model).items():
        if path not in group.lists and path not in shared and len(new_lists.get(path, ())) != len(blocks):
            return None
    paths = list(group.lists)
    if any(path not in new_lists for path in paths):
        return None
    new_sigs = {path: blocks_mod.signatures(new_lists[path], skips[path]) for path in paths}
    direct = all(fo == (1, 0) for fo in group.lists.values())
    if not direct:  # each list alone: the leading run of the source's blocks, every kind of that list present
        for path in paths:
            if new_sigs[path] != sigs[path][:len(new_sigs[path])] or set(new_sigs[path]) != set(sigs[path]):
                return None
        return list(keep)
    extra = _config_kinds(candidate, per_layer, index, len(keep))
    if any(len(new_sigs[p]) != len(keep) for p in paths):
        return None
    new_kinds = [(tuple(new_sigs[p][j] for p in paths), extra[j]) for j in range(len(keep))]
    if mode != "any":
        return list(keep) if new_kinds == [kinds[i] for i in keep] else None
    if set(new_kinds) != set(kinds):
        return None
    return [kinds.index(kind) for kind in new_kinds]
