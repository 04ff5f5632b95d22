"""TinyMoEPipeline: text-to-image with the TinyMoE transformer, a T5 text encoder and an AutoencoderKL.

The pipeline is TinyMM's (examples/tinymm: rectified flow with an Euler scheduler, prompts padded with their mask
passed to the transformer, batched classifier-free guidance); only the transformer differs. `model_index.json` names
this package (`["tinymoe", "TinyMoEPipeline"]`), so the folder loads as TinyMoE.
"""

from __future__ import annotations

from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler
from tinymm.pipeline_tinymm import TinyMMPipeline
from transformers import T5EncoderModel, T5Tokenizer

from .transformer_tinymoe import TinyMoETransformer2DModel


class TinyMoEPipeline(TinyMMPipeline):
    def __init__(self, scheduler: FlowMatchEulerDiscreteScheduler, vae: AutoencoderKL,
                 text_encoder: T5EncoderModel, tokenizer: T5Tokenizer, transformer: TinyMoETransformer2DModel):
        super().__init__(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                         transformer=transformer)
