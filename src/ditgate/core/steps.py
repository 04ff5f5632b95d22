"""The denoising steps of a pipeline call, seen at its scheduler, whatever callbacks the pipeline offers.

`SchedulerSteps(pipe)` wraps `pipe.scheduler.step` on that scheduler instance (never on its class) while the
context is active: every call records the sample it was given and the one it returned. The first step's input is
the initial latents the pipeline prepared (its noise, in the layout of the final latents); the last step's output
is the final latents. Taken off on exit, so a pipeline copied or reused later sees its scheduler unchanged.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch


def tensor_of(output: Any, field: str) -> torch.Tensor | None:
    """The tensor a module or scheduler returned: itself, the first of a tuple, or the output object's `field`
    (`prev_sample` of a scheduler step, `sample` of a transformer's BaseOutput)."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    value = getattr(output, field, None)
    return value if isinstance(value, torch.Tensor) else None


class SchedulerSteps:
    """Context manager; `calls`, `first_sample` and `last_sample` after the call (CPU float32 copies)."""

    def __init__(self, pipe, on_step: Callable[[], None] | None = None):
        self.scheduler = getattr(pipe, "scheduler", None)
        self.on_step = on_step
        self.calls = 0
        self.first_sample: torch.Tensor | None = None
        self._last: torch.Tensor | None = None
        self._installed = False

    @property
    def available(self) -> bool:
        return callable(getattr(self.scheduler, "step", None))

    @property
    def last_sample(self) -> torch.Tensor | None:
        return None if self._last is None else self._last.float().cpu()

    def reset(self) -> None:
        self.calls, self.first_sample, self._last = 0, None, None

    def __enter__(self) -> "SchedulerSteps":
        if not self.available or self._installed:
            return self
        original = self.scheduler.step
        try:
            signature = inspect.signature(original)
        except (TypeError, ValueError):
            signature = None

        def step(*args, **kwargs):
            output = original(*args, **kwargs)
            self._record(signature, args, kwargs, output)
            return output

        self.scheduler.step = step  # an instance attribute: shadows the method for this scheduler only
        self._installed = True
        return self

    def _record(self, signature, args, kwargs, output) -> None:
        self.calls += 1
        if self.first_sample is None and signature is not None:
            try:
                sample = signature.bind_partial(*args, **kwargs).arguments.get("sample")
            except TypeError:
                sample = None
            if isinstance(sample, torch.Tensor):
                self.first_sample = sample.detach().float().cpu().clone()
        result = tensor_of(output, "prev_sample")
        if result is not None:
            self._last = result.detach().clone()  # on its device until read: no copy to the host per step
        if self.on_step is not None:
            self.on_step()

    def __exit__(self, *exc) -> None:
        if self._installed:
            vars(self.scheduler).pop("step", None)
            self._installed = False
