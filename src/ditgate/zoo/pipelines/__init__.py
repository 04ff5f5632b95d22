"""Tiny seeded copies of real diffusers pipelines, one or more per model family cache-dit registers an adapter for.

`zoo:pipe/NAME` names one wherever a model path is accepted (`ditgate zoo list --pipelines` lists them); they are
built, saved and loaded like every zoo model. They exist so that the runtime meets pipelines it was not written
around: their own call arguments, CFG styles, block layouts, latents packing and outputs. Each builder writes its
components here (sizes in the spirit of diffusers' `get_dummy_components`), from the encoders of `encoders`.

May import: `ditgate.zoo.builders` and `ditgate.zoo.tokenizers` (the zoo package imports this one).
"""

from __future__ import annotations

from ditgate.zoo.pipelines import image_dit, image_llm, image_mmdit, video, video_wan
from ditgate.zoo.pipelines.spec import PipelineSpec

PREFIX = "pipe/"

SPECS: list[PipelineSpec] = image_mmdit.SPECS + image_dit.SPECS + image_llm.SPECS + video.SPECS + video_wan.SPECS

PIPELINES: dict[str, PipelineSpec] = {s.name: s for s in SPECS}


def names() -> list[str]:
    return [PREFIX + name for name in PIPELINES]
