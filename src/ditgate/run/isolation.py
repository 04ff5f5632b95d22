"""Undo class-level patches between rows that share a process.

cache-dit patches classes, not only instances: a context-parallel planner replaces e.g.
`WanAttnProcessor.__call__` with a version that expects `_cp_config` on every processor, and the cache adapter
wraps the pipeline class's `__call__`. A pipeline loaded afterwards in the same process inherits those patches,
so a tensor-parallel row run after a context-parallel row fails (`'WanAttnProcessor' object has no attribute
'_cp_config'`) although it would pass alone. `ClassSnapshot` records the attributes of every class the pipeline's
objects belong to before a row and puts them back after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

_SENTINEL = object()


def _classes_of(pipe) -> set[type]:
    found: set[type] = set(type(pipe).__mro__)
    for component in getattr(pipe, "components", {}).values():
        if not isinstance(component, torch.nn.Module):
            continue
        for module in component.modules():
            found.update(type(module).__mro__)
            processor = getattr(module, "processor", None)
            if processor is not None:
                found.update(type(processor).__mro__)
    return {cls for cls in found if cls.__module__ != "builtins" and cls is not torch.nn.Module}


@dataclass
class ClassSnapshot:
    attributes: dict[type, dict[str, object]] = field(default_factory=dict)

    @classmethod
    def of(cls, pipe) -> "ClassSnapshot":
        return cls({klass: dict(vars(klass)) for klass in _classes_of(pipe)})

    def restore(self) -> list[str]:
        """Put every recorded class back as it was; returns `Class.attribute` for each attribute restored."""
        restored = []
        for klass, saved in self.attributes.items():
            current = dict(vars(klass))
            for name, value in saved.items():
                if current.get(name, _SENTINEL) is not value:
                    setattr(klass, name, value)
                    restored.append(f"{klass.__name__}.{name}")
            for name in current.keys() - saved.keys():
                delattr(klass, name)
                restored.append(f"{klass.__name__}.{name}")
        return restored
