"""Block lists and the kind of each block: what a twin must keep one of.

A block list is an `nn.ModuleList` that is not inside another list's item (a transformer's `transformer_blocks`, a
T5's `encoder.block`, a refiner's `token_refiner.refiner_blocks`). A block's structural signature is its class, the
class and the scalar settings of every submodule (a sliding window, `context_pre_only`, an expert count) and the
names and shapes of its parameters and buffers; a setting that only counts the block's position (`layer_idx`) is left
out, or every block would differ. A block's kind adds what the config says of its position: its entry in each
per-layer list (`layer_types`) and whether it is named in each index list (`fullatt_block_indexes`).
"""

from __future__ import annotations

from typing import Any, Hashable, Sequence

_SCALARS = (bool, int, float, str, type(None))


def block_lists(model) -> dict[str, Any]:
    """Non-empty ModuleLists of `model` by dotted path, those inside another list's items left out."""
    import torch

    found = {}
    for name, module in model.named_modules():
        if not name or not isinstance(module, torch.nn.ModuleList) or len(module) == 0:
            continue
        if any(part.isdigit() for part in name.split(".")):
            continue
        found[name] = module
    return found


def _scalar(value: Any) -> bool:
    if isinstance(value, _SCALARS):
        return True
    return isinstance(value, tuple) and all(isinstance(v, _SCALARS) for v in value)


def _settings(block) -> dict[tuple[str, str], Any]:
    out = {}
    for name, module in block.named_modules():
        for key, value in vars(module).items():
            if not key.startswith("_") and key != "training" and _scalar(value):
                out[(name, key)] = value
    return out


def positional_settings(blocks: Sequence) -> set[tuple[str, str]]:
    """Settings whose value is the block's position plus a constant in every block (`layer_idx`, `layer_id`)."""
    if len(blocks) < 2:
        return set()
    per_block = [_settings(b) for b in blocks]
    shared = set.intersection(*(set(s) for s in per_block))
    out = set()
    for key in shared:
        values = [s[key] for s in per_block]
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            offsets = {v - i for i, v in enumerate(values)}
            if len(offsets) == 1:
                out.add(key)
    return out


def signature(block, skip: set[tuple[str, str]]) -> Hashable:
    """The structural signature of one block (see the module docstring)."""
    settings = tuple(sorted((k, v) for k, v in _settings(block).items() if k not in skip))
    classes = tuple((name, type(m).__qualname__) for name, m in block.named_modules())
    params = tuple((name, tuple(p.shape)) for name, p in block.named_parameters())
    buffers = tuple((name, tuple(b.shape)) for name, b in block.named_buffers())
    return (type(block).__qualname__, classes, settings, params, buffers)


def signatures(blocks: Sequence, skip: set[tuple[str, str]] | None = None) -> list[Hashable]:
    skip = positional_settings(blocks) if skip is None else skip
    return [signature(b, skip) for b in blocks]


def cover(kinds: Sequence[Hashable]) -> list[int]:
    """The fewest indices holding every kind: the first block of each kind, in order (a first or last block that
    differs, the first MoE layer after the dense ones, one spatial/temporal pair of an alternating pattern)."""
    seen, keep = set(), []
    for i, kind in enumerate(kinds):
        if kind not in seen:
            seen.add(kind)
            keep.append(i)
    return keep


def period(kinds: Sequence[Hashable]) -> int:
    """The shortest period of a repeating pattern of kinds (repeated at least twice), else the length."""
    n = len(kinds)
    for p in range(1, n // 2 + 1):
        if all(kinds[i] == kinds[i + p] for i in range(n - p)):
            return p
    return n


def describe(kinds: Sequence[Hashable], keep: Sequence[int], mode: str) -> str:
    """Why these indices were kept: "19 blocks of one kind", "3 kinds in 24 blocks: the first block of each", ..."""
    distinct, n = len(set(kinds)), len(kinds)
    if distinct == 1:
        return f"{n} blocks of one kind"
    if mode == "first":
        return (f"{distinct} kinds in {n} blocks: a text encoder keeps its first {len(keep)} (the pipeline reads its "
                "output, not each kind)")
    if mode in ("moved", "selected"):
        return f"{distinct} kinds in {n} blocks: the first block of each"
    p = period(kinds)
    if mode == "leading" and p < n and len(keep) == p:
        return f"{distinct} kinds repeating with period {p}: one whole period"
    if mode == "leading":
        return f"{distinct} kinds in {n} blocks: the shortest leading run that holds every kind and rebuilds the same"
    return (f"{distinct} kinds in {n} blocks, laid out by rules on the count: the fewest blocks whose rebuilt "
            "layout holds every kind")
