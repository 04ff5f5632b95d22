"""Which blocks of a list have which sub-layers: blocks of one class can differ (dense and MoE feed-forwards, a
cross-attention only some blocks have), so no plan may assume every block looks like block 0.

`variants(blocks)` groups the indices of a block list by the blocks' structure (every sub-module's path and class,
every parameter's shape); each group's first block is the one the trace follows and the one TP rows are read from.
"""

from __future__ import annotations

from typing import Any


def _structure(block) -> tuple:
    modules = tuple((path, type(m).__name__) for path, m in block.named_modules())
    params = tuple((path, tuple(p.shape)) for path, p in block.named_parameters())
    return modules, params


def variants(blocks) -> list[list[int]]:
    """Indices of `blocks` grouped by identical structure, in order of their first block."""
    groups: dict[tuple, list[int]] = {}
    for i, block in enumerate(blocks):
        groups.setdefault(_structure(block), []).append(i)
    return list(groups.values())


def span(indices: list[int]) -> str:
    """`[0, 1, 2, 5]` -> "0-2, 5"."""
    parts, start = [], None
    for a, b in zip(indices, indices[1:] + [None]):
        start = a if start is None else start
        if b != a + 1:
            parts.append(f"{start}" if start == a else f"{start}-{a}")
            start = None
    return ", ".join(parts)


def _children(block) -> dict[str, str]:
    return {name: type(child).__name__ for name, child in block.named_children()}


def describe(t_name: str, lists: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per block list with more than one structure: each group's blocks and the sub-layers where it differs from the
    others (a sub-layer present in one group only, or of another class)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for attribute, blocks in lists.items():
        groups = variants(blocks)
        if len(groups) < 2:
            continue
        kids = [_children(blocks[g[0]]) for g in groups]
        names = sorted({n for k in kids for n in k}, key=lambda n: min(list(k).index(n) for k in kids if n in k))
        rows = []
        for g, k in zip(groups, kids):
            differs = [f"{n}: {k.get(n, 'absent')}" for n in names if len({kk.get(n) for kk in kids}) > 1]
            rows.append({"blocks": span(g), "first": g[0], "count": len(g),
                         "sublayers": differs or ["same sub-layers, parameter shapes differ"]})
        found[f"{t_name}.{attribute}"] = rows
    return found
