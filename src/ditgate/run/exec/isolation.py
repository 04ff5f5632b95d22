"""Rows that share a process: each starts from the pristine pipeline, and class-level patches are undone after it.

A run loads the pipeline once per process (`Pristine`) and gives every row its own copy (`Pristine.fresh`): the
weights come from memory, not the disk, and whatever a row does to its copy (cache-dit's hooks, tensor-parallel
DTensors, quantized layers, compiled blocks, a tiled VAE) goes away with the copy.

cache-dit patches classes, not only instances: a context-parallel planner replaces e.g.
`WanAttnProcessor.__call__` with a version that expects `_cp_config` on every processor, and the cache adapter
wraps the pipeline class's `__call__`. A pipeline loaded afterwards in the same process inherits those patches,
so a tensor-parallel row run after a context-parallel row fails (`'WanAttnProcessor' object has no attribute
'_cp_config'`) although it would pass alone. `ClassSnapshot` records the attributes of every class the pipeline's
objects belong to before a row and puts them back after it.
"""

from __future__ import annotations

import copy
import gc
import time
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


def _tensors_of(pipe):
    """Every tensor the pipeline's modules hold: parameters, buffers and plain tensor attributes (weight_norm keeps
    its computed weight as one)."""
    for component in getattr(pipe, "components", {}).values():
        if not isinstance(component, torch.nn.Module):
            continue
        for module in component.modules():
            for value in vars(module).values():
                if isinstance(value, torch.Tensor):
                    yield value
            yield from (t for t in module._parameters.values() if t is not None)
            yield from (t for t in module._buffers.values() if t is not None)


def _copy_of(tensor: torch.Tensor, device) -> torch.Tensor:
    if tensor.is_meta:  # no data to copy (a weight_norm weight before its first forward recomputes it)
        return tensor
    data = tensor.detach().to(device, copy=True)
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(data, requires_grad=tensor.requires_grad)
    return data


class Pristine:
    """A pipeline loaded once, never run, never changed; every row runs on a copy of it (`fresh`).

    On CUDA the pristine copy stays on the GPU when there is room for two copies of the weights (a copy there takes
    milliseconds), else it waits in host memory and each row copies it over. `resident_bytes` is what it keeps on
    the row's device (taken off the row's peak memory, so the peak is the row's own)."""

    def __init__(self, pipe, device: str, load_s: float = 0.0, load_key: tuple | None = None):
        self.pipe, self.device, self.load_s, self.load_key = pipe, device, load_s, load_key
        self._handover = False  # `last_row`
        self.bytes = sum(t.numel() * t.element_size() for t in {id(t): t for t in _tensors_of(pipe)}.values())
        self.on_host = False
        if device.startswith("cuda"):
            free, _ = torch.cuda.mem_get_info(torch.device(device))
            if free < self.bytes * 1.5:  # a second copy would leave too little for the row's activations
                self.pipe = pipe.to("cpu")
                self.on_host = True
                torch.cuda.empty_cache()
        # what exists now lives as long as this pipeline: out of the collector's sight, each row's collections walk
        # only what the row made (0.2 s a collection on zoo:flux otherwise); `release` gives it back
        # `ditgate serve` froze its own heap (its imports and the pipeline it kept) before forking this process:
        # that stays frozen (collecting it here would free nothing of the server's and cost a walk of it)
        self._thaw = gc.get_freeze_count() == 0
        gc.collect()
        gc.freeze()

    def release(self) -> None:
        """Let the collector see the pipeline again (call before dropping the last reference to it)."""
        if self._thaw:
            gc.unfreeze()

    def give_back(self) -> bool:
        """Keep the pipeline, never run or changed, for the next command of a process that runs commands one after
        another (ditgate.core.warm.give_back); False: not kept (the caller lets it go). Not after `last_row`."""
        from ditgate.core import warm

        return self.load_key is not None and self.pipe is not None and warm.give_back(self.load_key, self.pipe)

    @property
    def resident_bytes(self) -> int:
        return 0 if self.on_host or not self.device.startswith("cuda") else self.bytes

    def last_row(self) -> None:
        """The next `fresh` is the last this process asks for (a worker rank's last row: the rank ends after it):
        on a CPU it hands over the pristine pipeline itself, never run, instead of a copy of it."""
        self._handover = not self.device.startswith("cuda")

    def fresh(self):
        """A copy of the pristine pipeline on its device, sharing nothing with it; returns (pipe, seconds). After
        `last_row` (on a CPU): the pristine pipeline itself, once."""
        if self._handover and self.pipe is not None:
            pipe, self.pipe, self._handover = self.pipe, None, False
            return pipe, 0.0
        start = time.perf_counter()
        memo = {}
        with torch.no_grad():
            for tensor in _tensors_of(self.pipe):
                if id(tensor) not in memo:
                    memo[id(tensor)] = _copy_of(tensor, self.device)
            pipe = copy.deepcopy(self.pipe, memo)
        if self.device.startswith("cuda"):
            torch.cuda.synchronize(torch.device(self.device))
        return pipe, time.perf_counter() - start
