"""The generation request every row runs: the pipeline call arguments and the seed.

Defaults come from the zoo metadata of the model folder (`ditgate.json`) when there is one; flags override them.
The same request, with a fresh CPU generator seeded identically, is used by every row and every rank.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from ditgate.core.errors import DitgateError

DEFAULT_PROMPT = "a red cube on a wooden table, studio light"


@dataclass(frozen=True)
class Request:
    call: dict[str, Any] = field(default_factory=dict)  # keyword arguments of pipe(...)
    seed: int = 0
    vae_tiling: dict[str, Any] = field(default_factory=dict)  # keyword arguments of pipe.vae.enable_tiling(...)

    @property
    def steps(self) -> int | None:
        return self.call.get("num_inference_steps")

    def to_dict(self) -> dict[str, Any]:
        return {"call": dict(self.call), "seed": self.seed, "vae_tiling": dict(self.vae_tiling)}


def build(meta: dict[str, Any], *, prompt: str | None = None, height: int | None = None, width: int | None = None,
          frames: int | None = None, steps: int | None = None, seed: int = 0,
          extra: dict[str, Any] | None = None) -> Request:
    """Request from zoo metadata (`meta["call"]`, may be empty) overridden by explicit values."""
    call = dict(meta.get("call", {}))
    call.setdefault("prompt", DEFAULT_PROMPT)
    for key, value in (("prompt", prompt), ("height", height), ("width", width), ("num_frames", frames),
                       ("num_inference_steps", steps)):
        if value is not None:
            call[key] = value
    for key in ("height", "width", "num_frames", "num_inference_steps"):
        if key in call and (not isinstance(call[key], int) or call[key] < 1):
            raise DitgateError(f"{key} must be a positive integer, got {call[key]!r}")
    call.update(extra or {})
    return Request(call=call, seed=seed, vae_tiling=dict(meta.get("vae_tiling", {})))


def call_kwargs(pipe, request: Request) -> dict[str, Any]:
    """The request's arguments, checked against what `pipe.__call__` accepts."""
    params = inspect.signature(type(pipe).__call__).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in request.call.items() if takes_any or k in params}
    dropped = sorted(set(request.call) - set(kwargs))
    if dropped:
        raise DitgateError(f"{type(pipe).__name__} does not accept {', '.join(dropped)}")
    return kwargs


def resolve_device(device: str) -> str:
    """`device`, with "auto" resolved to cuda when a GPU is visible, else cpu."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
