"""What the pipeline zoo knows of each pipeline: its class, modality, builder and default call."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

PROMPT = "a tiny red cube on a table"


@dataclass(frozen=True)
class PipelineSpec:
    name: str  # without the `pipe/` prefix
    pipeline: str  # the diffusers class
    modality: str  # "image" | "video"
    summary: str
    build: Callable[[int], Any] = field(repr=False)
    call: dict[str, Any] = field(default_factory=dict)  # default pipeline call arguments
    image: bool = False  # the call needs an input image (edit, image-to-video, inpaint)
    family: bool = True  # cache-dit registers an adapter for it (False: a trait to test that no family has)


def image_call(steps: int = 6, size: int = 32, **extra) -> dict[str, Any]:
    return {"prompt": PROMPT, "height": size, "width": size, "num_inference_steps": steps, **extra}


def video_call(frames: int, steps: int = 6, size: int = 32, **extra) -> dict[str, Any]:
    return {"prompt": "a tiny red cube spinning", "height": size, "width": size, "num_frames": frames,
            "num_inference_steps": steps, **extra}
