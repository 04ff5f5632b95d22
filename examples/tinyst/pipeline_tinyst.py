"""TinySTPipeline: text-to-video with the TinyST transformer, a T5 text encoder and a per-frame AutoencoderKL.

Rectified flow with an Euler scheduler. Prompts are padded to `max_sequence_length`; the padding mask goes to the
transformer (`encoder_attention_mask`). Classifier-free guidance is batched: one transformer call per step on
`[negative, positive]`, the negative prompt (short by default) padded more than the prompt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from diffusers.image_processor import VaeImageProcessor
from diffusers.models import AutoencoderKL
from diffusers.pipelines.pipeline_utils import DiffusionPipeline
from diffusers.schedulers import FlowMatchEulerDiscreteScheduler
from diffusers.utils import BaseOutput
from diffusers.utils.torch_utils import randn_tensor
from transformers import T5EncoderModel, T5Tokenizer

from .transformer_tinyst import TinySTTransformer3DModel


@dataclass
class TinySTPipelineOutput(BaseOutput):
    frames: Any  # np.ndarray (B, F, H, W, C) in [0, 1], or latents (B, C, F, h, w)


class TinySTPipeline(DiffusionPipeline):
    model_cpu_offload_seq = "text_encoder->transformer->vae"
    _callback_tensor_inputs = ["latents"]

    def __init__(self, scheduler: FlowMatchEulerDiscreteScheduler, vae: AutoencoderKL,
                 text_encoder: T5EncoderModel, tokenizer: T5Tokenizer, transformer: TinySTTransformer3DModel):
        super().__init__()
        self.register_modules(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                              transformer=transformer)
        self.vae_scale_factor = 2 ** (len(self.vae.config.block_out_channels) - 1)
        self.image_processor = VaeImageProcessor(vae_scale_factor=self.vae_scale_factor)

    def save_pretrained(self, save_directory, **kwargs):
        """As diffusers', but `model_index.json` names the package too (`["tinyst", "TinySTPipeline"]`)."""
        super().save_pretrained(save_directory, **kwargs)
        index_file = Path(save_directory) / "model_index.json"
        index = json.loads(index_file.read_text())
        index["_class_name"] = [type(self).__module__.split(".")[0], type(self).__name__]
        index_file.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")

    def encode_prompt(self, prompts: list[str], max_sequence_length: int, device):
        tokens = self.tokenizer(prompts, padding="max_length", max_length=max_sequence_length, truncation=True,
                                return_tensors="pt")
        ids, mask = tokens.input_ids.to(device), tokens.attention_mask.to(device)
        return self.text_encoder(ids, attention_mask=mask).last_hidden_state.to(self.transformer.dtype), mask

    @torch.no_grad()
    def __call__(self, prompt: str | list[str], negative_prompt: str | list[str] | None = None, height: int = 32,
                 width: int = 32, num_frames: int = 4, num_inference_steps: int = 8, guidance_scale: float = 4.0,
                 generator: torch.Generator | None = None, latents: torch.Tensor | None = None,
                 max_sequence_length: int = 32, output_type: str = "np", return_dict: bool = True,
                 callback_on_step_end: Callable[..., dict[str, Any]] | None = None,
                 callback_on_step_end_tensor_inputs: list[str] | None = None):
        device = self._execution_device
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        batch = len(prompts)
        cfg = guidance_scale > 1.0
        embeds, mask = self.encode_prompt(prompts, max_sequence_length, device)
        if cfg:
            negative = negative_prompt if negative_prompt is not None else ""
            negatives = [negative] * batch if isinstance(negative, str) else list(negative)
            neg_embeds, neg_mask = self.encode_prompt(negatives, max_sequence_length, device)
            embeds, mask = torch.cat([neg_embeds, embeds]), torch.cat([neg_mask, mask])

        channels = self.transformer.config.in_channels
        shape = (batch, channels, num_frames, height // self.vae_scale_factor, width // self.vae_scale_factor)
        if latents is None:
            latents = randn_tensor(shape, generator=generator, device=device, dtype=self.transformer.dtype)
        self.scheduler.set_timesteps(num_inference_steps, device=device)
        tensor_inputs = callback_on_step_end_tensor_inputs or ["latents"]
        for i, t in enumerate(self.scheduler.timesteps):
            model_input = torch.cat([latents] * 2) if cfg else latents
            velocity = self.transformer(hidden_states=model_input, encoder_hidden_states=embeds,
                                        timestep=t.expand(model_input.shape[0]), encoder_attention_mask=mask,
                                        return_dict=False)[0]
            if cfg:
                uncond, cond = velocity.chunk(2)
                velocity = uncond + guidance_scale * (cond - uncond)
            latents = self.scheduler.step(velocity, t, latents, return_dict=False)[0]
            if callback_on_step_end is not None:
                values = callback_on_step_end(self, i, t, {name: {"latents": latents}[name] for name in tensor_inputs})
                latents = values.get("latents", latents)

        if output_type == "latent":
            frames = latents
        else:
            flat = latents.transpose(1, 2).flatten(0, 1)  # one image per frame
            scaled = flat / self.vae.config.scaling_factor + self.vae.config.shift_factor
            images = self.vae.decode(scaled.to(self.vae.dtype), return_dict=False)[0]
            images = self.image_processor.postprocess(images, output_type="np")
            frames = np.asarray(images).reshape(batch, num_frames, *images.shape[1:])
        self.maybe_free_model_hooks()
        if not return_dict:
            return (frames,)
        return TinySTPipelineOutput(frames=frames)
