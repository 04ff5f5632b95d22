"""The denoising steps of a pipeline call, seen at its scheduler, whatever callbacks the pipeline offers.

`SchedulerSteps(pipe)` records every `step` of `pipe.scheduler` while the context is active: the sample it was
given and the one it returned. The first step's input is the initial latents the pipeline prepared (its noise, in
the layout of the final latents); the last step's output is the final latents.

The capture never changes what the pipeline does. The scheduler instance is given a subclass of its own class for
the call, made here (equal to its class and hashed like it, for pipelines that compare the scheduler's type), whose
`step` calls the class's own `step` on whatever scheduler it is called on and records
only the calls made on the pipeline's scheduler. A pipeline that copies its scheduler (deep or shallow: one per
stream, as audio-video pipelines do) gets copies that step themselves, unrecorded; other schedulers are never
touched; a pipeline that steps itself simply records no step. An earlier design put a closure on the instance,
which `copy.deepcopy` carried into the copy still bound to the original: the copy then stepped the original
scheduler, twice per step, into an IndexError. On exit the scheduler gets its class back; a copy made during the
call keeps the subclass, which only passes its calls through.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch


def step_ranges(steps: list[int]) -> str:
    """[0, 1, 2, 5, 6] -> "steps 0-2, 5-6"."""
    runs: list[list[int]] = []
    for step in sorted(set(steps)):
        if runs and step == runs[-1][1] + 1:
            runs[-1][1] = step
        else:
            runs.append([step, step])
    return "step" + "s" * (len(steps) > 1) + " " + ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)


def tensor_of(output: Any, field: str) -> torch.Tensor | None:
    """The tensor a module or scheduler returned: itself, the first of a tuple, or the output object's `field`
    (`prev_sample` of a scheduler step, `sample` of a transformer's BaseOutput)."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    value = getattr(output, field, None)
    return value if isinstance(value, torch.Tensor) else None


def _same_class(cls: type) -> type:
    """The metaclass of the recording subclass of `cls`: a class that compares equal to `cls` and hashes like it, so
    a pipeline testing `type(self.scheduler) != FlowMatchEulerDiscreteScheduler` (Bria's does, before it calls
    `scale_model_input`) or keying a table by the scheduler's class takes the branch it takes without the capture."""
    meta = type(cls)

    class Same(meta):
        def __eq__(self, other):
            return True if other is cls or other is self else NotImplemented

        def __ne__(self, other):
            return False if other is cls or other is self else NotImplemented

        def __hash__(self):
            return hash(cls)

    return Same


class SchedulerSteps:
    """Context manager; `calls`, `first_sample` and `last_sample` after the call (CPU float32 copies)."""

    def __init__(self, pipe, on_step: Callable[[], None] | None = None):
        self.scheduler = getattr(pipe, "scheduler", None)
        self.on_step = on_step
        self.calls = 0
        self.first_sample: torch.Tensor | None = None
        self._last: torch.Tensor | None = None
        self._class: type | None = None  # the scheduler's own class while its recording subclass is set
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
        if not self.available or self._installed or "step" in vars(self.scheduler):
            return self  # a step set on the instance by someone else stays theirs: nothing is recorded
        cls = type(self.scheduler)
        try:
            signature = inspect.signature(cls.step)
        except (TypeError, ValueError):
            signature = None
        tap = self

        def step(scheduler, *args, **kwargs):
            output = super(recording, scheduler).step(*args, **kwargs)
            if scheduler is tap.scheduler and tap._installed:
                tap._record(signature, (scheduler, *args), kwargs, output)
            return output

        if signature is not None:  # a pipeline that reads the step's parameters (`"generator" in signature(
            step.__signature__ = signature  # scheduler.step).parameters`: DDPM's noise) finds the class's own
        recording = _same_class(cls)(cls.__name__, (cls,), {"step": step, "__module__": cls.__module__,
                                                            "__qualname__": cls.__qualname__, "__doc__": cls.__doc__})
        try:
            self.scheduler.__class__ = recording
        except TypeError:  # a layout that refuses another class: steps are not seen, the call is untouched
            return self
        self._class, self._installed = cls, True
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
            self.scheduler.__class__ = self._class
            self._installed = False
