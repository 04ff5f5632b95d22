"""The parts of a loaded pipeline that every stage looks at: its transformers and their block lists."""

from __future__ import annotations

import torch


def block_lists(module: torch.nn.Module) -> dict[str, torch.nn.ModuleList]:
    """Direct ModuleList children of `module` whose items all share one class: the transformer's block lists."""
    found = {}
    for name, child in module.named_children():
        if isinstance(child, torch.nn.ModuleList) and len(child) > 0 and len({type(b) for b in child}) == 1:
            found[name] = child
    return found


def transformers_of(pipe) -> dict[str, torch.nn.Module]:
    """Transformer components of a pipeline: `transformer`, `transformer_2`, ... (those that are set)."""
    comps = getattr(pipe, "components", {})
    return {k: v for k, v in comps.items() if k.startswith("transformer") and isinstance(v, torch.nn.Module)}
